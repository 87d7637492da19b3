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
//!   `tile([each(nb), d])`: `each(nb)` takes one index at a time (one program per
//!   `b`), and the name is then an integer (`offsets[b + 1]`);
//! - `for t in tile(extent) { … }`: a nested tile loop, run sequentially in the program,
//!   nested as deep as you like; `for t in tile(begin..end)` walks tiles from `begin`,
//!   masked at `end`, both computed in the program (`tile(offsets[b]..offsets[b + 1])`
//!   for a jagged row); `for i in begin..end` takes one index at a time;
//!   `tile(sk).until(bound)` walks only the tiles that begin before `bound` (an
//!   integer computed in the program, e.g. `tm.end()` for a causal mask), each tile
//!   keeping its extent;
//! - `t.begin()`, `t.end()`, `t.size()`: the bounds of the program's tile along `t`;
//! - loads and stores: `x[(tm, tk)]`, `bias[tn]`, `out[(tm, tn)] = value;`. Each index
//!   component is an integer expression: a tile (its indices), a tile plus or minus an
//!   offset (`y[(tm, tn - n1)]`), a gathered index (`w[(ids[tt], td)]`,
//!   `logits[(tm, labels[tm])]`) or a scalar (`offsets[b]`). The value has the tiles of
//!   its index. Elements past a tile's extent are masked, so any extent works; a load
//!   outside the tensor reads zero and a store outside it is dropped. A tensor indexed
//!   by a tile itself must have that tile's extent as its size (checked at launch);
//! - `atomic_add(t[index], v);`, `atomic_max`, `atomic_min`: each element of `v`
//!   combined into its place atomically (f32, bf16, f16, i32, u32, i64), masked as a
//!   store: histograms, split reductions, a whole tensor's sum. `let old =
//!   atomic_add(counts[ids[tt]], 1);` also keeps what each place held before (0 where
//!   a place is skipped): a token's slot in its id's or its expert's list;
//! - `zeros::<f32>([tm, tn])`, `full::<f32>([tm, tn], v)`: accumulators (`v` a number
//!   literal or a bound a double holds exactly: `i32::MIN`, `u32::MAX`,
//!   `f32::NEG_INFINITY`);
//! - `let (a, b) = (x, y);` binds several values at once (all read first, so
//!   `(b, a)` swaps);
//! - `acc = addmm(acc, a[(tm, tk)], b[(tk, tn)])`: `acc + a·b` (bf16 or f16 operands,
//!   f32 accumulation). It contracts by tile name, over the one tile both operands
//!   have and `acc` lacks, so `addmm(s, q[(tb, tm, td)], k[(tb, tn, td)])` is `s + q·kᵀ`
//!   for each batch tile `tb`. A matmul kernel (one `addmm` loop, `b` as `[k, n]`) runs
//!   on tensor cores (TMA and `wgmma` on Hopper); a loop with two (scores, then
//!   `acc = addmm(acc * alpha, p.cast::<bf16>(), v[(tb, tn, td)])`) is lowered as flash
//!   attention (`examples/attention.rs`): with `wgmma` (the default on Hopper) in the
//!   manner of FlashAttention-3, else of FlashAttention-2; any other `addmm` takes the
//!   general lowering, which multiplies through shared memory with FMAs;
//! - elementwise operators `+ - * / %` (C's integer division and remainder, `fmodf` on
//!   floats), `& | ^ << >> !` on integers and masks (`&&`, `||` on masks; a shift by
//!   the width or more gives 0), comparisons (`==`, `<`, …, giving masks), and the
//!   functions of [`codegen::prims::UnOp`] and [`codegen::prims::BinOp`] (one line
//!   each: name and meaning) as functions or methods, such as `exp`, `ln` (`log`),
//!   `sqrt`, `rsqrt`, `tanh`, `erf`, `gelu`, `silu`, `sigmoid` and their derivatives
//!   (`gelu_grad`, …), the trigonometric and hyperbolic functions and their inverses,
//!   `min`, `max`, `powf` (`pow`, `powi`), `hypot`, `copysign`, and `clamp(x, lo, hi)`
//!   (`x.clamp(lo, hi)`: `min(max(x, lo), hi)`). As in Triton, `exp` is `2^(x·log2 e)` on the
//!   fast exponential unit and f32 `/` is `div.full` (both within 2 ulp), and so are
//!   the exponentials and divisions inside `sigmoid`, `silu`, `gelu_grad` and their
//!   kin; the others are CUDA's libm. Tiles broadcast by dimension name: `acc + bias[tn]`
//!   adds the bias to every row;
//! - types: tensors of bf16, f16, f32, i8, u8, i16, i32, u32, i64; floats compute in
//!   f32, integers in their type promoted as C promotes them (an integer literal takes
//!   the other operand's type, as does a value made of literals only:
//!   `count + select(m, 1, 0).sum(t)` selects and sums in `count`'s i32), wrapping;
//!   `.cast::<T>()` and `x as T` convert as Rust's
//!   `as` does (rounding to nearest even, floats into integers saturating), and
//!   `.cast()` at a store takes the tensor's type;
//! - reductions ([`codegen::prims::ReduceOp`]: `x.sum(t)`, `x.max(t)`, `x.min(t)`, …) along any tile of the
//!   value (its in-bounds elements only), giving a tile without `t` that broadcasts
//!   back (`exp(v - v.max(tn))`); accumulators carried across a loop's steps
//!   (`acc = acc + x.sum(tn)`) sum a whole extent (the tiles are added in
//!   registers and reduced once after the loop; where a program's first loop only
//!   accumulates and the grid is too small for the GPU, several programs share it
//!   and add their parts in a fixed order: `Config::split`). Storing one block's reduction at
//!   every step of the loop over that block, or one program's reduction over a grid
//!   tile to a place every program shares, is a compile error that says what to write
//!   instead (accumulate across the loop, or `atomic_add`); `x.argmax(t)` and
//!   `x.argmin(t)` give the index (i64, as `t.index()` counts) of the first element
//!   equal to `x.max(t)` (`x.min(t)`), never a NaN's;
//! - scans (the reductions' inclusive prefixes: `x.cumsum(t)`, `x.cummax(t)`,
//!   `x.cummin(t)`, `x.cumprod(t)`) along a tile of the value, the same tiles as
//!   `x`: each element combined with those before it in the block. A scan sees a
//!   `whole(…)` tile entire; along a loop's tile it covers one block a step, and the
//!   loop carries the total of the blocks before (`out[(tm, tn)] = carry +
//!   v.cumsum(tn); carry = carry + v.sum(tn);`). A scan over one block of a grid
//!   tile, or in a loop that carries nothing, is a compile error;
//! - masks: `t.index()` is each element's index along tile `t`; `select(mask, a, b)`
//!   picks `a` where the mask holds, else `b` (`select(tn.index() == label, v, 0.0)`,
//!   `examples/cross_entropy.rs`); both sides are computed, as `torch.where` does;
//! - random numbers: `rand(seed, offset)` (uniform in [0, 1), multiples of 2^-23),
//!   `randn(…)`, `randint(…)`: Philox 4x32-10 keyed by the seed, as Triton's `tl.rand`,
//!   from each element's integer offset, so a dropout mask can be recomputed; four
//!   consecutive offsets share one call's words (two for `randn`), as cuRAND's
//!   `uniform4`, so offsets that run along a tile (`tm.index() * n + tn.index()`) draw
//!   once per four;
//! - host values (`alpha`, `m / chunks`) are captured by value; `#[constexpr]`
//!   parameters are baked into the generated code;
//! - `if cond { … } else { … }`, as a statement or a value
//!   (`let y = if act == 1 { relu(y) } else { y };`): on `#[constexpr]` parameters
//!   and literals it is decided when the kernel is specialized, so each
//!   specialization compiles, checks and touches only the branch it takes (a tensor
//!   used only in a branch not taken may be any tensor of the right rank); on runtime
//!   scalars (`if beta == 0.0 { … }`, `if end > begin { … }`) the whole program takes
//!   one branch (a value `if` chooses per launch, as `select` does);
//! - `wait(flags, index, value);`: one thread spins until `flags[index] >= value`
//!   (acquire, system scope), then the block continues. The spin is bounded
//!   (`TILEFUSE_WAIT_TIMEOUT_MS`, default 10 s): a timeout is reported by the next
//!   synchronize as an error naming the site and the flag. In a matmul's K loop
//!   (before its `addmm`) it is tested per k-tile, before that k-tile's loads (on
//!   Hopper by a warp of its own, ahead of the thread that issues the loads): an
//!   all-gather in bands of columns feeds a GEMM that starts on the first ones.
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
    autotune, cache, cublas, jit, time_gpu, Device, Element, Error, KernelDef, Result, SideStream,
    Tensor, Timing,
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
