//! Cache entries on disk: one file per key, written atomically (a temporary file in
//! the same folder, then a rename), read back only when everything checks out.
//!
//! An entry is `MAGIC`, a one-line JSON header (format, tilefuse version, the
//! whole key, payload length and SHA-256), then the payload. A file that is
//! truncated, corrupt, from another tilefuse version or for another key (a hash
//! collision of file names) is ignored with a warning, and the caller's fresh
//! result overwrites it. Several processes may write one key at once: each writes
//! its own temporary file (a random name, created exclusively: a link planted
//! there is never followed) and the renames are atomic, so a reader sees one
//! whole entry or none.
//!
//! Trust: a cubin from the cache runs in the process, so the folder must be this
//! user's alone. It is created 0700; one that another user owns, or that its
//! group or others may write, is refused with a warning and the process runs
//! without it (reading nothing, writing nothing). The digest catches corruption,
//! not a forger who can write the folder: the ownership check is what keeps
//! strangers out.

use super::warn;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::OnceLock;
use std::time::Duration;
use tilefuse_codegen::hash::fnv1a64;

const MAGIC: &[u8] = b"TILEFUSE-CACHE\n";
/// Bumped when the entry layout changes.
const FORMAT: u32 = 2;
/// Temporary files older than this are a crashed writer's: removed.
const STALE: Duration = Duration::from_secs(3600);

#[derive(Serialize, Deserialize)]
struct Header {
    format: u32,
    tilefuse: String,
    key: String,
    len: u64,
    sha256: String,
}

fn sha256_hex(bytes: &[u8]) -> String {
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// One kind of entry (cubins, tuning results) in one folder.
pub struct DiskCache {
    dir: PathBuf,
    /// Set after the first failed write: the folder is not writable, so the rest of
    /// the process runs without writing (and says so once).
    disabled: AtomicBool,
    /// Whether the folder is this user's alone (checked once, on first use).
    trusted: OnceLock<bool>,
}

impl DiskCache {
    pub fn new(dir: PathBuf) -> DiskCache {
        DiskCache {
            dir,
            disabled: AtomicBool::new(false),
            trusted: OnceLock::new(),
        }
    }

    /// Creates the folder (0700) if needed, then whether it may be used: owned by
    /// this user and not writable by its group or others (else a warning, once).
    /// Stale temporary files of crashed writers go.
    fn trusted(&self) -> bool {
        *self.trusted.get_or_init(|| match prepare(&self.dir) {
            Ok(()) => {
                remove_stale(&self.dir);
                true
            }
            Err(why) => {
                warn(format!(
                    "not using the cache folder {}: {why}; going on without a cache \
                     (make it yours and 0700, or set TILEFUSE_CACHE_DIR to a folder of your own)",
                    self.dir.display()
                ));
                false
            }
        })
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The file an entry for `key` lives in.
    pub fn path_of(&self, key: &str) -> PathBuf {
        self.dir
            .join(format!("{:016x}.bin", fnv1a64(key.as_bytes())))
    }

    /// The payload stored for `key`, if a whole, current entry for exactly this key
    /// is there.
    pub fn get(&self, key: &str) -> Option<Vec<u8>> {
        if !self.trusted() {
            return None;
        }
        let path = self.path_of(key);
        let bytes = match std::fs::read(&path) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return None,
            Err(e) => {
                warn(format!(
                    "cache entry {} could not be read ({e}); ignoring it",
                    path.display()
                ));
                return None;
            }
        };
        match decode(&bytes, key) {
            Ok(payload) => Some(payload),
            Err(why) => {
                warn(format!(
                    "cache entry {} is {why}; ignoring it (it will be rewritten)",
                    path.display()
                ));
                None
            }
        }
    }

    /// Stores `payload` for `key`. Failures are warnings: the cache is an
    /// optimisation, and an unwritable folder disables writing for the process.
    pub fn put(&self, key: &str, payload: &[u8]) {
        if self.disabled.load(Ordering::Relaxed) || !self.trusted() {
            return;
        }
        if let Err(e) = self.write(key, payload) {
            if !self.disabled.swap(true, Ordering::Relaxed) {
                warn(format!(
                    "the cache folder {} is not writable ({e}); going on without caching there \
                     (set TILEFUSE_CACHE_DIR to a writable folder, or TILEFUSE_SKIP_CACHE=1)",
                    self.dir.display()
                ));
            }
        }
    }

    fn write(&self, key: &str, payload: &[u8]) -> std::io::Result<()> {
        // A random name, created exclusively (0600), removed if anything fails.
        let mut tmp = tempfile::Builder::new()
            .prefix(".tmp")
            .suffix(".tmp")
            .tempfile_in(&self.dir)?;
        tmp.write_all(&encode(key, payload))?;
        tmp.as_file().sync_all()?;
        // The rename replaces whatever is at the entry's name (a link included),
        // never writing through it.
        tmp.persist(self.path_of(key))
            .map(drop)
            .map_err(|e| e.error)
    }
}

/// Creates `dir` (0700, parents as needed) and checks that it and its parent
/// (the cache root, whose owner could swap the folder) are this user's alone.
fn prepare(dir: &Path) -> Result<(), String> {
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(|e| format!("it cannot be created ({e})"))?;
    own_folder(dir, false)?;
    match dir.parent() {
        Some(root) if !root.as_os_str().is_empty() => {
            own_folder(root, true).map_err(|why| format!("its parent {}: {why}", root.display()))
        }
        _ => Ok(()),
    }
}

/// `dir` is a folder (not a link) of this user that nobody else may write. A
/// `parent` may also be root's, and writable by others when sticky (`/tmp`:
/// nobody but its owner can then rename or remove the folder in it).
fn own_folder(dir: &Path, parent: bool) -> Result<(), String> {
    let meta = std::fs::symlink_metadata(dir).map_err(|e| format!("it cannot be read ({e})"))?;
    if !meta.is_dir() {
        return Err("it is not a folder (a link?)".into());
    }
    // SAFETY: geteuid has no preconditions and cannot fail.
    let me = unsafe { libc::geteuid() };
    if meta.uid() != me && !(parent && meta.uid() == 0) {
        return Err(format!(
            "it belongs to user {}, not to this user ({me})",
            meta.uid()
        ));
    }
    let sticky = meta.mode() & 0o1000 != 0;
    if meta.mode() & 0o022 != 0 && !(parent && sticky) {
        return Err(format!(
            "its group or others may write it (mode {:o})",
            meta.mode() & 0o7777
        ));
    }
    Ok(())
}

/// Removes temporary files older than [`STALE`] (a writer that crashed).
fn remove_stale(dir: &Path) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let name = e.file_name();
        let name = name.to_string_lossy();
        if !name.ends_with(".tmp") {
            continue;
        }
        let old = e
            .metadata()
            .and_then(|m| m.modified())
            .ok()
            .and_then(|t| t.elapsed().ok())
            .is_some_and(|age| age > STALE);
        if old {
            let _ = std::fs::remove_file(e.path());
        }
    }
}

/// The bytes of an entry.
pub fn encode(key: &str, payload: &[u8]) -> Vec<u8> {
    let header = Header {
        format: FORMAT,
        tilefuse: env!("CARGO_PKG_VERSION").into(),
        key: key.into(),
        len: payload.len() as u64,
        sha256: sha256_hex(payload),
    };
    let mut out = MAGIC.to_vec();
    out.extend(serde_json::to_vec(&header).unwrap_or_default());
    out.push(b'\n');
    out.extend_from_slice(payload);
    out
}

/// The payload of an entry for `key`, or why it cannot be trusted.
pub fn decode(bytes: &[u8], key: &str) -> Result<Vec<u8>, String> {
    let rest = bytes
        .strip_prefix(MAGIC)
        .ok_or("not a tilefuse cache entry (or truncated)")?;
    let nl = rest
        .iter()
        .position(|&b| b == b'\n')
        .ok_or("truncated (no complete header)")?;
    let header: Header = serde_json::from_slice(&rest[..nl])
        .map_err(|e| format!("corrupt (unreadable header: {e})"))?;
    if header.format != FORMAT || header.tilefuse != env!("CARGO_PKG_VERSION") {
        return Err(format!(
            "from another tilefuse version ({} format {}; this is {} format {FORMAT})",
            header.tilefuse,
            header.format,
            env!("CARGO_PKG_VERSION")
        ));
    }
    if header.key != key {
        return Err("for another key (file names collided)".into());
    }
    let payload = &rest[nl + 1..];
    if payload.len() as u64 != header.len {
        return Err(format!(
            "truncated ({} of {} payload bytes)",
            payload.len(),
            header.len
        ));
    }
    if sha256_hex(payload) != header.sha256 {
        return Err("corrupt (SHA-256 mismatch)".into());
    }
    Ok(payload.to_vec())
}
