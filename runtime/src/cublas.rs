//! cuBLAS as the reference and the baseline: `C = A·B` on row-major tensors.
//!
//! In interpret mode (tensors on the host) the same calls compute the product
//! on the CPU, accumulating in f64 and rounding once to the element type, so
//! programs that check a kernel against cuBLAS run unchanged without a GPU.

use crate::device::Device;
use crate::element::Element;
use crate::error::{argument, driver, Error, Result};
use crate::libs;
use crate::tensor::Tensor;
use cudarc::cublas::{result as blas, sys as bsys, CudaBlas};
use std::collections::hash_map::{Entry, HashMap};
use std::ffi::c_void;
use std::sync::{Mutex, OnceLock};
use tilefuse_codegen::DType;

fn with_handle<R>(dev: &Device, f: impl FnOnce(&CudaBlas) -> Result<R>) -> Result<R> {
    libs::require_cublas()?;
    static HANDLES: OnceLock<Mutex<HashMap<usize, CudaBlas>>> = OnceLock::new();
    let mut map = HANDLES
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|p| p.into_inner());
    let h = match map.entry(dev.ordinal()) {
        Entry::Occupied(o) => o.into_mut(),
        Entry::Vacant(v) => {
            v.insert(
                CudaBlas::new(dev.stream()?.clone()).map_err(|e| Error::Cublas {
                    context: "creating a handle".into(),
                    message: format!("{e:?}"),
                })?,
            )
        }
    };
    f(h)
}

/// cuBLAS operand description of a row-major-indexed 2-D tensor `x` used as the
/// column-major matrix `xᵀ`: (transpose?, leading dimension).
fn as_col_major_transposed<T: Element>(
    x: &Tensor<T>,
    name: &str,
) -> Result<(bsys::cublasOperation_t, i32)> {
    let s = x.strides();
    let ld = |v: isize| {
        i32::try_from(v.max(1)).map_err(|_| argument("cuBLAS matmul", name, "stride too large"))
    };
    if s[1] == 1 || x.size(1) == 1 {
        Ok((
            bsys::cublasOperation_t::CUBLAS_OP_N,
            ld(s[0].max(x.size(1) as isize))?,
        ))
    } else if s[0] == 1 || x.size(0) == 1 {
        Ok((
            bsys::cublasOperation_t::CUBLAS_OP_T,
            ld(s[1].max(x.size(0) as isize))?,
        ))
    } else {
        Err(argument(
            "cuBLAS matmul",
            name,
            format!("needs one unit stride, got strides {s:?}"),
        ))
    }
}

fn cuda_type(d: DType) -> Result<bsys::cudaDataType> {
    Ok(match d {
        DType::BF16 => bsys::cudaDataType::CUDA_R_16BF,
        DType::F16 => bsys::cudaDataType::CUDA_R_16F,
        DType::F32 => bsys::cudaDataType::CUDA_R_32F,
        other => {
            return Err(argument(
                "cuBLAS matmul",
                "a",
                format!("dtype {other} is not a GEMM type"),
            ))
        }
    })
}

/// `out = a · b` with cuBLAS (f32 accumulation), for row-major `a[M,K]`, `b[K,N]`
/// and `out[M,N]` with a unit last stride. Queued on the device's launch stream.
pub fn matmul_into<T: Element>(out: &mut Tensor<T>, a: &Tensor<T>, b: &Tensor<T>) -> Result<()> {
    let ctx = "cuBLAS matmul";
    for (n, t) in [("a", a.dims()), ("b", b.dims()), ("out", out.dims())] {
        if t.len() != 2 {
            return Err(argument(
                ctx,
                n,
                format!("expected a 2-D tensor, got shape {t:?}"),
            ));
        }
    }
    let (m, k, n) = (a.size(0), a.size(1), b.size(1));
    if b.size(0) != k {
        return Err(argument(
            ctx,
            "b",
            format!("has {} rows but a has {k} columns", b.size(0)),
        ));
    }
    if out.dims() != [m, n] {
        return Err(argument(
            ctx,
            "out",
            format!("expected shape [{m}, {n}], got {:?}", out.dims()),
        ));
    }
    if out.strides()[1] != 1 && n > 1 {
        return Err(argument(ctx, "out", "needs a unit last stride"));
    }
    if m == 0 || n == 0 {
        return Ok(());
    }
    let dev = out.device().clone();
    if dev.is_host() {
        return host_matmul_into(out, a, b, [m, n, k]);
    }
    let (op_b, ld_b) = as_col_major_transposed(b, "b")?;
    let (op_a, ld_a) = as_col_major_transposed(a, "a")?;
    let ldc = i32::try_from(out.strides()[0].max(n as isize))
        .map_err(|_| argument(ctx, "out", "stride too large"))?;
    let dt = cuda_type(T::DTYPE)?;
    let (alpha, beta) = (1.0f32, 0.0f32);
    let dims = |v: usize, what: &str| {
        i32::try_from(v).map_err(|_| argument(ctx, what, "size exceeds i32"))
    };
    let (mi, ni, ki) = (dims(m, "a")?, dims(n, "b")?, dims(k, "a")?);
    dev.context()?
        .bind_to_thread()
        .map_err(driver("binding the GPU context"))?;
    with_handle(&dev, |h| {
        // SAFETY: row-major C[M,N] = A·B is column-major Cᵀ = Bᵀ·Aᵀ: cuBLAS's A is our
        // b (N×K as seen column-major), its B our a. Pointers come from live tensors
        // whose shapes and strides were checked above; the handle runs on the
        // device's launch stream.
        unsafe {
            blas::gemm_ex(
                *h.handle(),
                op_b,
                op_a,
                ni,
                mi,
                ki,
                &alpha as *const f32 as *const c_void,
                b.device_ptr() as *const c_void,
                dt,
                ld_b,
                a.device_ptr() as *const c_void,
                dt,
                ld_a,
                &beta as *const f32 as *const c_void,
                out.device_ptr() as *mut c_void,
                dt,
                ldc,
                bsys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
                bsys::cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
            )
        }
        .map_err(|e| Error::Cublas {
            context: format!("gemm {m}x{n}x{k}"),
            message: format!("{e:?}"),
        })
    })
}

/// Interpret mode's stand-in: the product on the CPU, row by row into `out`.
fn host_matmul_into<T: Element>(
    out: &mut Tensor<T>,
    a: &Tensor<T>,
    b: &Tensor<T>,
    [m, n, k]: [usize; 3],
) -> Result<()> {
    let av: Vec<f64> = a.to_vec()?.into_iter().map(T::to_f64).collect();
    let bv: Vec<f64> = b.to_vec()?.into_iter().map(T::to_f64).collect();
    let mut row = vec![0f64; n];
    for i in 0..m {
        row.iter_mut().for_each(|x| *x = 0.0);
        for (p, &x) in av[i * k..(i + 1) * k].iter().enumerate() {
            for (acc, &y) in row.iter_mut().zip(&bv[p * n..(p + 1) * n]) {
                *acc += x * y;
            }
        }
        let values: Vec<T> = row.iter().map(|&x| T::from_f64(x)).collect();
        out.narrow(0, i, 1)?.copy_from_slice(&values)?;
    }
    Ok(())
}

/// `a · b` with cuBLAS into a new tensor.
pub fn matmul<T: Element>(a: &Tensor<T>, b: &Tensor<T>) -> Result<Tensor<T>> {
    if a.rank() != 2 || b.rank() != 2 {
        return Err(argument("cuBLAS matmul", "a/b", "expected 2-D tensors"));
    }
    let mut out = Tensor::<T>::empty_on(a.device(), [a.size(0), b.size(1)])?;
    matmul_into(&mut out, a, b)?;
    Ok(out)
}
