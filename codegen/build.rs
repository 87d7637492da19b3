//! Hashes the crate's sources into `TILEFUSE_CODEGEN_HASH`: the tuning cache
//! keys its winners by it, so a winner found with other generated code (an
//! older build of this crate) is not reused where it may now lose to the
//! default.

use std::path::Path;

fn fnv(h: &mut u64, bytes: &[u8]) {
    for &b in bytes {
        *h ^= u64::from(b);
        *h = h.wrapping_mul(0x0100_0000_01b3);
    }
}

fn walk(dir: &Path, files: &mut Vec<std::path::PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let p = e.path();
        if p.is_dir() {
            walk(&p, files);
        } else if p.extension().is_some_and(|x| x == "rs") {
            files.push(p);
        }
    }
}

fn main() {
    let src = Path::new("src");
    println!("cargo:rerun-if-changed=src");
    let mut files = Vec::new();
    walk(src, &mut files);
    // Sorted, with their paths: the same sources give the same hash anywhere.
    files.sort();
    let mut h = 0xcbf2_9ce4_8422_2325u64;
    for f in &files {
        fnv(&mut h, f.to_string_lossy().replace('\\', "/").as_bytes());
        fnv(&mut h, &std::fs::read(f).unwrap_or_default());
    }
    println!("cargo:rustc-env=TILEFUSE_CODEGEN_HASH={h:016x}");
}
