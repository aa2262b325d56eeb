//! A Git writer's own clone, opened on first use and used off the async threads: image
//! automation's and the dashboard actions'. A job that outlives its timeout hands the clone
//! back when it ends; the next job waits for it rather than open the clone a second time (no
//! lock is held across the network: the clone moves into the job and back).

use std::path::PathBuf;
use std::time::Duration;

use crate::source::git::{GitError, GitRemote};
use crate::writeback::push::{StatusWriter, WriteError};
use crate::writeback::signing::CommitSigner;

/// Where the clone is and how it commits.
#[derive(Clone)]
pub struct WriterSettings {
    pub remote: GitRemote,
    pub cache_dir: PathBuf,
    pub author_name: String,
    pub author_email: String,
    pub signer: Option<std::sync::Arc<CommitSigner>>,
    /// One fetch or push (`--git-timeout`); a job gets three.
    pub timeout: Duration,
}

/// The clone, here or on its way back from a job that timed out.
#[derive(Default)]
pub struct WriterSlot {
    writer: Option<StatusWriter>,
    returning: Option<tokio::sync::oneshot::Receiver<Option<StatusWriter>>>,
}

impl WriterSlot {
    /// Runs `work` on the clone's writer (opened on first use) off the async threads, within
    /// three timeouts (a fetch, a push and the reads).
    pub async fn run<T: Send + 'static>(
        &mut self,
        settings: &WriterSettings,
        work: impl FnOnce(&mut StatusWriter) -> Result<T, WriteError> + Send + 'static,
    ) -> Result<T, WriteError> {
        if let Some(back) = self.returning.take() {
            self.writer = back.await.ok().flatten();
        }
        let (c, writer) = (settings.clone(), self.writer.take());
        let mut task = tokio::task::spawn_blocking(move || {
            let mut writer = match writer {
                Some(w) => w,
                None => match StatusWriter::open(
                    &c.cache_dir,
                    c.remote.clone(),
                    &c.author_name,
                    &c.author_email,
                ) {
                    Ok(w) => w.with_timeout(c.timeout).with_signer(c.signer.clone()),
                    Err(e) => return (None, Err(e.into())),
                },
            };
            let out = work(&mut writer);
            (Some(writer), out)
        });
        match tokio::time::timeout(settings.timeout * 3, &mut task).await {
            Ok(Ok((writer, out))) => {
                self.writer = writer;
                out
            }
            Ok(Err(e)) => Err(WriteError::Panicked(e.to_string())),
            Err(_) => {
                let (back, returning) = tokio::sync::oneshot::channel();
                tokio::spawn(async move {
                    let _ = back.send(task.await.ok().and_then(|(w, _)| w));
                });
                self.returning = Some(returning);
                Err(WriteError::Git(GitError::Timeout {
                    url: crate::text::redact_credentials(&settings.remote.url),
                    after: settings.timeout * 3,
                }))
            }
        }
    }
}
