//! The Hopper kernels' pipeline barriers are bounded: a barrier that never
//! completes (only a lowering bug leaves one so) stops the kernel with an error
//! after about 10 s instead of hanging the process.

use cudarc::driver::{LaunchConfig, PushKernelArg};
use std::io::Read;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};
use tilefuse::prelude::*;

/// Set in the child process that runs the stuck kernel.
const CHILD: &str = "TILEFUSE_TEST_STUCK_BARRIER_CHILD";

/// The Hopper helpers and a kernel whose barrier expects two arrivals and gets
/// one: every thread waits on it, as a consumer waits on a stage nobody fills.
fn stuck_source() -> String {
    format!(
        "{}{}{}",
        tilefuse::codegen::emit::prelude::PRELUDE,
        tilefuse::codegen::emit::HOPPER_HELPERS,
        r#"
extern "C" __global__ void tf_stuck(tf_u32* done) {
  __shared__ __align__(8) tf_u64 bar;
  const tf_u32 b = tf_smem_u32(&bar);
  if (threadIdx.x == 0) tf_mbar_init(b, 2);
  __syncthreads();
  if (threadIdx.x == 0) tf_mbar_arrive(b);
  tf_mbar_wait(b, 0);
  done[threadIdx.x] = 1;
}
"#
    )
}

#[test]
fn a_barrier_that_never_completes_stops_the_kernel() {
    let Some(_dev) = crate::wgmma::hopper_alone() else {
        return;
    };
    // The stopped kernel ends the process's CUDA context, so it runs in a child.
    let me = std::env::current_exe().expect("the test binary's path");
    let mut child = Command::new(me)
        .args([
            "--exact",
            "barrier::stuck_barrier_child",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD, "1")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawning the child test");
    let t0 = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().expect("polling the child") {
            break s;
        }
        if t0.elapsed() > Duration::from_secs(60) {
            let _ = child.kill();
            panic!("the stuck kernel still ran after 60 s: the barrier wait is not bounded");
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let mut out = String::new();
    for pipe in [
        child.stdout.take().map(|p| Box::new(p) as Box<dyn Read>),
        child.stderr.take().map(|p| Box::new(p) as Box<dyn Read>),
    ]
    .into_iter()
    .flatten()
    {
        let mut pipe = pipe;
        let _ = pipe.read_to_string(&mut out);
    }
    eprintln!("child ({status}) after {:?}:\n{out}", t0.elapsed());
    assert!(status.success(), "the child test failed:\n{out}");
    assert!(
        out.contains("stuck kernel stopped after"),
        "the child did not report the stopped kernel:\n{out}"
    );
}

/// Run by [`a_barrier_that_never_completes_stops_the_kernel`] in a child
/// process; does nothing elsewhere.
#[test]
#[ignore = "run in a child process by a_barrier_that_never_completes_stops_the_kernel"]
fn stuck_barrier_child() {
    if std::env::var_os(CHILD).is_none() {
        return;
    }
    let dev = Device::get(0).expect("GPU 0");
    let cubin = tilefuse::jit::compile_cubin("tf_stuck", &stuck_source(), &dev.arch())
        .expect("the stuck kernel compiles");
    let module = dev
        .context()
        .expect("context")
        .load_module(cudarc::nvrtc::Ptx::from_binary(cubin.image))
        .expect("loading the stuck kernel");
    let f = module.load_function("tf_stuck").expect("tf_stuck");
    let stream = dev.stream().expect("stream");
    let mut done = stream.alloc_zeros::<u32>(128).expect("alloc");
    let t0 = Instant::now();
    let cfg = LaunchConfig {
        grid_dim: (1, 1, 1),
        block_dim: (128, 1, 1),
        shared_mem_bytes: 0,
    };
    // SAFETY: tf_stuck takes one pointer to 128 u32s, which `done` holds.
    unsafe { stream.launch_builder(&f).arg(&mut done).launch(cfg) }.expect("launch");
    let e = dev
        .synchronize()
        .expect_err("a barrier that never completes must stop the kernel");
    let waited = t0.elapsed();
    let msg = e.to_string();
    println!("stuck kernel stopped after {waited:?}: {msg}");
    // 3 ticks of %globaltimer's high word (2^32 ns each): 8.6 to 12.9 s.
    assert!(
        waited >= Duration::from_secs(8) && waited <= Duration::from_secs(20),
        "stopped after {waited:?}, outside the bound's 8.6-12.9 s"
    );
    assert!(msg.contains("pipeline barrier"), "no hint in: {msg}");
}
