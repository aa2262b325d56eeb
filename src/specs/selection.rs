//! Which parts of a repository a source applies (`--path`, repeatable). The repository is
//! the boundary: a kustomization or chart may use any directory of it (Flux's
//! `apps/staging` over `../base`). The paths pick what is applied: the plain files below
//! them, and the units whose directory is at or below one of them. A directory a path names
//! exactly is a unit even when another kustomization uses it as a base (an Argo CD
//! `Application` pointed at a base).

use std::fmt;

/// The paths a source applies, normalized (`apps/staging`, no `./`, no trailing `/`); empty
/// for the whole repository.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PathSelection {
    paths: Vec<String>,
}

/// Why a `--path` cannot be taken.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("--path {given:?} leaves the repository: give a directory inside it, relative to its root")]
pub struct PathOutsideRepository {
    pub given: String,
}

impl PathSelection {
    /// The whole repository.
    pub fn whole() -> PathSelection {
        PathSelection::default()
    }

    /// The selection of `values` (each `--path`; `.` or `/` is the whole repository). A path
    /// below another one given adds nothing and is dropped.
    pub fn new<S: AsRef<str>>(values: &[S]) -> Result<PathSelection, PathOutsideRepository> {
        let mut paths = Vec::new();
        for value in values {
            let mut parts = Vec::new();
            for part in value.as_ref().split('/') {
                match part {
                    "" | "." => {}
                    ".." => {
                        return Err(PathOutsideRepository {
                            given: value.as_ref().to_string(),
                        });
                    }
                    p => parts.push(p),
                }
            }
            if parts.is_empty() {
                return Ok(PathSelection::whole());
            }
            paths.push(parts.join("/"));
        }
        paths.sort();
        paths.dedup();
        let all = paths.clone();
        paths.retain(|p| !all.iter().any(|q| q != p && below(p, q)));
        Ok(PathSelection { paths })
    }

    /// Whether this is the whole repository.
    pub fn is_whole(&self) -> bool {
        self.paths.is_empty()
    }

    /// The paths, normalized (none: the whole repository).
    pub fn paths(&self) -> &[String] {
        &self.paths
    }

    /// Whether the file or directory `path` (repository-relative) is at or below a selected
    /// path.
    pub fn selects(&self, path: &str) -> bool {
        self.root_of(path).is_some()
    }

    /// The selected path `path` is at or below (`""` for the whole repository).
    pub fn root_of(&self, path: &str) -> Option<&str> {
        if self.is_whole() {
            return Some("");
        }
        let path = path.trim_end_matches('/');
        self.paths
            .iter()
            .find(|p| below(path, p))
            .map(String::as_str)
    }

    /// Whether a selected path is exactly the directory `dir`.
    pub fn names(&self, dir: &str) -> bool {
        self.paths.iter().any(|p| p == dir)
    }

    /// Whether `dir` holds a selected path below it (a blocked directory that does, blocks
    /// what was selected).
    pub fn is_above_one(&self, dir: &str) -> bool {
        let dir = dir.trim_end_matches('/');
        self.paths.iter().any(|p| below(p, dir))
    }

    /// The selected paths that none of `files` (repository-relative) is at or below: a wrong
    /// or emptied `--path`, which must not prune what it applied.
    pub fn holding_nothing<'a>(&self, files: impl IntoIterator<Item = &'a str>) -> Vec<String> {
        let mut empty: Vec<&String> = self.paths.iter().collect();
        for file in files {
            empty.retain(|p| !below(file, p));
            if empty.is_empty() {
                break;
            }
        }
        empty.into_iter().cloned().collect()
    }
}

/// Whether `path` is `dir` or below it (`dir` `""`: the root).
fn below(path: &str, dir: &str) -> bool {
    dir.is_empty()
        || path == dir
        || (path.len() > dir.len() && path.starts_with(dir) && path.as_bytes()[dir.len()] == b'/')
}

impl fmt::Display for PathSelection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.is_whole() {
            return f.write_str(".");
        }
        f.write_str(&self.paths.join(","))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dots_slashes_and_the_root_are_normalized() {
        let s = PathSelection::new(&["./apps/staging/", "apps//production"]).unwrap();
        assert_eq!(s.paths(), ["apps/production", "apps/staging"]);
        assert!(PathSelection::new(&["."]).unwrap().is_whole());
        assert!(PathSelection::new(&["apps", "/"]).unwrap().is_whole());
        assert!(PathSelection::new::<&str>(&[]).unwrap().is_whole());
        assert_eq!(PathSelection::new(&["/apps"]).unwrap().paths(), ["apps"]);
    }

    #[test]
    fn a_path_that_climbs_out_of_the_repository_is_refused() {
        for bad in ["..", "apps/../..", "apps/../x", "../other"] {
            let e = PathSelection::new(&[bad]).unwrap_err();
            assert!(e.to_string().contains("leaves the repository"), "{e}");
        }
    }

    #[test]
    fn a_path_below_another_adds_nothing() {
        let s = PathSelection::new(&["apps/staging/web", "apps", "apps"]).unwrap();
        assert_eq!(s.paths(), ["apps"]);
    }

    #[test]
    fn selects_files_at_and_below_a_path_not_beside_it() {
        let s = PathSelection::new(&["apps/staging"]).unwrap();
        assert!(s.selects("apps/staging"));
        assert!(s.selects("apps/staging/web.yaml"));
        assert!(s.selects("apps/staging/"));
        assert!(!s.selects("apps/staging-eu/web.yaml"));
        assert!(!s.selects("apps/base/web.yaml"));
        assert!(!s.selects("apps"));
        assert!(s.is_above_one("apps/"));
        assert!(!s.is_above_one("apps/base/"));
        assert!(s.names("apps/staging"));
        assert!(!s.names("apps/staging/web"));
        assert!(PathSelection::whole().selects("anything/at/all.yaml"));
    }

    #[test]
    fn each_path_without_a_file_is_named() {
        let s = PathSelection::new(&["apps/staging", "apps/prod"]).unwrap();
        let files = ["apps/staging/kustomization.yaml", "apps/base/x.yaml"];
        assert_eq!(s.holding_nothing(files), ["apps/prod"]);
        assert!(PathSelection::whole().holding_nothing([]).is_empty());
        assert_eq!(s.to_string(), "apps/prod,apps/staging");
    }
}
