//! Where kernels run in this process: on the GPU, or on the CPU in interpret
//! mode (`tilefuse-interpret`), decided once.
//!
//! - `TILEFUSE_INTERPRET=1` (or `true`): interpret mode, even with a GPU present;
//! - `TILEFUSE_INTERPRET=0` (or `false`): the GPU, and an error where there is none;
//! - unset: the GPU when one is usable, else interpret mode, with a one-line
//!   notice on stderr saying so (`TILEFUSE_REQUIRE_GPU=1` turns that fallback
//!   into the error instead, for test runs that must use the GPU).
//!
//! In interpret mode [`crate::Device::current`] is the host: tensors live in host
//! memory, kernels run through the interpreter, `synchronize` returns at once, and
//! what only a GPU can do (NCCL, graphs, TMA) is an error that says so.

use crate::error::{Error, Result};
use std::sync::{Mutex, OnceLock};

/// Where kernels run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Compiled by NVRTC, launched on a GPU.
    Gpu,
    /// Run on the CPU by the interpreter, with the GPU's semantics.
    Interpret,
}

fn chosen() -> &'static Mutex<Option<Mode>> {
    static M: OnceLock<Mutex<Option<Mode>>> = OnceLock::new();
    M.get_or_init(Default::default)
}

/// This process's mode, decided on the first call (see the module docs).
pub fn mode() -> Result<Mode> {
    let mut m = chosen().lock().unwrap_or_else(|p| p.into_inner());
    if let Some(m) = *m {
        return Ok(m);
    }
    let decided = decide()?;
    *m = Some(decided);
    Ok(decided)
}

/// Whether kernels run in interpret mode (false when the mode cannot be decided:
/// the error comes from the call that needs a device).
pub fn interpreting() -> bool {
    matches!(mode(), Ok(Mode::Interpret))
}

/// Chooses the mode before anything decided it (tests, tools). An error when
/// the process already runs in the other mode.
///
/// ```
/// use tilefuse_runtime::mode::{set_mode, Mode};
/// set_mode(Mode::Interpret).unwrap();
/// assert!(set_mode(Mode::Interpret).is_ok());
/// assert!(set_mode(Mode::Gpu).is_err());
/// ```
pub fn set_mode(want: Mode) -> Result<()> {
    let mut m = chosen().lock().unwrap_or_else(|p| p.into_inner());
    match *m {
        Some(have) if have != want => Err(Error::Argument {
            context: "tilefuse::runtime::mode::set_mode".into(),
            arg: "mode".into(),
            message: format!(
                "this process already runs in {have:?} mode (devices and tensors exist); \
                 choose the mode before the first device or tensor"
            ),
        }),
        _ => {
            *m = Some(want);
            Ok(())
        }
    }
}

/// The mode a value of `TILEFUSE_INTERPRET` asks for (`None`: unset, decide
/// by the GPU), for tools that start processes and must read it as they will.
///
/// ```
/// use tilefuse_runtime::mode::{asked, Mode};
/// assert_eq!(asked(Some("false")).unwrap(), Some(Mode::Gpu));
/// assert!(asked(Some("maybe")).is_err());
/// ```
pub fn asked(value: Option<&str>) -> Result<Option<Mode>> {
    match value {
        None => Ok(None),
        Some("1") | Some("true") => Ok(Some(Mode::Interpret)),
        Some("0") | Some("false") | Some("") => Ok(Some(Mode::Gpu)),
        Some(other) => Err(Error::Argument {
            context: "the environment".into(),
            arg: "TILEFUSE_INTERPRET".into(),
            message: format!(
                "`{other}`: expected 1 or true (interpret mode), 0 or false (the GPU)"
            ),
        }),
    }
}

fn decide() -> Result<Mode> {
    if let Some(m) = asked(std::env::var("TILEFUSE_INTERPRET").ok().as_deref())? {
        return Ok(m);
    }
    if std::env::var("TILEFUSE_REQUIRE_GPU").as_deref() == Ok("1") {
        return Ok(Mode::Gpu);
    }
    match crate::Device::count() {
        Ok(n) if n > 0 => Ok(Mode::Gpu),
        outcome => {
            let why = match outcome {
                Ok(_) => "the driver sees no GPU".to_string(),
                Err(e) => e.to_string(),
            };
            eprintln!(
                "tilefuse: no GPU ({why}); running kernels in interpret mode on the CPU \
                 (TILEFUSE_INTERPRET=0 makes this an error)"
            );
            Ok(Mode::Interpret)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_variable_is_read_strictly() {
        assert_eq!(asked(None).unwrap(), None);
        assert_eq!(asked(Some("1")).unwrap(), Some(Mode::Interpret));
        assert_eq!(asked(Some("true")).unwrap(), Some(Mode::Interpret));
        assert_eq!(asked(Some("0")).unwrap(), Some(Mode::Gpu));
        let e = asked(Some("yes")).unwrap_err().to_string();
        assert!(
            e.contains("TILEFUSE_INTERPRET") && e.contains("`yes`"),
            "{e}"
        );
    }
}
