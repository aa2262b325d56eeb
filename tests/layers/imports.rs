//! The module graph, read with a real Rust parser (syn): every `use` tree (grouped, nested,
//! `self`, `super::super::`), every path in code and types, and paths inside macro calls
//! (`format!`, `tracing::info!`), resolved to the module they name. Text matching missed
//! `use crate::sync;`, a module not first in a group, and `super::super::` (issue 46).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use proc_macro2::{TokenStream, TokenTree};
use syn::visit::Visit;

/// A crate's modules and the imports between them.
pub struct Graph {
    /// Module path (`["runtime", "look"]`) -> the module paths it names.
    pub imports: BTreeMap<Vec<String>, BTreeSet<Vec<String>>>,
    /// Module path -> the file that holds it.
    pub files: BTreeMap<Vec<String>, PathBuf>,
}

/// Reads every `.rs` file of the crate whose `lib.rs` is in `src` (tests at the bottom of a
/// file count: they are compiled into the same module).
pub fn read_crate(src: &Path) -> Graph {
    let mut graph = Graph {
        imports: BTreeMap::new(),
        files: BTreeMap::new(),
    };
    let mut files = Vec::new();
    rust_files(src, &mut files);
    for file in files {
        let rel = file.strip_prefix(src).unwrap_or(&file);
        let mut module: Vec<String> = rel
            .with_extension("")
            .components()
            .map(|c| c.as_os_str().to_string_lossy().into_owned())
            .collect();
        if module.last().is_some_and(|m| m == "mod") {
            module.pop();
        }
        if module == ["lib"] || module == ["main"] {
            module.clear();
        }
        let text = std::fs::read_to_string(&file).unwrap_or_default();
        let parsed = syn::parse_file(&text)
            .unwrap_or_else(|e| panic!("{}: cannot parse: {e}", file.display()));
        graph.files.insert(module.clone(), file.clone());
        let mut reader = Reader {
            module: module.clone(),
            found: BTreeMap::new(),
        };
        reader.visit_file(&parsed);
        for (from, to) in reader.found {
            graph.imports.entry(from).or_default().extend(to);
        }
    }
    graph
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
        let path = entry.map(|e| e.path()).unwrap_or_default();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|x| x == "rs") {
            out.push(path);
        }
    }
}

struct Reader {
    /// The module being read (inline `mod x { }` blocks extend it).
    module: Vec<String>,
    found: BTreeMap<Vec<String>, BTreeSet<Vec<String>>>,
}

impl Reader {
    /// Records `segments` (a path as written) from the current module.
    fn path(&mut self, segments: &[String]) {
        let Some(first) = segments.first() else {
            return;
        };
        let target = match first.as_str() {
            "crate" => segments[1..].to_vec(),
            "self" | "super" => {
                let mut base = self.module.clone();
                let mut rest = segments;
                while let Some(s) = rest.first() {
                    match s.as_str() {
                        "self" => {}
                        "super" => {
                            base.pop();
                        }
                        _ => break,
                    }
                    rest = &rest[1..];
                }
                base.extend(rest.iter().cloned());
                base
            }
            _ => return,
        };
        self.found
            .entry(self.module.clone())
            .or_default()
            .insert(target);
    }

    fn use_tree(&mut self, prefix: &mut Vec<String>, tree: &syn::UseTree) {
        match tree {
            syn::UseTree::Path(p) => {
                prefix.push(p.ident.to_string());
                self.use_tree(prefix, &p.tree);
                prefix.pop();
            }
            syn::UseTree::Name(n) => {
                let mut whole = prefix.clone();
                if n.ident != "self" {
                    whole.push(n.ident.to_string());
                }
                self.path(&whole);
            }
            syn::UseTree::Rename(r) => {
                let mut whole = prefix.clone();
                if r.ident != "self" {
                    whole.push(r.ident.to_string());
                }
                self.path(&whole);
            }
            syn::UseTree::Glob(_) => {
                let whole = prefix.clone();
                self.path(&whole);
            }
            syn::UseTree::Group(g) => {
                for t in &g.items {
                    self.use_tree(prefix, t);
                }
            }
        }
    }

    /// Paths written inside a macro call: `crate`, `self` or `super`, then `::` and names.
    fn tokens(&mut self, tokens: TokenStream) {
        let tokens: Vec<TokenTree> = tokens.into_iter().collect();
        let mut i = 0;
        while i < tokens.len() {
            match &tokens[i] {
                TokenTree::Group(g) => self.tokens(g.stream()),
                TokenTree::Ident(id) if ["crate", "self", "super"].contains(&&*id.to_string()) => {
                    let mut segments = vec![id.to_string()];
                    let mut j = i + 1;
                    loop {
                        let colons = matches!((&tokens.get(j), &tokens.get(j + 1)),
                            (Some(TokenTree::Punct(a)), Some(TokenTree::Punct(b)))
                                if a.as_char() == ':' && b.as_char() == ':');
                        match (colons, tokens.get(j + 2)) {
                            (true, Some(TokenTree::Ident(next))) => {
                                segments.push(next.to_string());
                                j += 3;
                            }
                            _ => break,
                        }
                    }
                    if segments.len() > 1 {
                        self.path(&segments);
                    }
                    i = j.max(i + 1);
                    continue;
                }
                _ => {}
            }
            i += 1;
        }
    }
}

impl<'ast> Visit<'ast> for Reader {
    fn visit_item_use(&mut self, u: &'ast syn::ItemUse) {
        self.use_tree(&mut Vec::new(), &u.tree);
    }

    fn visit_item_mod(&mut self, m: &'ast syn::ItemMod) {
        if m.content.is_some() {
            self.module.push(m.ident.to_string());
            syn::visit::visit_item_mod(self, m);
            self.module.pop();
        }
    }

    fn visit_path(&mut self, p: &'ast syn::Path) {
        let segments: Vec<String> = p.segments.iter().map(|s| s.ident.to_string()).collect();
        self.path(&segments);
        syn::visit::visit_path(self, p);
    }

    fn visit_macro(&mut self, m: &'ast syn::Macro) {
        self.tokens(m.tokens.clone());
        syn::visit::visit_macro(self, m);
    }

    fn visit_attribute(&mut self, a: &'ast syn::Attribute) {
        // Doc links (`[`crate::x`]`) are not imports; paths inside any other attribute are
        // (issue 71: `#[error("…", crate::error::io_reason(.source))]` hid a cycle).
        if !a.path().is_ident("doc") {
            if let syn::Meta::List(list) = &a.meta {
                self.tokens(list.tokens.clone());
            }
            syn::visit::visit_attribute(self, a);
        }
    }
}

impl Graph {
    /// Edges between the children of `parent` (`[]` for the crate's top-level modules): `a`
    /// imports `b` when something in `a` names something in `b`.
    pub fn children_edges(&self, parent: &[String]) -> BTreeMap<String, BTreeSet<String>> {
        let mut edges: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        for (from, targets) in &self.imports {
            if from.len() <= parent.len() || !from.starts_with(parent) {
                continue;
            }
            let a = &from[parent.len()];
            for to in targets {
                if to.len() <= parent.len() || !to.starts_with(parent) {
                    continue;
                }
                let b = &to[parent.len()];
                // Only names of modules that exist: `super::Thing` from a child names an item
                // of the parent, not a sibling.
                let mut sibling = parent.to_vec();
                sibling.push(b.clone());
                if b != a && self.files.contains_key(&sibling) {
                    edges.entry(a.clone()).or_default().insert(b.clone());
                }
            }
        }
        edges
    }

    /// Every module that has children.
    pub fn parents(&self) -> BTreeSet<Vec<String>> {
        self.files
            .keys()
            .filter(|m| !m.is_empty())
            .map(|m| m[..m.len() - 1].to_vec())
            .collect()
    }
}

/// A cycle in `edges`, as the list of its nodes, if there is one.
pub fn find_cycle(edges: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    #[derive(Clone, Copy, PartialEq)]
    enum Mark {
        Open,
        Done,
    }
    fn walk(
        n: &str,
        edges: &BTreeMap<String, BTreeSet<String>>,
        marks: &mut BTreeMap<String, Mark>,
        stack: &mut Vec<String>,
    ) -> Option<Vec<String>> {
        marks.insert(n.to_string(), Mark::Open);
        stack.push(n.to_string());
        for next in edges.get(n).into_iter().flatten() {
            match marks.get(next) {
                Some(Mark::Open) => {
                    let at = stack.iter().position(|s| s == next).unwrap_or(0);
                    let mut cycle = stack[at..].to_vec();
                    cycle.push(next.clone());
                    return Some(cycle);
                }
                Some(Mark::Done) => {}
                None => {
                    if let Some(c) = walk(next, edges, marks, stack) {
                        return Some(c);
                    }
                }
            }
        }
        stack.pop();
        marks.insert(n.to_string(), Mark::Done);
        None
    }
    let mut marks = BTreeMap::new();
    for n in edges.keys() {
        if !marks.contains_key(n)
            && let Some(c) = walk(n, edges, &mut marks, &mut Vec::new())
        {
            return Some(c);
        }
    }
    None
}
