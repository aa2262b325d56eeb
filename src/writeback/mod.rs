//! Write-back: the only module that writes to Git. It commits rollout status files and posts
//! commit statuses to the Git host, never force-pushes, and never loses a human's commit.
//!
//! - [`status_files`]: the files and commit messages (pure);
//! - [`push`]: commit on top of the branch and push, redoing it on a new tip when rejected.

pub mod push;
pub mod status_files;
