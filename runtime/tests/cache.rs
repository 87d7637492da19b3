//! The on-disk caches without a GPU: entries that must not be trusted (truncated,
//! corrupt, from another version, for another key), several processes writing
//! one key at once, and a folder that cannot be written.

use std::path::PathBuf;
use std::process::Command;
use tilefuse_runtime::cache::disk::{decode, encode, DiskCache};

fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("tilefuse-cache-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

#[test]
fn a_written_entry_reads_back_and_other_keys_miss() {
    let c = DiskCache::new(scratch("roundtrip"));
    assert_eq!(c.get("k"), None);
    c.put("k", b"payload");
    assert_eq!(c.get("k").as_deref(), Some(&b"payload"[..]));
    assert_eq!(c.get("other"), None);
    // No temporary files are left behind.
    let names: Vec<String> = std::fs::read_dir(c.dir())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(names.len(), 1, "{names:?}");
    assert!(names[0].ends_with(".bin"));
}

#[test]
fn a_truncated_entry_is_ignored_then_rewritten() {
    let c = DiskCache::new(scratch("truncated"));
    c.put("k", &[7u8; 1000]);
    let path = c.path_of("k");
    let whole = std::fs::read(&path).unwrap();
    for cut in [whole.len() - 1, whole.len() / 2, 10, 0] {
        std::fs::write(&path, &whole[..cut]).unwrap();
        assert_eq!(c.get("k"), None, "cut at {cut}");
    }
    let e = decode(&whole[..whole.len() - 1], "k").unwrap_err();
    assert!(e.contains("truncated"), "{e}");
    c.put("k", &[8u8; 10]);
    assert_eq!(c.get("k").as_deref(), Some(&[8u8; 10][..]));
}

#[test]
fn a_corrupt_entry_or_one_for_another_key_is_ignored() {
    let mut bytes = encode("k", b"0123456789");
    let last = bytes.len() - 1;
    bytes[last] ^= 1;
    assert!(decode(&bytes, "k")
        .unwrap_err()
        .contains("SHA-256 mismatch"));
    let e = decode(&encode("k", b"x"), "j").unwrap_err();
    assert!(e.contains("another key"), "{e}");
    assert!(decode(b"garbage", "k").is_err());
}

#[test]
fn an_entry_from_another_version_is_ignored() {
    let c = DiskCache::new(scratch("version"));
    c.put("k", b"new");
    let path = c.path_of("k");
    let text = std::fs::read(&path).unwrap();
    let forged = String::from_utf8_lossy(&text).replace(
        &format!("\"tilefuse\":\"{}\"", env!("CARGO_PKG_VERSION")),
        "\"tilefuse\":\"0.0.1-old\"",
    );
    assert_ne!(forged.as_bytes(), &text[..], "the header names the version");
    std::fs::write(&path, forged.as_bytes()).unwrap();
    assert_eq!(c.get("k"), None);
    let e = decode(forged.as_bytes(), "k").unwrap_err();
    assert!(
        e.contains("another tilefuse version") && e.contains("0.0.1-old"),
        "{e}"
    );
}

/// Run as a child (see below): writes one key many times with its own payload.
#[test]
fn child_writer() {
    let Ok(dir) = std::env::var("TILEFUSE_TEST_WRITER_DIR") else {
        return;
    };
    let id: u8 = std::env::var("TILEFUSE_TEST_WRITER_ID")
        .unwrap()
        .parse()
        .unwrap();
    let c = DiskCache::new(PathBuf::from(dir));
    for _ in 0..200 {
        c.put("shared", &vec![id; 64 * 1024]);
        if let Some(v) = c.get("shared") {
            assert!(
                v.len() == 64 * 1024 && v.iter().all(|&b| b == v[0]),
                "a torn entry"
            );
        }
    }
}

#[test]
fn processes_writing_one_key_at_once_leave_a_whole_entry() {
    let dir = scratch("race");
    let me = std::env::current_exe().unwrap();
    let children: Vec<_> = (1..=4u8)
        .map(|id| {
            Command::new(&me)
                .args(["child_writer", "--exact", "--nocapture"])
                .env("TILEFUSE_TEST_WRITER_DIR", &dir)
                .env("TILEFUSE_TEST_WRITER_ID", id.to_string())
                .stdout(std::process::Stdio::null())
                .spawn()
                .unwrap()
        })
        .collect();
    for mut c in children {
        assert!(c.wait().unwrap().success(), "a writer saw a torn entry");
    }
    let c = DiskCache::new(dir.clone());
    let v = c.get("shared").expect("a whole entry");
    assert!(v.len() == 64 * 1024 && (1..=4).contains(&v[0]) && v.iter().all(|&b| b == v[0]));
    let left: Vec<_> = std::fs::read_dir(&dir).unwrap().collect();
    assert_eq!(left.len(), 1, "temporary files left behind");
}

#[test]
fn an_unwritable_folder_is_a_warning_and_no_cache() {
    // A file where the folder should be: nothing can be created under it.
    let base = scratch("unwritable");
    std::fs::create_dir_all(base.parent().unwrap()).unwrap();
    std::fs::write(&base, b"a file, not a folder").unwrap();
    let c = DiskCache::new(base.join("tuned"));
    c.put("k", b"v"); // warns once, does not panic
    c.put("k2", b"v");
    assert_eq!(c.get("k"), None);
    let _ = std::fs::remove_file(&base);
}
