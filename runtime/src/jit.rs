//! NVRTC: generated CUDA C → a cubin for a real GPU architecture.
//!
//! cudarc's safe NVRTC layer only returns PTX, so this goes through `nvrtc::result`
//! and `nvrtc::sys` for the cubin. Works without a GPU: only libnvrtc is needed.

use crate::cache::cubins;
use crate::error::{Error, Result};
use crate::libs;
use cudarc::nvrtc::{result as nv, sys as nvsys};
use std::ffi::{c_char, CString};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};

static COMPILES: AtomicU64 = AtomicU64::new(0);

/// How many NVRTC compiles this process has run (cubins taken from the disk cache
/// are not compiles: see [`crate::cache::cubins::hits`]).
pub fn compile_count() -> u64 {
    COMPILES.load(Ordering::Relaxed)
}

/// NVRTC's version (major, minor).
pub fn nvrtc_version() -> Result<(i32, i32)> {
    libs::require_nvrtc()?;
    let (mut maj, mut min) = (0, 0);
    // SAFETY: libnvrtc is loaded (checked above); both out-pointers are valid.
    unsafe { nvsys::nvrtcVersion(&mut maj, &mut min) }
        .result()
        .map_err(|e| nvrtc_err("(version)", "-", format!("{e:?}")))?;
    Ok((maj, min))
}

fn nvrtc_err(kernel: &str, arch: &str, log: String) -> Error {
    Error::Compile {
        kernel: kernel.to_string(),
        arch: arch.to_string(),
        log,
    }
}

/// The options every compile uses, for `arch` (e.g. `sm_90a`).
pub fn compile_options(arch: &str) -> Vec<String> {
    vec![
        format!("--gpu-architecture={arch}"),
        "-std=c++17".into(),
        "--fmad=true".into(),
    ]
}

/// A compiled kernel image and the compiler's log.
pub struct Cubin {
    pub image: Vec<u8>,
    pub log: String,
}

fn program_log(prog: nvsys::nvrtcProgram) -> String {
    // SAFETY: `prog` is a live program created by `create_program`.
    match unsafe { nv::get_program_log(prog) } {
        Ok(raw) => {
            let bytes: Vec<u8> = raw
                .iter()
                .take_while(|&&c| c != 0)
                .map(|&c| c as u8)
                .collect();
            String::from_utf8_lossy(&bytes).trim().to_string()
        }
        Err(e) => format!("(no log: {e:?})"),
    }
}

/// Compiles `source` to a cubin for `arch`, or takes it from the disk cache
/// ([`crate::cache::cubins`]); `kernel` names it in errors and dumps. With
/// `TILEFUSE_DUMP_DIR` set it always compiles, to write the compiler's report;
/// with `TILEFUSE_OVERRIDE_DIR`, a hand-edited source there is compiled in
/// place of `source` ([`crate::source_override`]).
pub fn compile_cubin(kernel: &str, source: &str, arch: &str) -> Result<Cubin> {
    let overridden = crate::source_override::lookup(kernel, arch, source)?;
    let source = overridden.as_deref().unwrap_or(source);
    if std::env::var_os("TILEFUSE_DUMP_DIR").is_some() {
        return compile(kernel, source, arch, true);
    }
    let key = cubins::key(source, arch, &compile_options(arch), nvrtc_version()?);
    if let Some(image) = cubins::load(&key) {
        return Ok(Cubin {
            image,
            log: String::new(),
        });
    }
    let c = compile(kernel, source, arch, false)?;
    cubins::store(&key, &c.image);
    Ok(c)
}

/// ptxas's resource report for `source` on `arch` (registers, shared memory, stack
/// frame, spill stores and loads), as NVRTC's log gives it.
///
/// NVRTC takes a source it compiled before (the same text and options) from the
/// CUDA compute cache (`~/.nv/ComputeCache`) without running ptxas, and its log
/// then holds no report: that is an error here, which says to set
/// `CUDA_CACHE_DISABLE=1` (the GPU bundle's NVRTC steps do).
///
/// ```no_run
/// # fn main() -> tilefuse_runtime::Result<()> {
/// let log = tilefuse_runtime::jit::resource_report("k", "extern \"C\" __global__ void k() {}", "sm_90a")?;
/// assert!(log.contains("0 bytes spill stores"));
/// # Ok(()) }
/// ```
pub fn resource_report(kernel: &str, source: &str, arch: &str) -> Result<String> {
    let log = compile(kernel, source, arch, true)?.log;
    match has_report(&log) {
        true => Ok(log),
        false => Err(nvrtc_err(kernel, arch, format!("{NO_REPORT}\n{log}"))),
    }
}

/// Why a verbose compile's log can lack ptxas's report.
const NO_REPORT: &str = "NVRTC gave no ptxas resource report: the CUDA compute cache \
     (~/.nv/ComputeCache) served this source, compiled before with the same options, \
     without running ptxas; set CUDA_CACHE_DISABLE=1 to compile it afresh";

/// Whether a verbose compile's log holds ptxas's report of a kernel.
fn has_report(log: &str) -> bool {
    log.contains("Function properties for")
}

fn compile(kernel: &str, source: &str, arch: &str, verbose: bool) -> Result<Cubin> {
    libs::require_nvrtc()?;
    let src = CString::new(source)
        .map_err(|_| nvrtc_err(kernel, arch, "source contains a NUL byte".into()))?;
    let file = CString::new(format!("{kernel}.cu")).unwrap_or_else(|_| c"kernel.cu".to_owned());
    let prog = nv::create_program(&src, Some(file.as_c_str()))
        .map_err(|e| nvrtc_err(kernel, arch, format!("{e:?}")))?;
    let mut opts = compile_options(arch);
    if verbose {
        // The log then carries ptxas's resource report (registers, spills).
        opts.push("--ptxas-options=-v".into());
    }
    COMPILES.fetch_add(1, Ordering::Relaxed);
    // SAFETY: `prog` is live; `src` and `file` outlive it; options are plain strings.
    let compiled = unsafe { nv::compile_program(prog, &opts) };
    let log = program_log(prog);
    let result = compiled
        .map_err(|e| nvrtc_err(kernel, arch, format!("{e:?}\n{log}")))
        .and_then(|()| {
            let mut size = 0usize;
            // SAFETY: `prog` compiled successfully; `size` is a valid out-pointer.
            unsafe { nvsys::nvrtcGetCUBINSize(prog, &mut size) }
                .result()
                .map_err(|e| nvrtc_err(kernel, arch, format!("getting the cubin size: {e:?}")))?;
            let mut image = vec![0u8; size];
            // SAFETY: `image` has exactly the size NVRTC reported.
            unsafe { nvsys::nvrtcGetCUBIN(prog, image.as_mut_ptr() as *mut c_char) }
                .result()
                .map_err(|e| nvrtc_err(kernel, arch, format!("getting the cubin: {e:?}")))?;
            Ok(Cubin {
                image,
                log: log.clone(),
            })
        });
    // A dump's log says why it has no report rather than being empty.
    let dumped_log = match verbose && result.is_ok() && !has_report(&log) {
        true => format!("{NO_REPORT}\n{log}"),
        false => log,
    };
    dump(
        kernel,
        arch,
        source,
        &dumped_log,
        result.as_ref().ok().map(|c| &c.image[..]),
    );
    // SAFETY: destroys the program created above, exactly once.
    let _ = unsafe { nv::destroy_program(prog) };
    result
}

/// With `TILEFUSE_DUMP_DIR=dir`, writes each generated source, its compile log and
/// the cubin (for `cuobjdump -sass` / `nvdisasm`, which need no GPU).
fn dump(kernel: &str, arch: &str, source: &str, log: &str, cubin: Option<&[u8]>) {
    let Some(dir) = std::env::var_os("TILEFUSE_DUMP_DIR") else {
        return;
    };
    let dir = PathBuf::from(dir);
    // The name `TILEFUSE_OVERRIDE_DIR` looks a source up by.
    let stem = crate::source_override::path_in(&dir, kernel, arch, source);
    let written = std::fs::create_dir_all(&dir)
        .and_then(|()| std::fs::write(stem.with_extension("cu"), source))
        .and_then(|()| std::fs::write(stem.with_extension("log"), log))
        .and_then(|()| match cubin {
            Some(image) => std::fs::write(stem.with_extension("cubin"), image),
            None => Ok(()),
        });
    if let Err(e) = written {
        crate::log::warn(format_args!(
            "TILEFUSE_DUMP_DIR: could not write {}: {e}",
            stem.display()
        ));
    }
}

#[cfg(test)]
mod tests {
    use super::has_report;

    #[test]
    fn a_log_without_ptxas_s_report_is_told_apart() {
        let report = "ptxas info    : 1 bytes gmem\nptxas info    : Compiling entry function 'tf_k' for 'sm_90a'\n\
                      ptxas info    : Function properties for tf_k\n\
                      ptxas         .     0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads\n\
                      ptxas info    : Used 56 registers, used 0 barriers";
        assert!(has_report(report));
        // What NVRTC logs when the CUDA compute cache serves the compile.
        assert!(!has_report(""));
        assert!(!has_report(
            "k.cu(3): warning #177-D: variable \"x\" was declared but never referenced"
        ));
    }
}
