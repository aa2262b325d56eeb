//! The flags that say how Kustomize overlays and Helm charts are rendered (shared by
//! `validate`, `diff` and `agent`, so that all three render the same way).

use std::path::PathBuf;
use std::time::Duration;

use super::args::parse_duration;
use crate::render::RenderOptions;

/// How a repository's kustomizations and `linnet-helm.yaml` charts are rendered.
#[derive(Debug, Clone, clap::Args)]
pub struct RenderArgs {
    /// The kustomize binary that renders a directory with a kustomization.yaml (the image
    /// ships it; a bare name is looked up in PATH).
    #[arg(long, default_value = "kustomize", env = "LINNET_KUSTOMIZE")]
    pub kustomize: PathBuf,
    /// The helm binary that renders a chart a linnet-helm.yaml names.
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

impl RenderArgs {
    /// The render options these flags describe.
    pub fn render_options(&self) -> RenderOptions {
        RenderOptions {
            kustomize: self.kustomize.clone(),
            helm: self.helm.clone(),
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
