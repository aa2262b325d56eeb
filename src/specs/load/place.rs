//! Where a document's errors point, and what loading one document gives: shared by the
//! loader of applied kinds ([`super::document`]) and of the kinds read from Git
//! ([`super::read_from_git`]).

use super::*;

/// What one document gives.
pub(super) enum Loaded {
    Object(LoadedObject),
    /// An empty document.
    Nothing,
    /// A document left out on purpose, and why (at its start).
    LeftOut(SpecError),
}

/// Where a document's errors point: its first line, or a key in it.
pub(super) struct Place<'a> {
    pub(super) file: &'a str,
    pub(super) doc: &'a Document,
}

impl Place<'_> {
    pub(super) fn start(&self, message: String) -> SpecError {
        error_at(self.file, self.doc.first_line, 1, message)
    }

    /// At the key, or, when the locator cannot see it (a flow mapping: `strategy: {a: b}`),
    /// at its nearest ancestor it can.
    pub(super) fn key(&self, path: &[&str], message: String) -> SpecError {
        let found = (1..=path.len())
            .rev()
            .find_map(|n| find_key(&self.doc.text, &path[..n]));
        match found {
            Some((line, column)) => {
                error_at(self.file, self.doc.first_line + line - 1, column, message)
            }
            None => self.start(message),
        }
    }
}
