//! Running a renderer on hostile input: in a directory of its own, with a clean environment
//! (no `PATH` to `git` or plugins, no network unless a host is allowed), and within a time,
//! memory and output limit. A render that passes one is stopped and says which.

use std::ffi::OsString;
use std::io::Read as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use wait_timeout::ChildExt as _;

use super::RenderOptions;

/// A directory a render's inputs are written to, removed when dropped.
#[derive(Debug)]
pub(super) struct WorkDir {
    path: PathBuf,
}

impl WorkDir {
    pub(super) fn new(under: &Path) -> std::io::Result<WorkDir> {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        static SWEPT: std::sync::Once = std::sync::Once::new();
        SWEPT.call_once(|| remove_orphans(under));
        let path = under.join(format!(
            "linnet-render-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&path);
        std::fs::create_dir_all(path.join("home"))?;
        std::fs::create_dir_all(path.join("in"))?;
        Ok(WorkDir { path })
    }

    /// Where the unit's files go, at their repository paths.
    pub(super) fn inputs(&self) -> PathBuf {
        self.path.join("in")
    }

    /// Writes one input file at its repository path below [`WorkDir::inputs`].
    pub(super) fn write(&self, rel: &str, bytes: &[u8]) -> std::io::Result<()> {
        let to = self.inputs().join(rel);
        if let Some(parent) = to.parent() {
            std::fs::create_dir_all(parent)?;
        }
        std::fs::write(to, bytes)
    }

    pub(super) fn home(&self) -> PathBuf {
        self.path.join("home")
    }
}

/// Removes the directories of renders whose process is gone (killed mid-render): a pod's
/// `/tmp` outlives its container's restarts. Run once, before this process renders.
fn remove_orphans(under: &Path) {
    let Ok(entries) = std::fs::read_dir(under) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(pid) = name
            .strip_prefix("linnet-render-")
            .and_then(|rest| rest.split('-').next())
            .and_then(|pid| pid.parse::<u32>().ok())
        else {
            continue;
        };
        // This process has made none yet: one with its pid is a former container's (a
        // container's pids start again at 1).
        let alive = Path::new("/proc").join(pid.to_string()).exists();
        if pid == std::process::id() || !alive {
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
}

impl Drop for WorkDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.path);
    }
}

/// Why a render gave no output.
#[derive(Debug, thiserror::Error)]
pub(super) enum RunFailure {
    #[error(
        "cannot run {program}: {why}; linnet's image ships kustomize and helm, and `make \
         install` puts them beside linnet (in ../lib/linnet); elsewhere install them or name \
         them with --kustomize and --helm"
    )]
    Spawn { program: String, why: String },
    #[error("it ran longer than the {0:?} a render may take (--render-timeout) and was stopped")]
    Timeout(Duration),
    #[error(
        "it printed more than the {0} bytes a render may give (--render-max-bytes) and was stopped"
    )]
    OutputOver(usize),
    #[error(
        "it ran out of the {0} bytes of memory a render may use (--render-max-memory) and was stopped"
    )]
    Memory(u64),
    /// SIGKILL from no one in linnet: the kernel's OOM killer, most likely the container's
    /// cgroup (issue 70: helm's limit was above the container's, and the render said "it
    /// printed no reason").
    #[error(
        "it was killed (SIGKILL) before it finished: most likely the container ran out of \
         memory and the kernel stopped the render. Give --render-max-memory a value under the \
         container's memory limit (it is {0} bytes now), or raise the limit"
    )]
    Killed(u64),
    #[error("{0}")]
    Failed(String),
}

/// What a render prints at most to stderr that is kept for its error.
const MAX_STDERR: usize = 16 * 1024;

/// Runs `program args` in `dir` within `limits`; its stdout, or why not. `network` lets it
/// use the agent's proxy settings and `PATH` (a host was allowed); otherwise any HTTP goes
/// to a closed local port and nothing but the program itself can run.
pub(super) fn run_bounded(
    program: &Path,
    args: &[OsString],
    dir: &Path,
    home: &Path,
    network: bool,
    limits: &RenderOptions,
) -> Result<Vec<u8>, RunFailure> {
    // Found in the agent's PATH: the child's own PATH leads nowhere.
    let program = &resolve_program(program);
    let mut cmd = Command::new(program);
    cmd.args(args)
        .current_dir(dir)
        .env_clear()
        // A pipe closed at once, not /dev/null, which a bare filesystem may not have.
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    confine_environment(&mut cmd, home, network, limits);
    limit_memory(&mut cmd, limits.max_memory_bytes);
    let mut child = cmd.spawn().map_err(|e| RunFailure::Spawn {
        program: program.display().to_string(),
        why: crate::error::io_reason(&e),
    })?;
    drop(child.stdin.take());
    let max_out = limits.max_output_bytes;
    let out_reader = read_bounded_stdout(child.stdout.take(), max_out);
    let err_reader = read_bounded_stderr(child.stderr.take());
    // A render that fetches has the Git timeout for its download on top of its own.
    let timeout = if network {
        limits.timeout + limits.fetch_timeout
    } else {
        limits.timeout
    };
    let status = match child.wait_timeout(timeout) {
        Ok(Some(status)) => Some(status),
        Ok(None) | Err(_) => {
            let _ = child.kill();
            let _ = child.wait();
            None
        }
    };
    let (out, over) = out_reader.join().unwrap_or_default();
    let err = err_reader.join().unwrap_or_default();
    let Some(status) = status else {
        return Err(RunFailure::Timeout(timeout));
    };
    if over {
        return Err(RunFailure::OutputOver(max_out));
    }
    let err = String::from_utf8_lossy(&err);
    if std::os::unix::process::ExitStatusExt::signal(&status) == Some(libc::SIGKILL) {
        return Err(RunFailure::Killed(limits.max_memory_bytes));
    }
    if !status.success() {
        if err.contains("out of memory")
            || err.contains("cannot allocate memory")
            || err.contains("failed to reserve")
        {
            return Err(RunFailure::Memory(limits.max_memory_bytes));
        }
        return Err(RunFailure::Failed(err.trim().to_string()));
    }
    Ok(out)
}

/// The tool's environment: its own home and caches, no plugins, a Go memory limit below the
/// kernel's, and without `network` no PATH and proxies that refuse every request.
fn confine_environment(cmd: &mut Command, home: &Path, network: bool, limits: &RenderOptions) {
    let home_dir = |sub: &str| home.join(sub);
    cmd.env("HOME", home)
        .env("XDG_CACHE_HOME", home_dir("cache"))
        .env("XDG_CONFIG_HOME", home_dir("config"))
        .env("XDG_DATA_HOME", home_dir("data"))
        .env("HELM_CACHE_HOME", home_dir("cache/helm"))
        .env("HELM_CONFIG_HOME", home_dir("config/helm"))
        .env("HELM_DATA_HOME", home_dir("data/helm"))
        .env("HELM_PLUGINS", home_dir("no-plugins"))
        .env("KUSTOMIZE_PLUGIN_HOME", home_dir("no-plugins"))
        // The Go runtime collects harder as it nears the limit, before the kernel says no.
        .env("GOMEMLIMIT", format!("{}", limits.max_memory_bytes / 4 * 3));
    if !network {
        // Port 9 (discard) is closed: every HTTP request a tool tries fails at once.
        cmd.env("PATH", "/nonexistent")
            .env("HTTP_PROXY", "http://127.0.0.1:9")
            .env("HTTPS_PROXY", "http://127.0.0.1:9")
            .env("ALL_PROXY", "http://127.0.0.1:9")
            .env("NO_PROXY", "");
        return;
    }
    for var in [
        "PATH",
        "HTTP_PROXY",
        "HTTPS_PROXY",
        "NO_PROXY",
        "http_proxy",
        "https_proxy",
        "no_proxy",
        "SSL_CERT_FILE",
        "SSL_CERT_DIR",
    ] {
        if let Some(v) = std::env::var_os(var) {
            cmd.env(var, v);
        }
    }
}

/// Reads the tool's output up to `max_out` bytes; whether it went past them. One byte past
/// the limit says it was passed; dropping the pipe then stops the tool (a Go program exits on
/// a write to a closed stdout).
fn read_bounded_stdout(
    stdout: Option<std::process::ChildStdout>,
    max_out: usize,
) -> std::thread::JoinHandle<(Vec<u8>, bool)> {
    std::thread::spawn(move || {
        let Some(stdout) = stdout else {
            return (Vec::new(), false);
        };
        let mut out = Vec::new();
        let _ = stdout.take(max_out as u64 + 1).read_to_end(&mut out);
        let over = out.len() > max_out;
        (out, over)
    })
}

/// Reads the tool's stderr to its end, keeping the first [`MAX_STDERR`] bytes.
fn read_bounded_stderr(
    stderr: Option<std::process::ChildStderr>,
) -> std::thread::JoinHandle<Vec<u8>> {
    std::thread::spawn(move || {
        let Some(mut stderr) = stderr else {
            return Vec::new();
        };
        let mut kept = Vec::new();
        let mut buf = [0u8; 8192];
        while let Ok(n) = stderr.read(&mut buf) {
            if n == 0 {
                break;
            }
            let room = MAX_STDERR.saturating_sub(kept.len());
            kept.extend_from_slice(&buf[..n.min(room)]);
        }
        kept
    })
}

/// `program` as a path: a bare name is looked up in the agent's `PATH`; a name not found
/// there is left as it is, and the spawn says so.
fn resolve_program(program: &Path) -> PathBuf {
    if program.components().count() != 1 {
        return program.to_path_buf();
    }
    std::env::var_os("PATH")
        .iter()
        .flat_map(std::env::split_paths)
        .map(|dir| dir.join(program))
        .find(|candidate| candidate.is_file())
        .unwrap_or_else(|| program.to_path_buf())
}

/// A tool's stderr as one line for an error: its lines joined, `Error: ` taken off, and the
/// render directory taken out of paths, so that they read as repository paths.
pub(super) fn tool_message(stderr: &str, work_dir: &Path) -> String {
    let work_dir = work_dir.display().to_string();
    let text = stderr
        .lines()
        .filter(|l| !l.trim().is_empty())
        .collect::<Vec<_>>()
        .join("; ")
        .replace(&format!("{work_dir}/"), "")
        .replace(&work_dir, ".");
    match text.strip_prefix("Error: ") {
        Some(rest) => rest.to_string(),
        None if text.is_empty() => "it printed no reason".into(),
        None => text,
    }
}

/// The memory limit of this process's cgroup (v2 `memory.max`, else v1's
/// `memory.limit_in_bytes`), if it has one.
pub(crate) fn cgroup_memory_limit() -> Option<u64> {
    let read = |path: &str| std::fs::read_to_string(path).ok();
    let text = read("/sys/fs/cgroup/memory.max")
        .or_else(|| read("/sys/fs/cgroup/memory/memory.limit_in_bytes"))?;
    let bytes: u64 = text.trim().parse().ok()?;
    // v1 says "no limit" with a number near 2^63.
    (bytes < 1 << 60).then_some(bytes)
}

/// Caps the child's data segment: the Go runtime's heap lives there, while its address space
/// reservations (which `RLIMIT_AS` would refuse at start) do not count.
#[allow(unsafe_code)]
fn limit_memory(cmd: &mut Command, bytes: u64) {
    use std::os::unix::process::CommandExt as _;
    let limit = libc::rlimit {
        rlim_cur: bytes as libc::rlim_t,
        rlim_max: bytes as libc::rlim_t,
    };
    // SAFETY: runs in the forked child before exec and calls only setrlimit, which is
    // async-signal-safe; `limit` is a plain copy.
    unsafe {
        cmd.pre_exec(move || {
            if libc::setrlimit(libc::RLIMIT_DATA, &limit) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
}
