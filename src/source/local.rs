//! A plain working directory as a source (`linnet agent --repo-path`), for the
//! edit-save-see loop: a watcher that says when its files change. Listing and reading them
//! (regular files only, links reported) is [`crate::specs::list_local_spec_files`].

use std::path::PathBuf;
use std::time::Duration;

use notify::{RecursiveMode, Watcher};
use tokio::sync::mpsc;

/// Watches `root` and sends one message per burst of changes (debounced by `quiet`).
/// Dropping the returned watcher stops it.
pub fn watch(
    root: PathBuf,
    quiet: Duration,
) -> notify::Result<(notify::RecommendedWatcher, mpsc::Receiver<()>)> {
    let (raw_tx, mut raw_rx) = mpsc::unbounded_channel::<()>();
    let mut watcher = notify::recommended_watcher(move |event: notify::Result<notify::Event>| {
        if event.is_ok() {
            let _ = raw_tx.send(());
        }
    })?;
    watcher.watch(&root, RecursiveMode::Recursive)?;
    let (tx, rx) = mpsc::channel(1);
    tokio::spawn(async move {
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
