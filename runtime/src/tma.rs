//! TMA descriptors (`CUtensorMap`) for kernels that load tiles with the Hopper
//! tensor memory accelerator: built on the host per launch (a few hundred
//! nanoseconds) and passed by value as `__grid_constant__` parameters.

use crate::args::TensorArg;
use crate::error::{argument, driver, Result};
use cudarc::driver::sys;
use tilefuse_codegen::DType;

/// A descriptor of the 2-D tensor `t` (last dimension contiguous) for boxes of
/// `box_outer` rows by `box_inner` elements, 128-byte swizzle, zero fill outside.
pub(crate) fn tensor_map_2d(
    t: &TensorArg,
    name: &str,
    box_inner: usize,
    box_outer: usize,
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
    let row_bytes = t.strides.first().copied().unwrap_or(0) as i64 * elem as i64;
    if t.shape.len() != 2
        || t.strides[1] != 1
        || t.ptr % 16 != 0
        || row_bytes <= 0
        || row_bytes % 16 != 0
    {
        return Err(argument(
            "TMA descriptor",
            name,
            format!(
                "needs a 2-D tensor with contiguous rows, a 16-byte aligned start and a row stride that is a multiple of 16 bytes; got shape {:?}, strides {:?}",
                t.shape, t.strides
            ),
        ));
    }
    let dims: [u64; 2] = [t.shape[1] as u64, t.shape[0] as u64];
    let strides: [u64; 1] = [row_bytes as u64];
    let boxes: [u32; 2] = [box_inner as u32, box_outer as u32];
    let elem_strides: [u32; 2] = [1, 1];
    let mut map = std::mem::MaybeUninit::<sys::CUtensorMap>::zeroed();
    // SAFETY: every array holds `rank` (2) entries (strides rank - 1); the address is
    // a live device allocation of at least `dims` elements at these strides (the
    // tensor's), and `map` is writable storage of the right size and alignment.
    unsafe {
        sys::cuTensorMapEncodeTiled(
            map.as_mut_ptr(),
            data_type,
            2,
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
