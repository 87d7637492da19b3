//! # tilefuse
//!
//! Fused GPU kernels written as Rust tile loops. `#[fused_kernel]` turns a function
//! into tile IR at compile time; at run time NVRTC compiles the generated CUDA C for
//! the GPU in hand and the kernel launches like a normal Rust call.
//!
//! ```ignore
//! use tilefuse::prelude::*;
//!
//! #[fused_kernel]
//! fn matmul_bias_gelu(a: &Tensor<bf16>, b: &Tensor<bf16>, bias: &Tensor<bf16>) -> Tensor<bf16> {
//!     let [m, k] = a.shape();
//!     let [_, n] = b.shape();
//!     let mut out = Tensor::<bf16>::empty([m, n])?;
//!     for (tm, tn) in tile([m, n]) {          // the launch grid: one program per output tile
//!         let mut acc = zeros::<f32>([tm, tn]);
//!         for tk in tile(k) {                  // sequential inside the program
//!             acc = addmm(acc, a[(tm, tk)], b[(tk, tn)]);
//!         }
//!         out[(tm, tn)] = gelu(acc + bias[tn]).cast();
//!     }
//!     out
//! }
//! // matmul_bias_gelu(&a, &b, &bias)? -> Tensor<bf16>
//! ```
//!
//! ## The DSL
//!
//! Host code (shapes, checks, allocation) surrounds one outermost
//! `for … in tile([extents])` loop: its body is the device code, run once per tile.
//! `tile([m, n]).starting_at([i, j])` makes the programs' order start at the tiles
//! holding index `i` and `j` and wrap around (an all-gather matmul starts on the
//! rank's own rows, which are there first). Inside it:
//!
//! - `tile([b, s, whole(d)])`: `whole(d)` is one tile over all of `d` (its block
//!   follows the extent at each launch, whatever the config says): attention's head
//!   dimension, contracted by `q·kᵀ` and kept whole in the output accumulator;
//! - `for t in tile(extent) { … }`: a nested tile loop, run sequentially in the program;
//!   `tile(sk).until(bound)` walks only the tiles that begin before `bound` (an
//!   integer computed in the program, e.g. `tm.end()` for a causal mask), each tile
//!   keeping its extent (attention kernels);
//! - `t.begin()`, `t.end()`, `t.size()`: the bounds of the program's tile along `t`;
//! - `x[(tm, tk)]`, `bias[tn]`: tile loads; `out[(tm, tn)] = value;`: tile stores.
//!   Ragged edges are masked, so any extent works. A tensor's size along each
//!   dimension must equal the extent of the tile that indexes it (checked at launch);
//! - `zeros::<f32>([tm, tn])`, `full::<f32>([tm, tn], v)`: accumulators;
//! - `acc = addmm(acc, a[(tm, tk)], b[(tk, tn)])`: `acc + a·b` on tensor cores (bf16 or
//!   f16 operands, f32 accumulation). It contracts by tile name, over the one tile
//!   both operands have and `acc` lacks, so `addmm(s, q[(tb, tm, td)], k[(tb, tn, td)])`
//!   is `s + q·kᵀ` for each batch tile `tb`. A matmul kernel (one `addmm` loop) takes
//!   `b` as `[k, n]`; a loop with two (scores, then `acc = addmm(acc * alpha,
//!   p.cast::<bf16>(), v[(tb, tn, td)])`) is lowered as flash attention
//!   (`examples/attention.rs`): with `wgmma` (the default on Hopper) in the manner of
//!   FlashAttention-3, else of FlashAttention-2;
//! - elementwise `+ - * / %`, `min`, `max`, `exp`, `log`, `sqrt`, `rsqrt`, `abs`, `relu`,
//!   `gelu`, `gelu_tanh`, `silu`, `sigmoid`, `tanh`, and the derivatives `relu_grad`,
//!   `gelu_grad` (functions or methods). As in Triton, `exp` is `2^(x·log2 e)` on the
//!   fast exponential unit and f32 `/` is `div.full` (both within 2 ulp, plus the
//!   rounding of `x·log2 e` for large `|x|`; `exp(a - b)` is `2^(a·log2 e − b·log2 e)`,
//!   one fused multiply-add, as FlashAttention computes it); the others are CUDA's libm;
//!   `.cast::<T>()` (round to `T`) and `.cast()` at a store. Tiles broadcast by
//!   dimension name: `acc + bias[tn]` adds the bias to every row;
//! - in kernels without `addmm`, and in attention kernels over the keys:
//!   `x.sum(tn)`, `x.max(tn)`, `x.min(tn)` reduce a tile
//!   along the tile `tn` of the enclosing `tile()` loop (its in-bounds elements only),
//!   giving a per-row tile that broadcasts back (`exp(v - row_max)`); per-row
//!   accumulators (`full::<f32>([tm], f32::NEG_INFINITY)`) carry across the loop's
//!   steps. The column block decides one step or several (`examples/softmax.rs`);
//! - masks: `t.index()` is each element's index along tile `t`; comparisons
//!   (`==`, `!=`, `<`, `<=`, `>`, `>=`) give 1 or 0; `select(mask, a, b)` picks `a`
//!   where the mask is not zero, else `b` (`select(tn.index() == label, v, 0.0)`
//!   picks a row's label column, `examples/cross_entropy.rs`);
//! - host values (`alpha`, `m / chunks`) are captured by value; `#[constexpr]`
//!   parameters are baked into the generated code;
//! - `if cond { … } else { … }` on `#[constexpr]` parameters and integer literals
//!   (`==`, `<`, `&&`, `!`, …), as a statement or a value
//!   (`let y = if act == 1 { relu(y) } else { y };`): decided when the kernel is
//!   specialized, so each specialization compiles, checks and touches only the
//!   branch it takes (a tensor used only in a branch not taken may be any tensor
//!   of the right rank);
//! - `wait(flags, index, value);`: one thread spins until `flags[index] >= value`
//!   (acquire, system scope), then the block continues. The spin is bounded
//!   (`TILEFUSE_WAIT_TIMEOUT_MS`, default 10 s): a timeout is reported by the next
//!   synchronize as an error naming the site and the flag.
//!   `wait(flags, lo..hi, value)` (or `lo..=hi`) waits for every flag in the range,
//!   e.g. every chunk a tile's rows touch:
//!   `wait(progress, tm.begin() / rows_per_chunk..=(tm.end() - 1) / rows_per_chunk, epoch)`.
//! - `signal(counters, index, value);`: once the tile's stores above it are done
//!   and visible to the whole system (a barrier over the storing threads, then a
//!   system-scope fence), one thread adds `value` to the `u32` counter
//!   `counters[index]` (wrapping; an index outside the tensor, or a tile past the
//!   grid's end, adds nothing). The producer half of `wait`: e.g.
//!   `signal(done, tm.begin() / rows_per_chunk, (tm.end() - tm.begin()) * (tn.end() - tn.begin()))`
//!   counts each chunk of rows up to its area, which a stream (`Exchange::await_count`)
//!   or another kernel waits for. `KernelDef::with_group_rows` keeps such chunks
//!   completing in order.
//!
//! Float arithmetic runs in f32: 16-bit values are widened on load and rounded
//! (to nearest even) on store or `.cast::<bf16>()`.
//!
//! The generated function returns `tilefuse::Result<…>` (unless it already returns a
//! `Result`): bad arguments are errors naming the argument, never panics.
//! Its config comes from `my_kernel::kernel()` (pinned on the attribute, e.g.
//! `#[fused_kernel(block_sizes = [128, 256, 64], num_warps = 8, num_stages = 3)]`,
//! or the default), and can be overridden with `KernelDef::with_config`.
//!
//! `TILEFUSE_DUMP_DIR=dir` writes every generated `.cu`, its NVRTC log and its cubin to `dir`.

// The kernels of `ops` are written with `#[fused_kernel]`, whose code names
// `::tilefuse::…`.
extern crate self as tilefuse;

pub mod ops;

pub use half::{bf16, f16};
pub use tilefuse_codegen as codegen;
pub use tilefuse_codegen::Config;
pub use tilefuse_interpret as interpret;
pub use tilefuse_macros::fused_kernel;
pub use tilefuse_runtime as runtime;
pub use tilefuse_runtime::{
    autotune, cache, cublas, jit, time_gpu, verify, Device, Element, Error, KernelDef, Result,
    SideStream, Tensor, Timing,
};

/// What a kernel file needs: `use tilefuse::prelude::*;`.
pub mod prelude {
    pub use crate::{bf16, f16, fused_kernel, Config, Device, Error, Result, Tensor};
}

/// Used by code the macro generates; not a stable API.
#[doc(hidden)]
pub mod __private {
    pub use tilefuse_runtime::args::{
        expect_rank, AsTensorArg, IntoConst, IntoScalar, ScalarArg, TensorArg,
    };
}
