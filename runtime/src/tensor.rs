// Shapes, strides and offsets come from users: arithmetic on them is checked
// where it enters (`checked_numel`, the view constructors) and allowed, with
// the invariant that bounds it, where it runs on a tensor already built.
#![warn(clippy::arithmetic_side_effects)]
//! `Tensor<T>`: a strided view of a device buffer.

use crate::buffer::{Buffer, Memory};
use crate::device::Device;
use crate::element::Element;
use crate::error::{argument, driver, Result};
use std::marker::PhantomData;
use std::sync::Arc;
use tilefuse_codegen::DType;

/// An n-dimensional array on one GPU (or, in interpret mode, in host memory): a
/// shared buffer, an element offset, a shape and strides (in elements). Views
/// (`t()`, `narrow`) share the buffer.
///
/// ```no_run
/// use tilefuse_runtime::Tensor;
/// use half::bf16;
/// let a = Tensor::<bf16>::from_slice(&vec![bf16::ONE; 6], [2, 3])?;
/// assert_eq!(a.shape(), [2, 3]);
/// assert_eq!(a.t()?.shape(), [3, 2]);
/// # Ok::<(), tilefuse_runtime::Error>(())
/// ```
pub struct Tensor<T: Element> {
    buf: Arc<Buffer>,
    offset: usize,
    shape: Vec<usize>,
    strides: Vec<isize>,
    _t: PhantomData<T>,
}

impl<T: Element> Clone for Tensor<T> {
    /// A second handle to the same memory (not a copy of the data).
    fn clone(&self) -> Self {
        Tensor {
            buf: self.buf.clone(),
            offset: self.offset,
            shape: self.shape.clone(),
            strides: self.strides.clone(),
            _t: PhantomData,
        }
    }
}

impl<T: Element> std::fmt::Debug for Tensor<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Tensor<{}>(shape {:?}, strides {:?}, device {})",
            T::DTYPE,
            self.shape,
            self.strides,
            self.buf.dev.ordinal()
        )
    }
}

/// The bytes of a slice of elements (all of them plain numbers: no padding, any
/// bit pattern valid).
fn as_bytes<T: Element>(data: &[T]) -> &[u8] {
    // SAFETY: `Element` types are bf16, f16, f32, i32, u32 and i64: no padding and
    // no invalid bit patterns; the byte slice covers exactly the same memory.
    unsafe { std::slice::from_raw_parts(data.as_ptr().cast::<u8>(), std::mem::size_of_val(data)) }
}

fn as_bytes_mut<T: Element>(data: &mut [T]) -> &mut [u8] {
    // SAFETY: as in `as_bytes`; every byte pattern written is a valid element.
    unsafe {
        std::slice::from_raw_parts_mut(data.as_mut_ptr().cast::<u8>(), std::mem::size_of_val(data))
    }
}

/// The element count of `shape`, checked: the product of its dimensions (each
/// counted as at least 1, as the strides count them) times the element size
/// fits an `isize`, so every stride, offset and byte count of a tensor of this
/// shape does too. An error names `context` and `arg` otherwise.
pub(crate) fn checked_numel<T>(context: &str, arg: &str, shape: &[usize]) -> Result<usize> {
    let elem = std::mem::size_of::<T>();
    let span = shape
        .iter()
        .try_fold(elem, |bytes, &d| bytes.checked_mul(d.max(1)));
    match span {
        Some(bytes) if bytes <= isize::MAX as usize => Ok(shape.iter().product()),
        _ => Err(argument(
            context,
            arg,
            format!("{shape:?} of {elem}-byte elements overflows the address space"),
        )),
    }
}

/// The bytes of a contiguous `shape` of `T`, checked as [`checked_numel`] checks it.
pub(crate) fn checked_bytes<T>(context: &str, arg: &str, shape: &[usize]) -> Result<usize> {
    let n = checked_numel::<T>(context, arg, shape)?;
    n.checked_mul(std::mem::size_of::<T>()).ok_or_else(|| {
        argument(
            context,
            arg,
            format!("{shape:?} overflows the address space"),
        )
    })
}

/// Row-major strides of `shape` (checked by [`checked_numel`]: they cannot overflow).
#[allow(
    clippy::arithmetic_side_effects,
    reason = "checked_numel bounds every partial product by isize::MAX"
)]
fn contiguous_strides(shape: &[usize]) -> Vec<isize> {
    let mut strides = vec![1isize; shape.len()];
    for i in (0..shape.len().saturating_sub(1)).rev() {
        strides[i] = strides[i + 1] * shape[i + 1].max(1) as isize;
    }
    strides
}

// A built tensor's span, strides, offset and byte counts fit an isize (its
// shape passed `checked_numel`, its views stay inside its buffer), so the
// arithmetic on them below cannot overflow; user offsets are checked first.
#[allow(
    clippy::arithmetic_side_effects,
    reason = "bounded by the tensor's invariant: every view lies inside its buffer"
)]
impl<T: Element> Tensor<T> {
    /// An uninitialized contiguous tensor on `device`, in `memory`.
    pub fn empty_in(
        device: &Arc<Device>,
        shape: impl AsRef<[usize]>,
        memory: Memory,
    ) -> Result<Tensor<T>> {
        let shape = shape.as_ref();
        let bytes = checked_bytes::<T>("Tensor allocation", "shape", shape)?;
        Ok(Tensor {
            buf: Arc::new(Buffer::alloc(device, bytes, memory)?),
            offset: 0,
            strides: contiguous_strides(shape),
            shape: shape.to_vec(),
            _t: PhantomData,
        })
    }

    /// A contiguous view of `shape` starting `byte_offset` bytes into `buf` (a
    /// multiple of the element size; the callers check the end is inside).
    pub(crate) fn from_buffer_at(
        buf: Arc<Buffer>,
        byte_offset: usize,
        shape: &[usize],
    ) -> Tensor<T> {
        let elem = std::mem::size_of::<T>();
        debug_assert!(byte_offset % elem == 0);
        debug_assert!(byte_offset + shape.iter().product::<usize>() * elem <= buf.bytes);
        Tensor {
            buf,
            offset: byte_offset / elem,
            strides: contiguous_strides(shape),
            shape: shape.to_vec(),
            _t: PhantomData,
        }
    }

    /// Whether this tensor's memory is `buf`.
    pub(crate) fn is_in(&self, buf: &Arc<Buffer>) -> bool {
        Arc::ptr_eq(&self.buf, buf)
    }

    /// An uninitialized contiguous tensor on the current device.
    pub fn empty(shape: impl AsRef<[usize]>) -> Result<Tensor<T>> {
        Tensor::empty_in(&Device::current()?, shape, Memory::Pooled)
    }

    /// An uninitialized contiguous tensor on `device`.
    pub fn empty_on(device: &Arc<Device>, shape: impl AsRef<[usize]>) -> Result<Tensor<T>> {
        Tensor::empty_in(device, shape, Memory::Pooled)
    }

    /// A tensor of zeros on the current device.
    pub fn zeros(shape: impl AsRef<[usize]>) -> Result<Tensor<T>> {
        Tensor::zeros_on(&Device::current()?, shape)
    }

    /// Sets every element to zero (every byte 0: `0.0`, `0`, `false`), queued on
    /// the device's launch stream: what an accumulator needs before a kernel
    /// adds into it with `atomic_add`. The tensor must be contiguous.
    ///
    /// ```ignore
    /// counts.zero()?;
    /// histogram(&x, &counts)?;
    /// ```
    pub fn zero(&self) -> Result<()> {
        if !self.is_contiguous() {
            return Err(argument(
                "Tensor::zero",
                "self",
                format!(
                    "is a strided view (shape {:?}, strides {:?}); zero a contiguous tensor",
                    self.shape, self.strides
                ),
            ));
        }
        let size = std::mem::size_of::<T>();
        self.buf
            .fill_range(self.offset * size, self.numel() * size, 0)
    }

    /// A zeroed contiguous tensor on `device`.
    pub fn zeros_on(device: &Arc<Device>, shape: impl AsRef<[usize]>) -> Result<Tensor<T>> {
        let t = Tensor::empty_on(device, shape)?;
        t.buf.fill_bytes(0)?;
        Ok(t)
    }

    /// A tensor filled with `value`, on the current device.
    pub fn full(shape: impl AsRef<[usize]>, value: T) -> Result<Tensor<T>> {
        let shape = shape.as_ref();
        let n = checked_numel::<T>("Tensor::full", "shape", shape)?;
        Tensor::from_slice(&vec![value; n], shape)
    }

    /// Copies row-major host data into a new tensor on the current device.
    pub fn from_slice(data: &[T], shape: impl AsRef<[usize]>) -> Result<Tensor<T>> {
        Tensor::from_slice_on(&Device::current()?, data, shape)
    }

    /// Copies row-major host data into a new tensor on `device`.
    pub fn from_slice_on(
        device: &Arc<Device>,
        data: &[T],
        shape: impl AsRef<[usize]>,
    ) -> Result<Tensor<T>> {
        let shape = shape.as_ref();
        let n = checked_numel::<T>("Tensor::from_slice", "shape", shape)?;
        if data.len() != n {
            return Err(argument(
                "Tensor::from_slice",
                "data",
                format!("has {} elements but shape {shape:?} needs {n}", data.len()),
            ));
        }
        let mut t = Tensor::empty_on(device, shape)?;
        t.copy_from_slice(data)?;
        Ok(t)
    }

    /// Overwrites a contiguous tensor with row-major host data.
    pub fn copy_from_slice(&mut self, data: &[T]) -> Result<()> {
        if !self.is_contiguous() || data.len() != self.numel() {
            return Err(argument(
                "Tensor::copy_from_slice",
                "data",
                format!(
                    "needs a contiguous destination and {} elements; got {} elements for {:?}",
                    self.numel(),
                    data.len(),
                    self
                ),
            ));
        }
        if data.is_empty() {
            return Ok(());
        }
        if let Some(mem) = &self.buf.host {
            return mem
                .write_bytes(self.offset * std::mem::size_of::<T>(), as_bytes(data))
                .map_err(|e| argument("Tensor::copy_from_slice", "data", e.to_string()));
        }
        let stream = self.buf.dev.stream()?;
        self.buf
            .dev
            .context()?
            .bind_to_thread()
            .map_err(driver("binding the GPU context"))?;
        // SAFETY: the destination range [offset, offset + len) lies inside the buffer
        // (a contiguous view of `numel` elements). The copy is synchronous, so `data`
        // only needs to live for the call.
        unsafe {
            cudarc::driver::result::memcpy_htod_async(self.device_ptr(), data, stream.cu_stream())
                .and_then(|()| stream.synchronize())
        }
        .map_err(driver("copying host data to the GPU"))
    }

    /// Copies the tensor to the host, row-major (views are gathered). Synchronizes
    /// the device first, so a kernel's failed `wait` is reported here.
    pub fn to_vec(&self) -> Result<Vec<T>> {
        let dev = &self.buf.dev;
        dev.synchronize()?;
        // The span of buffer elements this view touches (strides are non-negative).
        let span = 1 + self
            .shape
            .iter()
            .zip(&self.strides)
            .map(|(&n, &s)| n.saturating_sub(1) * s.unsigned_abs())
            .sum::<usize>();
        if self.numel() == 0 {
            return Ok(Vec::new());
        }
        let mut all = vec![T::default(); span];
        if let Some(mem) = &self.buf.host {
            mem.read_bytes(
                self.offset * std::mem::size_of::<T>(),
                as_bytes_mut(&mut all),
            )
            .map_err(|e| argument("Tensor::to_vec", "self", e.to_string()))?;
        } else {
            dev.context()?
                .bind_to_thread()
                .map_err(driver("binding the GPU context"))?;
            // SAFETY: `span` elements from this view's first element stay inside the
            // buffer (the view was built inside it), and `all` holds exactly that many.
            unsafe { cudarc::driver::result::memcpy_dtoh_sync(&mut all, self.device_ptr()) }
                .map_err(driver("copying a tensor to the host"))?;
        }
        if self.is_contiguous() {
            all.truncate(self.numel());
            return Ok(all);
        }
        let mut out = Vec::with_capacity(self.numel());
        let mut idx = vec![0usize; self.rank()];
        for _ in 0..self.numel() {
            let off: isize = idx
                .iter()
                .zip(&self.strides)
                .map(|(&i, &s)| i as isize * s)
                .sum();
            out.push(all[off as usize]);
            for d in (0..idx.len()).rev() {
                idx[d] += 1;
                if idx[d] < self.shape[d] {
                    break;
                }
                idx[d] = 0;
            }
        }
        Ok(out)
    }

    /// The shape as an array, for destructuring: `let [m, k] = a.shape();`.
    ///
    /// # Panics
    /// If the tensor does not have `N` dimensions. Kernel arguments are checked
    /// before the kernel's host code runs, so inside a `#[fused_kernel]` this holds.
    pub fn shape<const N: usize>(&self) -> [usize; N] {
        match <[usize; N]>::try_from(self.shape.as_slice()) {
            Ok(s) => s,
            Err(_) => panic!("tensor has shape {:?}, not {N} dimensions", self.shape),
        }
    }

    /// The shape as a slice.
    pub fn dims(&self) -> &[usize] {
        &self.shape
    }

    /// The size along dimension `d`.
    ///
    /// # Panics
    /// If `d >= rank`.
    pub fn size(&self, d: usize) -> usize {
        self.shape[d]
    }

    pub fn rank(&self) -> usize {
        self.shape.len()
    }

    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }

    /// Strides in elements.
    pub fn strides(&self) -> &[isize] {
        &self.strides
    }

    pub fn dtype(&self) -> DType {
        T::DTYPE
    }

    pub fn device(&self) -> &Arc<Device> {
        &self.buf.dev
    }

    /// Where the tensor's memory comes from.
    pub fn memory(&self) -> Memory {
        self.buf.memory
    }

    /// Row-major with no gaps.
    pub fn is_contiguous(&self) -> bool {
        let mut expect = 1isize;
        for (&n, &s) in self.shape.iter().zip(&self.strides).rev() {
            if n != 1 && s != expect {
                return false;
            }
            expect *= n as isize;
        }
        true
    }

    /// The host memory of a tensor in interpret mode, and the element offset of
    /// its first element in it; `None` for a GPU tensor.
    pub fn host_memory(&self) -> Option<(&Arc<tilefuse_interpret::HostMemory>, usize)> {
        self.buf.host.as_ref().map(|m| (m, self.offset))
    }

    /// Device address of the first element (in interpret mode, its host address).
    pub fn device_ptr(&self) -> u64 {
        self.buf.ptr + (self.offset * std::mem::size_of::<T>()) as u64
    }

    /// Copies `src` into this tensor (same shape; each a 1-D contiguous tensor or
    /// a 2-D view with unit last stride), queued on the device's launch stream.
    pub fn copy_from(&self, src: &Tensor<T>) -> Result<()> {
        let ctx = "Tensor::copy_from";
        if src.dims() != self.dims() {
            return Err(argument(
                ctx,
                "src",
                format!(
                    "has shape {:?}; this tensor has {:?}",
                    src.dims(),
                    self.dims()
                ),
            ));
        }
        if src.device().ordinal() != self.device().ordinal() {
            return Err(argument(ctx, "src", "is on another GPU"));
        }
        let (rows, cols, dst_pitch) = self.row_layout(ctx, "self")?;
        let (_, _, src_pitch) = src.row_layout(ctx, "src")?;
        let elem = std::mem::size_of::<T>();
        if let (Some(dst), Some(from)) = (&self.buf.host, &src.buf.host) {
            // Row by row through a host copy: the rows may overlap when both are
            // views of one buffer, as `cuMemcpy2D`'s may not.
            let mut row = vec![0u8; cols * elem];
            for r in 0..rows {
                let bad =
                    |e: tilefuse_interpret::InterpretError| argument(ctx, "src", e.to_string());
                from.read_bytes((src.offset + r * src_pitch) * elem, &mut row)
                    .map_err(bad)?;
                dst.write_bytes((self.offset + r * dst_pitch) * elem, &row)
                    .map_err(bad)?;
            }
            return Ok(());
        }
        let dev = self.device();
        dev.context()?
            .bind_to_thread()
            .map_err(driver("binding the GPU context"))?;
        // SAFETY: both views describe memory their live buffers own (shape and
        // strides checked above); the copy is queued on the launch stream, which
        // orders it with the tensors' other uses.
        unsafe {
            crate::dist::stream_ops::copy_2d(
                dev.stream()?.cu_stream(),
                self.device_ptr(),
                dst_pitch * elem,
                src.device_ptr(),
                src_pitch * elem,
                cols * elem,
                rows,
            )
        }
    }

    /// `(rows, columns, row pitch in elements)` of a 1-D contiguous tensor (one
    /// row) or a 2-D view with unit last stride: what a 2-D copy needs. An error
    /// naming `name` (in `ctx`) for anything else.
    pub(crate) fn row_layout(&self, ctx: &str, name: &str) -> Result<(usize, usize, usize)> {
        match (self.dims(), self.strides()) {
            ([n], _) if self.is_contiguous() => Ok((1, *n, *n)),
            ([r, c], [s0, s1]) if (*s1 == 1 || *c <= 1) && *s0 >= 0 => {
                Ok((*r, *c, *s0 as usize))
            }
            (d, s) => Err(argument(
                ctx,
                name,
                format!("expected a 1-D contiguous or 2-D row-major view, got shape {d:?} strides {s:?}"),
            )),
        }
    }

    /// The same elements as a contiguous tensor of `shape` (a view; this tensor
    /// must be contiguous and `shape` hold as many elements).
    pub fn reshape(&self, shape: impl AsRef<[usize]>) -> Result<Tensor<T>> {
        let shape = shape.as_ref();
        let n = checked_numel::<T>("Tensor::reshape", "shape", shape)?;
        if !self.is_contiguous() || n != self.numel() {
            return Err(argument(
                "Tensor::reshape",
                "shape",
                format!(
                    "cannot view {:?} (strides {:?}) as {shape:?}: needs a contiguous tensor and the same number of elements",
                    self.shape, self.strides
                ),
            ));
        }
        let mut v = self.clone();
        v.strides = contiguous_strides(shape);
        v.shape = shape.to_vec();
        Ok(v)
    }

    /// The transpose of a 2-D tensor, as a view (a 0-D or 1-D tensor is its own
    /// transpose, as in PyTorch). More dimensions are an error: say which two
    /// to swap with a reshape or a copy instead.
    pub fn t(&self) -> Result<Tensor<T>> {
        if self.rank() > 2 {
            return Err(argument(
                "Tensor::t",
                "self",
                format!(
                    "t() transposes tensors of at most 2 dimensions; this one has shape {:?}",
                    self.shape
                ),
            ));
        }
        let mut v = self.clone();
        v.shape.reverse();
        v.strides.reverse();
        Ok(v)
    }

    /// The view of `len` indices of dimension `dim` starting at `start`.
    pub fn narrow(&self, dim: usize, start: usize, len: usize) -> Result<Tensor<T>> {
        let end = start.checked_add(len);
        if dim >= self.rank() || end.is_none_or(|e| e > self.shape[dim]) {
            return Err(argument(
                "Tensor::narrow",
                "dim/start/len",
                format!(
                    "{len} indices from {start} along dimension {dim} are outside shape {:?}",
                    self.shape
                ),
            ));
        }
        let mut v = self.clone();
        v.offset = (self.offset as isize + start as isize * self.strides[dim]) as usize;
        v.shape[dim] = len;
        Ok(v)
    }
}

impl Tensor<u32> {
    /// `len` zeroed progress flags, in plain device memory so that stream memory
    /// operations (`cuStreamWriteValue32`, [`crate::SideStream::write_flag`]) accept them.
    pub fn flags(len: usize) -> Result<Tensor<u32>> {
        let t = Tensor::empty_in(&Device::current()?, [len], Memory::Plain)?;
        t.buf.fill_bytes(0)?;
        Ok(t)
    }
}
