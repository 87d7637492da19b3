//! Tests that need a library the machine may lack skip and say why, unless
//! the run requires it.

/// True when NVRTC can be loaded. Otherwise prints why the test is skipped, or
/// panics when `TILEFUSE_REQUIRE_NVRTC=1` (CI) or `TILEFUSE_REQUIRE_GPU=1`.
pub fn nvrtc_or_skip() -> bool {
    if tilefuse_runtime::libs::nvrtc_present() {
        return true;
    }
    let why = format!(
        "NVRTC (libnvrtc.so.{}) is not on the library path",
        tilefuse_runtime::libs::CUDA_MAJOR
    );
    if std::env::var("TILEFUSE_REQUIRE_NVRTC").as_deref() == Ok("1")
        || std::env::var("TILEFUSE_REQUIRE_GPU").as_deref() == Ok("1")
    {
        panic!("{why}, and TILEFUSE_REQUIRE_NVRTC/TILEFUSE_REQUIRE_GPU=1 forbids skipping");
    }
    eprintln!("SKIPPED: {why}");
    false
}
