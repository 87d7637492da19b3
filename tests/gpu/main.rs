//! The GPU suite: one test binary (so the bundle for the GPU machine stays small).
//! Every test skips without a GPU and says so; `TILEFUSE_REQUIRE_GPU=1` makes a
//! missing GPU a failure.

#[path = "../common/mod.rs"]
mod common;

mod atomics;
mod attention;
mod autotune;
mod bad_input;
mod barrier;
mod epilogue;
mod gathers;
mod interpret;
mod matmul;
mod pointwise;
mod primitives;
mod rows;
mod split_tail;
mod wait;
mod wgmma;

/// A test that holds the GPU and asks for it again (a helper calling `gpu()`)
/// while another test waits to hold it alone: the second ask shares the first
/// guard instead of queueing behind the writer (it deadlocked the suite once).
/// The holder runs on its own thread, so a regression fails here in seconds.
#[test]
fn asking_for_the_gpu_twice_does_not_wait_on_a_queued_writer() {
    use std::sync::mpsc::channel;
    use std::time::Duration;
    let (held_tx, held_rx) = channel();
    let (go_tx, go_rx) = channel::<()>();
    let (done_tx, done_rx) = channel();
    let holder = std::thread::spawn(move || {
        let Some(outer) = common::gpu() else {
            held_tx.send(false).unwrap();
            return;
        };
        held_tx.send(true).unwrap();
        go_rx.recv().unwrap();
        let inner = common::gpu();
        done_tx.send(inner.is_some()).unwrap();
        drop((inner, outer));
    });
    if !held_rx.recv().unwrap() {
        return; // skipped (no GPU), said by gpu()
    }
    let writer = std::thread::spawn(|| common::gpu_alone().is_some());
    // Long enough for the writer to queue on the lock.
    std::thread::sleep(Duration::from_millis(300));
    go_tx.send(()).unwrap();
    assert_eq!(
        done_rx.recv_timeout(Duration::from_secs(10)),
        Ok(true),
        "a nested gpu() waited behind the queued gpu_alone()"
    );
    holder.join().unwrap();
    assert!(writer.join().unwrap(), "the writer gets the GPU after");
}
