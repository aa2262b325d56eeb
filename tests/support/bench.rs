//! What `make bench` and `make chaos` share around their runs: settings from the environment
//! and a line of a command's output for their results' headers.

use std::process::Command;

/// The environment variable `name` parsed, or `default` when unset or unparsable.
pub fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// What `cmd args` prints, trimmed; empty when it cannot run.
pub fn sh(cmd: &str, args: &[&str]) -> String {
    Command::new(cmd)
        .args(args)
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default()
}

/// Where spec file `i` of a bench's repository is: `apps/r-<i>.yaml`, or with `per_dir` > 0,
/// `apps/<i / per_dir>/r-<i>.yaml` (a repository that spreads its specs over directories, by
/// team or namespace). `r-<i>` is also the rollout's name.
pub fn spec_file(i: usize, per_dir: usize) -> String {
    match per_dir {
        0 => format!("apps/r-{i:04}.yaml"),
        k => format!("apps/{:03}/r-{i:04}.yaml", i / k),
    }
}

/// Puts `section` (with its `<!-- bench:begin … -->` and `<!-- bench:end -->` markers) in the
/// results file at `path` in place of the one there, keeping the notes around it; a file
/// without the markers becomes `# <title>` and the section.
pub fn write_section(path: &str, title: &str, section: &str) {
    write_marked(path, title, "bench", section);
}

/// [`write_section`] between `<!-- {marker}:begin` and `<!-- {marker}:end -->` (which
/// `section` carries); a file without them gets the section appended.
pub fn write_marked(path: &str, title: &str, marker: &str, section: &str) {
    let old = std::fs::read_to_string(path).unwrap_or_default();
    let (begin, end) = (
        format!("<!-- {marker}:begin"),
        format!("<!-- {marker}:end -->"),
    );
    let new = match (old.find(&begin), old.find(&end)) {
        (Some(a), Some(b)) if a < b => {
            format!("{}{section}{}", &old[..a], &old[b + end.len()..])
        }
        _ if marker != "bench" && !old.is_empty() => format!("{}\n\n{section}\n", old.trim_end()),
        _ => format!("# {title}\n\n{section}\n"),
    };
    std::fs::write(path, new).expect("write the results");
    eprintln!("bench: wrote {path}");
}
