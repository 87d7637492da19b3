//! The tilefuse kernels the fused ops and plans launch: one GEMM with a waiting
//! prologue and a configurable epilogue, and the same epilogue on its own (for
//! the unfused paths, after cuBLAS). The variants a schedule needs are chosen
//! with `#[constexpr]` switches, decided when the kernel is specialized, so each
//! launch compiles only the code it runs.
//!
//! The GEMM waits, before its tile's loads, for the flags of the row chunks its
//! tile covers: `flags[c * flags_per_chunk .. (c + 1) * flags_per_chunk]` for every
//! chunk `c` of `rows_per_chunk` rows to hold at least `ready`. Passing 0 makes
//! the wait pass at once (flags are unsigned). With `along_k` the chunks are
//! bands of `cols_per_chunk` columns of A (K) of each of `ranks` blocks of
//! `rows_per_chunk` rows, flag `band * ranks + block`, and the GEMM waits per
//! k-tile, inside its K loop, for the bands that k-tile reads: a GEMM of one
//! wave then runs on the first columns while the later ones arrive.
//!
//! With `with_signal`, each tile then adds its area (rows × columns stored) to
//! `counters[tile's first row / rows_per_signal]` once its stores are visible
//! system-wide: a chunk of `rows_per_signal` rows is done when its counter has
//! grown by the chunk's area, which the backend stream waits for before it
//! moves the chunk. Chunks must be whole tiles (`rows_per_signal` a multiple
//! of the block's rows), so that each tile counts in one chunk.
//!
//! The epilogue, on the f32 accumulator:
//! `y = alpha·acc + bias_m[row] + bias_n[col] (+ addend) (+ beta·c)`; then
//! `aux = y` (forward `_aux` epilogues), and `out = act(y)`, where `act` is
//! relu, gelu, or for the backward `y · relu'(aux)` / `y · gelu'(aux)`.
//! Tensors a switch turns off are not read or written (pass any tensor of the
//! right rank).

use crate::prelude::*;

/// `act` codes of [`gemm_fused`] and [`epilogue`].
pub(crate) mod act {
    pub const NONE: usize = 0;
    pub const RELU: usize = 1;
    pub const GELU: usize = 2;
    pub const DRELU: usize = 3;
    pub const DGELU: usize = 4;
}

/// `out (= copy = copy2 = copy3, the first `copies` of them) = epilogue(a · b)`,
/// each tile after its rows' flags.
#[fused_kernel]
#[allow(clippy::too_many_arguments)]
pub fn gemm_fused(
    a: &Tensor<bf16>,
    b: &Tensor<bf16>,
    out: &Tensor<bf16>,
    copy: &Tensor<bf16>,
    copy2: &Tensor<bf16>,
    copy3: &Tensor<bf16>,
    addend: &Tensor<bf16>,
    c: &Tensor<bf16>,
    aux: &Tensor<bf16>,
    bias_m: &Tensor<bf16>,
    bias_n: &Tensor<bf16>,
    flags: &Tensor<u32>,
    counters: &Tensor<u32>,
    rows_per_chunk: usize,
    flags_per_chunk: usize,
    cols_per_chunk: usize,
    ranks: usize,
    rows_per_signal: usize,
    ready: usize,
    first_row: usize,
    alpha: f32,
    beta: f32,
    #[constexpr] along_k: bool,
    #[constexpr] with_signal: bool,
    #[constexpr] copies: usize,
    #[constexpr] with_addend: bool,
    #[constexpr] with_c: bool,
    #[constexpr] aux_out: bool,
    #[constexpr] act: usize,
) {
    let [m, k] = a.shape();
    let [_, n] = b.shape();
    for (tm, tn) in tile([m, n]).starting_at([first_row, 0]) {
        if !along_k {
            wait(
                flags,
                tm.begin() / rows_per_chunk * flags_per_chunk
                    ..((tm.end() - 1) / rows_per_chunk + 1) * flags_per_chunk,
                ready,
            );
        }
        let mut acc = zeros::<f32>([tm, tn]);
        for tk in tile(k) {
            if along_k {
                // The k-tile's bands of every block its rows touch (and those
                // between, which arrive in the same round).
                wait(
                    flags,
                    tk.begin() / cols_per_chunk * ranks + tm.begin() / rows_per_chunk
                        ..=(tk.end() - 1) / cols_per_chunk * ranks
                            + (tm.end() - 1) / rows_per_chunk,
                    ready,
                );
            }
            acc = addmm(acc, a[(tm, tk)], b[(tk, tn)]);
        }
        let y = acc * alpha + bias_m[tm] + bias_n[tn];
        let y = if with_addend { y + addend[(tm, tn)] } else { y };
        let y = if with_c { y + c[(tm, tn)] * beta } else { y };
        if aux_out {
            aux[(tm, tn)] = y.cast();
        }
        let y = if act == 1 {
            relu(y)
        } else if act == 2 {
            gelu(y)
        } else if act == 3 {
            y * relu_grad(aux[(tm, tn)])
        } else if act == 4 {
            y * gelu_grad(aux[(tm, tn)])
        } else {
            y
        };
        let y = y.cast::<bf16>();
        out[(tm, tn)] = y;
        if copies >= 1 {
            copy[(tm, tn)] = y;
        }
        if copies >= 2 {
            copy2[(tm, tn)] = y;
        }
        if copies >= 3 {
            copy3[(tm, tn)] = y;
        }
        if with_signal {
            signal(
                counters,
                tm.begin() / rows_per_signal,
                (tm.end() - tm.begin()) * (tn.end() - tn.begin()),
            );
        }
    }
}

/// `x = epilogue(x (+ addend))` in place: [`gemm_fused()`]'s epilogue with `x`
/// (plus another partial sum, `with_addend`) for `acc`.
#[fused_kernel]
#[allow(clippy::too_many_arguments)]
pub fn epilogue(
    x: &Tensor<bf16>,
    addend: &Tensor<bf16>,
    c: &Tensor<bf16>,
    aux: &Tensor<bf16>,
    bias_m: &Tensor<bf16>,
    bias_n: &Tensor<bf16>,
    alpha: f32,
    beta: f32,
    #[constexpr] with_addend: bool,
    #[constexpr] with_c: bool,
    #[constexpr] aux_out: bool,
    #[constexpr] act: usize,
) {
    let [m, n] = x.shape();
    for (tm, tn) in tile([m, n]) {
        let y = x[(tm, tn)] * alpha + bias_m[tm] + bias_n[tn];
        let y = if with_addend {
            y + addend[(tm, tn)] * alpha
        } else {
            y
        };
        let y = if with_c { y + c[(tm, tn)] * beta } else { y };
        if aux_out {
            aux[(tm, tn)] = y.cast();
        }
        let y = if act == 1 {
            relu(y)
        } else if act == 2 {
            gelu(y)
        } else if act == 3 {
            y * relu_grad(aux[(tm, tn)])
        } else if act == 4 {
            y * gelu_grad(aux[(tm, tn)])
        } else {
            y
        };
        x[(tm, tn)] = y.cast();
    }
}

/// `out = xᵀ` (`x[n, m]`, `out[m, n]`): a transposed operand made row-major
/// for the GEMM, which reads rows.
#[fused_kernel]
pub fn transpose(x: &Tensor<bf16>, out: &Tensor<bf16>) {
    let [m, n] = out.shape();
    for (tm, tn) in tile([m, n]) {
        out[(tm, tn)] = x[(tn, tm)];
    }
}
