//! Cache entries on disk: one file per key, written atomically (a temporary file in
//! the same folder, then a rename), read back only when everything checks out.
//!
//! An entry is `MAGIC`, a one-line JSON header (format, tilefuse version, the
//! whole key, payload length and checksum), then the payload. A file that is
//! truncated, corrupt, from another tilefuse version or for another key (a hash
//! collision of file names) is ignored with a warning, and the caller's fresh
//! result overwrites it. Several processes may write one key at once: each writes
//! its own temporary file and the renames are atomic, so a reader sees one whole
//! entry or none.

use super::warn;
use serde::{Deserialize, Serialize};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use tilefuse_codegen::hash::fnv1a64;

const MAGIC: &[u8] = b"TILEFUSE-CACHE\n";
/// Bumped when the entry layout changes.
const FORMAT: u32 = 1;

#[derive(Serialize, Deserialize)]
struct Header {
    format: u32,
    tilefuse: String,
    key: String,
    len: u64,
    fnv: String,
}

/// One kind of entry (cubins, tuning results) in one folder.
pub struct DiskCache {
    dir: PathBuf,
    /// Set after the first failed write: the folder is not writable, so the rest of
    /// the process runs without writing (and says so once).
    disabled: AtomicBool,
}

impl DiskCache {
    pub fn new(dir: PathBuf) -> DiskCache {
        DiskCache {
            dir,
            disabled: AtomicBool::new(false),
        }
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
        if self.disabled.load(Ordering::Relaxed) {
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
        static SEQ: AtomicU64 = AtomicU64::new(0);
        std::fs::create_dir_all(&self.dir)?;
        let path = self.path_of(key);
        let tmp = path.with_extension(format!(
            "{}.{}.tmp",
            std::process::id(),
            SEQ.fetch_add(1, Ordering::Relaxed)
        ));
        let written = (|| {
            let mut f = std::fs::File::create(&tmp)?;
            f.write_all(&encode(key, payload))?;
            f.sync_all()?;
            std::fs::rename(&tmp, &path)
        })();
        if written.is_err() {
            let _ = std::fs::remove_file(&tmp);
        }
        written
    }
}

/// The bytes of an entry.
pub fn encode(key: &str, payload: &[u8]) -> Vec<u8> {
    let header = Header {
        format: FORMAT,
        tilefuse: env!("CARGO_PKG_VERSION").into(),
        key: key.into(),
        len: payload.len() as u64,
        fnv: format!("{:016x}", fnv1a64(payload)),
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
    if format!("{:016x}", fnv1a64(payload)) != header.fnv {
        return Err("corrupt (checksum mismatch)".into());
    }
    Ok(payload.to_vec())
}
