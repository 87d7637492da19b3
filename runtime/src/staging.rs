//! Staged matmul operands: before a launch compiled with `Config::stage`, each
//! operand the lowering listed (`Lowered::staged`, unaligned rows) is copied into
//! device scratch whose rows start on 16-byte boundaries, and the kernel reads
//! that copy. See `tilefuse_codegen::staging` for which operands and why.

#![warn(clippy::arithmetic_side_effects)] // user shapes and strides: checked

use crate::args::TensorArg;
use crate::device::Device;
use crate::error::{argument, driver, Error, Result};
use cudarc::driver::sys;
use cudarc::driver::{CudaSlice, DevicePtr};
use tilefuse_codegen::ir::Kernel;

/// Where each copy starts in the scratch: a multiple of this (TMA wants 16 bytes;
/// 256 keeps copies off each other's cache lines).
const COPY_ALIGN: usize = 256;
/// Rows of a copy start this far apart at least: a multiple of 16 bytes.
const ROW_ALIGN: usize = 16;

/// A device's scratch for staged operands, grown on demand and reused (launches
/// are ordered on the device's stream, so one scratch serves them all).
#[derive(Default)]
pub(crate) struct Scratch {
    buf: Option<CudaSlice<u8>>,
    /// Bumped when the buffer is replaced: a CUDA graph captured before holds
    /// the old address (see [`crate::graph`]).
    pub(crate) generation: u64,
}

/// One operand's copy: its place in the scratch and its row pitch, in bytes.
struct Copy {
    tensor: usize,
    offset: usize,
    pitch: usize,
    rows: usize,
    row_bytes: usize,
}

/// Where copies of operands `(tensor, rows, bytes per row)` go in the scratch,
/// and the bytes they need; `None` where a size overflows.
fn layout(operands: impl IntoIterator<Item = (usize, usize, usize)>) -> Option<(Vec<Copy>, usize)> {
    let mut copies = Vec::new();
    let mut end = 0usize;
    for (t, rows, row_bytes) in operands {
        let pitch = row_bytes.checked_next_multiple_of(ROW_ALIGN)?;
        let offset = end.checked_next_multiple_of(COPY_ALIGN)?;
        end = offset.checked_add(rows.checked_mul(pitch)?)?;
        copies.push(Copy {
            tensor: t,
            offset,
            pitch,
            rows,
            row_bytes,
        });
    }
    Some((copies, end))
}

impl Device {
    /// Queues copies of `tensors[staged]` (2-D, contiguous along their last
    /// dimension) into aligned scratch on the launch stream, and returns the
    /// arguments of `k` with those tensors replaced by their copies.
    pub(crate) fn stage_operands(
        &self,
        k: &Kernel,
        tensors: &[TensorArg],
        staged: &[usize],
    ) -> Result<Vec<TensorArg>> {
        let mut out = tensors.to_vec();
        if staged.is_empty() {
            return Ok(out);
        }
        let overflow = || {
            argument(
                format!("kernel `{}`", k.name),
                "(staged operands)",
                "their aligned copies' bytes overflow the address space",
            )
        };
        let (copies, bytes) = layout(staged.iter().map(|&t| {
            (
                t,
                tensors[t].shape[0],
                tensors[t].shape[1].saturating_mul(tensors[t].dtype.size()),
            )
        }))
        .ok_or_else(overflow)?;
        let stream = &self.gpu("staging operands")?.stream;
        let mut s = self.staging.lock().unwrap_or_else(|p| p.into_inner());
        let size = bytes.checked_next_power_of_two().ok_or_else(overflow)?;
        if s.buf.as_ref().is_none_or(|b| b.len() < bytes) {
            // Inside a graph capture an allocation on the stream would belong to
            // the graph, and the scratch kept here would be invalid outside it.
            if self.is_capturing()? {
                return Err(Error::Driver {
                    context: format!("growing the scratch for the staged operands of `{}`", k.name),
                    message: "the launch stream is capturing a CUDA graph; queue the work once outside the capture first, so the scratch has its size before".into(),
                });
            }
            // The old buffer is freed in stream order, after the launches using it.
            s.generation = s.generation.wrapping_add(1);
            s.buf = Some(
                // SAFETY: every byte a kernel reads from the scratch is written by
                // the copies queued below, before that kernel on the same stream.
                unsafe { stream.alloc::<u8>(size) }
                    .map_err(driver("allocating scratch for staged operands"))?,
            );
        }
        let Some(buf) = &s.buf else {
            unreachable!("the buffer was just allocated");
        };
        let (base, guard) = buf.device_ptr(stream);
        drop(guard);
        for c in &copies {
            let src = &tensors[c.tensor];
            let name = k.tensors[c.tensor].name.as_str();
            let esize = src.dtype.size();
            let dst = base.checked_add(c.offset as u64).ok_or_else(overflow)?;
            // A row stride in bytes (saturated: a huge one never overlaps).
            let stride = src.strides[0];
            let pitch = (stride.max(0) as usize).saturating_mul(esize);
            if c.rows > 0 && c.row_bytes > 0 {
                if stride < 0 || (pitch < c.row_bytes && c.rows > 1) {
                    return Err(argument(
                        format!("kernel `{}`", k.name),
                        name,
                        format!(
                            "has overlapping or reversed rows (row stride {stride} for {} columns); it cannot be staged into aligned rows: pass a contiguous copy, or a config without `stage`",
                            src.shape[1]
                        ),
                    ));
                }
                let copy = sys::CUDA_MEMCPY2D {
                    srcXInBytes: 0,
                    srcY: 0,
                    srcMemoryType: sys::CUmemorytype::CU_MEMORYTYPE_DEVICE,
                    srcHost: std::ptr::null(),
                    srcDevice: src.ptr,
                    srcArray: std::ptr::null_mut(),
                    srcPitch: pitch.max(c.row_bytes),
                    dstXInBytes: 0,
                    dstY: 0,
                    dstMemoryType: sys::CUmemorytype::CU_MEMORYTYPE_DEVICE,
                    dstHost: std::ptr::null_mut(),
                    dstDevice: dst,
                    dstArray: std::ptr::null_mut(),
                    dstPitch: c.pitch,
                    WidthInBytes: c.row_bytes,
                    Height: c.rows,
                };
                // SAFETY: the source rows lie inside a live tensor on this device
                // (its sizes were checked against the kernel's extents), the
                // destination rows inside the scratch (`layout` sized it), and the
                // copy is queued on the stream the kernel then runs on.
                unsafe { sys::cuMemcpy2DAsync_v2(&copy, stream.cu_stream()) }
                    .result()
                    .map_err(driver(format!(
                        "copying operand `{name}` of `{}` into aligned rows",
                        k.name
                    )))?;
            }
            let t = &mut out[c.tensor];
            t.ptr = dst;
            t.strides = vec![c.pitch.checked_div(esize).unwrap_or(0) as isize, 1];
        }
        Ok(out)
    }

    /// How many times the staging scratch was reallocated.
    pub(crate) fn staging_generation(&self) -> u64 {
        self.staging
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .generation
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn copies_start_aligned_with_rows_of_whole_16_bytes() {
        // bf16 A 777x3333 and B 3333x2222, as a ragged benchmark shape stages them.
        let (c, bytes) = layout([(0, 777, 3333 * 2), (1, 3333, 2222 * 2)]).expect("fits");
        assert_eq!((c[0].offset, c[0].pitch), (0, 6672));
        assert_eq!(c[1].pitch, 4448);
        assert_eq!(c[1].offset % COPY_ALIGN, 0);
        assert!(c[1].offset >= 777 * 6672);
        assert_eq!(bytes, c[1].offset + 3333 * 4448);
        // Aligned rows keep their length; empty operands take no room.
        let (c, bytes) = layout([(2, 4, 64), (3, 0, 6)]).expect("fits");
        assert_eq!((c[0].pitch, c[1].offset, bytes), (64, 256, 256));
    }

    #[test]
    fn copies_whose_bytes_overflow_are_refused() {
        assert!(layout([(0, usize::MAX, 64)]).is_none());
        assert!(layout([(0, 2, usize::MAX)]).is_none());
        assert!(layout([(0, 1, 64), (1, usize::MAX / 64, 64)]).is_none());
    }
}
