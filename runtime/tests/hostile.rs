//! What a hostile or careless caller can pass, and the errors it gets instead of
//! memory outside a buffer. Runs without a GPU (interpret mode's host device).

use tilefuse_runtime::{Device, Error, Tensor};

/// An argument error that names `arg` and says `says`.
#[track_caller]
fn refused<T: std::fmt::Debug>(r: Result<T, Error>, arg: &str, says: &str) {
    match r {
        Err(e @ Error::Argument { .. }) => {
            let m = e.to_string();
            assert!(m.contains(arg) && m.contains(says), "{m}");
        }
        other => panic!("expected an argument error naming `{arg}`, got {other:?}"),
    }
}

#[test]
fn shapes_whose_size_overflows_are_refused() {
    let dev = Device::interpreter();
    // 2^32 · 2^32 · 4 elements wraps to 0 in a usize product.
    refused(
        Tensor::<f32>::empty_on(&dev, [1 << 32, 1 << 32, 4]),
        "shape",
        "overflows the address space",
    );
    // A zero dimension makes no elements, but the strides still overflow.
    refused(
        Tensor::<f32>::empty_on(&dev, [0, 1 << 62, 8]),
        "shape",
        "overflows the address space",
    );
    refused(
        Tensor::<f32>::from_slice_on(&dev, &[], [0, usize::MAX]),
        "shape",
        "overflows",
    );
    // Just inside: an empty tensor of a large but representable shape.
    let t = Tensor::<f32>::empty_on(&dev, [0, 1 << 20]).expect("an empty tensor");
    assert_eq!(t.numel(), 0);
}

/// A GEMM's K extent from a scalar argument (no tensor bounds it) plans its
/// split of the last wave without overflowing, and the plan still reaches the
/// last K tile.
#[test]
fn huge_k_extents_plan_the_split_tail_without_overflow() {
    use tilefuse_runtime::split_tail::{plan, set_enabled, stream_k_plan};
    set_enabled(true);
    for k_tiles in [u64::MAX, u64::MAX / 3, 1 << 62] {
        assert_eq!(stream_k_plan(7, k_tiles, 132).parts, 0, "{k_tiles}");
        let p = stream_k_plan(1, k_tiles, 132);
        assert_eq!((p.split, p.parts, p.ways), (1, 132, 132), "{k_tiles}");
        let last = p.segments(p.programs() - 1, k_tiles);
        assert_eq!(last.last().map(|s| s.k.1), Some(k_tiles));
        let p = plan(8, k_tiles, 132, 4);
        assert_eq!((p.ways, p.parts), (4, 32));
        assert_eq!(p.segments(p.programs() - 1, k_tiles)[0].k.1, k_tiles);
    }
    assert_eq!(plan(u64::MAX, 8, 0, 4).ways, 1);
    assert_eq!(stream_k_plan(u64::MAX, 8, 0).parts, 0);
}

#[test]
fn views_outside_their_tensor_are_refused() {
    let dev = Device::interpreter();
    let empty = Tensor::<f32>::empty_on(&dev, [0, 4]).expect("an empty tensor");
    // 2^63 · 2 elements wraps to 0, the element count of the empty tensor.
    refused(empty.reshape([1 << 63, 2]), "shape", "overflows");
    let t = Tensor::<f32>::zeros_on(&dev, [6, 4]).expect("a tensor");
    // usize::MAX + 2 wraps to 1, inside the 6 rows.
    refused(t.narrow(0, usize::MAX, 2), "dim/start/len", "outside shape");
    refused(t.narrow(2, 0, 1), "dim/start/len", "outside shape");
    refused(t.reshape([5, 5]), "shape", "same number of elements");
    let v = t.narrow(1, 1, 3).expect("an inside view");
    assert_eq!(v.dims(), &[6, 3]);
}

/// Huge finite values where a duration is read clamp to a week instead of
/// overflowing `Duration` (a panic); values that are not numbers are errors
/// naming their variable or flag.
#[test]
fn huge_timeouts_clamp_and_bad_ones_are_refused() {
    use std::time::Duration;
    use tilefuse_runtime::autotune::Effort;
    use tilefuse_runtime::settings::LONGEST;
    std::env::set_var("TILEFUSE_DIST_TIMEOUT_S", "1e300");
    assert_eq!(tilefuse_runtime::dist::default_timeout().unwrap(), LONGEST);
    std::env::set_var("TILEFUSE_DIST_TIMEOUT_S", "soon");
    refused(
        tilefuse_runtime::dist::default_timeout(),
        "TILEFUSE_DIST_TIMEOUT_S",
        "expected a positive number of seconds",
    );
    std::env::set_var("TILEFUSE_DIST_TIMEOUT_S", "30");
    assert_eq!(
        tilefuse_runtime::dist::default_timeout().unwrap(),
        Duration::from_secs(30)
    );
    std::env::remove_var("TILEFUSE_DIST_TIMEOUT_S");
    std::env::set_var("TILEFUSE_AUTOTUNE_BUDGET_S", "1e308");
    assert_eq!(Effort::Quick.budget().unwrap(), LONGEST);
    std::env::remove_var("TILEFUSE_AUTOTUNE_BUDGET_S");
    let args = |g: &str| {
        tilefuse_runtime::launcher::parse(
            ["--grace-period-s", g, "prog"].map(std::ffi::OsString::from),
        )
    };
    let a = args("1e300").expect("parses");
    assert_eq!(a.grace_period_s, LONGEST.as_secs_f64());
    let e = args("never").expect_err("not a number").to_string();
    assert!(
        e.contains("--grace-period-s") && e.contains("`never`"),
        "{e}"
    );
}

fn scratch(name: &str) -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("tilefuse-hostile-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

/// The cache folder is made 0700; one that others may write is refused (a
/// cubin planted there would run in the process): nothing is read from it or
/// written to it, and the run goes on.
#[test]
fn a_cache_folder_others_can_write_is_refused() {
    use std::os::unix::fs::PermissionsExt;
    use tilefuse_runtime::cache::disk::DiskCache;
    let root = scratch("cache-mode");
    let c = DiskCache::new(root.join("cubins"));
    c.put("k", b"payload");
    let mode = |p: &std::path::Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(c.dir()), 0o700);
    assert_eq!(c.get("k").as_deref(), Some(&b"payload"[..]));
    // Someone opens the folder to everyone and plants a valid entry.
    std::fs::set_permissions(c.dir(), std::fs::Permissions::from_mode(0o777)).unwrap();
    let forged = tilefuse_runtime::cache::disk::encode("j", b"not a cubin of ours");
    let fresh = DiskCache::new(c.dir().to_path_buf());
    std::fs::write(fresh.path_of("j"), forged).unwrap();
    assert_eq!(
        fresh.get("j"),
        None,
        "an entry read from a folder others write"
    );
    assert_eq!(fresh.get("k"), None);
    fresh.put("x", b"y");
    assert!(
        !fresh.path_of("x").exists(),
        "an entry written into a folder others write"
    );
    let _ = std::fs::remove_dir_all(&root);
}

/// A link planted at an entry's name (or anywhere a writer might write) is
/// replaced, never written through; a crashed writer's stale temporary file goes.
#[test]
fn a_link_planted_at_an_entry_is_not_followed() {
    use tilefuse_runtime::cache::disk::DiskCache;
    let root = scratch("cache-link");
    let c = DiskCache::new(root.join("tuned"));
    c.put("warm-up", b"x"); // makes the folder
    let victim = root.join("victim");
    std::fs::write(&victim, b"precious").unwrap();
    std::os::unix::fs::symlink(&victim, c.path_of("k")).unwrap();
    c.put("k", b"payload");
    assert_eq!(std::fs::read(&victim).unwrap(), b"precious");
    assert!(!std::fs::symlink_metadata(c.path_of("k"))
        .unwrap()
        .is_symlink());
    assert_eq!(c.get("k").as_deref(), Some(&b"payload"[..]));
    // A temporary file two hours old: removed when a process next opens the folder.
    let stale = c.dir().join(".tmpcrashed.tmp");
    std::fs::write(&stale, b"half an entry").unwrap();
    let two_hours_ago = std::time::SystemTime::now() - std::time::Duration::from_secs(7200);
    std::fs::File::options()
        .write(true)
        .open(&stale)
        .unwrap()
        .set_modified(two_hours_ago)
        .unwrap();
    let again = DiskCache::new(c.dir().to_path_buf());
    assert_eq!(again.get("k").as_deref(), Some(&b"payload"[..]));
    assert!(!stale.exists(), "a stale temporary file was left");
    let _ = std::fs::remove_dir_all(&root);
}

/// A stranger's frames and connections cost the store nothing lasting: a frame
/// that claims 60 MiB and sends nothing, garbage, and 3000 short connections
/// leave the descriptor count where it was, and the ranks' store keeps serving.
#[test]
fn strangers_connections_are_released_and_the_store_goes_on() {
    use std::io::Write;
    use std::net::{Ipv4Addr, TcpStream};
    use std::time::Duration;
    use tilefuse_runtime::dist::store::{Store, StoreServer};
    let server = StoreServer::start(Ipv4Addr::LOCALHOST.into(), 0, b"s3cret").expect("a store");
    let port = server.port();
    // Only this server's sockets count: the tests beside it in this process
    // open their own stores, files and connections while it runs.
    let fds = || server_sockets(port);
    let rank =
        Store::connect("127.0.0.1", port, 1, Duration::from_secs(5), b"s3cret").expect("a rank");
    rank.set("k", b"v").unwrap();
    let before = fds();
    assert!(
        before >= 2,
        "the listener and the rank's connection are seen: {before} sockets on port {port}"
    );
    // A huge field length, then nothing; then garbage.
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.write_all(&[1u8]).unwrap();
    s.write_all(&(60u32 << 20).to_le_bytes()).unwrap();
    drop(s);
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.write_all(&[0xff; 64]).unwrap();
    drop(s);
    for _ in 0..3000 {
        drop(TcpStream::connect(("127.0.0.1", port)).unwrap());
    }
    // The server's threads notice the closes; give them a moment. Connections
    // still in the listen backlog are accepted (and become descriptors) later,
    // so one low reading proves nothing: the count must stay down for half a
    // second, and the assertion judges the reading the loop ended on.
    let t = std::time::Instant::now();
    let mut now = fds();
    let mut quiet_since = None;
    while t.elapsed() < Duration::from_secs(30) {
        now = fds();
        if now > before {
            quiet_since = None;
        } else if quiet_since
            .get_or_insert_with(std::time::Instant::now)
            .elapsed()
            >= Duration::from_millis(500)
        {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(
        now <= before,
        "the store holds {now} sockets on port {port}, {before} before"
    );
    assert_eq!(
        rank.get("k", Duration::from_secs(5), "a key").unwrap(),
        b"v"
    );
}

/// How many of this process's descriptors are TCP sockets whose local port is
/// `port` (the listener and the connections it accepted), read from
/// `/proc/self/fd` and `/proc/net/tcp{,6}`.
fn server_sockets(port: u16) -> usize {
    let mut inodes = std::collections::HashSet::new();
    for table in ["/proc/net/tcp", "/proc/net/tcp6"] {
        let Ok(text) = std::fs::read_to_string(table) else {
            continue;
        };
        for line in text.lines().skip(1) {
            let cols: Vec<&str> = line.split_whitespace().collect();
            let local_port = cols
                .get(1)
                .and_then(|a| a.rsplit(':').next())
                .and_then(|p| u16::from_str_radix(p, 16).ok());
            if local_port == Some(port) {
                if let Some(inode) = cols.get(9) {
                    inodes.insert(format!("socket:[{inode}]"));
                }
            }
        }
    }
    std::fs::read_dir("/proc/self/fd").map_or(0, |d| {
        d.filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
            .filter(|l| inodes.contains(l.to_string_lossy().as_ref()))
            .count()
    })
}

/// A client must open with the magic, the version and the job's secret: a
/// stranger without it, with a wrong one, or speaking another protocol gets
/// nothing (the connection closes) and sets nothing.
#[test]
fn the_store_serves_only_clients_with_the_jobs_secret() {
    use std::io::{Read, Write};
    use std::net::{Ipv4Addr, TcpStream};
    use std::time::Duration;
    use tilefuse_runtime::dist::store::{Store, StoreServer};
    let t = Duration::from_secs(5);
    let server = StoreServer::start(Ipv4Addr::LOCALHOST.into(), 0, b"right").expect("a store");
    let port = server.port();
    let rank = Store::connect("127.0.0.1", port, 0, t, b"right").expect("the job's rank");
    for wrong in [&b""[..], b"wrong", b"righ", b"right!"] {
        refused_store(Store::connect("127.0.0.1", port, 1, t, wrong));
    }
    // Another protocol's bytes (a set of key `k` without any hello): closed.
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    let mut frame = vec![1u8];
    for field in [&b"k"[..], b"forged"] {
        frame.extend((field.len() as u32).to_le_bytes());
        frame.extend(field);
    }
    frame.extend(0u64.to_le_bytes());
    let _ = s.write_all(&frame);
    let mut reply = Vec::new();
    let _ = s.read_to_end(&mut reply);
    assert!(reply.len() <= 1, "{reply:?}");
    assert!(!rank.check("k").unwrap(), "a stranger set a key");
    // Even the job's rank cannot grow the store past its limits.
    let e = rank.set(&"k".repeat(5000), b"v").unwrap_err().to_string();
    assert!(e.contains("keys are at most 4096 bytes"), "{e}");
    rank.set("small", b"fine").unwrap();
}

#[track_caller]
fn refused_store<T>(r: Result<T, Error>) {
    match r {
        Err(e @ Error::Store { .. }) => {
            let m = e.to_string();
            assert!(m.contains("TILEFUSE_STORE_SECRET"), "{m}");
        }
        Err(other) => panic!("expected a store error, got {other}"),
        Ok(_) => panic!("a client without the secret was served"),
    }
}

/// `zero` resets exactly the tensor's elements: a row of a larger tensor
/// leaves its neighbours alone, and a strided view is refused by name.
#[test]
fn zero_resets_its_own_elements_and_refuses_a_strided_view() {
    let dev = Device::interpreter();
    let data: Vec<f32> = (1..=12).map(|v| v as f32).collect();
    let t = Tensor::<f32>::from_slice_on(&dev, &data, [3, 4]).expect("a tensor");
    t.narrow(0, 1, 1).expect("row 1").zero().expect("zeroed");
    let got = t.to_vec().expect("read back");
    assert_eq!(got, [1., 2., 3., 4., 0., 0., 0., 0., 9., 10., 11., 12.]);
    refused(t.t().expect("a transpose").zero(), "self", "strided view");
    t.zero().expect("zeroed");
    assert!(t.to_vec().expect("read back").iter().all(|&v| v == 0.0));
}
