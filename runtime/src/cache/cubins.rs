//! Compiled cubins, keyed by everything that decides the bytes NVRTC produces: the
//! generated source (whole, so file-name collisions are caught), the compile
//! options, NVRTC's version and the architecture.

use std::sync::atomic::{AtomicU64, Ordering};

static HITS: AtomicU64 = AtomicU64::new(0);

/// Cubins this process took from the disk cache instead of compiling.
pub fn hits() -> u64 {
    HITS.load(Ordering::Relaxed)
}

/// The cache key of one compile.
pub fn key(source: &str, arch: &str, options: &[String], nvrtc: (i32, i32)) -> String {
    format!(
        "cubin\narch {arch}\noptions {}\nnvrtc {}.{}\n{source}",
        options.join(" "),
        nvrtc.0,
        nvrtc.1
    )
}

/// The cached cubin for `key`, if any.
pub fn load(key: &str) -> Option<Vec<u8>> {
    let image = super::of_kind("cubins")?.get(key)?;
    HITS.fetch_add(1, Ordering::Relaxed);
    Some(image)
}

pub fn store(key: &str, image: &[u8]) {
    if let Some(c) = super::of_kind("cubins") {
        c.put(key, image);
    }
}
