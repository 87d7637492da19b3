//! Probes for the CUDA libraries. cudarc panics on the first call into a library it
//! cannot load, so every entry point checks here first and returns an error instead.

use crate::error::{Error, Result};
use std::sync::OnceLock;

const LD_HINT: &str = "put its folder on LD_LIBRARY_PATH";

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
            what: "NVRTC (libnvrtc.so.13)",
            hint: format!(
                "install it (e.g. `pip install nvidia-cuda-nvrtc==13.0.88`) and {LD_HINT} \
                 (the folder must also hold libnvrtc-builtins.so.13.0)"
            ),
        })
    }
}

pub(crate) fn require_cublas() -> Result<()> {
    if cublas_present() {
        Ok(())
    } else {
        Err(Error::Unavailable {
            what: "cuBLAS (libcublas.so.13)",
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
