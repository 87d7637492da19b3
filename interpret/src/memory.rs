//! Host memory that tensors view in interpret mode: owned by this process, or a
//! mapping shared with other processes (symmetric buffers between CPU ranks).
//!
//! Another thread (a copy thread filling an all-gather's chunks) or process may
//! write the same bytes while a kernel runs, so every access is atomic: elements
//! with relaxed atomics of their size, flags with acquire loads and release adds,
//! which give `wait` and `signal` the ordering they have on the GPU, and a
//! kernel's `atomic_add` (max, min) a compare-and-swap loop on the element's
//! cell, so programs running on several threads lose no update. On x86 and
//! ARM relaxed atomics are plain loads and stores, so this costs nothing.

use crate::error::InterpretError;
use std::any::Any;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU16, AtomicU32, AtomicU64, AtomicU8, Ordering};
use std::sync::Arc;
use tilefuse_codegen::prims::cast::Num;
use tilefuse_codegen::DType;

/// The value of an element of `dtype` whose stored bits are `bits`.
fn decode(dtype: DType, bits: u64) -> Num {
    match dtype {
        DType::BF16 => Num::F(half::bf16::from_bits(bits as u16).to_f64()),
        DType::F16 => Num::F(half::f16::from_bits(bits as u16).to_f64()),
        DType::F32 => Num::F(f64::from(f32::from_bits(bits as u32))),
        DType::I8 => Num::I(i64::from(bits as u8 as i8)),
        DType::U8 => Num::I(i64::from(bits as u8)),
        DType::I16 => Num::I(i64::from(bits as u16 as i16)),
        DType::I32 => Num::I(i64::from(bits as u32 as i32)),
        DType::U32 => Num::I(i64::from(bits as u32)),
        DType::I64 => Num::I(bits as i64),
        DType::Bool => Num::I(i64::from(bits as u8 != 0)),
    }
}

/// The bits that store `v`, a value of `dtype` (a float rounded to it, an
/// integer in its range), in the low `dtype.size()` bytes.
fn encode(dtype: DType, v: Num) -> u64 {
    let int = |v: Num| match v {
        Num::I(i) => i,
        Num::F(x) => x as i64,
    };
    match dtype {
        DType::BF16 => u64::from(half::bf16::from_f64(v.as_f64()).to_bits()),
        DType::F16 => u64::from(half::f16::from_f64(v.as_f64()).to_bits()),
        DType::F32 => u64::from((v.as_f64() as f32).to_bits()),
        DType::I8 | DType::U8 => u64::from(int(v) as u8),
        DType::I16 => u64::from(int(v) as u16),
        DType::I32 | DType::U32 => u64::from(int(v) as u32),
        DType::I64 => int(v) as u64,
        DType::Bool => u64::from(int(v) != 0),
    }
}

/// A block of host bytes, 8-byte aligned, that tensors view.
///
/// ```
/// use tilefuse_interpret::HostMemory;
/// let m = HostMemory::zeroed(16);
/// m.write_bytes(0, &[1, 2, 3]).unwrap();
/// let mut back = [0u8; 4];
/// m.read_bytes(0, &mut back).unwrap();
/// assert_eq!(back, [1, 2, 3, 0]);
/// ```
pub struct HostMemory {
    ptr: NonNull<u8>,
    bytes: usize,
    /// What keeps `ptr..ptr + bytes` alive: our own words, or a mapping.
    _owner: Owner,
}

enum Owner {
    Words(#[allow(dead_code)] Box<[u64]>),
    External(#[allow(dead_code)] Box<dyn Any + Send + Sync>),
}

// SAFETY: the memory is only accessed through atomics (see the module docs), and
// the owner is `Send + Sync`.
unsafe impl Send for HostMemory {}
// SAFETY: as above.
unsafe impl Sync for HostMemory {}

impl std::fmt::Debug for HostMemory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "HostMemory({} bytes at {:p})", self.bytes, self.ptr)
    }
}

impl HostMemory {
    /// `bytes` zeroed bytes (at least 8).
    pub fn zeroed(bytes: usize) -> Arc<HostMemory> {
        let mut words = vec![0u64; bytes.div_ceil(8).max(1)].into_boxed_slice();
        let ptr = NonNull::from(&mut words[0]).cast::<u8>();
        Arc::new(HostMemory {
            ptr,
            bytes,
            _owner: Owner::Words(words),
        })
    }

    /// Memory that `owner` keeps mapped (e.g. a shared-memory mapping).
    ///
    /// # Safety
    /// `ptr` must be 8-byte aligned and valid for reads and writes of `bytes`
    /// bytes for as long as `owner` lives, and every other user of those bytes
    /// (another process included) must access them atomically too.
    pub unsafe fn from_raw(
        ptr: NonNull<u8>,
        bytes: usize,
        owner: Box<dyn Any + Send + Sync>,
    ) -> Arc<HostMemory> {
        Arc::new(HostMemory {
            ptr,
            bytes,
            _owner: Owner::External(owner),
        })
    }

    /// The size in bytes.
    pub fn len(&self) -> usize {
        self.bytes
    }

    pub fn is_empty(&self) -> bool {
        self.bytes == 0
    }

    /// The address of the first byte (an identity for the memory; all access
    /// goes through the methods here).
    pub fn addr(&self) -> usize {
        self.ptr.as_ptr() as usize
    }

    fn check(&self, at: usize, len: usize) -> Result<(), InterpretError> {
        match at.checked_add(len) {
            Some(end) if end <= self.bytes => Ok(()),
            _ => Err(InterpretError::Argument {
                kernel: "(host memory)".into(),
                arg: "range".into(),
                message: format!(
                    "bytes {at}..{} are outside the {} bytes of this memory",
                    at.saturating_add(len),
                    self.bytes
                ),
            }),
        }
    }

    fn byte(&self, at: usize) -> &AtomicU8 {
        debug_assert!(at < self.bytes);
        // SAFETY: `at` is inside the live allocation (checked by the callers), and
        // all accesses to it are atomic.
        unsafe { AtomicU8::from_ptr(self.ptr.as_ptr().add(at)) }
    }

    /// Copies `src` into the bytes from `at`.
    pub fn write_bytes(&self, at: usize, src: &[u8]) -> Result<(), InterpretError> {
        self.check(at, src.len())?;
        for (i, &b) in src.iter().enumerate() {
            self.byte(at + i).store(b, Ordering::Relaxed);
        }
        Ok(())
    }

    /// Copies the bytes from `at` into `dst`.
    pub fn read_bytes(&self, at: usize, dst: &mut [u8]) -> Result<(), InterpretError> {
        self.check(at, dst.len())?;
        for (i, b) in dst.iter_mut().enumerate() {
            *b = self.byte(at + i).load(Ordering::Relaxed);
        }
        Ok(())
    }

    /// Sets every byte to `value`.
    pub fn fill(&self, value: u8) {
        for i in 0..self.bytes {
            self.byte(i).store(value, Ordering::Relaxed);
        }
    }

    /// The `T` at element index `elem` (of `T`-sized elements).
    ///
    /// # Safety
    /// `elem` must be inside the memory (the tensor views check it).
    unsafe fn cell<T>(&self, elem: usize) -> *mut T {
        debug_assert!((elem + 1) * std::mem::size_of::<T>() <= self.bytes);
        // SAFETY: inside the allocation (the caller's contract); aligned because the
        // base is 8-aligned and `T` is at most 8 bytes.
        unsafe { self.ptr.as_ptr().cast::<T>().add(elem) }
    }

    /// The raw bits of element `elem` of a `dtype` array starting at the
    /// first byte (zero-extended), read atomically.
    fn load_bits(&self, dtype: DType, elem: usize) -> u64 {
        let r = Ordering::Relaxed;
        // SAFETY: in all arms, `elem` is inside the memory (the views check their
        // extent against it), and the cell is only accessed atomically.
        unsafe {
            match dtype.size() {
                1 => u64::from(AtomicU8::from_ptr(self.cell(elem)).load(r)),
                2 => u64::from(AtomicU16::from_ptr(self.cell(elem)).load(r)),
                4 => u64::from(AtomicU32::from_ptr(self.cell(elem)).load(r)),
                _ => AtomicU64::from_ptr(self.cell(elem)).load(r),
            }
        }
    }

    /// Element `elem` of a `dtype` array starting at the first byte, as the exact
    /// value of the dtype (a `bool` element is 0 or 1: any byte but 0 is true).
    pub(crate) fn load(&self, dtype: DType, elem: usize) -> Num {
        decode(dtype, self.load_bits(dtype, elem))
    }

    /// Stores `v`, a value of `dtype` (already converted to it: see
    /// [`tilefuse_codegen::prims::cast::cpu`]), into element `elem`.
    pub(crate) fn store(&self, dtype: DType, elem: usize, v: Num) {
        let bits = encode(dtype, v);
        let r = Ordering::Relaxed;
        // SAFETY: in all arms, as in `load_bits`.
        unsafe {
            match dtype.size() {
                1 => AtomicU8::from_ptr(self.cell(elem)).store(bits as u8, r),
                2 => AtomicU16::from_ptr(self.cell(elem)).store(bits as u16, r),
                4 => AtomicU32::from_ptr(self.cell(elem)).store(bits as u32, r),
                _ => AtomicU64::from_ptr(self.cell(elem)).store(bits, r),
            }
        }
    }

    /// Replaces element `elem` of a `dtype` array by `f(old)` atomically (a
    /// compare-and-swap loop on the element's own atomic cell, as the GPU's
    /// atomics and its CAS loops for 16-bit floats and float max/min do):
    /// concurrent updates from other threads are never lost. `f` returns a
    /// value of `dtype` and may run more than once. Returns the value the
    /// element held just before (what `let old = atomic_add(…)` keeps).
    pub(crate) fn update(&self, dtype: DType, elem: usize, f: impl Fn(Num) -> Num) -> Num {
        let (r, w) = (Ordering::Relaxed, Ordering::Relaxed);
        macro_rules! cas_loop {
            ($atomic:ty, $t:ty) => {{
                // SAFETY: as in `load_bits`.
                let cell = unsafe { <$atomic>::from_ptr(self.cell(elem)) };
                let mut old = cell.load(r);
                loop {
                    let before = decode(dtype, u64::from(old));
                    let new = encode(dtype, f(before)) as $t;
                    if new == old {
                        break before;
                    }
                    match cell.compare_exchange_weak(old, new, w, r) {
                        Ok(_) => break before,
                        Err(seen) => old = seen,
                    }
                }
            }};
        }
        match dtype.size() {
            1 => cas_loop!(AtomicU8, u8),
            2 => cas_loop!(AtomicU16, u16),
            4 => cas_loop!(AtomicU32, u32),
            _ => cas_loop!(AtomicU64, u64),
        }
    }

    /// The `u32` flag at element `elem`, read with acquire ordering: what its
    /// writer stored before setting it is visible after this returns it.
    pub fn load_flag(&self, elem: usize) -> Result<u32, InterpretError> {
        self.check(elem * 4, 4)?;
        // SAFETY: checked inside the memory just above; atomic access only.
        Ok(unsafe { AtomicU32::from_ptr(self.cell(elem)) }.load(Ordering::Acquire))
    }

    /// Sets the `u32` flag at element `elem` with release ordering (what was
    /// written before is visible to whoever acquires the flag).
    pub fn store_flag(&self, elem: usize, value: u32) -> Result<(), InterpretError> {
        self.check(elem * 4, 4)?;
        // SAFETY: as in `load_flag`.
        unsafe { AtomicU32::from_ptr(self.cell(elem)) }.store(value, Ordering::Release);
        Ok(())
    }

    /// Adds `value` (wrapping) to the `u32` flag at element `elem`, release and
    /// acquire, as `signal` does on the GPU.
    pub fn add_flag(&self, elem: usize, value: u32) -> Result<u32, InterpretError> {
        self.check(elem * 4, 4)?;
        // SAFETY: as in `load_flag`.
        Ok(unsafe { AtomicU32::from_ptr(self.cell(elem)) }.fetch_add(value, Ordering::AcqRel))
    }
}
