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
