//! Where kernels report a `wait` that gave up, and how the host reads it back.
//!
//! Each compiled variant registers its `wait` sites and gets a base id; the kernel
//! records `base + site` in the device's status block. `check` runs after a
//! synchronize and turns a record into an [`Error`], then clears the block.

use crate::device::Device;
use crate::error::{driver, Error, Result};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};
use tilefuse_codegen::emit::prelude::{STATUS_WAIT_INDEX, STATUS_WAIT_TIMEOUT, STATUS_WORDS};

struct Sites {
    kernel: String,
    sites: Vec<String>,
}

fn registry() -> &'static Mutex<Vec<Sites>> {
    static R: OnceLock<Mutex<Vec<Sites>>> = OnceLock::new();
    R.get_or_init(Default::default)
}

/// Registers a variant's wait sites; returns the base id its kernel adds to a site index.
pub(crate) fn register(kernel: &str, sites: &[String]) -> u64 {
    let mut r = registry().lock().unwrap_or_else(|p| p.into_inner());
    r.push(Sites {
        kernel: kernel.to_string(),
        sites: sites.to_vec(),
    });
    ((r.len() - 1) as u64) << 16
}

static TIMEOUT_OVERRIDE_MS: AtomicU64 = AtomicU64::new(0);

/// Sets the wait timeout for kernels launched from now on, in this process
/// (`None`: back to `TILEFUSE_WAIT_TIMEOUT_MS` or the default).
pub fn set_wait_timeout_ms(ms: Option<u64>) {
    TIMEOUT_OVERRIDE_MS.store(
        ms.unwrap_or(0).max(u64::from(ms.is_some())),
        Ordering::Relaxed,
    );
}

/// The wait timeout kernels are launched with: [`set_wait_timeout_ms`], else
/// `TILEFUSE_WAIT_TIMEOUT_MS` (read once: positive milliseconds, at most a
/// week), else 10 s. A value that is not such a number is an error naming the
/// variable, at every launch.
pub fn wait_timeout_ms() -> crate::Result<u64> {
    let o = TIMEOUT_OVERRIDE_MS.load(Ordering::Relaxed);
    if o != 0 {
        return Ok(o);
    }
    static FROM_ENV: OnceLock<std::result::Result<u64, String>> = OnceLock::new();
    const VAR: &str = "TILEFUSE_WAIT_TIMEOUT_MS";
    FROM_ENV
        .get_or_init(|| match std::env::var(VAR) {
            Ok(v) => crate::settings::parse_millis(&v),
            Err(_) => Ok(10_000),
        })
        .clone()
        .map_err(|message| Error::Argument {
            context: "environment".into(),
            arg: VAR.into(),
            message,
        })
}

/// Reads and clears the device's status block (the stream must be synchronized).
pub(crate) fn check(dev: &Device) -> Result<()> {
    let Ok(gpu) = dev.gpu("the kernel status block") else {
        return Ok(()); // the interpreter reports a failed wait as it happens
    };
    let (stream, status) = (&gpu.stream, &gpu.status);
    let words = stream
        .clone_dtoh(status)
        .map_err(driver("reading the kernel status block"))?;
    if words.len() < STATUS_WORDS || words[0] == 0 {
        return Ok(());
    }
    let zeros = [0u64; STATUS_WORDS];
    // SAFETY: the status block holds STATUS_WORDS u64s; `zeros` outlives the
    // synchronous copy below.
    unsafe {
        let (ptr, guard) = cudarc::driver::DevicePtr::device_ptr(status, stream);
        drop(guard);
        cudarc::driver::result::memcpy_htod_async(ptr, &zeros, stream.cu_stream())
    }
    .map_err(driver("clearing the kernel status block"))?;
    // A program that gave up skipped its arrival at a split counter.
    dev.zero_split_counters()?;
    stream
        .synchronize()
        .map_err(driver("clearing the kernel status block"))?;
    let (code, site) = (words[0] as u32, words[1]);
    let (index, expected, seen) = (words[2] as i64, words[3] as i64, words[4] as i64);
    let r = registry().lock().unwrap_or_else(|p| p.into_inner());
    let (kernel, site_text) = r
        .get((site >> 16) as usize)
        .map(|s| {
            (
                s.kernel.clone(),
                s.sites
                    .get((site & 0xffff) as usize)
                    .cloned()
                    .unwrap_or_default(),
            )
        })
        .unwrap_or_else(|| ("(unknown)".into(), "(unknown)".into()));
    Err(match code {
        STATUS_WAIT_INDEX => Error::WaitIndex {
            kernel,
            site: site_text,
            index,
            len: expected,
        },
        c => {
            debug_assert_eq!(c, STATUS_WAIT_TIMEOUT);
            Error::WaitTimeout {
                kernel,
                site: site_text,
                index,
                expected,
                seen,
                // The launch that timed out read it, so it is valid.
                timeout_ms: wait_timeout_ms().unwrap_or_default(),
            }
        }
    })
}
