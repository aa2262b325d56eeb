//! The layers of docs/development.md, checked on the source. What the compiler can check, it
//! does: the pure core (`api`, `plan`, `hash`, `text`, `sigv4`) is the crate `linnet-core`, which
//! cannot name the agent's modules, and this test checks that its dependencies hold no
//! Kubernetes client, Git or async runtime. The rest is read with a Rust parser
//! (`layers/imports.rs`): no import cycle between modules, imports that run down the layers
//! listed in docs/development.md, that list and the layout table complete, no file over
//! [`MAX_LINES`] lines of code nor [`MAX_FILE_LINES`] lines with its tests, no function over
//! [`MAX_FUNCTION_LINES`] lines, the processes wired by `agent.rs` only, and no function whose
//! error is a bare `String`.

#[path = "layers/imports.rs"]
mod imports;

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// The most lines a file may have before its tests (`#[cfg(test)]`); test files are exempt.
const MAX_LINES: usize = 500;

/// The most lines a whole file may have, its tests included, test files too: what a reader
/// opens to change one thing. Tests belong beside their code, but not so many that the code
/// is lost among them: past this, split by what is tested (issue 71).
const MAX_FILE_LINES: usize = 600;

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

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

/// Every `.rs` file of both crates.
fn all_sources() -> Vec<std::path::PathBuf> {
    let mut files = Vec::new();
    rust_files(&root().join("src"), &mut files);
    rust_files(&root().join("crates/core/src"), &mut files);
    files
}

#[test]
fn no_module_imports_a_module_that_imports_it_back() {
    let mut found = Vec::new();
    for (krate, src) in [("linnet", "src"), ("linnet-core", "crates/core/src")] {
        let graph = imports::read_crate(&root().join(src));
        let mut parents = graph.parents();
        parents.insert(Vec::new());
        for parent in parents {
            if let Some(cycle) = imports::find_cycle(&graph.children_edges(&parent)) {
                let prefix: String = parent.iter().map(|p| format!("{p}::")).collect();
                let cycle: Vec<String> = cycle.iter().map(|m| format!("{prefix}{m}")).collect();
                found.push(format!("{krate}: {}", cycle.join(" -> ")));
            }
        }
    }
    assert!(
        found.is_empty(),
        "import cycles (move what both need below both, or pass it in):\n{}",
        found.join("\n")
    );
}

/// The layers listed in docs/development.md's "Layers" section, lowest first: lines
/// `N. `a`, `b` ...`, each module named in backticks before the first ` - `.
fn documented_layers() -> Vec<BTreeSet<String>> {
    let doc = std::fs::read_to_string(root().join("docs/development.md")).unwrap_or_default();
    let section = doc
        .split("\n## Layers")
        .nth(1)
        .and_then(|s| s.split("\n## ").next())
        .unwrap_or_default();
    section
        .lines()
        .filter(|l| {
            l.split_once(". ")
                .is_some_and(|(n, _)| n.parse::<u32>().is_ok())
        })
        .map(|l| {
            let names = l.split(" - ").next().unwrap_or_default();
            names
                .split('`')
                .skip(1)
                .step_by(2)
                .map(str::to_string)
                .collect()
        })
        .collect()
}

#[test]
fn imports_run_down_the_documented_layers() {
    let layers = documented_layers();
    assert!(
        layers.len() > 3,
        "docs/development.md has no list of layers under \"## Layers\""
    );
    let layer_of: BTreeMap<&str, usize> = layers
        .iter()
        .enumerate()
        .flat_map(|(i, l)| l.iter().map(move |m| (m.as_str(), i)))
        .collect();
    let mut found = Vec::new();
    for src in ["src", "crates/core/src"] {
        let graph = imports::read_crate(&root().join(src));
        let top: BTreeSet<String> = graph
            .files
            .keys()
            .filter_map(|m| m.first().cloned())
            .collect();
        for module in &top {
            if !layer_of.contains_key(module.as_str()) {
                found.push(format!(
                    "{src}/{module} is in no layer of docs/development.md"
                ));
            }
        }
        for (from, to) in graph.children_edges(&[]) {
            for to in to {
                let (Some(a), Some(b)) = (layer_of.get(from.as_str()), layer_of.get(to.as_str()))
                else {
                    continue;
                };
                if b > a {
                    found.push(format!(
                        "{from} (layer {a}) imports {to} (layer {b}), a layer above it"
                    ));
                }
            }
        }
    }
    assert!(found.is_empty(), "{}", found.join("\n"));
}

#[test]
fn the_layout_table_names_every_module_and_file_it_lists() {
    let doc = std::fs::read_to_string(root().join("docs/development.md")).unwrap_or_default();
    let layout = doc
        .split("\n## Layout")
        .nth(1)
        .and_then(|s| s.split("\n## ").next())
        .unwrap_or_default();
    let mut found = Vec::new();
    // Every path the table names exists.
    for path in layout
        .split('`')
        .skip(1)
        .step_by(2)
        .filter(|p| p.starts_with("src/") || p.starts_with("crates/"))
    {
        if !root().join(path.trim_end_matches('/')).exists() {
            found.push(format!(
                "the layout table names {path}, which does not exist"
            ));
        }
    }
    // Every module of both crates is in it.
    for src in ["src", "crates/core/src"] {
        for entry in std::fs::read_dir(root().join(src))
            .into_iter()
            .flatten()
            .flatten()
        {
            let name = entry.file_name().to_string_lossy().into_owned();
            let path = if entry.path().is_dir() {
                format!("{src}/{name}/")
            } else {
                format!("{src}/{name}")
            };
            if name == "lib.rs"
                || name == "main.rs"
                || !(entry.path().is_dir() || name.ends_with(".rs"))
            {
                continue;
            }
            if entry.path().is_dir() && root().join(src).join(format!("{name}.rs")).exists() {
                continue;
            }
            if !layout.contains(&format!("`{path}`")) {
                found.push(format!("the layout table leaves out `{path}`"));
            }
        }
    }
    assert!(
        found.is_empty(),
        "docs/development.md: {}",
        found.join("\n")
    );
}

#[test]
fn the_core_crate_has_no_kubernetes_client_git_or_async_runtime() {
    let out = std::process::Command::new(env!("CARGO"))
        .args([
            "tree",
            "--offline",
            "-p",
            "linnet-core",
            "-e",
            "normal",
            "--prefix",
            "none",
            "--format",
            "{p}",
        ])
        .current_dir(root())
        .output()
        .unwrap_or_else(|e| panic!("cargo tree: {e}"));
    assert!(
        out.status.success(),
        "cargo tree: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let tree = String::from_utf8_lossy(&out.stdout);
    let crates: BTreeSet<&str> = tree
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .collect();
    assert!(crates.contains("kube-core"), "{tree}");
    for banned in [
        "tokio",
        "git2",
        "hyper",
        "reqwest",
        "kube-client",
        "kube-runtime",
        "tower",
        "axum",
    ] {
        assert!(
            !crates.contains(banned),
            "linnet-core depends on {banned}:\n{tree}"
        );
    }
}

/// The lines of `text` before its tests: up to a `#[cfg(test)]` at the start of a line that
/// is not on a `use` (a test-only import near the top does not start the tests).
fn code_lines(text: &str) -> usize {
    let lines: Vec<&str> = text.lines().collect();
    lines
        .iter()
        .enumerate()
        .position(|(i, l)| {
            l.starts_with("#[cfg(test)]")
                && !lines
                    .get(i + 1)
                    .is_some_and(|next| next.starts_with("use "))
        })
        .unwrap_or(lines.len())
}

#[test]
fn no_file_is_over_the_line_limit_before_its_tests() {
    let mut found = Vec::new();
    for file in all_sources() {
        let rel = file
            .strip_prefix(root())
            .unwrap_or(&file)
            .to_string_lossy()
            .into_owned();
        if rel.contains("/tests/") || rel.ends_with("/tests.rs") {
            continue;
        }
        let lines = code_lines(&std::fs::read_to_string(&file).unwrap_or_default());
        if lines > MAX_LINES {
            found.push(format!("{rel}: {lines} lines"));
        }
    }
    assert!(
        found.is_empty(),
        "split these by what they do (at most {MAX_LINES} lines before the tests):\n{}",
        found.join("\n")
    );
}

#[test]
fn no_whole_file_is_over_the_limit_tests_included() {
    let mut found = Vec::new();
    for file in all_sources() {
        let lines = std::fs::read_to_string(&file)
            .unwrap_or_default()
            .lines()
            .count();
        if lines > MAX_FILE_LINES {
            let rel = file
                .strip_prefix(root())
                .unwrap_or(&file)
                .display()
                .to_string();
            found.push(format!("{rel}: {lines} lines"));
        }
    }
    assert!(
        found.is_empty(),
        "split these by what they do or what they test (at most {MAX_FILE_LINES} lines, tests \
         included):\n{}",
        found.join("\n")
    );
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

/// Writes a file of a scratch crate.
fn scratch(root: &Path, file: &str, text: &str) {
    let path = root.join(file);
    std::fs::create_dir_all(path.parent().unwrap_or(root)).unwrap_or_default();
    std::fs::write(path, text).unwrap_or_else(|e| panic!("{file}: {e}"));
}

#[test]
fn the_import_reader_sees_every_form_text_matching_missed() {
    // Issue 46: the text matcher missed `use crate::sync;`, a module not first in a
    // `use crate::{...}` group, and `super::super::`.
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let src = dir.path();
    scratch(src, "lib.rs", "mod a;\nmod b;\nmod c;\nmod d;\n");
    scratch(src, "a.rs", "use crate::b;\n");
    scratch(src, "b.rs", "use crate::{d::Other, c::Thing};\n");
    scratch(src, "c/mod.rs", "mod inner;\npub struct Thing;\n");
    scratch(src, "c/inner.rs", "fn f() { super::super::d::g(); }\n");
    scratch(
        src,
        "d.rs",
        "pub struct Other;\npub fn g() { tracing::info!(\"{}\", crate::a::X); }\n",
    );
    let graph = imports::read_crate(src);
    let edges = graph.children_edges(&[]);
    let has = |a: &str, b: &str| edges.get(a).is_some_and(|t| t.contains(b));
    assert!(has("a", "b"), "use crate::b; {edges:?}");
    assert!(has("b", "c"), "second in a group: {edges:?}");
    assert!(has("b", "d"), "first in a group: {edges:?}");
    assert!(has("c", "d"), "super::super:: {edges:?}");
    assert!(has("d", "a"), "a path in a macro call: {edges:?}");
    let cycle = imports::find_cycle(&edges).unwrap_or_default();
    assert!(cycle.len() >= 3, "no cycle found in {edges:?}");
}

#[test]
fn a_test_only_import_near_the_top_does_not_hide_a_files_code() {
    let text = "use a;\n#[cfg(test)]\nuse b;\nfn f() {}\n#[cfg(test)]\nmod tests;\n";
    assert_eq!(code_lines(text), 4);
}

/// Regression (issue 71): `error.rs` and `net.rs` imported each other, one side inside an
/// `#[error(...)]` attribute, which the reader skipped.
#[test]
fn an_import_inside_an_attribute_counts() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("lib.rs"), "mod a;\nmod b;\n").unwrap();
    std::fs::write(
        dir.path().join("a.rs"),
        "#[derive(thiserror::Error, Debug)]\npub enum E {\n    #[error(\"{}\", crate::b::why(.0))]\n    X(String),\n}\n",
    )
    .unwrap();
    std::fs::write(
        dir.path().join("b.rs"),
        "pub fn why(s: &str) -> String { crate::a::E::X(s.into()).to_string() }\n",
    )
    .unwrap();
    let graph = imports::read_crate(dir.path());
    assert!(imports::find_cycle(&graph.children_edges(&[])).is_some());
}

/// docs/development.md's "Where is X decided" table (issue 71): every file it names exists and
/// holds the function named with it, so the table cannot drift from the code unseen.
#[test]
fn the_where_is_it_decided_table_names_real_places() {
    let doc = std::fs::read_to_string(root().join("docs/development.md")).unwrap_or_default();
    let section = doc
        .split("\n## Where is X decided")
        .nth(1)
        .and_then(|s| s.split("\n## ").next())
        .unwrap_or_default();
    let ticked = |cell: &str| cell.trim().trim_matches('`').to_string();
    let mut rows = 0;
    let mut wrong = Vec::new();
    for line in section.lines().filter(|l| l.starts_with("| ")) {
        let cells: Vec<&str> = line.split('|').collect();
        if cells.len() < 4 || !cells[2].contains('`') {
            continue;
        }
        rows += 1;
        let (path, function) = (ticked(cells[2]), ticked(cells[3]));
        match std::fs::read_to_string(root().join(&path)) {
            Err(e) => wrong.push(format!("{path}: {e}")),
            Ok(text) => {
                let defines = [format!("fn {function}("), format!("fn {function}<")]
                    .iter()
                    .any(|f| text.contains(f.as_str()));
                if !defines {
                    wrong.push(format!("{path} has no fn {function}"));
                }
            }
        }
    }
    assert!(rows >= 20, "the table has {rows} rows");
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

/// The longest a function may be, in lines from its signature to its closing brace; tests
/// are exempt. A reader names the parts of a longer one: split it there (issue 71).
const MAX_FUNCTION_LINES: usize = 80;

/// Functions allowed past [`MAX_FUNCTION_LINES`], each with why. Keep it short: a new entry
/// needs a reason a reviewer accepts, and splitting one takes it off.
const LONG_FUNCTIONS: &[(&str, &str)] = &[(
    "src/telemetry/metrics.rs::default",
    "registers every metric family, one statement each: a list, not steps",
)];

/// Every function of both crates over `limit` lines, outside `#[cfg(test)]` modules, as
/// `path::fn (N lines)`.
fn long_functions(limit: usize) -> Vec<(String, usize)> {
    use syn::visit::Visit;
    struct Finder<'a> {
        file: &'a str,
        limit: usize,
        found: Vec<(String, usize)>,
    }
    impl Finder<'_> {
        fn check(&mut self, name: &syn::Ident, block: &syn::Block) {
            let start = name.span().start().line;
            let end = block.brace_token.span.close().end().line;
            let lines = end.saturating_sub(start) + 1;
            if lines > self.limit {
                self.found.push((format!("{}::{name}", self.file), lines));
            }
        }
    }
    impl<'ast> Visit<'ast> for Finder<'_> {
        fn visit_item_mod(&mut self, m: &'ast syn::ItemMod) {
            let is_test = m.attrs.iter().any(|a| {
                a.path().is_ident("cfg") && a.parse_args::<syn::Ident>().is_ok_and(|i| i == "test")
            });
            if !is_test {
                syn::visit::visit_item_mod(self, m);
            }
        }
        fn visit_item_fn(&mut self, f: &'ast syn::ItemFn) {
            self.check(&f.sig.ident, &f.block);
            syn::visit::visit_item_fn(self, f);
        }
        fn visit_impl_item_fn(&mut self, f: &'ast syn::ImplItemFn) {
            self.check(&f.sig.ident, &f.block);
            syn::visit::visit_impl_item_fn(self, f);
        }
    }
    let mut found = Vec::new();
    for path in all_sources() {
        let rel = path
            .strip_prefix(root())
            .unwrap_or(&path)
            .display()
            .to_string();
        // A module's tests in their own file (`#[cfg(test)] mod tests;`) are tests too.
        if rel.ends_with("/tests.rs") || rel.contains("/tests/") {
            continue;
        }
        let text = std::fs::read_to_string(&path).unwrap_or_default();
        let Ok(parsed) = syn::parse_file(&text) else {
            continue;
        };
        let mut finder = Finder {
            file: &rel,
            limit,
            found: Vec::new(),
        };
        finder.visit_file(&parsed);
        found.extend(finder.found);
    }
    found.sort_by_key(|f| std::cmp::Reverse(f.1));
    found
}

#[test]
fn no_function_is_longer_than_the_limit() {
    let long = long_functions(MAX_FUNCTION_LINES);
    let too_long: Vec<String> = long
        .iter()
        .filter(|(name, _)| !LONG_FUNCTIONS.iter().any(|(allowed, _)| name == allowed))
        .map(|(name, lines)| format!("{name} ({lines} lines)"))
        .collect();
    assert!(
        too_long.is_empty(),
        "split these where a reader would name the parts (at most {MAX_FUNCTION_LINES} lines), or \
         allow one in LONG_FUNCTIONS with its reason:\n{}",
        too_long.join("\n")
    );
    let short_now: Vec<&str> = LONG_FUNCTIONS
        .iter()
        .map(|(name, _)| *name)
        .filter(|name| !long.iter().any(|(n, _)| n == name))
        .collect();
    assert!(
        short_now.is_empty(),
        "under the limit now (or gone): take these off LONG_FUNCTIONS:\n{}",
        short_now.join("\n")
    );
}

/// Fixed sleeps in the integration tests outside a loop, as `path:line`. A poll's pause
/// between tries sits in a loop; one on its own orders steps by the wall clock (wait for the
/// step's effect: `support::eventually`) or waits out a window in which nothing must happen
/// (`support::holds_for`, which looks all through it). Where time itself is the subject (a
/// fault outlasting a lease, a stretch whose events are counted), `support::let_time_pass`
/// says why, and is the one sleep allowed.
fn fixed_sleeps() -> Vec<String> {
    use syn::visit::Visit;
    struct Finder<'a> {
        file: &'a str,
        in_loop: usize,
        found: Vec<String>,
    }
    impl<'ast> Visit<'ast> for Finder<'_> {
        fn visit_expr_loop(&mut self, e: &'ast syn::ExprLoop) {
            self.in_loop += 1;
            syn::visit::visit_expr_loop(self, e);
            self.in_loop -= 1;
        }
        fn visit_expr_while(&mut self, e: &'ast syn::ExprWhile) {
            self.in_loop += 1;
            syn::visit::visit_expr_while(self, e);
            self.in_loop -= 1;
        }
        fn visit_expr_for_loop(&mut self, e: &'ast syn::ExprForLoop) {
            self.in_loop += 1;
            syn::visit::visit_expr_for_loop(self, e);
            self.in_loop -= 1;
        }
        fn visit_item_fn(&mut self, f: &'ast syn::ItemFn) {
            if f.sig.ident != "let_time_pass" {
                syn::visit::visit_item_fn(self, f);
            }
        }
        fn visit_expr_call(&mut self, c: &'ast syn::ExprCall) {
            if let syn::Expr::Path(p) = &*c.func {
                let last = p.path.segments.last().map(|s| s.ident.to_string());
                if last.as_deref() == Some("sleep") && self.in_loop == 0 {
                    let line = p.path.segments[0].ident.span().start().line;
                    self.found.push(format!("{}:{line}", self.file));
                }
            }
            syn::visit::visit_expr_call(self, c);
        }
    }
    let mut files = Vec::new();
    rust_files(&root().join("tests"), &mut files);
    let mut found = Vec::new();
    for path in files {
        let rel = path
            .strip_prefix(root())
            .unwrap_or(&path)
            .display()
            .to_string();
        let text = std::fs::read_to_string(&path).unwrap_or_default();
        let Ok(parsed) = syn::parse_file(&text) else {
            continue;
        };
        let mut finder = Finder {
            file: &rel,
            in_loop: 0,
            found: Vec::new(),
        };
        finder.visit_file(&parsed);
        found.extend(finder.found);
    }
    found.sort();
    found
}

#[test]
fn no_fixed_sleep_orders_the_steps_of_a_test() {
    let found = fixed_sleeps();
    assert!(
        found.is_empty(),
        "fixed sleeps: wait for the effect (support::eventually), check a window through \
         (support::holds_for), or say why time itself must pass (support::let_time_pass):\n{}",
        found.join("\n")
    );
}
