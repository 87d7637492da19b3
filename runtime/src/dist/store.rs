//! A TCP key-value store for rendezvous, hosted by rank 0 (like torch's
//! `TCPStore`): ranks publish small values (an NCCL id, IPC handles, shapes) and
//! wait for each other's. Every wait is bounded and says what it waited for; a
//! store that goes away is an error on every rank still talking to it.
//!
//! Wire format, little-endian: a connection opens with `HELLO` (a magic and the
//! protocol version) and the job's secret (`u32 len + bytes`), answered by one
//! byte (0: welcome; else the server closes). Then a request is `op: u8, key:
//! u32 len + bytes, value: u32 len + bytes, timeout_ms: u64`; a reply is
//! `status: u8` (0 ok, 1 timed out) and `u32 len + bytes`.
//!
//! Trust model: the keys steer the job (barriers, the NCCL id, IPC handles,
//! tuned configs), so a client must present the job's secret first
//! ([`SECRET_ENV`]: `tilefuse-run` makes a random one for a job of one node; a
//! job of several nodes takes it from the environment, the same on every node,
//! and without one accepts any client, as torch's `TCPStore` does). A job of
//! one node also listens on loopback only ([`bind_address`]); one of several
//! listens on the interface `MASTER_ADDR` names. What a multi-node user must
//! still protect: the secret (it travels in clear over the network: the
//! network between the nodes must be the cluster's own) and the environment of
//! the job's processes. Against a stranger that connects, the server bounds
//! what it costs: a field's length allocates nothing
//! before its bytes arrive (at most 64 MiB), a connection must send its first
//! request within 30 s, at most 4096 are served at once, a closed one releases
//! its descriptor and thread, and accept errors back off.

use crate::error::{Error, Result};
use std::collections::HashMap;
use std::io::{BufReader, BufWriter, Read, Write};
use std::net::{TcpListener, TcpStream, ToSocketAddrs};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

const OP_SET: u8 = 1;
const OP_GET: u8 = 2;
const OP_ADD: u8 = 3;
const OP_CHECK: u8 = 4;
/// How long a dropped server waits for the ranks to disconnect.
const LINGER: Duration = Duration::from_secs(5);
/// Keys and values are small (ids, handles, shapes); this bounds a bad peer.
const MAX_LEN: u32 = 64 << 20;
/// The longest key.
const MAX_KEY: usize = 4096;
/// The most bytes of keys and values the store holds (a job's rendezvous needs
/// kilobytes; tuned configs and IPC handles a few more).
const MAX_TOTAL: usize = 1 << 30;
/// A reply's status: done, timed out, or refused (over the limits above).
const REFUSED: u8 = 2;

/// The first bytes of a connection: a magic and the protocol version.
const HELLO: &[u8; 8] = b"TFSTORE\x01";
/// The longest secret a client may present.
const MAX_SECRET: u32 = 1024;

/// The variable that holds the job's store secret: set by `tilefuse-run` (a
/// random one for a job of one node), or by the user for several nodes (the
/// same everywhere). Unset: the store takes any client.
pub const SECRET_ENV: &str = "TILEFUSE_STORE_SECRET";

/// The job's secret from [`SECRET_ENV`] (empty when unset).
pub fn secret_from_env() -> Vec<u8> {
    use std::os::unix::ffi::OsStringExt;
    std::env::var_os(SECRET_ENV).map_or_else(Vec::new, OsStringExt::into_vec)
}

/// Equal, in a time that does not depend on where they differ.
fn same_secret(a: &[u8], b: &[u8]) -> bool {
    let diff = a
        .iter()
        .zip(b)
        .fold(a.len() ^ b.len(), |d, (x, y)| d | usize::from(x ^ y));
    diff == 0
}

/// Connections served at once (more are closed at once): far above what the
/// ranks of a job open, far below the process's descriptors.
const MAX_CONNECTIONS: usize = 4096;
/// A connection must send its first request within this (a rank does so at
/// once; a stranger's idle connection is closed).
const FIRST_REQUEST: Duration = Duration::from_secs(30);

/// Where a store listens: loopback when every rank is on this node (nobody
/// else can reach it), else the address `master_addr` names (the interface the
/// other nodes use), not every interface.
pub fn bind_address(master_addr: &str, single_node: bool) -> Result<std::net::IpAddr> {
    use std::net::{IpAddr, Ipv4Addr};
    if single_node {
        return Ok(IpAddr::V4(Ipv4Addr::LOCALHOST));
    }
    (master_addr, 0)
        .to_socket_addrs()
        .ok()
        .and_then(|mut a| a.next())
        .map(|a| a.ip())
        .ok_or_else(|| Error::Store {
            addr: master_addr.into(),
            message: "MASTER_ADDR does not resolve to an address of this node to listen on".into(),
        })
}

#[derive(Default)]
struct State {
    map: Mutex<HashMap<String, Vec<u8>>>,
    changed: Condvar,
    /// Open connections by number, shut down when the server is dropped; each
    /// leaves when it closes.
    conns: Mutex<HashMap<u64, TcpStream>>,
    /// Connections still being served (their ranks have not closed them).
    live: std::sync::atomic::AtomicUsize,
    /// Of those, the ones blocked on a key missing since their last look
    /// (a set or add counts them all as awake again, see `serve_requests`).
    waiting: std::sync::atomic::AtomicUsize,
    /// Bumped by every set and add, under `map`'s lock.
    generation: std::sync::atomic::AtomicU64,
    closed: std::sync::atomic::AtomicBool,
    /// What a client must present first.
    secret: Vec<u8>,
    /// Bytes of keys and values held (under `map`'s lock).
    held: std::sync::atomic::AtomicUsize,
}

/// The serving side, run by rank 0 on its own threads. Dropping it waits (at
/// most a few seconds) for the other ranks to disconnect, unless all of them
/// are blocked on keys nobody set: a rank may still be on its way to read the
/// last barrier's outcome when rank 0 is done. Then it closes every
/// connection, as the end of rank 0's process would.
pub struct StoreServer {
    ip: std::net::IpAddr,
    port: u16,
    state: Arc<State>,
}

impl Drop for StoreServer {
    fn drop(&mut self) {
        use std::sync::atomic::Ordering;
        let start = Instant::now();
        while self.state.live.load(Ordering::SeqCst) > self.state.waiting.load(Ordering::SeqCst)
            && start.elapsed() < LINGER
        {
            std::thread::sleep(Duration::from_millis(2));
        }
        self.state.closed.store(true, Ordering::SeqCst);
        for c in self
            .state
            .conns
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .drain()
        {
            let _ = c.1.shutdown(std::net::Shutdown::Both);
        }
        // Wake the accept loop so it sees `closed`.
        let _ = TcpStream::connect((self.ip, self.port));
        self.state.changed.notify_all();
    }
}

/// Set by `tilefuse-run` for rank 0: the descriptor of a socket already listening
/// on the master port, so no other process can take the port before rank 0 runs.
pub const STORE_FD_ENV: &str = "TILEFUSE_STORE_FD";

/// The socket a launcher left listening on `port` for this process, taken once.
fn inherited_listener(port: u16) -> Option<TcpListener> {
    use std::os::fd::{FromRawFd, IntoRawFd, RawFd};
    use std::sync::atomic::{AtomicBool, Ordering};
    static TAKEN: AtomicBool = AtomicBool::new(false);
    let fd: RawFd = std::env::var(STORE_FD_ENV).ok()?.parse().ok()?;
    if fd < 0 || TAKEN.swap(true, Ordering::SeqCst) {
        return None;
    }
    // SAFETY: the launcher opened `fd` for this process alone and nothing else here
    // refers to it (taken once, above); if it turns out not to be our listener it
    // is released again below without being closed.
    let l = unsafe { TcpListener::from_raw_fd(fd) };
    match l.local_addr() {
        Ok(a) if a.port() == port && port != 0 => {
            // The launcher's socket is close-on-exec no more: restore it.
            // SAFETY: fcntl on a descriptor this process owns.
            unsafe { libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC) };
            Some(l)
        }
        _ => {
            let _ = l.into_raw_fd();
            None
        }
    }
}

impl StoreServer {
    /// Listens on `ip` at `port` (0: any free port; see [`bind_address`]). Under
    /// `tilefuse-run`, rank 0 takes the socket the launcher already bound
    /// ([`STORE_FD_ENV`]).
    pub fn start(ip: std::net::IpAddr, port: u16, secret: &[u8]) -> Result<StoreServer> {
        let listener = match inherited_listener(port) {
            Some(l) => l,
            None => TcpListener::bind((ip, port)).map_err(|e| Error::Store {
                addr: format!("{ip}:{port}"),
                message: format!(
                    "rank 0 could not listen: {e} (is MASTER_PORT {port} taken? pick another, or 0 under tilefuse-run)"
                ),
            })?,
        };
        let local = listener.local_addr().ok();
        let port = local.map_or(port, |a| a.port());
        let ip = local.map_or(ip, |a| a.ip());
        let state = Arc::new(State {
            secret: secret.to_vec(),
            ..State::default()
        });
        let accepting = state.clone();
        std::thread::Builder::new()
            .name("tilefuse-store".into())
            .spawn(move || accept_loop(&listener, &accepting))
            .map_err(|e| Error::Store {
                addr: format!("{ip}:{port}"),
                message: format!("could not start the store thread: {e}"),
            })?;
        Ok(StoreServer { ip, port, state })
    }

    /// The port it listens on.
    pub fn port(&self) -> u16 {
        self.port
    }
}

fn read_u32(r: &mut impl Read) -> std::io::Result<u32> {
    let mut b = [0u8; 4];
    r.read_exact(&mut b)?;
    Ok(u32::from_le_bytes(b))
}

/// Accepts connections until the server closes: each served on its own thread,
/// at most [`MAX_CONNECTIONS`] at once; an accept error (descriptors run out)
/// backs off instead of spinning.
fn accept_loop(listener: &TcpListener, state: &Arc<State>) {
    use std::sync::atomic::Ordering;
    let mut next = 0u64;
    for conn in listener.incoming() {
        if state.closed.load(Ordering::SeqCst) {
            return;
        }
        let conn = match conn {
            Ok(c) => c,
            Err(_) => {
                std::thread::sleep(Duration::from_millis(50));
                continue;
            }
        };
        let Ok(c) = conn.try_clone() else {
            continue;
        };
        {
            let mut conns = state.conns.lock().unwrap_or_else(|p| p.into_inner());
            if conns.len() >= MAX_CONNECTIONS {
                continue; // dropped: closed at once
            }
            conns.insert(next, c);
        }
        let (id, mine) = (next, state.clone());
        next += 1;
        let spawned = std::thread::Builder::new()
            .name("tilefuse-store-conn".into())
            .spawn(move || {
                serve(conn, &mine);
                mine.conns
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .remove(&id);
            });
        if spawned.is_err() {
            state
                .conns
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .remove(&id);
        }
    }
}

/// A length-prefixed field, read as its bytes arrive (a length alone allocates
/// nothing), at most [`MAX_LEN`].
fn read_bytes(r: &mut impl Read) -> std::io::Result<Vec<u8>> {
    let n = read_u32(r)?;
    if n > MAX_LEN {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("a field of {n} bytes"),
        ));
    }
    let mut v = Vec::new();
    r.by_ref().take(u64::from(n)).read_to_end(&mut v)?;
    if v.len() != n as usize {
        return Err(std::io::ErrorKind::UnexpectedEof.into());
    }
    Ok(v)
}

fn write_bytes(w: &mut impl Write, b: &[u8]) -> std::io::Result<()> {
    w.write_all(&(b.len() as u32).to_le_bytes())?;
    w.write_all(b)
}

/// One client connection: requests until it closes.
fn serve(conn: TcpStream, state: &State) {
    use std::sync::atomic::Ordering;
    state.live.fetch_add(1, Ordering::SeqCst);
    serve_requests(conn, state);
    state.live.fetch_sub(1, Ordering::SeqCst);
}

/// A key was set: every request blocked on a key is awake again (each looks
/// at the map before it may sleep once more). Called under `map`'s lock.
fn awake(state: &State) {
    use std::sync::atomic::Ordering::SeqCst;
    state.generation.fetch_add(1, SeqCst);
    state.waiting.store(0, SeqCst);
    state.changed.notify_all();
}

fn serve_requests(conn: TcpStream, state: &State) {
    use std::sync::atomic::Ordering::SeqCst;
    let _ = conn.set_nodelay(true);
    // The first request must come soon; a rank's later ones may be far apart.
    let _ = conn.set_read_timeout(Some(FIRST_REQUEST));
    let Ok(read_half) = conn.try_clone() else {
        return;
    };
    let (mut r, mut w) = (BufReader::new(read_half), BufWriter::new(conn));
    // The magic, the version and the job's secret, or nothing more.
    let mut hello = [0u8; 8];
    let welcome = r.read_exact(&mut hello).is_ok()
        && &hello == HELLO
        && read_u32(&mut r).is_ok_and(|n| {
            let mut presented = Vec::new();
            n <= MAX_SECRET
                && r.by_ref()
                    .take(u64::from(n))
                    .read_to_end(&mut presented)
                    .is_ok()
                && presented.len() == n as usize
                && same_secret(&presented, &state.secret)
        });
    let answered = w.write_all(&[u8::from(!welcome)]).and_then(|()| w.flush());
    if !welcome || answered.is_err() {
        return;
    }
    let mut first = true;
    loop {
        let mut op = [0u8; 1];
        if r.read_exact(&mut op).is_err() {
            return;
        }

        let (Ok(key), Ok(value)) = (read_bytes(&mut r), read_bytes(&mut r)) else {
            return;
        };
        let mut t = [0u8; 8];
        if r.read_exact(&mut t).is_err() {
            return;
        }
        if std::mem::take(&mut first) {
            let _ = r.get_ref().set_read_timeout(None);
        }
        let timeout = Duration::from_millis(u64::from_le_bytes(t));
        let key = String::from_utf8_lossy(&key).into_owned();
        let mut map = state.map.lock().unwrap_or_else(|p| p.into_inner());
        let (status, reply): (u8, Vec<u8>) = match op[0] {
            OP_SET => {
                let old = map.get(&key).map_or(0, |v| key.len() + v.len());
                let held = state.held.load(SeqCst) - old + key.len() + value.len();
                if key.len() > MAX_KEY || held > MAX_TOTAL {
                    (REFUSED, Vec::new())
                } else {
                    state.held.store(held, SeqCst);
                    map.insert(key, value);
                    awake(state);
                    (0, Vec::new())
                }
            }
            OP_ADD => {
                let delta = value
                    .get(..8)
                    .map_or(0, |b| i64::from_le_bytes(b.try_into().unwrap_or([0; 8])));
                if key.len() > MAX_KEY {
                    return;
                }
                // The counter replaces whatever value the key held.
                let old = map.get(&key).map_or(0, |v| key.len() + v.len());
                state
                    .held
                    .store(state.held.load(SeqCst) - old + key.len() + 8, SeqCst);
                let now = map
                    .get(&key)
                    .and_then(|v| v.get(..8))
                    .map_or(0, |b| i64::from_le_bytes(b.try_into().unwrap_or([0; 8])))
                    + delta;
                map.insert(key, now.to_le_bytes().to_vec());
                awake(state);
                (0, now.to_le_bytes().to_vec())
            }
            OP_CHECK => (0, vec![u8::from(map.contains_key(&key))]),
            OP_GET => {
                let deadline = Instant::now() + timeout;
                // The generation this request went to sleep at, if it did.
                let mut asleep: Option<u64> = None;
                loop {
                    // Woken by a timeout or spuriously (no set since): awake again.
                    if asleep.take() == Some(state.generation.load(SeqCst)) {
                        state.waiting.fetch_sub(1, SeqCst);
                    }
                    if let Some(v) = map.get(&key) {
                        break (0, v.clone());
                    }
                    let left = deadline.saturating_duration_since(Instant::now());
                    if state.closed.load(SeqCst) {
                        return;
                    }
                    if left.is_zero() {
                        break (1, Vec::new());
                    }
                    asleep = Some(state.generation.load(SeqCst));
                    state.waiting.fetch_add(1, SeqCst);
                    map = state
                        .changed
                        .wait_timeout(map, left)
                        .unwrap_or_else(|p| p.into_inner())
                        .0;
                }
            }
            _ => return,
        };
        drop(map);
        let sent = w
            .write_all(&[status])
            .and_then(|()| write_bytes(&mut w, &reply))
            .and_then(|()| w.flush());
        if sent.is_err() {
            return;
        }
    }
}

/// A rank's connection to the store.
pub struct Store {
    addr: String,
    rank: usize,
    conn: Mutex<(BufReader<TcpStream>, BufWriter<TcpStream>)>,
    /// The longest a single wait may take.
    timeout: Duration,
}

impl Store {
    /// Connects to the store at `host:port`, retrying until `timeout` (rank 0 may
    /// start later than the others). `rank` names this process in errors.
    pub fn connect(
        host: &str,
        port: u16,
        rank: usize,
        timeout: Duration,
        secret: &[u8],
    ) -> Result<Store> {
        let addr = format!("{host}:{port}");
        let start = Instant::now();
        let conn = loop {
            let attempt = (host, port)
                .to_socket_addrs()
                .map_err(|e| Error::Store {
                    addr: addr.clone(),
                    message: format!("cannot resolve MASTER_ADDR `{host}`: {e}"),
                })?
                .find_map(|a| TcpStream::connect_timeout(&a, Duration::from_secs(1)).ok())
                // On loopback, a connect to a port nobody listens on can pick that
                // very port as its source and connect to itself: not the store.
                .filter(|c| c.local_addr().ok() != c.peer_addr().ok());
            if let Some(c) = attempt {
                break c;
            }
            if start.elapsed() >= timeout {
                return Err(Error::Timeout {
                    rank,
                    what: format!("the store at {addr}"),
                    waited_ms: start.elapsed().as_millis() as u64,
                    hint: "is rank 0 running, and are MASTER_ADDR and MASTER_PORT the same on every rank?"
                        .into(),
                });
            }
            std::thread::sleep(Duration::from_millis(50));
        };
        let _ = conn.set_nodelay(true);
        let read_half = conn.try_clone().map_err(|e| Error::Store {
            addr: addr.clone(),
            message: e.to_string(),
        })?;
        let (mut r, mut w) = (BufReader::new(read_half), BufWriter::new(conn));
        let len = u32::try_from(secret.len()).unwrap_or(u32::MAX);
        let mut answer = [1u8];
        let _ = r.get_ref().set_read_timeout(Some(FIRST_REQUEST));
        let greeted = w
            .write_all(HELLO)
            .and_then(|()| w.write_all(&len.to_le_bytes()))
            .and_then(|()| w.write_all(secret))
            .and_then(|()| w.flush())
            .and_then(|()| r.read_exact(&mut answer));
        let _ = r.get_ref().set_read_timeout(None);
        if greeted.is_err() || answer[0] != 0 {
            return Err(Error::Store {
                addr,
                message: format!(
                    "the store refused rank {rank}: its {SECRET_ENV} differs from rank 0's (every rank of a job needs the same; tilefuse-run sets it for one node)"
                ),
            });
        }
        Ok(Store {
            addr,
            rank,
            conn: Mutex::new((r, w)),
            timeout,
        })
    }

    /// The default bound on waits.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    fn gone(&self, e: std::io::Error) -> Error {
        Error::Store {
            addr: self.addr.clone(),
            message: format!(
                "the connection failed ({e}): the store went away; rank 0 probably exited, see its output"
            ),
        }
    }

    fn request(&self, op: u8, key: &str, value: &[u8], timeout: Duration) -> Result<(u8, Vec<u8>)> {
        let mut guard = self.conn.lock().unwrap_or_else(|p| p.into_inner());
        let (r, w) = &mut *guard;
        // The server answers a GET within `timeout`; a silent server past that
        // (and a margin) is gone.
        let _ = r
            .get_ref()
            .set_read_timeout(Some(timeout + Duration::from_secs(10)));
        let ms = timeout.as_millis().min(u64::MAX as u128) as u64;
        w.write_all(&[op])
            .and_then(|()| write_bytes(w, key.as_bytes()))
            .and_then(|()| write_bytes(w, value))
            .and_then(|()| w.write_all(&ms.to_le_bytes()))
            .and_then(|()| w.flush())
            .map_err(|e| self.gone(e))?;
        let mut status = [0u8; 1];
        r.read_exact(&mut status).map_err(|e| self.gone(e))?;
        let reply = read_bytes(r).map_err(|e| self.gone(e))?;
        Ok((status[0], reply))
    }

    /// Sets `key` to `value` (replacing it), waking everyone waiting for it.
    /// A key over 4 KiB, or a value that would take the store past 1 GiB, is
    /// refused.
    pub fn set(&self, key: &str, value: &[u8]) -> Result<()> {
        match self.request(OP_SET, key, value, Duration::ZERO)? {
            (REFUSED, _) => Err(Error::Store {
                addr: self.addr.clone(),
                message: format!(
                    "refused to set `{}` ({} key bytes, {} value bytes): keys are at most {MAX_KEY} bytes and the store holds at most {MAX_TOTAL} bytes",
                    key.chars().take(64).collect::<String>(),
                    key.len(),
                    value.len()
                ),
            }),
            _ => Ok(()),
        }
    }

    /// The value of `key`, waiting for it at most `timeout`. `what` says what the
    /// key stands for, for the error.
    pub fn get(&self, key: &str, timeout: Duration, what: &str) -> Result<Vec<u8>> {
        let start = Instant::now();
        match self.request(OP_GET, key, &[], timeout)? {
            (0, v) => Ok(v),
            _ => Err(Error::Timeout {
                rank: self.rank,
                what: format!("{what} (store key `{key}`)"),
                waited_ms: start.elapsed().as_millis() as u64,
                hint: "the rank that publishes it has not got there: it may have failed or hung (see its output), or be far behind".into(),
            }),
        }
    }

    /// Adds `delta` to the counter at `key` (0 if absent); returns the new value.
    pub fn add(&self, key: &str, delta: i64) -> Result<i64> {
        let (_, v) = self.request(OP_ADD, key, &delta.to_le_bytes(), Duration::ZERO)?;
        Ok(v.get(..8)
            .map_or(0, |b| i64::from_le_bytes(b.try_into().unwrap_or([0; 8]))))
    }

    /// Whether `key` is set, without waiting.
    pub fn check(&self, key: &str) -> Result<bool> {
        let (_, v) = self.request(OP_CHECK, key, &[], Duration::ZERO)?;
        Ok(v.first() == Some(&1))
    }

    /// Waits until all `world` ranks have called `barrier(name, ...)`; on timeout
    /// the error lists the ranks that did not arrive. Each `name` is used once.
    pub fn barrier(&self, name: &str, world: usize, timeout: Duration) -> Result<()> {
        let start = Instant::now();
        self.set(&format!("barrier/{name}/{}", self.rank), b"1")?;
        let n = self.add(&format!("barrier/{name}/count"), 1)?;
        if n as usize == world {
            self.set(&format!("barrier/{name}/done"), b"1")?;
        }
        match self.request(OP_GET, &format!("barrier/{name}/done"), &[], timeout)? {
            (0, _) => Ok(()),
            _ => {
                let mut missing = Vec::new();
                for r in 0..world {
                    if !self.check(&format!("barrier/{name}/{r}"))? {
                        missing.push(r.to_string());
                    }
                }
                Err(Error::Timeout {
                    rank: self.rank,
                    what: format!("the other ranks at barrier `{name}`"),
                    waited_ms: start.elapsed().as_millis() as u64,
                    hint: format!(
                        "rank(s) {} never arrived: they failed, hung, or run a different program path",
                        missing.join(", ")
                    ),
                })
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pair() -> (StoreServer, Store, Store) {
        let s = StoreServer::start(std::net::Ipv4Addr::LOCALHOST.into(), 0, b"job").unwrap();
        let t = Duration::from_secs(5);
        let a = Store::connect("127.0.0.1", s.port(), 0, t, b"job").unwrap();
        let b = Store::connect("127.0.0.1", s.port(), 1, t, b"job").unwrap();
        (s, a, b)
    }

    #[test]
    fn set_get_add_check() {
        let (_s, a, b) = pair();
        a.set("k", b"v").unwrap();
        assert_eq!(b.get("k", Duration::from_secs(1), "k").unwrap(), b"v");
        assert!(b.check("k").unwrap());
        assert!(!b.check("nope").unwrap());
        assert_eq!(a.add("c", 2).unwrap(), 2);
        assert_eq!(b.add("c", 3).unwrap(), 5);
    }

    #[test]
    fn get_waits_for_a_later_set() {
        let (_s, a, b) = pair();
        let h = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(200));
            a.set("late", b"x").unwrap();
        });
        let t = Instant::now();
        assert_eq!(b.get("late", Duration::from_secs(5), "late").unwrap(), b"x");
        assert!(t.elapsed() >= Duration::from_millis(150));
        h.join().unwrap();
    }

    #[test]
    fn a_missing_key_times_out_naming_it() {
        let (_s, _a, b) = pair();
        let e = b
            .get("nccl/id", Duration::from_millis(200), "the NCCL id")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("rank 1") && e.contains("the NCCL id") && e.contains("nccl/id"),
            "{e}"
        );
    }

    #[test]
    fn a_barrier_names_the_rank_that_never_arrives() {
        let (_s, a, b) = pair();
        let h = std::thread::spawn(move || a.barrier("b1", 3, Duration::from_secs(1)));
        let e = b
            .barrier("b1", 3, Duration::from_millis(300))
            .unwrap_err()
            .to_string();
        assert!(e.contains("rank(s) 2 never arrived"), "{e}");
        // Rank 0 is still waiting; it times out too (bounded).
        assert!(h.join().unwrap().is_err());
    }

    #[test]
    fn a_barrier_releases_everyone() {
        let (_s, a, b) = pair();
        let h = std::thread::spawn(move || a.barrier("b2", 2, Duration::from_secs(5)));
        b.barrier("b2", 2, Duration::from_secs(5)).unwrap();
        h.join().unwrap().unwrap();
    }

    #[test]
    fn a_store_that_goes_away_fails_the_waiting_ranks() {
        let (s, a, b) = pair();
        let h = std::thread::spawn(move || b.get("never", Duration::from_secs(30), "a key"));
        std::thread::sleep(Duration::from_millis(100));
        let t = Instant::now();
        // Rank 0 ends: its own connection first, then the server, which does
        // not wait for a rank blocked on a key nobody will set.
        drop(a);
        drop(s);
        let e = h.join().unwrap().unwrap_err().to_string();
        assert!(
            t.elapsed() < Duration::from_secs(5),
            "took {:?}",
            t.elapsed()
        );
        assert!(e.contains("went away"), "{e}");
    }

    #[test]
    fn rank_0_ending_first_waits_for_a_rank_still_talking_to_the_store() {
        let (s, a, b) = pair();
        a.set("done", b"1").unwrap();
        // Rank 0 is done; rank 1 is slower to read the outcome.
        let ending = std::thread::spawn(move || {
            drop(a);
            drop(s);
        });
        std::thread::sleep(Duration::from_millis(200));
        let got = b.get("done", Duration::from_secs(1), "the last barrier");
        assert_eq!(got.unwrap(), b"1");
        drop(b);
        ending.join().unwrap();
    }

    #[test]
    fn no_store_is_a_bounded_error() {
        // A port nobody listens on: bind one, then free it.
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let t = Instant::now();
        let e = Store::connect("127.0.0.1", port, 3, Duration::from_millis(300), b"")
            .err()
            .expect("no store there")
            .to_string();
        assert!(t.elapsed() < Duration::from_secs(5));
        assert!(
            e.contains("rank 3") && e.contains("is rank 0 running"),
            "{e}"
        );
    }
}
