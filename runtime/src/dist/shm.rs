//! Shared memory between the CPU ranks of interpret mode: each rank's symmetric
//! buffer is a file in `/dev/shm` (the temp dir where there is none) that every
//! rank maps. The owner removes the file once all ranks mapped it, so nothing is
//! left behind when the ranks exit or die; the mappings outlive the name.

use crate::error::{Error, Result};
use std::fs::OpenOptions;
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use tilefuse_interpret::HostMemory;

/// A `mmap`ed region, unmapped on drop.
struct Mapping {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: the mapping is plain shared memory, accessed through `HostMemory`'s
// atomics only; unmapping happens once, on drop.
unsafe impl Send for Mapping {}
// SAFETY: as above.
unsafe impl Sync for Mapping {}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: `ptr..ptr + len` is a mapping made by `map` and unmapped once.
        unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.len) };
    }
}

fn shm_error(what: String, e: std::io::Error) -> Error {
    Error::Distributed {
        context: "interpret mode's shared memory".into(),
        message: format!("{what}: {e}"),
    }
}

/// A new name for this rank's buffer, unique on the machine. The first call
/// of a process also removes the buffers of processes that died before their
/// peers mapped them (the one moment a name can outlive its owner).
pub(crate) fn new_path(rank: usize) -> PathBuf {
    static SEQ: AtomicU64 = AtomicU64::new(0);
    static SWEPT: std::sync::Once = std::sync::Once::new();
    let dir = Path::new("/dev/shm");
    let dir = if dir.is_dir() {
        dir.to_path_buf()
    } else {
        std::env::temp_dir()
    };
    SWEPT.call_once(|| remove_orphans(&dir));
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    dir.join(format!(
        "tilefuse-{}-{nanos}-{}-rank{rank}",
        std::process::id(),
        SEQ.fetch_add(1, Ordering::Relaxed)
    ))
}

/// Removes this user's `tilefuse-PID-…` buffers in `dir` whose process is gone.
fn remove_orphans(dir: &Path) {
    use std::os::unix::fs::MetadataExt;
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    // SAFETY: geteuid has no preconditions and cannot fail.
    let me = unsafe { libc::geteuid() };
    for e in entries.flatten() {
        let name = e.file_name();
        let Some(pid) = name
            .to_str()
            .and_then(|n| n.strip_prefix("tilefuse-"))
            .and_then(|n| n.split('-').next())
            .and_then(|p| p.parse::<libc::pid_t>().ok())
        else {
            continue;
        };
        let mine = e.metadata().is_ok_and(|m| m.uid() == me);
        // SAFETY: kill with signal 0 only asks whether the process exists.
        let gone = pid > 0
            && unsafe { libc::kill(pid, 0) } != 0
            && std::io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH);
        if mine && gone {
            let _ = std::fs::remove_file(e.path());
        }
    }
}

/// Maps `bytes` of the file at `path`, creating it (zeroed) when `create`.
pub(crate) fn map(path: &Path, bytes: usize, create: bool) -> Result<Arc<HostMemory>> {
    let len = bytes.max(8);
    // Only this user's processes (the job's ranks) may open it: another user's
    // could read the buffers, or write into them.
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(create)
        .mode(0o600)
        .open(path)
        .map_err(|e| shm_error(format!("opening {}", path.display()), e))?;
    if create {
        file.set_len(len as u64)
            .map_err(|e| shm_error(format!("sizing {} to {len} bytes", path.display()), e))?;
    } else {
        let have = file
            .metadata()
            .map_err(|e| shm_error(format!("reading {}", path.display()), e))?
            .len();
        if have < len as u64 {
            return Err(Error::Distributed {
                context: "interpret mode's shared memory".into(),
                message: format!(
                    "{} holds {have} bytes, not the {len} its owner published",
                    path.display()
                ),
            });
        }
    }
    // SAFETY: maps `len` bytes of a file at least that long, shared and
    // read-write; the result is checked below.
    let ptr = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            file.as_raw_fd(),
            0,
        )
    };
    if ptr == libc::MAP_FAILED {
        return Err(shm_error(
            format!("mapping {}", path.display()),
            std::io::Error::last_os_error(),
        ));
    }
    let ptr = NonNull::new(ptr.cast::<u8>()).ok_or_else(|| Error::Distributed {
        context: "interpret mode's shared memory".into(),
        message: "mmap returned a null mapping".into(),
    })?;
    let mapping = Mapping { ptr, len };
    // SAFETY: a page-aligned mapping of `len` bytes that `mapping` keeps until it
    // drops with the `HostMemory`; every rank accesses it through `HostMemory`.
    Ok(unsafe { HostMemory::from_raw(ptr, len, Box::new(mapping)) })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn a_dead_processs_buffer_is_swept() {
        // A pid that cannot be alive: above the kernel's limit.
        let dir = std::env::temp_dir().join(format!("tilefuse-sweep-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let dead = dir.join("tilefuse-2147483646-1-0-rank0");
        let alive = dir.join(format!("tilefuse-{}-1-0-rank0", std::process::id()));
        let other = dir.join("unrelated");
        for f in [&dead, &alive, &other] {
            std::fs::write(f, b"x").unwrap();
        }
        remove_orphans(&dir);
        let (d, a, o) = (dead.exists(), alive.exists(), other.exists());
        let _ = std::fs::remove_dir_all(&dir);
        assert!(!d && a && o, "dead {d}, alive {a}, other {o}");
    }

    #[test]
    fn a_new_buffer_file_is_the_users_alone() {
        let path = new_path(0);
        let mem = map(&path, 64, true).expect("a new mapping");
        let mode = std::fs::metadata(&path)
            .expect("the file")
            .permissions()
            .mode();
        let _ = std::fs::remove_file(&path);
        drop(mem);
        assert_eq!(mode & 0o777, 0o600, "mode {mode:o}");
    }
}
