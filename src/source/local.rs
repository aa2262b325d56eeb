//! A plain working directory as a source (`linnet agent --repo-path`), for the
//! edit-save-see loop: a listing of its spec files, and a watcher that says when they change.

use std::path::{Path, PathBuf};
use std::time::Duration;

use notify::{RecursiveMode, Watcher};
use tokio::sync::mpsc;

use crate::specs::is_spec_file;

/// `(path relative to root, change id)` of every spec file; the id changes when the file does.
pub fn list_files(root: &Path) -> std::io::Result<Vec<(String, String)>> {
    let mut out = Vec::new();
    walk(root, root, &mut out)?;
    out.sort();
    Ok(out)
}

fn walk(root: &Path, dir: &Path, out: &mut Vec<(String, String)>) -> std::io::Result<()> {
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.starts_with('.') {
            continue;
        }
        let path = entry.path();
        let meta = std::fs::metadata(&path)?;
        if meta.is_dir() {
            walk(root, &path, out)?;
        } else if is_spec_file(&name) {
            let modified = meta
                .modified()
                .ok()
                .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
                .map(|d| d.as_nanos())
                .unwrap_or(0);
            let rel = path
                .strip_prefix(root)
                .unwrap_or(&path)
                .to_string_lossy()
                .replace('\\', "/");
            out.push((rel, format!("{}-{modified}", meta.len())));
        }
    }
    Ok(())
}

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
