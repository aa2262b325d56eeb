//! The flags that say how Kustomize overlays and Helm charts are rendered (shared by
//! `validate`, `diff` and `agent`, so that all three render the same way).

use std::path::{Path, PathBuf};
use std::time::Duration;

use super::args::parse_duration;
use crate::render::RenderOptions;

/// How a repository's kustomizations and `linnet-helm.yaml` charts are rendered.
#[derive(Debug, Clone, clap::Args)]
pub struct RenderArgs {
    /// The kustomize binary that renders a directory with a kustomization.yaml (the image
    /// ships it; a bare name is looked up in PATH, then in ../lib/linnet beside this binary,
    /// where `make install` puts it).
    #[arg(long, default_value = "kustomize", env = "LINNET_KUSTOMIZE")]
    pub kustomize: PathBuf,
    /// The helm binary that renders a chart a linnet-helm.yaml names (looked up as kustomize
    /// is).
    #[arg(long, default_value = "helm", env = "LINNET_HELM")]
    pub helm: PathBuf,
    /// The longest one unit's render may take; past it the render is stopped and the unit is
    /// an error. A render that fetches (--render-allow-host) has the agent's --git-timeout on
    /// top.
    #[arg(long, default_value = "30s", value_parser = parse_duration, env = "LINNET_RENDER_TIMEOUT")]
    pub render_timeout: Duration,
    /// The memory one render's process may take, in bytes. Default: 512 MiB, or half the
    /// container's memory limit (its cgroup's) when that is less, so that a render that
    /// needs too much is stopped and said to, before the kernel stops it or the agent.
    #[arg(long, env = "LINNET_RENDER_MAX_MEMORY")]
    pub render_max_memory: Option<u64>,
    /// The most one render may print, in bytes.
    #[arg(long, default_value_t = 8 * 1024 * 1024, env = "LINNET_RENDER_MAX_BYTES")]
    pub render_max_bytes: usize,
    /// The most objects one unit may render to.
    #[arg(long, default_value_t = 2_000, env = "LINNET_RENDER_MAX_OBJECTS")]
    pub render_max_objects: usize,
    /// A host that kustomize remote bases and Helm charts may be fetched from (repeat or
    /// comma-separate). None by default: rendering is offline, and a remote base or chart is
    /// an error on the file that names it.
    #[arg(
        long = "render-allow-host",
        value_delimiter = ',',
        env = "LINNET_RENDER_ALLOW_HOSTS"
    )]
    pub render_allowed_hosts: Vec<String>,
}

/// Where `make install` puts the renderers, relative to the directory of the linnet binary:
/// beside it, not on PATH, so that they never shadow a kustomize or helm of the user's.
const INSTALLED_TOOLS: &str = "../lib/linnet";

/// `tool` as given, unless it is a bare name PATH does not have and `make install` put one
/// beside the running binary.
fn installed_tool(tool: &Path) -> PathBuf {
    let exe = std::env::current_exe().ok();
    let path = std::env::var_os("PATH");
    resolve_tool(tool, path.as_deref(), exe.as_deref())
}

fn resolve_tool(tool: &Path, path: Option<&std::ffi::OsStr>, exe: Option<&Path>) -> PathBuf {
    let bare = tool.components().count() == 1 && tool.is_relative();
    let on_path = || {
        path.into_iter()
            .flat_map(std::env::split_paths)
            .any(|dir| dir.join(tool).is_file())
    };
    if !bare || on_path() {
        return tool.to_path_buf();
    }
    exe.and_then(Path::parent)
        .map(|dir| dir.join(INSTALLED_TOOLS).join(tool))
        .filter(|installed| installed.is_file())
        .unwrap_or_else(|| tool.to_path_buf())
}

impl RenderArgs {
    /// The render options these flags describe.
    pub fn render_options(&self) -> RenderOptions {
        RenderOptions {
            kustomize: installed_tool(&self.kustomize),
            helm: installed_tool(&self.helm),
            timeout: self.render_timeout,
            max_memory_bytes: self
                .render_max_memory
                .unwrap_or_else(crate::render::default_max_memory),
            max_output_bytes: self.render_max_bytes,
            max_objects: self.render_max_objects,
            allowed_hosts: self
                .render_allowed_hosts
                .iter()
                .map(|h| h.trim().to_string())
                .filter(|h| !h.is_empty())
                .collect(),
            fetch_timeout: Duration::from_secs(60),
            work_dir: std::env::temp_dir(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Regression (issue 72): after `make install`, `linnet validate` could not find the
    /// renderers `make` had built (they were in a cache nothing pointed to).
    #[test]
    fn a_renderer_is_found_on_path_else_where_make_install_puts_it() {
        let dir = tempfile::tempdir().unwrap();
        let (bin, lib, elsewhere) = (
            dir.path().join("bin"),
            dir.path().join("lib/linnet"),
            dir.path().join("elsewhere"),
        );
        for d in [&bin, &lib, &elsewhere] {
            std::fs::create_dir_all(d).unwrap();
        }
        std::fs::write(lib.join("helm"), "").unwrap();
        let exe = bin.join("linnet");
        let helm = Path::new("helm");
        let path = std::env::join_paths([&elsewhere]).unwrap();
        assert_eq!(
            resolve_tool(helm, Some(&path), Some(&exe)),
            bin.join("../lib/linnet/helm")
        );
        // The user's own on PATH wins; a path given is kept; nothing found stays the name.
        std::fs::write(elsewhere.join("helm"), "").unwrap();
        assert_eq!(resolve_tool(helm, Some(&path), Some(&exe)), helm);
        let given = Path::new("/opt/helm");
        assert_eq!(resolve_tool(given, Some(&path), Some(&exe)), given);
        let kustomize = Path::new("kustomize");
        assert_eq!(resolve_tool(kustomize, Some(&path), Some(&exe)), kustomize);
    }
}
