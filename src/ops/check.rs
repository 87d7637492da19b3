//! Argument checks shared by the ops: every mismatch is an error naming the
//! argument and what was expected.
// Sizes here come from users' arguments: arithmetic on them is checked.
#![warn(clippy::arithmetic_side_effects)]

use super::epilogue::Epilogue;
use super::Bias;
use crate::{bf16, Error, Result, Tensor};
use tilefuse_runtime::dist::ProcessGroup;

pub(crate) fn arg(op: &str, name: &str, message: impl Into<String>) -> Error {
    Error::Argument {
        context: op.into(),
        arg: name.into(),
        message: message.into(),
    }
}

/// `t` is a 2-D matrix with unit last stride on this rank's GPU; its shape.
pub(crate) fn matrix(
    pg: &ProcessGroup,
    op: &str,
    name: &str,
    t: &Tensor<bf16>,
) -> Result<[usize; 2]> {
    let [r, c] = match t.dims() {
        [r, c] => [*r, *c],
        d => {
            return Err(arg(
                op,
                name,
                format!("expected a 2-D matrix, got shape {d:?}"),
            ))
        }
    };
    if c > 1 && t.strides()[1] != 1 {
        return Err(arg(
            op,
            name,
            format!(
                "needs unit stride along its last dimension (row-major), got strides {:?}",
                t.strides()
            ),
        ));
    }
    if r == 0 || c == 0 {
        return Err(arg(op, name, format!("is empty (shape [{r}, {c}])")));
    }
    on_rank_gpu(pg, op, name, t)?;
    Ok([r, c])
}

pub(crate) fn on_rank_gpu(pg: &ProcessGroup, op: &str, name: &str, t: &Tensor<bf16>) -> Result<()> {
    if t.device().ordinal() != pg.device().ordinal() {
        return Err(arg(
            op,
            name,
            format!(
                "is on GPU {}, but this rank runs on GPU {}",
                t.device().ordinal(),
                pg.device().ordinal()
            ),
        ));
    }
    Ok(())
}

/// `t` has exactly `want` as its shape.
pub(crate) fn shape_is(
    op: &str,
    name: &str,
    got: [usize; 2],
    want: [usize; 2],
    why: &str,
) -> Result<()> {
    if got != want {
        return Err(arg(
            op,
            name,
            format!("expected shape {want:?} ({why}), got {got:?}"),
        ));
    }
    Ok(())
}

/// `value` splits evenly over the ranks.
pub(crate) fn divides(
    op: &str,
    name: &str,
    what: &str,
    value: usize,
    world: usize,
) -> Result<usize> {
    match (value.checked_rem(world), value.checked_div(world)) {
        (Some(0), Some(share)) => Ok(share),
        _ => Err(arg(
            op,
            name,
            format!("its {what} ({value}) must split evenly over the {world} ranks"),
        )),
    }
}

/// The bias as the kernels take it: one vector along rows and one along
/// columns, `zeros` (at least `max(m, n)` long) standing in for the one not given.
pub(crate) fn biases(
    pg: &ProcessGroup,
    op: &str,
    bias: Bias<'_>,
    m: usize,
    n: usize,
    zeros: &Tensor<bf16>,
) -> Result<(Tensor<bf16>, Tensor<bf16>)> {
    let vector = |t: &Tensor<bf16>, len: usize, along: &str| -> Result<Tensor<bf16>> {
        if t.dims() != [len] {
            return Err(arg(
                op,
                "bias",
                format!(
                    "a bias along the output's {along} needs shape [{len}], got {:?}",
                    t.dims()
                ),
            ));
        }
        on_rank_gpu(pg, op, "bias", t)?;
        Ok(t.clone())
    };
    Ok(match bias {
        Bias::None => (zeros.narrow(0, 0, m)?, zeros.narrow(0, 0, n)?),
        Bias::Rows(t) => (vector(t, m, "rows")?, zeros.narrow(0, 0, n)?),
        Bias::Cols(t) => (zeros.narrow(0, 0, m)?, vector(t, n, "columns")?),
    })
}

/// The number of chunks asked for (4 by default), at least 1.
pub(crate) fn chunks(op: &str, asked: Option<usize>) -> Result<usize> {
    chunks_or(op, asked, 4)
}

/// As [`chunks`], with the op's own default.
pub(crate) fn chunks_or(op: &str, asked: Option<usize>, default: usize) -> Result<usize> {
    match asked {
        Some(0) => Err(arg(op, "config.chunks", "must be at least 1")),
        Some(c) => Ok(c),
        None => Ok(default),
    }
}

/// The ops' epilogue: the caller's bias (zeros standing in for the vector not
/// given), nothing else.
pub(crate) fn bias_epilogue(
    pg: &ProcessGroup,
    op: &str,
    bias: Bias<'_>,
    m: usize,
    n: usize,
    zeros: &Tensor<bf16>,
) -> Result<Epilogue> {
    let (bias_m, bias_n) = biases(pg, op, bias, m, n, zeros)?;
    Ok(Epilogue::bias(bias_m, bias_n, !matches!(bias, Bias::None)))
}
