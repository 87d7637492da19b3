//! Launches on the host device of interpret mode: the kernel's IR run by
//! `tilefuse-interpret` on the tensors' host memory, with the GPU's semantics.

use crate::args::{ScalarArg, TensorArg};
use crate::error::{Error, Result};
use crate::status;
use std::time::Duration;
use tilefuse_codegen::ir::Kernel;
use tilefuse_codegen::{Config, Planned};
use tilefuse_interpret::{HostTensor, InterpretError, Options, Scalar};

/// Runs `k` (specialized, its arguments checked) on the host, returning when
/// every program has run. A `wait` waits as long as a GPU launch's would
/// ([`status::wait_timeout_ms`]) and fails with the same error.
pub(crate) fn launch(
    k: &Planned,
    config: &Config,
    consts: &[i64],
    tensors: &[TensorArg],
    scalars: &[ScalarArg],
) -> Result<()> {
    let mut views = Vec::with_capacity(tensors.len());
    for (p, t) in k.tensors.iter().zip(tensors) {
        let Some((mem, offset)) = &t.host else {
            return Err(Error::Argument {
                context: format!("kernel `{}`", k.name),
                arg: p.name.clone(),
                message: "is a GPU tensor, and this launch runs in interpret mode on the host"
                    .into(),
            });
        };
        let view = HostTensor::view(mem.clone(), t.dtype, &t.shape, &t.strides, *offset)
            .map_err(|e| interpret_error(k, e))?;
        views.push(view);
    }
    let scalars: Vec<Scalar> = scalars
        .iter()
        .map(|s| match *s {
            ScalarArg::Int(v) => Scalar::Int(v),
            ScalarArg::Float(v) => Scalar::Float(v),
            ScalarArg::I32(v) => Scalar::I32(v),
            ScalarArg::U32(v) => Scalar::U32(v),
        })
        .collect();
    let options = Options {
        wait_timeout: Duration::from_millis(status::wait_timeout_ms()?),
        threads: threads(std::env::var("TILEFUSE_INTERPRET_THREADS").ok().as_deref())?,
    };
    tilefuse_interpret::run_with(k, config, consts, &views, &scalars, &options)
        .map_err(|e| interpret_error(k, e))
}

/// The threads interpret mode runs a launch's programs on, from
/// `TILEFUSE_INTERPRET_THREADS` (unset or 0: one per core; 1 runs them one
/// after another in grid order, for stepping through a kernel).
fn threads(var: Option<&str>) -> Result<usize> {
    match var.map(str::trim) {
        None | Some("") => Ok(0),
        Some(v) => v.parse().map_err(|_| Error::Argument {
            context: "interpret mode".into(),
            arg: "TILEFUSE_INTERPRET_THREADS".into(),
            message: format!("expected a number of threads (0: one per core), got `{v}`"),
        }),
    }
}

/// The runtime's error for an interpreter error: a failed `wait` is the GPU's
/// [`Error::WaitTimeout`], a bad argument an [`Error::Argument`].
fn interpret_error(k: &Kernel, e: InterpretError) -> Error {
    match e {
        InterpretError::WaitTimeout {
            kernel,
            at,
            index,
            expected,
            seen,
            timeout_ms,
        } => Error::WaitTimeout {
            kernel,
            site: at,
            index,
            expected,
            seen,
            timeout_ms,
        },
        InterpretError::Argument { arg, message, .. } => Error::Argument {
            context: format!("kernel `{}` (interpret mode)", k.name),
            arg,
            message,
        },
        other => Error::Interpret(Box::new(other)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn interpret_threads_come_from_the_environment_variable() {
        assert_eq!(threads(None).unwrap(), 0);
        assert_eq!(threads(Some(" 1 ")).unwrap(), 1);
        let e = threads(Some("many")).unwrap_err().to_string();
        assert!(
            e.contains("TILEFUSE_INTERPRET_THREADS") && e.contains("many"),
            "{e}"
        );
    }

    /// Interpret mode's timeout reads as the GPU's, word for word (the two
    /// crates each hold the text: this keeps them from drifting apart).
    #[test]
    fn a_wait_timeout_reads_as_on_the_gpu() {
        let from_interpreter = InterpretError::WaitTimeout {
            kernel: "k".into(),
            at: "wait(flags, i, 3)".into(),
            index: 2,
            expected: 3,
            seen: 1,
            timeout_ms: 150,
        };
        let text = from_interpreter.to_string();
        let k = Kernel::empty("k");
        let mapped = interpret_error(&k, from_interpreter);
        assert!(matches!(mapped, Error::WaitTimeout { .. }));
        assert_eq!(mapped.to_string(), text);
    }
}
