//! The layers of DESIGN.md, checked on the source: `plan/` makes decisions from what it is
//! given and imports nothing from the modules that do I/O or wire processes; the processes
//! live in `runtime/`, wired by `agent.rs` only; and no function's error is a bare `String`.

use std::path::Path;

/// The modules `plan/` may not use: they talk to Git, the cluster or the network, or run
/// processes.
const ABOVE_PLAN: &[&str] = &[
    "sync",
    "source",
    "writeback",
    "controller",
    "agent",
    "runtime",
    "inspect",
    "cli",
    "serve",
    "kube_client",
    "net",
    "events",
];

fn rust_files(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
        let path = entry.map(|e| e.path()).unwrap_or_default();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|x| x == "rs") {
            out.push(path);
        }
    }
}

#[test]
fn plan_imports_nothing_from_the_layers_above_it() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/plan");
    let mut files = vec![root.with_extension("rs")];
    files.retain(|f| f.exists());
    rust_files(&root, &mut files);
    let mut found = Vec::new();
    for file in &files {
        let text = std::fs::read_to_string(file).unwrap_or_default();
        for (n, line) in text.lines().enumerate() {
            let code = line.split("//").next().unwrap_or_default();
            for module in ABOVE_PLAN {
                if code.contains(&format!("crate::{module}::"))
                    || code.contains(&format!("crate::{module}}}"))
                    || code.contains(&format!("crate::{{{module}"))
                    || code.contains(&format!("linnet::{module}::"))
                {
                    found.push(format!("{}:{}: {}", file.display(), n + 1, line.trim()));
                }
            }
        }
    }
    assert!(
        found.is_empty(),
        "plan/ must stay pure; move what it shares with these modules below both (as \
         src/hash.rs):\n{}",
        found.join("\n")
    );
}

/// Every `.rs` file under `src/`.
fn all_sources() -> Vec<std::path::PathBuf> {
    let mut files = Vec::new();
    rust_files(
        &Path::new(env!("CARGO_MANIFEST_DIR")).join("src"),
        &mut files,
    );
    files
}

#[test]
fn only_the_agent_wires_the_runtime_tasks() {
    // The stores of rollouts are shared by their consumers; the tasks themselves (the source
    // loop, the listeners, the lease) are started in one place.
    let mut found = Vec::new();
    for file in all_sources() {
        let rel = file.to_string_lossy().into_owned();
        if rel.contains("/src/runtime") || rel.ends_with("/src/agent.rs") {
            continue;
        }
        let text = std::fs::read_to_string(&file).unwrap_or_default();
        for (n, line) in text.lines().enumerate() {
            let code = line.split("//").next().unwrap_or_default();
            for task in ["source_loop", "listeners", "lease", "look"] {
                if code.contains(&format!("runtime::{task}")) {
                    found.push(format!("{rel}:{}: {}", n + 1, line.trim()));
                }
            }
        }
    }
    assert!(
        found.is_empty(),
        "only src/agent.rs starts the runtime's tasks:\n{}",
        found.join("\n")
    );
}

#[test]
fn no_function_returns_a_bare_string_error() {
    // A typed error carries its context and a stable metric label; a String carries neither.
    let mut found = Vec::new();
    for file in all_sources() {
        let text = std::fs::read_to_string(&file).unwrap_or_default();
        for (n, line) in text.lines().enumerate() {
            let code = line.split("//").next().unwrap_or_default();
            let bare = code
                .match_indices("Result<")
                .any(|(at, _)| error_type(&code[at + 7..]) == Some("String"));
            if bare && !file.to_string_lossy().contains("/tests") {
                found.push(format!("{}:{}: {}", file.display(), n + 1, line.trim()));
            }
        }
    }
    assert!(
        found.is_empty(),
        "give these an error type (thiserror) instead of String:\n{}",
        found.join("\n")
    );
}

/// The error type of a `Result<T, E>` whose text follows `Result<`: `E` when there are two
/// arguments at the top level.
fn error_type(after: &str) -> Option<&str> {
    let (mut depth, mut comma) = (0usize, None);
    for (i, c) in after.char_indices() {
        match c {
            '<' | '(' | '[' => depth += 1,
            '>' | ')' | ']' if depth > 0 => depth -= 1,
            '>' => return comma.map(|at: usize| after[at + 1..i].trim()),
            ',' if depth == 0 => comma = Some(i),
            _ => {}
        }
    }
    None
}
