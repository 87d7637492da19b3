//! The on-disk caches under `TILEFUSE_CACHE_DIR` (default: the user's cache folder,
//! e.g. `~/.cache/tilefuse`): compiled cubins ([`cubins`]) and tuning results
//! ([`tuned`]), so a second run of a program compiles and tunes nothing.
//! `TILEFUSE_SKIP_CACHE=1` bypasses both.

pub mod cubins;
pub mod disk;
pub mod tuned;

use disk::DiskCache;
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

/// The cache root: `TILEFUSE_CACHE_DIR`, else the user's cache folder + `tilefuse`;
/// `None` with `TILEFUSE_SKIP_CACHE=1` or when no folder can be found.
pub fn root() -> Option<PathBuf> {
    if std::env::var("TILEFUSE_SKIP_CACHE").is_ok_and(|v| v == "1") {
        return None;
    }
    match std::env::var_os("TILEFUSE_CACHE_DIR") {
        Some(d) if !d.is_empty() => Some(PathBuf::from(d)),
        _ => dirs::cache_dir().map(|d| d.join("tilefuse")),
    }
}

/// The cache of one kind (`"cubins"`, `"tuned"`) under the current root.
/// One `DiskCache` per folder, so an unwritable folder is reported once.
pub(crate) fn of_kind(kind: &str) -> Option<Arc<DiskCache>> {
    static OPEN: Mutex<Option<HashMap<PathBuf, Arc<DiskCache>>>> = Mutex::new(None);
    let dir = root()?.join(kind);
    let mut open = OPEN.lock().unwrap_or_else(|p| p.into_inner());
    Some(
        open.get_or_insert_with(HashMap::new)
            .entry(dir.clone())
            .or_insert_with(|| Arc::new(DiskCache::new(dir)))
            .clone(),
    )
}

pub(crate) use crate::log::warn;
