//! Shared by the integration tests: skips with reasons, and the example kernels.
#![allow(dead_code)]

/// True when NVRTC can be loaded. Otherwise prints why the test is skipped, or
/// panics when `TILEFUSE_REQUIRE_NVRTC=1` (CI) or `TILEFUSE_REQUIRE_GPU=1`.
pub fn nvrtc_or_skip() -> bool {
    if tilefuse::runtime::libs::nvrtc_present() {
        return true;
    }
    let why = "NVRTC (libnvrtc.so.13) is not on the library path";
    if std::env::var("TILEFUSE_REQUIRE_NVRTC").as_deref() == Ok("1")
        || std::env::var("TILEFUSE_REQUIRE_GPU").as_deref() == Ok("1")
    {
        panic!("{why}, and TILEFUSE_REQUIRE_NVRTC/TILEFUSE_REQUIRE_GPU=1 forbids skipping");
    }
    eprintln!("SKIPPED: {why}");
    false
}

/// The example programs' kernels, compiled into the tests.
#[path = "examples.rs"]
pub mod examples;
