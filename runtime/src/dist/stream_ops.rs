//! Checked wrappers of the raw stream operations the all-gather is built from:
//! 32-bit memory writes and waits done by the stream's front end (no SM), and
//! copy-engine copies between device addresses (a peer's, through its IPC
//! mapping, included).

use crate::error::{driver, Result};
use cudarc::driver::sys;

/// Queues `*addr = value` on `stream` after its earlier work.
///
/// # Safety
/// `addr` must be a 4-byte aligned device address, in memory allocated with
/// `cuMemAlloc` (stream memory operations reject pool memory), that stays mapped
/// until the stream has run the write.
pub(crate) unsafe fn write_value(stream: sys::CUstream, addr: u64, value: u32) -> Result<()> {
    // SAFETY: the caller's contract (above) is the driver call's.
    unsafe {
        sys::cuStreamWriteValue32_v2(
            stream,
            addr,
            value,
            sys::CUstreamWriteValue_flags::CU_STREAM_WRITE_VALUE_DEFAULT as u32,
        )
    }
    .result()
    .map_err(driver("cuStreamWriteValue32"))
}

/// Queues `*addr = value` for every address of `addrs`, in order, as one batch
/// of stream memory operations: the front end runs a batch as one step, where
/// separate writes cost a few microseconds each between copies.
///
/// # Safety
/// As for [`write_value`], for every address.
pub(crate) unsafe fn write_values(stream: sys::CUstream, addrs: &[u64], value: u32) -> Result<()> {
    // The driver caps a batch's length (256 on the GPUs seen); chunks of 64
    // stay well under it.
    for part in addrs.chunks(64) {
        let mut ops: Vec<sys::CUstreamBatchMemOpParams> = part
            .iter()
            .map(|&address| {
                // SAFETY: the parameter union is plain data, valid all zeros
                // (its unused fields must be zero).
                let mut op: sys::CUstreamBatchMemOpParams = unsafe { std::mem::zeroed() };
                op.writeValue.operation =
                    sys::CUstreamBatchMemOpType::CU_STREAM_MEM_OP_WRITE_VALUE_32;
                op.writeValue.address = address;
                op.writeValue.__bindgen_anon_1.value = value;
                op
            })
            .collect();
        // SAFETY: `ops` holds `part.len()` initialized write operations, each
        // on an address the caller vouches for; the driver copies them before
        // returning.
        unsafe { sys::cuStreamBatchMemOp_v2(stream, ops.len() as u32, ops.as_mut_ptr(), 0) }
            .result()
            .map_err(driver("cuStreamBatchMemOp"))?;
    }
    Ok(())
}

/// Queues a wait until `*addr >= value` (as unsigned 32-bit) on `stream`.
///
/// # Safety
/// As for [`write_value`]. The wait has no time limit on the device: callers
/// bound it by their own host-side deadline (see `ProcessGroup::synchronize`).
pub(crate) unsafe fn wait_value_geq(stream: sys::CUstream, addr: u64, value: u32) -> Result<()> {
    // SAFETY: the caller's contract (above) is the driver call's.
    unsafe {
        sys::cuStreamWaitValue32_v2(
            stream,
            addr,
            value,
            sys::CUstreamWaitValue_flags::CU_STREAM_WAIT_VALUE_GEQ as u32,
        )
    }
    .result()
    .map_err(driver("cuStreamWaitValue32"))
}

/// Queues `len` 32-bit zeros from `addr` on `stream`.
///
/// # Safety
/// `addr .. addr + 4·len` must be 4-byte aligned device memory that stays
/// mapped until the stream has run the memset.
pub(crate) unsafe fn zero_words(stream: sys::CUstream, addr: u64, len: usize) -> Result<()> {
    // SAFETY: the caller's contract (above) is the driver call's.
    unsafe { sys::cuMemsetD32Async(addr, 0, len, stream) }
        .result()
        .map_err(driver("cuMemsetD32Async"))
}

/// Queues a copy of `bytes` from `src` to `dst` on `stream` (the copy engine).
///
/// # Safety
/// Both ranges must be mapped in this context (a peer's through IPC) and stay so
/// until the copy has run.
pub(crate) unsafe fn copy(stream: sys::CUstream, dst: u64, src: u64, bytes: usize) -> Result<()> {
    // SAFETY: the caller's contract (above) is the driver call's.
    unsafe { sys::cuMemcpyDtoDAsync_v2(dst, src, bytes, stream) }
        .result()
        .map_err(driver("cuMemcpyDtoDAsync"))
}

/// Queues a copy of `height` rows of `width_bytes` each, from rows `src_pitch`
/// bytes apart to rows `dst_pitch` bytes apart, on `stream` (the copy engine).
///
/// # Safety
/// As for [`copy`], for every row of both ranges.
pub(crate) unsafe fn copy_2d(
    stream: sys::CUstream,
    dst: u64,
    dst_pitch: usize,
    src: u64,
    src_pitch: usize,
    width_bytes: usize,
    height: usize,
) -> Result<()> {
    if height == 0 || width_bytes == 0 {
        return Ok(());
    }
    if height == 1 || (dst_pitch == width_bytes && src_pitch == width_bytes) {
        // SAFETY: contiguous rows: the one range the caller vouches for.
        return unsafe { copy(stream, dst, src, width_bytes * height) };
    }
    let p = sys::CUDA_MEMCPY2D {
        srcXInBytes: 0,
        srcY: 0,
        srcMemoryType: sys::CUmemorytype::CU_MEMORYTYPE_DEVICE,
        srcHost: std::ptr::null(),
        srcDevice: src,
        srcArray: std::ptr::null_mut(),
        srcPitch: src_pitch,
        dstXInBytes: 0,
        dstY: 0,
        dstMemoryType: sys::CUmemorytype::CU_MEMORYTYPE_DEVICE,
        dstHost: std::ptr::null_mut(),
        dstDevice: dst,
        dstArray: std::ptr::null_mut(),
        dstPitch: dst_pitch,
        WidthInBytes: width_bytes,
        Height: height,
    };
    // SAFETY: `p` describes the caller's rows (its contract above), and the
    // driver reads it before returning.
    unsafe { sys::cuMemcpy2DAsync_v2(&p, stream) }
        .result()
        .map_err(driver("cuMemcpy2DAsync"))
}
