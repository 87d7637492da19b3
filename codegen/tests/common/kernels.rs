//! Kernels of the shapes the general lowering takes (jagged loops, atomics,
//! reductions along any tile, random numbers, bits, several grid tiles),
//! shared by `general.rs`, which lowers them, and `text.rs`, which reads and
//! prints them. The text is the IR's own notation ([`Kernel::parse`]): what
//! a kernel means, in as many lines as its source.

use super::*;

/// `text` read as a kernel; a test's own text has no errors.
pub fn parse(text: &str) -> Kernel {
    Kernel::parse(text).unwrap_or_else(|e| panic!("{e}\n{text}"))
}

/// `for b in each(nb)`: a jagged sum of the rows `offsets[b]..offsets[b + 1]`.
pub fn jagged_sum() -> Kernel {
    parse(
        "kernel jagged_sum(offsets: Tensor<i64, 1>, x: Tensor<f32, 2>, out: Tensor<f32, 2>; nb, d) {
           for (b, td) in tile([each(nb), d]) {
             let mut acc = zeros::<f32>([td]);
             for tr in tile(offsets[b]..offsets[b + 1]) {
               acc = acc + x[(tr, td)].sum(tr);
             }
             out[(b, td)] = acc;
           }
         }",
    )
}

/// A column sum `out[tn] = x[(tm, tn)].sum(tm)` over a loop of rows, and a
/// whole-tensor sum into one scalar with an atomic.
pub fn column_and_total_sums() -> Kernel {
    parse(
        "kernel sums(x: Tensor<bf16, 2>, cols: Tensor<f32, 1>, total: Tensor<f32, 1>; n, m) {
           for tn in tile(n) {
             let mut acc = zeros::<f32>([tn]);
             for tm in tile(m) {
               acc = acc + x[(tm, tn)].cast::<f32>().sum(tm);
             }
             cols[tn] = acc;
             atomic_add(total[0], acc.sum(tn));
           }
         }",
    )
}

/// Dropout: `out = select(rand(seed, i) >= p, x / (1 - p), 0)`.
pub fn dropout() -> Kernel {
    parse(
        "kernel dropout(x: Tensor<bf16, 1>, out: Tensor<bf16, 1>; n, seed, p) {
           for ti in tile(n) {
             out[ti] = select(rand(seed, ti.index()) >= p, x[ti] / (1.0 - p), 0.0).cast();
           }
         }",
    )
}

/// A histogram: `atomic_add(counts[bins[ti]], 1)` from every program.
pub fn histogram() -> Kernel {
    parse(
        "kernel histogram(bins: Tensor<i32, 1>, counts: Tensor<i32, 1>; n) {
           for ti in tile(n) {
             atomic_add(counts[bins[ti]], 1);
           }
         }",
    )
}

/// Slots by a fetch-and-add: `let slot = atomic_add(counts[bins[ti]], 1)`,
/// each token's slot stored, then used by every column of a row copy.
pub fn slots() -> Kernel {
    parse(
        "kernel slots(bins: Tensor<i32, 1>, counts: Tensor<i32, 1>, slot: Tensor<i32, 1>, x: Tensor<f32, 2>, out: Tensor<f32, 2>; n, d) {
           for ti in tile(n) {
             let s = atomic_add(counts[bins[ti]], 1);
             slot[ti] = s;
             for td in tile(d) {
               out[(s, td)] = x[(ti, td)];
             }
           }
         }",
    )
}

/// Integer bits: `out = (x << 3) ^ (x >> 1) & 0xff` on u32, and a runtime if.
pub fn bits() -> Kernel {
    parse(
        "kernel bits(x: Tensor<u32, 1>, out: Tensor<u32, 1>; n, flip) {
           for ti in tile(n) {
             if flip {
               out[ti] = !((x[ti] << 3) ^ (x[ti] >> 1) & 0xff);
             } else {
               out[ti] = (x[ti] << 3) ^ (x[ti] >> 1) & 0xff;
             }
           }
         }",
    )
}

/// A batched softmax over a grid of two tiles, `tile([b, m])`, the row in one block.
pub fn batched_softmax() -> Kernel {
    let mut k = Kernel::empty("batched_softmax");
    k.tensors = vec![
        tensor("x", 3, Some(DType::BF16)),
        tensor("out", 3, Some(DType::BF16)),
    ];
    k.scalars = vec![scalar("b"), scalar("m"), scalar("n")];
    k.dims = vec![dim("tb", 0), dim("tm", 1), dim("tn", 2)];
    k.grid = vec![0, 1];
    k.vars = vec![var("v", false), var("mx", false), var("e", false)];
    let x = load(0, &[0, 1, 2], "x[(tb, tm, tn)]");
    k.body = vec![loop_(
        2,
        vec![
            let_(0, cast(x, Some(DType::F32)), "let v = …"),
            let_(
                1,
                reduce(ReduceOp::Max, Expr::Var(0), 2, "v.max(tn)"),
                "let mx = …",
            ),
            let_(
                2,
                un(
                    UnOp::Exp,
                    bin(BinOp::Sub, Expr::Var(0), Expr::Var(1), "v - mx"),
                ),
                "let e = exp(v - mx)",
            ),
            store(
                1,
                &[0, 1, 2],
                cast(
                    bin(
                        BinOp::Div,
                        Expr::Var(2),
                        reduce(ReduceOp::Sum, Expr::Var(2), 2, "e.sum(tn)"),
                        "e / e.sum(tn)",
                    ),
                    None,
                ),
                "out[(tb, tm, tn)] = (e / e.sum(tn)).cast()",
            ),
        ],
    )];
    k
}
