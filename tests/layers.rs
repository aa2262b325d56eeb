//! The layers of DESIGN.md, checked on the source: `plan/` makes decisions from what it is
//! given and imports nothing from the modules that do I/O or wire processes.

use std::path::Path;

/// The modules `plan/` may not use: they talk to Git, the cluster or the network, or run
/// processes.
const ABOVE_PLAN: &[&str] = &[
    "sync",
    "source",
    "writeback",
    "controller",
    "agent",
    "inspect",
    "cli",
    "serve",
    "kube_client",
    "net",
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
