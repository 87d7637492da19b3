//! Config options a lowering refuses, checked the same way wherever they are
//! refused: each lowering's `check_options` picks the checks that apply to it.

use super::config_err;
use crate::config::Config;
use crate::error::CodegenError;
use crate::ir::{Kernel, Stmt};

/// The message of [`no_matmul_options`] for a kernel without a matmul.
pub(crate) const MATMUL_ONLY: &str = "`wgmma`, `persistent`, `cluster_m`, `stage`, `tma_store`, `stream_k` and `pingpong` are options of a matmul (one tile loop with `addmm`); leave them unset for this kernel";

/// Refuses the options of the GEMM lowering (`wgmma` too, unless
/// `takes_wgmma`: a lowering with a Hopper program of its own), with `message`.
pub(crate) fn no_matmul_options(
    k: &Kernel,
    c: &Config,
    takes_wgmma: bool,
    message: &str,
) -> Result<(), CodegenError> {
    if (c.wgmma && !takes_wgmma)
        || c.persistent
        || c.cluster_m != 1
        || c.stage
        || c.tma_store
        || c.stream_k
        || c.pingpong
    {
        return Err(config_err(k, c, message));
    }
    Ok(())
}

/// Refuses [`Config::occupancy`], an option of the row lowering.
pub(crate) fn no_occupancy(k: &Kernel, c: &Config) -> Result<(), CodegenError> {
    if c.occupancy != 0 {
        return Err(config_err(
            k,
            c,
            "`occupancy` is an option of the row and general lowerings; leave it 0 here",
        ));
    }
    Ok(())
}

/// The blocks an SM that `__launch_bounds__` asks for at [`Config::occupancy`]
/// (threads an SM): `None` at 0, where the lowering derives its own; an
/// error outside the block's threads to 2048.
pub(crate) fn occupancy_blocks(
    k: &Kernel,
    c: &Config,
    threads: usize,
) -> Result<Option<usize>, CodegenError> {
    match c.occupancy {
        0 => Ok(None),
        o if o >= threads && o <= 2048 => Ok(Some(o / threads)),
        o => Err(config_err(
            k,
            c,
            format!(
                "occupancy {o} must be 0 (derived) or between the block's {threads} threads and 2048"
            ),
        )),
    }
}

/// Refuses [`Config::split`] for a kernel without a loop its programs can
/// share (`general::split::find`): `why` says what such a loop is.
pub(crate) fn no_split(k: &Kernel, c: &Config, why: &str) -> Result<(), CodegenError> {
    if c.split > 1 {
        return Err(config_err(
            k,
            c,
            format!("`split` shares a reduction loop among programs; {why}: leave it 0"),
        ));
    }
    Ok(())
}

/// Refuses [`Config::overlap`], an option of the Hopper attention program.
pub(crate) fn no_overlap(k: &Kernel, c: &Config) -> Result<(), CodegenError> {
    if c.overlap {
        return Err(config_err(
            k,
            c,
            "`overlap` is an option of the Hopper attention program (`wgmma` on an attention kernel); leave it unset here",
        ));
    }
    Ok(())
}

/// Why the fast paths refuse [`Config::split`].
pub(crate) const SPLIT_GENERAL_ONLY: &str =
    "only the general lowering splits loops, and this kernel takes another";

/// Refuses loops bounded by `.until(…)`, for a lowering whose loops walk
/// their whole extent.
pub(crate) fn no_bounded_loops(k: &Kernel) -> Result<(), CodegenError> {
    let mut bounded = None;
    k.walk_stmts(&mut |s| {
        if let Stmt::Loop {
            dim,
            until: Some(_),
            ..
        } = s
        {
            bounded.get_or_insert(*dim);
        }
    });
    match bounded {
        Some(d) => Err(CodegenError::Unsupported {
            kernel: k.name.clone(),
            at: format!("for {} in tile(…).until(…)", k.dims[d].name),
            message:
                "`.until(…)` bounds the key loop of an attention kernel; other loops walk their whole extent"
                    .into(),
        }),
        None => Ok(()),
    }
}
