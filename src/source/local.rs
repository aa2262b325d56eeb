//! A plain working directory as a source (`linnet agent --repo-path`), for the
//! edit-save-see loop: a watcher that says when its files change. Listing and reading them
//! (regular files only, links reported) is [`crate::specs::list_local_spec_files`].

use std::path::PathBuf;
use std::time::Duration;

use notify::event::{AccessKind, AccessMode};
use notify::{EventKind, RecursiveMode, Watcher};
use tokio::sync::mpsc;

/// Whether an event can change what the files say. Opening, reading and closing a file
/// unwritten cannot: the agent's own reads of the specs after a change made those events, so a
/// sync woke the next one every `quiet` for as long as the agent ran.
fn changes_content(kind: &EventKind) -> bool {
    match kind {
        EventKind::Access(AccessKind::Close(AccessMode::Write)) => true,
        EventKind::Access(_) => false,
        _ => true,
    }
}

/// Watches `root` and sends one message per burst of changes (debounced by `quiet`).
/// Dropping the returned watcher stops it.
pub fn watch(
    root: PathBuf,
    quiet: Duration,
) -> notify::Result<(notify::RecommendedWatcher, mpsc::Receiver<()>)> {
    let (raw_tx, mut raw_rx) = mpsc::unbounded_channel::<()>();
    let mut watcher = notify::recommended_watcher(move |event: notify::Result<notify::Event>| {
        if event.is_ok_and(|e| changes_content(&e.kind)) {
            let _ = raw_tx.send(());
        }
    })?;
    watcher.watch(&root, RecursiveMode::Recursive)?;
    let (tx, rx) = mpsc::channel(1);
    crate::liveness::spawn("spec file watch", async move {
        while raw_rx.recv().await.is_some() {
            // Wait for the burst to end (editors write several times on save).
            loop {
                match tokio::time::timeout(quiet, raw_rx.recv()).await {
                    Ok(Some(())) => continue,
                    Ok(None) => return,
                    Err(_) => break,
                }
            }
            if tx.send(()).await.is_err() {
                return;
            }
        }
    });
    Ok((watcher, rx))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Regression: the agent's reads of the spec files after a change woke it again, every
    /// 200 ms, for as long as it ran (seen as "files changed on disk" five times a second in
    /// every `--repo-path` agent's log).
    #[tokio::test]
    async fn reading_the_files_is_not_a_change_and_writing_them_is() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("spec.yaml");
        std::fs::write(&file, "a: 1\n").unwrap();
        let (_watcher, mut changes) =
            watch(dir.path().to_path_buf(), Duration::from_millis(50)).unwrap();
        for _ in 0..5 {
            let _ = std::fs::read_to_string(&file).unwrap();
            let _ = std::fs::read_dir(dir.path()).unwrap().count();
        }
        let woke = tokio::time::timeout(Duration::from_millis(500), changes.recv()).await;
        assert!(woke.is_err(), "a read was taken for a change");
        std::fs::write(&file, "a: 2\n").unwrap();
        let woke = tokio::time::timeout(Duration::from_secs(5), changes.recv()).await;
        assert_eq!(woke.ok().flatten(), Some(()), "a write was missed");
    }
}
