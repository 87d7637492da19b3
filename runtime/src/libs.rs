//! Probes for the CUDA libraries. cudarc panics on the first call into a library it
//! cannot load, so every entry point checks here first and returns an error instead.

use crate::error::{Error, Result};
use std::sync::OnceLock;

const LD_HINT: &str = "put its folder on LD_LIBRARY_PATH";

/// The CUDA major version this build binds and loads (the `cuda-12` or
/// `cuda-13` feature).
#[cfg(feature = "cuda-12")]
pub const CUDA_MAJOR: u32 = 12;
/// The CUDA major version this build binds and loads (the `cuda-12` or
/// `cuda-13` feature).
#[cfg(not(feature = "cuda-12"))]
pub const CUDA_MAJOR: u32 = 13;

#[cfg(all(feature = "cuda-12", feature = "cuda-13"))]
compile_error!(
    "tilefuse: the features `cuda-12` and `cuda-13` are both on; take tilefuse with      `default-features = false, features = [\"cuda-12\"]` for CUDA 12"
);
#[cfg(not(any(feature = "cuda-12", feature = "cuda-13")))]
compile_error!(
    "tilefuse: choose the CUDA version with the feature `cuda-13` (the default) or `cuda-12`"
);

/// How to install the NVRTC this build loads.
#[cfg(feature = "cuda-12")]
const NVRTC_PIP: &str = "nvidia-cuda-nvrtc-cu12";
#[cfg(not(feature = "cuda-12"))]
const NVRTC_PIP: &str = "nvidia-cuda-nvrtc==13.0.88";

fn probe(cell: &'static OnceLock<bool>, f: unsafe fn() -> bool) -> bool {
    // SAFETY: the probe functions only try to dlopen the library and report success.
    *cell.get_or_init(|| unsafe { f() })
}

/// libcuda (the driver) can be loaded.
pub fn driver_present() -> bool {
    static P: OnceLock<bool> = OnceLock::new();
    probe(&P, cudarc::driver::sys::is_culib_present)
}

/// libnvrtc can be loaded.
pub fn nvrtc_present() -> bool {
    static P: OnceLock<bool> = OnceLock::new();
    probe(&P, cudarc::nvrtc::sys::is_culib_present)
}

/// libcublas can be loaded.
pub fn cublas_present() -> bool {
    static P: OnceLock<bool> = OnceLock::new();
    probe(&P, cudarc::cublas::sys::is_culib_present)
}

pub(crate) fn require_driver() -> Result<()> {
    if driver_present() {
        Ok(())
    } else {
        Err(Error::Unavailable {
            what: "the CUDA driver (libcuda.so.1)",
            hint: format!("this machine has no NVIDIA driver; run on a GPU machine, or {LD_HINT}"),
        })
    }
}

pub(crate) fn require_nvrtc() -> Result<()> {
    if nvrtc_present() {
        Ok(())
    } else {
        Err(Error::Unavailable {
            what: if CUDA_MAJOR == 12 {
                "NVRTC (libnvrtc.so.12)"
            } else {
                "NVRTC (libnvrtc.so.13)"
            },
            hint: format!(
                "install it (e.g. `pip install {NVRTC_PIP}`) and {LD_HINT} \
                 (the folder must also hold libnvrtc-builtins.so.{CUDA_MAJOR}.*)"
            ),
        })
    }
}

pub(crate) fn require_cublas() -> Result<()> {
    if cublas_present() {
        Ok(())
    } else {
        Err(Error::Unavailable {
            what: if CUDA_MAJOR == 12 {
                "cuBLAS (libcublas.so.12)"
            } else {
                "cuBLAS (libcublas.so.13)"
            },
            hint: LD_HINT.to_string(),
        })
    }
}

/// libnccl can be loaded.
pub fn nccl_present() -> bool {
    static P: OnceLock<bool> = OnceLock::new();
    probe(&P, cudarc::nccl::sys::is_culib_present)
}

pub(crate) fn require_nccl() -> Result<()> {
    if nccl_present() {
        Ok(())
    } else {
        Err(Error::Unavailable {
            what: "NCCL (libnccl.so)",
            hint: format!(
                "install NCCL 2.28 and {LD_HINT} (cudarc loads the unversioned libnccl.so)"
            ),
        })
    }
}
