//! Kustomize overlays and Helm charts in a repository, rendered into the objects linnet syncs.
//!
//! A directory with a `kustomization.yaml` that no other kustomization uses is rendered by
//! `kustomize build`; a `linnet-helm.yaml` names a chart and its values, rendered by `helm
//! template` ([`units`] says which directories are roots, and which files each reads). Each
//! unit is rendered as a hostile input ([`run`]): in a directory holding only its inputs, with
//! no network, plugins or exec, and within a time, memory, output and object limit. Its
//! objects are read like one spec file named after its kustomization or `linnet-helm.yaml`,
//! so an error blocks only that unit and never prunes what it applied.
//!
//! The unit's id is a hash of its inputs' content ids: the source's snapshot renders again only
//! a unit whose inputs changed.

mod chart_deps;
mod fetched;
mod helm;
mod kustomize;
mod output;
mod run;
mod units;

use std::path::PathBuf;
use std::time::Duration;

pub use helm::HelmRelease;

pub use units::{
    HELM_FILE, KUSTOMIZATION_NAMES, Layout, ParsedFiles, Unit, UnitKind, is_render_file, layout,
};

use crate::specs::{FileContent, FileSpecs, LoadOptions, SpecError};

/// How the listing marks a rendered unit's id: its path is the unit's kustomization or
/// `linnet-helm.yaml`, the rest of the id is the hash of its inputs.
pub const RENDERED: &str = "rendered:";

/// How units are rendered: the tools and the limits on each run.
#[derive(Clone, Debug, PartialEq)]
pub struct RenderOptions {
    /// The `kustomize` binary (a bare name is looked up in `PATH`).
    pub kustomize: PathBuf,
    /// The `helm` binary.
    pub helm: PathBuf,
    /// The longest one render may run; one that fetches has `fetch_timeout` on top.
    pub timeout: Duration,
    /// The memory one render's process may take (its data segment, `RLIMIT_DATA`).
    pub max_memory_bytes: u64,
    /// The most a render may print; past it the tool is stopped.
    pub max_output_bytes: usize,
    /// The most objects one unit may render to.
    pub max_objects: usize,
    /// Hosts whose charts and bases a unit may fetch; none by default.
    pub allowed_hosts: Vec<String>,
    /// What a render that fetches may take on top of `timeout`: the Git timeout, as a
    /// download from Git would have.
    pub fetch_timeout: Duration,
    /// Where each render's inputs are written, in a directory of its own.
    pub work_dir: PathBuf,
}

impl Default for RenderOptions {
    fn default() -> Self {
        RenderOptions {
            kustomize: "kustomize".into(),
            helm: "helm".into(),
            timeout: Duration::from_secs(30),
            max_memory_bytes: 512 * 1024 * 1024,
            max_output_bytes: 8 * 1024 * 1024,
            max_objects: 2_000,
            allowed_hosts: Vec::new(),
            fetch_timeout: Duration::from_secs(60),
            work_dir: std::env::temp_dir(),
        }
    }
}

/// The memory one render may take when `--render-max-memory` is not given: 512 MiB, or
/// half the container's limit when that is less (at least 64 MiB), so that the render, not
/// the agent, is the one stopped, and says why.
pub fn default_max_memory() -> u64 {
    default_max_memory_under(run::cgroup_memory_limit())
}

fn default_max_memory_under(cgroup_limit: Option<u64>) -> u64 {
    const MIB: u64 = 1024 * 1024;
    match cgroup_limit {
        Some(limit) => (limit / 2).clamp(64 * MIB, 512 * MIB),
        None => 512 * MIB,
    }
}

impl RenderOptions {
    /// Whether a unit may fetch from `host`.
    pub fn allows_host(&self, host: &str) -> bool {
        self.allowed_hosts
            .iter()
            .any(|h| h.eq_ignore_ascii_case(host))
    }
}

/// Renders `units`, in order: each one's inputs are read with `read` (which need not be
/// shared across threads) just before its turn, so that only a few units' inputs are held at
/// once, each unit's at most `--max-total-bytes`; the tools run one per core.
pub fn render_units<E>(
    units: &[&Unit],
    read: &mut impl FnMut(&str, &str) -> Result<FileContent, E>,
    opts: &LoadOptions,
    render: &RenderOptions,
) -> Result<Vec<FileSpecs>, E> {
    let workers = std::thread::available_parallelism().map_or(1, |n| n.get());
    let mut rendered = Vec::with_capacity(units.len());
    for chunk in units.chunks(workers * 2) {
        let mut jobs = Vec::with_capacity(chunk.len());
        for unit in chunk {
            jobs.push((*unit, prepare(unit, read, opts.max_total_bytes)?));
        }
        rendered.extend(render_all(jobs, opts, render));
    }
    Ok(rendered)
}

/// A unit's input files, read; or what it renders to without running a tool (an error).
#[derive(Debug)]
enum Prepared {
    Inputs(Vec<(String, Vec<u8>)>),
    Done(FileSpecs),
}

/// Reads a unit's inputs, at most `max_bytes` of them together.
fn prepare<E>(
    unit: &Unit,
    read: &mut impl FnMut(&str, &str) -> Result<FileContent, E>,
    max_bytes: usize,
) -> Result<Prepared, E> {
    if let Some(problem) = &unit.problem {
        return Ok(Prepared::Done(refused(problem.clone())));
    }
    let mut inputs = Vec::new();
    let mut total = 0usize;
    for (path, id) in &unit.inputs {
        match read(path, id)? {
            FileContent::Bytes(bytes) => {
                total = total.saturating_add(bytes.len());
                if total > max_bytes {
                    return Ok(Prepared::Done(refused(error_at(
                        &unit.key,
                        1,
                        1,
                        format!(
                            "the files this unit reads hold more than the {max_bytes} bytes a \
                             revision's specs may hold (--max-total-bytes): it is not rendered, \
                             and what it applied stays; split it"
                        ),
                    ))));
                }
                inputs.push((path.clone(), bytes));
            }
            FileContent::Refused(why) => {
                return Ok(Prepared::Done(refused(error_at(
                    path,
                    1,
                    1,
                    format!("{why}; {} cannot be rendered without it", unit.key),
                ))));
            }
        }
    }
    Ok(Prepared::Inputs(inputs))
}

/// Runs the unit's tool on its prepared inputs: its objects, or its errors.
#[tracing::instrument(name = "render", skip_all, fields(unit = %unit.key))]
fn render_prepared(
    unit: &Unit,
    prepared: Prepared,
    opts: &LoadOptions,
    render: &RenderOptions,
) -> FileSpecs {
    let inputs = match prepared {
        Prepared::Done(specs) => return specs,
        Prepared::Inputs(inputs) => inputs,
    };
    let work = match run::WorkDir::new(&render.work_dir) {
        Ok(w) => w,
        Err(e) => {
            return refused(error_at(
                &unit.key,
                1,
                1,
                format!(
                    "cannot make a directory to render in under {}: {e}",
                    render.work_dir.display()
                ),
            ));
        }
    };
    let rendered = match &unit.kind {
        UnitKind::Kustomize => kustomize::render(unit, &inputs, &work, render),
        UnitKind::Helm(release) => helm::render(unit, release, &inputs, &work, render),
    };
    match rendered {
        Ok(out) => output::read_rendered(unit, &out, &inputs, opts, render),
        Err(e) => refused(e),
    }
}

/// Renders many units at once, one tool at a time per core: a first sync of a thousand
/// overlays is bound by the tools' runs, which share nothing.
fn render_all(
    jobs: Vec<(&Unit, Prepared)>,
    opts: &LoadOptions,
    render: &RenderOptions,
) -> Vec<FileSpecs> {
    let workers = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .min(jobs.len())
        .max(1);
    if workers == 1 {
        return jobs
            .into_iter()
            .map(|(unit, prepared)| render_prepared(unit, prepared, opts, render))
            .collect();
    }
    let count = jobs.len();
    let queue = std::sync::Mutex::new(jobs.into_iter().enumerate().collect::<Vec<_>>());
    let results =
        std::sync::Mutex::new((0..count).map(|_| None).collect::<Vec<Option<FileSpecs>>>());
    // Each worker's renders are children of the caller's span (a thread starts with none).
    let parent = tracing::Span::current();
    std::thread::scope(|scope| {
        for _ in 0..workers {
            scope.spawn(|| {
                let _in = parent.enter();
                loop {
                    // The lock is held only to take a job, never across a render.
                    let job = queue.lock().ok().and_then(|mut q| q.pop());
                    let Some((i, (unit, prepared))) = job else {
                        break;
                    };
                    let specs = render_prepared(unit, prepared, opts, render);
                    if let Ok(mut r) = results.lock() {
                        r[i] = Some(specs);
                    }
                }
            });
        }
    });
    results
        .into_inner()
        .unwrap_or_default()
        .into_iter()
        .map(Option::unwrap_or_default)
        .collect()
}

/// The unit's error when its inputs cannot be written to render.
fn write_error(unit: &Unit, e: std::io::Error) -> SpecError {
    error_at(
        &unit.key,
        1,
        1,
        format!(
            "cannot write the inputs to render: {}",
            crate::error::io_reason(&e)
        ),
    )
}

fn refused(error: SpecError) -> FileSpecs {
    FileSpecs {
        left_out: Vec::new(),
        objects: Vec::new(),
        errors: vec![error],
    }
}

fn error_at(file: &str, line: u64, column: u64, message: String) -> SpecError {
    SpecError::at(file, line, column, message)
}

/// `dir` joined with the relative `path`, `.` and `..` resolved; `None` when it leaves the
/// spec root or is absolute.
pub(crate) fn join_relative(dir: &str, path: &str) -> Option<String> {
    if path.starts_with('/') {
        return None;
    }
    let mut parts: Vec<&str> = dir.split('/').filter(|p| !p.is_empty()).collect();
    for part in path.split('/') {
        match part {
            "" | "." => {}
            ".." => {
                parts.pop()?;
            }
            p => parts.push(p),
        }
    }
    Some(parts.join("/"))
}

/// The directory of a listed path (`""` at the root).
pub(crate) fn dir_of(path: &str) -> &str {
    path.rsplit_once('/').map(|(d, _)| d).unwrap_or("")
}

/// The line and column of the first `needle` in `text`; 1:1 when it is not there as written.
pub(crate) fn locate_text(text: &str, needle: &str) -> (u64, u64) {
    if needle.is_empty() {
        return (1, 1);
    }
    for (i, line) in text.lines().enumerate() {
        if let Some(at) = line.find(needle) {
            return (i as u64 + 1, line[..at].chars().count() as u64 + 1);
        }
    }
    (1, 1)
}

/// The host a kustomize reference fetches from, when it is remote (a URL, `git@host:`, or a
/// `host.tld/org/repo` form kustomize clones); empty (allowed nowhere) for a URL whose host
/// cannot be read for sure. URLs are read by the `url` crate, never by hand: the hand-made
/// reading took `https://127.0.0.1:12593#@allowed.example` for host `allowed.example`, and
/// helm fetched from 127.0.0.1 (issue 70).
pub(crate) fn remote_host(reference: &str) -> Option<String> {
    let r = reference.trim();
    let rest = if r.contains("://") {
        return Some(url_host(r).unwrap_or_default());
    } else if let Some(rest) = r.strip_prefix("git@") {
        return rest.split([':', '/']).next().map(str::to_string);
    } else {
        let first = r.split('/').next().unwrap_or("");
        let looks_like_host = first.contains('.')
            && r.contains('/')
            && !first.starts_with('.')
            && first
                .rsplit('.')
                .next()
                .is_some_and(|tld| tld.len() >= 2 && tld.chars().all(|c| c.is_ascii_alphabetic()));
        if !looks_like_host {
            return None;
        }
        r
    };
    Some(url_host(&format!("https://{rest}")).unwrap_or_default())
}

/// The host of URL `text` as the `url` crate reads it, lower-case; none for text a Go tool
/// might read another way (a backslash, a space or a control character) or a URL carrying a
/// password.
fn url_host(text: &str) -> Option<String> {
    if text
        .chars()
        .any(|c| c == '\\' || c.is_whitespace() || c.is_control())
    {
        return None;
    }
    let url = url::Url::parse(text).ok()?;
    if url.password().is_some() {
        return None;
    }
    let host = url.host_str()?;
    Some(
        host.trim_start_matches('[')
            .trim_end_matches(']')
            .to_ascii_lowercase(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn relative_paths_resolve_inside_the_root_only() {
        assert_eq!(
            join_relative("overlays/prod", "../../base").as_deref(),
            Some("base")
        );
        assert_eq!(
            join_relative("a", "./b/../c.yaml").as_deref(),
            Some("a/c.yaml")
        );
        assert_eq!(join_relative("a", "../../x"), None);
        assert_eq!(join_relative("", "/etc/passwd"), None);
        assert_eq!(dir_of("a/b/k.yaml"), "a/b");
        assert_eq!(dir_of("k.yaml"), "");
    }

    #[test]
    fn a_renders_memory_fits_under_the_containers_limit() {
        // Issue 70: 512 MiB for a render in a 384Mi container: the OOM killer stopped helm.
        const MIB: u64 = 1024 * 1024;
        assert_eq!(default_max_memory_under(None), 512 * MIB);
        assert_eq!(default_max_memory_under(Some(384 * MIB)), 192 * MIB);
        assert_eq!(default_max_memory_under(Some(4096 * MIB)), 512 * MIB);
        assert_eq!(default_max_memory_under(Some(64 * MIB)), 64 * MIB);
    }
}
