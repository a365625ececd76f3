//! Reload when the config file or a certificate, key or CA file really changes.
//!
//! Parent directories are watched, not the files, so rename-into-place editors and the
//! `..data` symlink swaps of kubelet and cert-manager are seen. Only create, modify and remove
//! events count (reading a file produces access events, which would otherwise loop), events
//! are debounced, and a reload is asked for only when the files' contents differ.

use std::collections::hash_map::DefaultHasher;
use std::collections::BTreeSet;
use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};
use std::time::Duration;

use notify::{EventKind, RecursiveMode, Watcher};
use tokio::sync::mpsc;

const DEBOUNCE: Duration = Duration::from_millis(300);
/// However busy the watched directories are (a log file written next to the certificates),
/// the files are looked at no later than this after the first event.
const MAX_SETTLE: Duration = Duration::from_secs(2);

/// The files a configuration depends on.
pub fn watched_files(config: &crate::config::Config) -> Vec<PathBuf> {
    let frontends = config
        .frontends
        .iter()
        .flat_map(|f| [&f.cert, &f.key, &f.ca_cert]);
    [
        &config.config_file,
        &config.cluster_cert,
        &config.cluster_key,
        &config.cluster_ca_cert,
    ]
    .into_iter()
    .chain(frontends)
    .flatten()
    .cloned()
    .collect()
}

/// A digest of the files' contents (following symlinks); missing files count as empty.
pub fn fingerprint(files: &[PathBuf]) -> u64 {
    let mut hasher = DefaultHasher::new();
    for file in files {
        file.hash(&mut hasher);
        std::fs::read(file).unwrap_or_default().hash(&mut hasher);
    }
    hasher.finish()
}

/// Watches `files`; sends on `changed` after each settled change of their contents.
/// Dropping the returned watcher stops it.
pub fn watch(
    files: Vec<PathBuf>,
    changed: mpsc::Sender<()>,
) -> notify::Result<notify::RecommendedWatcher> {
    let (events_tx, mut events_rx) = mpsc::channel::<()>(1);
    let mut watcher = notify::recommended_watcher(move |event: notify::Result<notify::Event>| {
        if let Ok(event) = event {
            if matches!(
                event.kind,
                EventKind::Create(_) | EventKind::Modify(_) | EventKind::Remove(_)
            ) {
                let _ = events_tx.try_send(());
            }
        }
    })?;
    let dirs: BTreeSet<PathBuf> = files
        .iter()
        .filter_map(|f| f.parent().map(Path::to_path_buf))
        .map(|d| {
            if d.as_os_str().is_empty() {
                PathBuf::from(".")
            } else {
                d
            }
        })
        .collect();
    for dir in &dirs {
        watcher.watch(dir, RecursiveMode::NonRecursive)?;
    }
    let mut last = fingerprint(&files);
    tokio::spawn(async move {
        while events_rx.recv().await.is_some() {
            // Let a burst (write, rename, symlink swap) settle, but not forever.
            let settle_by = tokio::time::Instant::now() + MAX_SETTLE;
            loop {
                let quiet = tokio::time::sleep(DEBOUNCE);
                tokio::select! {
                    event = events_rx.recv() => match event {
                        Some(()) if tokio::time::Instant::now() < settle_by => continue,
                        Some(()) => break,
                        None => return,
                    },
                    _ = quiet => break,
                }
            }
            let files = files.clone();
            let now = tokio::task::spawn_blocking(move || fingerprint(&files))
                .await
                .unwrap_or(last);
            if now != last {
                last = now;
                if changed.send(()).await.is_err() {
                    return;
                }
            }
        }
    });
    Ok(watcher)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_change_is_seen_while_a_neighbour_file_is_written_all_the_time() {
        let dir = tempfile::tempdir().unwrap();
        let cert = dir.path().join("cluster.crt");
        std::fs::write(&cert, "one").unwrap();
        let (tx, mut rx) = mpsc::channel(1);
        let _watcher = watch(vec![cert.clone()], tx).unwrap();
        // A log next to the certificate, written every 50 ms for 20 s.
        let noise = dir.path().join("server.log");
        let stop = tokio_util::sync::CancellationToken::new();
        let writer = {
            let stop = stop.clone();
            tokio::spawn(async move {
                let until = tokio::time::Instant::now() + Duration::from_secs(20);
                while tokio::time::Instant::now() < until && !stop.is_cancelled() {
                    std::fs::write(&noise, "line\n").unwrap();
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            })
        };
        tokio::time::sleep(Duration::from_millis(200)).await;
        std::fs::write(&cert, "two").unwrap();
        let seen = tokio::time::timeout(Duration::from_secs(15), rx.recv()).await;
        let writing = !writer.is_finished();
        stop.cancel();
        writer.await.unwrap();
        assert!(matches!(seen, Ok(Some(()))), "the change was not reported");
        assert!(writing, "reported only after the neighbour stopped writing");
    }
}
