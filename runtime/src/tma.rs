//! TMA descriptors (`CUtensorMap`) for kernels that load tiles with the Hopper
//! tensor memory accelerator: built on the host per launch (a few hundred
//! nanoseconds) and passed by value as `__grid_constant__` parameters.

#![warn(clippy::arithmetic_side_effects)] // user shapes and strides: checked

use crate::args::TensorArg;
use crate::error::{argument, driver, Result};
use cudarc::driver::sys;
use tilefuse_codegen::DType;

/// A descriptor of the tensor `t` (2 to 5 dimensions, the last contiguous) for
/// boxes of `box_outer` rows by `box_inner` elements (one index of every other
/// dimension), 128-byte swizzle, zero fill outside. The rows run along
/// dimension `rows_axis` (0: the outermost; `None`: the one before the last).
/// The box lands in shared memory the same way whichever it is: `box_outer`
/// rows of `box_inner` elements.
pub(crate) fn tensor_map(
    t: &TensorArg,
    name: &str,
    box_inner: usize,
    box_outer: usize,
    rows_axis: Option<usize>,
) -> Result<sys::CUtensorMap> {
    let elem = t.dtype.size();
    let data_type = match t.dtype {
        DType::BF16 => sys::CUtensorMapDataType::CU_TENSOR_MAP_DATA_TYPE_BFLOAT16,
        DType::F16 => sys::CUtensorMapDataType::CU_TENSOR_MAP_DATA_TYPE_FLOAT16,
        DType::F32 => sys::CUtensorMapDataType::CU_TENSOR_MAP_DATA_TYPE_FLOAT32,
        other => {
            return Err(argument(
                "TMA descriptor",
                name,
                format!("{other} tensors are not loaded with TMA"),
            ))
        }
    };
    let rank = t.shape.len();
    // Dimensions innermost first; each outer one's stride in bytes. A dimension of
    // one index is never stepped: any valid stride stands in for its own (which
    // may be 0 or odd for a broadcast or a view). Byte counts saturate: a huge
    // one fails the `< 2^40` test below instead of wrapping into a small one.
    let dims: Vec<u64> = t.shape.iter().rev().map(|&n| n as u64).collect();
    let outer = rank.saturating_sub(1);
    let mut strides: Vec<u64> = Vec::with_capacity(outer);
    let rows_axis = rows_axis.unwrap_or(rank.saturating_sub(2));
    let mut ok = (2..=5).contains(&rank)
        && rows_axis < rank.saturating_sub(1)
        && dims.iter().all(|&n| (1..=1 << 32).contains(&n))
        && t.strides.len() == rank
        && t.strides.last() == Some(&1)
        && t.ptr % 16 == 0;
    let inner = t.shape.last().map_or(0, |&n| n as u64);
    let mut span = inner
        .saturating_mul(elem as u64)
        .div_ceil(16)
        .saturating_mul(16);
    for i in (0..outer.min(t.strides.len())).rev() {
        let bytes = (t.strides[i] as i64).saturating_mul(elem as i64);
        let s = if t.shape[i] == 1 {
            span.max(16)
        } else {
            bytes.max(0) as u64
        };
        ok &= s > 0 && s % 16 == 0 && s < (1 << 40);
        span = s.saturating_mul(t.shape[i].max(1) as u64);
        strides.push(s);
    }
    if !ok {
        return Err(argument(
            "TMA descriptor",
            name,
            format!(
                "needs a tensor of 2 to 5 dimensions of 1 to 2^32 indices with contiguous rows, a 16-byte \
                 aligned start and outer strides that are positive multiples of 16 bytes below 2^40; got \
                 shape {:?}, strides {:?} (box rows along dimension {rows_axis})",
                t.shape, t.strides
            ),
        ));
    }
    // Innermost first, as `dims`: the rows' axis counted from the last.
    let mut boxes = vec![1u32; rank];
    // `rows_axis < rank - 1` (checked above): an outer dimension.
    let rows_at = rank.saturating_sub(1).saturating_sub(rows_axis);
    boxes[0] = box_inner as u32;
    if let Some(b) = boxes.get_mut(rows_at) {
        *b = box_outer as u32;
    }
    let elem_strides = vec![1u32; rank];
    let mut map = std::mem::MaybeUninit::<sys::CUtensorMap>::zeroed();
    // SAFETY: every array holds `rank` entries (strides rank - 1); the address is
    // a live device allocation of at least `dims` elements at these strides (the
    // tensor's), and `map` is writable storage of the right size and alignment.
    unsafe {
        sys::cuTensorMapEncodeTiled(
            map.as_mut_ptr(),
            data_type,
            rank as u32,
            t.ptr as *mut std::ffi::c_void,
            dims.as_ptr(),
            strides.as_ptr(),
            boxes.as_ptr(),
            elem_strides.as_ptr(),
            sys::CUtensorMapInterleave::CU_TENSOR_MAP_INTERLEAVE_NONE,
            sys::CUtensorMapSwizzle::CU_TENSOR_MAP_SWIZZLE_128B,
            sys::CUtensorMapL2promotion::CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
            sys::CUtensorMapFloatOOBfill::CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE,
        )
        .result()
        .map_err(driver(format!("encoding the TMA descriptor of `{name}`")))?;
        Ok(map.assume_init())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::Device;

    fn arg(shape: Vec<usize>, strides: Vec<isize>) -> TensorArg {
        TensorArg {
            ptr: 0,
            dtype: DType::BF16,
            shape,
            strides,
            device: Device::interpreter(),
            host: None,
        }
    }

    #[test]
    fn strides_that_overflow_in_bytes_are_refused_not_wrapped() {
        for (shape, strides) in [
            (vec![4, 64], vec![isize::MAX, 1]),
            (vec![4, 64], vec![isize::MAX / 2 + 8, 1]),
            (vec![usize::MAX, 64], vec![64, 1]),
            (vec![4, usize::MAX], vec![64, 1]),
        ] {
            let e = tensor_map(&arg(shape.clone(), strides), "a", 64, 64, None)
                .err()
                .unwrap_or_else(|| panic!("{shape:?} was accepted"));
            assert!(e.to_string().contains("outer strides"), "{e}");
        }
    }

    #[test]
    fn ranks_outside_two_to_five_are_refused_not_indexed() {
        for (shape, strides) in [
            (vec![], vec![]),
            (vec![8], vec![1]),
            (vec![2; 6], vec![1; 6]),
        ] {
            assert!(tensor_map(&arg(shape, strides), "a", 64, 64, None).is_err());
        }
        // Strides that do not match the shape's rank.
        assert!(tensor_map(&arg(vec![4, 64], vec![1]), "a", 64, 64, None).is_err());
        // Box rows along the contiguous dimension, or past the last.
        for axis in [1, 2, usize::MAX] {
            let e = tensor_map(&arg(vec![4, 64], vec![64, 1]), "a", 64, 64, Some(axis))
                .err()
                .unwrap_or_else(|| panic!("rows along {axis} were accepted"));
            assert!(e.to_string().contains("box rows along dimension"), "{e}");
        }
    }
}
