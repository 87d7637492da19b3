//! Interpret mode's semantics on hand-built IR kernels, against values
//! computed by hand: general indices (gathers, offsets, scalars), computed
//! loop bounds, `each` loops, atomics from many programs, integer edge cases,
//! casts, integer reductions, Philox numbers, runtime `if`s, and what the
//! interpreter refuses.

use tilefuse_codegen::ir::*;
use tilefuse_codegen::prims::rand::{normal, philox, uniform};
use tilefuse_codegen::{Config, DType, Planned, ScalarKind, Spec, TensorSpec};
use tilefuse_interpret::{run, run_with, HostTensor, InterpretError, Options, Scalar};

// ---- building kernels ------------------------------------------------------

fn tensor(name: &str, rank: usize) -> TensorParam {
    TensorParam {
        name: name.into(),
        rank,
        declared: None,
    }
}

/// A tile dimension over the extent in scalar `extent` (`None`: a loop with a range).
fn dim(name: &str, extent: Option<ScalarId>) -> TileDim {
    TileDim {
        name: name.into(),
        extent,
        whole: false,
        each: false,
    }
}

fn each(name: &str, extent: Option<ScalarId>) -> TileDim {
    TileDim {
        each: true,
        ..dim(name, extent)
    }
}

struct K {
    tensors: Vec<TensorParam>,
    scalars: Vec<&'static str>,
    dims: Vec<TileDim>,
    grid: Vec<DimId>,
    vars: Vec<(&'static str, bool)>,
}

impl K {
    /// The kernel, planned (as `run` takes it).
    fn build(self, body: Vec<Stmt>) -> Planned {
        Planned::new(Kernel {
            name: "k".into(),
            tensors: self.tensors,
            scalars: self
                .scalars
                .iter()
                .map(|s| ScalarParam::named(*s))
                .collect(),
            constexprs: vec![],
            dims: self.dims,
            grid: self.grid,
            grid_start: vec![],
            vars: self
                .vars
                .iter()
                .map(|&(name, mutable)| Var {
                    name: name.into(),
                    mutable,
                })
                .collect(),
            body,
        })
    }
}

fn b(e: Expr) -> Box<Expr> {
    Box::new(e)
}

fn load(tensor: TensorId, index: Vec<Expr>) -> Expr {
    Expr::Load {
        tensor,
        index,
        at: format!("t{tensor}[…]"),
    }
}

fn bin(op: BinOp, lhs: Expr, rhs: Expr) -> Expr {
    Expr::Binary {
        op,
        lhs: b(lhs),
        rhs: b(rhs),
        at: op.symbol().to_string(),
    }
}

fn cmp(op: CmpOp, lhs: Expr, rhs: Expr) -> Expr {
    Expr::Compare {
        op,
        lhs: b(lhs),
        rhs: b(rhs),
        at: "cmp".into(),
    }
}

fn ti(d: DimId) -> Expr {
    Expr::TileIndex(d)
}

fn store(tensor: TensorId, index: Vec<Expr>, value: Expr) -> Stmt {
    Stmt::Store {
        tensor,
        index,
        value,
        at: format!("t{tensor}[…] = …"),
    }
}

fn cast(arg: Expr, dtype: DType) -> Expr {
    Expr::Cast {
        arg: b(arg),
        dtype: Some(dtype),
    }
}

fn zeros(dims: Vec<DimId>, dtype: DType) -> Expr {
    Expr::Full {
        dims,
        dtype,
        value: 0.0,
    }
}

fn let_(var: VarId, value: Expr) -> Stmt {
    Stmt::Let {
        var,
        value,
        at: "let".into(),
    }
}

fn assign(var: VarId, value: Expr) -> Stmt {
    Stmt::Assign {
        var,
        value,
        at: "assign".into(),
    }
}

fn f32s(shape: &[usize], v: &[f64]) -> HostTensor {
    HostTensor::from_f64(DType::F32, shape, v.to_vec()).unwrap()
}

fn ints(dtype: DType, shape: &[usize], v: &[i64]) -> HostTensor {
    HostTensor::from_i64(dtype, shape, v.to_vec()).unwrap()
}

fn one_thread() -> Options {
    Options {
        threads: 1,
        ..Options::default()
    }
}

// ---- indices -----------------------------------------------------------------

/// `out[(t, d)] = w[(ids[t], d)]`: rows gathered by index; an index outside
/// `w` (past the end, negative) reads zeros. `d`'s extent 3 ends in a
/// partial block of 4.
#[test]
fn a_gather_reads_the_rows_its_indices_name_and_zeros_outside() {
    let k = K {
        tensors: vec![tensor("w", 2), tensor("ids", 1), tensor("out", 2)],
        scalars: vec!["n", "dm"],
        dims: vec![dim("t", Some(0)), dim("d", Some(1))],
        grid: vec![0, 1],
        vars: vec![],
    }
    .build(vec![store(
        2,
        vec![ti(0), ti(1)],
        load(0, vec![load(1, vec![ti(0)]), ti(1)]),
    )]);
    let w: Vec<f64> = (0..15).map(|i| i as f64 + 0.5).collect();
    let t = [
        f32s(&[5, 3], &w),
        ints(DType::I64, &[5], &[4, 0, 2, 7, -1]),
        HostTensor::filled(DType::F32, &[5, 3], f64::NAN).unwrap(),
    ];
    run(
        &k,
        &Config::new(&[2, 4]),
        &[],
        &t,
        &[Scalar::Int(5), Scalar::Int(3)],
    )
    .unwrap();
    let mut want = Vec::new();
    for id in [4i64, 0, 2, 7, -1] {
        for d in 0..3 {
            want.push(if (0..5).contains(&id) {
                w[id as usize * 3 + d]
            } else {
                0.0
            });
        }
    }
    assert_eq!(t[2].values(), want);
}

/// `out[t] = x[t + 2]`: the last two elements read past `x`'s end: zeros.
#[test]
fn an_offset_load_reads_zeros_past_the_end() {
    let k = K {
        tensors: vec![tensor("x", 1), tensor("out", 1)],
        scalars: vec!["n"],
        dims: vec![dim("t", Some(0))],
        grid: vec![0],
        vars: vec![],
    }
    .build(vec![store(
        1,
        vec![ti(0)],
        load(0, vec![bin(BinOp::Add, ti(0), Expr::Int(2))]),
    )]);
    let x: Vec<f64> = (1..=10).map(f64::from).collect();
    let t = [
        f32s(&[10], &x),
        HostTensor::filled(DType::F32, &[10], f64::NAN).unwrap(),
    ];
    run(&k, &Config::new(&[4]), &[], &t, &[Scalar::Int(10)]).unwrap();
    assert_eq!(
        t[1].values(),
        [3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0, 0.0, 0.0]
    );
}

/// A load at a scalar index (`y[j]`, `y[1]`) is a scalar, broadcast over
/// the tile it meets; a scalar index outside the tensor reads zero.
#[test]
fn a_scalar_load_broadcasts() {
    let k = K {
        tensors: vec![
            tensor("x", 1),
            tensor("y", 1),
            tensor("out", 1),
            tensor("o2", 1),
        ],
        scalars: vec!["n", "j", "far"],
        dims: vec![dim("t", Some(0))],
        grid: vec![0],
        vars: vec![],
    }
    .build(vec![
        store(
            2,
            vec![ti(0)],
            bin(
                BinOp::Add,
                bin(
                    BinOp::Mul,
                    load(0, vec![ti(0)]),
                    load(1, vec![Expr::Scalar(1)]),
                ),
                load(1, vec![Expr::Int(1)]),
            ),
        ),
        store(3, vec![ti(0)], load(1, vec![Expr::Scalar(2)])),
    ]);
    let t = [
        f32s(&[6], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]),
        f32s(&[3], &[10.0, 100.0, 3.0]),
        HostTensor::filled(DType::F32, &[6], f64::NAN).unwrap(),
        HostTensor::filled(DType::F32, &[6], f64::NAN).unwrap(),
    ];
    let s = [Scalar::Int(6), Scalar::Int(2), Scalar::Int(3)];
    run(&k, &Config::new(&[4]), &[], &t, &s).unwrap();
    assert_eq!(t[2].values(), [103.0, 106.0, 109.0, 112.0, 115.0, 118.0]);
    assert_eq!(t[3].values(), [0.0; 6]);
}

// ---- loops ---------------------------------------------------------------------

/// Jagged segments: a grid `each` over segments, `tile(off[s]..off[s + 1])`
/// inside (tiles from the segment's start, clipped at its end), an empty
/// segment summing to 0.
#[test]
fn a_range_loop_walks_tiles_from_its_begin_clipped_at_its_end() {
    let (s, tt) = (0, 1);
    let k = K {
        tensors: vec![
            tensor("x", 1),
            tensor("off", 1),
            tensor("sums", 1),
            tensor("steps", 1),
        ],
        scalars: vec!["segments"],
        dims: vec![each("s", Some(0)), dim("tt", None)],
        grid: vec![s],
        vars: vec![("acc", true), ("n", true)],
    }
    .build(vec![
        let_(0, zeros(vec![], DType::F32)),
        let_(1, Expr::Int(0)),
        Stmt::Loop {
            dim: tt,
            body: vec![
                assign(
                    0,
                    bin(
                        BinOp::Add,
                        Expr::Var(0),
                        Expr::Reduce {
                            op: ReduceOp::Sum,
                            arg: b(load(0, vec![ti(tt)])),
                            dim: tt,
                            at: "x[tt].sum(tt)".into(),
                        },
                    ),
                ),
                // Steps, weighted by their sizes: 100 per step plus its size.
                assign(
                    1,
                    bin(
                        BinOp::Add,
                        Expr::Var(1),
                        bin(BinOp::Add, Expr::Int(100), Expr::TileSize(tt)),
                    ),
                ),
            ],
            until: None,
            range: Some(Box::new(LoopRange {
                begin: load(1, vec![ti(s)]),
                end: load(1, vec![bin(BinOp::Add, ti(s), Expr::Int(1))]),
            })),
        },
        store(2, vec![ti(s)], Expr::Var(0)),
        store(3, vec![ti(s)], Expr::Var(1)),
    ]);
    let x: Vec<f64> = (0..8).map(|i| f64::from(1 << i)).collect();
    let t = [
        f32s(&[8], &x),
        ints(DType::I32, &[4], &[0, 3, 3, 8]),
        HostTensor::filled(DType::F32, &[3], f64::NAN).unwrap(),
        ints(DType::I64, &[3], &[-1, -1, -1]),
    ];
    run(&k, &Config::new(&[1, 2]), &[], &t, &[Scalar::Int(3)]).unwrap();
    assert_eq!(t[2].values(), [7.0, 0.0, 248.0]);
    // Segment 0: tiles 0..2, 2..3; segment 2: 3..5, 5..7, 7..8.
    assert_eq!(t[3].values_i64(), [203, 0, 305]);
}

/// `for j in 0..m`: one column at a time (`j` a scalar index), row sums of
/// an i32 matrix kept exact; `tm`'s last tile is partial.
#[test]
fn an_each_loop_takes_one_index_at_a_time() {
    let (tm, j) = (0, 1);
    let k = K {
        tensors: vec![tensor("x", 2), tensor("out", 1)],
        scalars: vec!["rows", "cols"],
        dims: vec![dim("tm", Some(0)), each("j", None)],
        grid: vec![tm],
        vars: vec![("acc", true)],
    }
    .build(vec![
        let_(0, zeros(vec![tm], DType::I32)),
        Stmt::Loop {
            dim: j,
            body: vec![assign(
                0,
                bin(
                    BinOp::Add,
                    Expr::Var(0),
                    bin(BinOp::Mul, load(0, vec![ti(tm), ti(j)]), ti(j)),
                ),
            )],
            until: None,
            range: Some(Box::new(LoopRange {
                begin: Expr::Int(0),
                end: Expr::Scalar(1),
            })),
        },
        store(1, vec![ti(tm)], Expr::Var(0)),
    ]);
    let (rows, cols) = (5usize, 7usize);
    let x: Vec<i64> = (0..rows * cols).map(|i| i as i64 * 1000).collect();
    let t = [
        ints(DType::I32, &[rows, cols], &x),
        ints(DType::I64, &[rows], &[0; 5]),
    ];
    let s = [Scalar::Int(rows as i64), Scalar::Int(cols as i64)];
    run(&k, &Config::new(&[4, 1]), &[], &t, &s).unwrap();
    let want: Vec<i64> = (0..rows)
        .map(|r| (0..cols).map(|c| x[r * cols + c] * c as i64).sum())
        .collect();
    assert_eq!(t[1].values_i64(), want);
}

// ---- atomics ------------------------------------------------------------------

/// A histogram from 250 programs on 8 threads: every `atomic_add` lands
/// (i32 counts, f32 and bf16 weights, an i32 max); values outside the bins
/// are skipped.
#[test]
fn atomics_from_many_programs_on_many_threads_lose_nothing() {
    let t_ = 0;
    let atomic = |op, tensor, value| Stmt::Atomic {
        op,
        tensor,
        index: vec![load(0, vec![ti(t_)])],
        value,
        old: None,
        at: "atomic".into(),
    };
    let k = K {
        tensors: vec![
            tensor("vals", 1),
            tensor("hist", 1),
            tensor("wsum", 1),
            tensor("bsum", 1),
            tensor("most", 1),
        ],
        scalars: vec!["n"],
        dims: vec![dim("t", Some(0))],
        grid: vec![t_],
        vars: vec![],
    }
    .build(vec![
        atomic(AtomicOp::Add, 1, Expr::Int(1)),
        atomic(AtomicOp::Add, 2, Expr::Float(0.5)),
        atomic(AtomicOp::Add, 3, Expr::Float(1.0)),
        atomic(AtomicOp::Max, 4, ti(t_)),
    ]);
    let n = 1000usize;
    // Bins 0..8, and 8 and -1 outside them.
    let vals: Vec<i64> = (0..n as i64)
        .map(|i| {
            if i % 50 == 49 {
                8
            } else if i % 50 == 48 {
                -1
            } else {
                i % 7
            }
        })
        .collect();
    let t = [
        ints(DType::I32, &[n], &vals),
        ints(DType::I32, &[8], &[0; 8]),
        f32s(&[8], &[0.0; 8]),
        HostTensor::filled(DType::BF16, &[8], 0.0).unwrap(),
        ints(DType::I32, &[8], &[-5; 8]),
    ];
    let options = Options {
        threads: 8,
        ..Options::default()
    };
    run_with(
        &k,
        &Config::new(&[4]),
        &[],
        &t,
        &[Scalar::Int(n as i64)],
        &options,
    )
    .unwrap();
    let mut counts = [0i64; 8];
    let mut most = [-5i64; 8];
    for (i, &v) in vals.iter().enumerate() {
        if (0..8).contains(&v) {
            counts[v as usize] += 1;
            most[v as usize] = most[v as usize].max(i as i64);
        }
    }
    assert_eq!(t[1].values_i64(), counts);
    let halves: Vec<f64> = counts.iter().map(|&c| c as f64 * 0.5).collect();
    assert_eq!(t[2].values(), halves);
    // Counts up to 256 are exact in bf16.
    assert!(counts.iter().all(|&c| c <= 256));
    let whole: Vec<f64> = counts.iter().map(|&c| c as f64).collect();
    assert_eq!(t[3].values(), whole);
    assert_eq!(t[4].values_i64(), most);
}

/// `let slot = atomic_add(counts[bin], 1)` from 250 programs on 8 threads:
/// each element of a bin gets a slot of its own, together exactly
/// `0..count`; an element outside the bins (skipped) gets 0.
#[test]
fn an_atomics_old_values_are_distinct_slots() {
    let t_ = 0;
    let k = K {
        tensors: vec![tensor("bins", 1), tensor("counts", 1), tensor("slots", 1)],
        scalars: vec!["n"],
        dims: vec![dim("t", Some(0))],
        grid: vec![t_],
        vars: vec![("slot", false)],
    }
    .build(vec![
        Stmt::Atomic {
            op: AtomicOp::Add,
            tensor: 1,
            index: vec![load(0, vec![ti(t_)])],
            value: Expr::Int(1),
            old: Some(0),
            at: "let slot = atomic_add(counts[bins[t]], 1)".into(),
        },
        store(2, vec![ti(t_)], Expr::Var(0)),
    ]);
    let n = 1000usize;
    let bins: Vec<i64> = (0..n as i64)
        .map(|i| if i % 97 == 5 { 9 } else { (i * 7) % 5 })
        .collect();
    let t = [
        ints(DType::I32, &[n], &bins),
        ints(DType::I32, &[5], &[0; 5]),
        ints(DType::I32, &[n], &vec![-1; n]),
    ];
    let options = Options {
        threads: 8,
        ..Options::default()
    };
    run_with(
        &k,
        &Config::new(&[4]),
        &[],
        &t,
        &[Scalar::Int(n as i64)],
        &options,
    )
    .unwrap();
    let slots = t[2].values_i64();
    for b in 0..5 {
        let mut got: Vec<i64> = (0..n).filter(|&i| bins[i] == b).map(|i| slots[i]).collect();
        got.sort_unstable();
        let count = got.len() as i64;
        assert_eq!(got, (0..count).collect::<Vec<_>>(), "bin {b}");
        assert_eq!(t[1].values_i64()[b as usize], count);
    }
    assert!((0..n).filter(|&i| bins[i] == 9).all(|i| slots[i] == 0));
}

// ---- integers ------------------------------------------------------------------

/// u32 arithmetic wraps, shifts by the width or more give 0 (or -1 for a
/// negative i32 `>>`), bit operations are exact on all 32 bits.
#[test]
fn integer_bit_ops_and_shifts_are_exact_at_their_edges() {
    let t_ = 0;
    let x = || load(0, vec![ti(t_)]);
    let sh = || load(1, vec![ti(t_)]);
    let neg = || load(2, vec![ti(t_)]);
    let k = K {
        tensors: (0..10).map(|i| tensor(&format!("t{i}"), 1)).collect(),
        scalars: vec!["n"],
        dims: vec![dim("t", Some(0))],
        grid: vec![t_],
        vars: vec![],
    }
    .build(vec![
        store(3, vec![ti(t_)], bin(BinOp::Shl, x(), sh())),
        store(4, vec![ti(t_)], bin(BinOp::Shr, x(), sh())),
        store(5, vec![ti(t_)], bin(BinOp::Shr, neg(), sh())),
        store(
            6,
            vec![ti(t_)],
            bin(BinOp::Mul, x(), Expr::Int(0x9E37_79B9)),
        ),
        store(
            7,
            vec![ti(t_)],
            bin(
                BinOp::BitXor,
                bin(BinOp::Add, x(), Expr::Int(1)),
                Expr::Int(0xFFFF_0000),
            ),
        ),
        store(
            8,
            vec![ti(t_)],
            Expr::Unary {
                op: UnOp::Not,
                arg: b(bin(
                    BinOp::BitOr,
                    x(),
                    bin(BinOp::BitAnd, sh(), Expr::Int(3)),
                )),
            },
        ),
        store(9, vec![ti(t_)], bin(BinOp::Shl, neg(), sh())),
    ]);
    let xs: [i64; 6] = [0xFFFF_FFFF, 0x8000_0001, 1, 0x1234_5678, 0, 0xDEAD_BEEF];
    let shs: [i64; 6] = [0, 1, 31, 32, 40, 3];
    let negs: [i64; 6] = [-8, -8, -8, -8, -8, i64::from(i32::MIN)];
    let u32s = |v: &[i64]| ints(DType::U32, &[6], v);
    let t = [
        u32s(&xs),
        ints(DType::I32, &[6], &shs),
        ints(DType::I32, &[6], &negs),
        u32s(&[0; 6]),
        u32s(&[0; 6]),
        ints(DType::I32, &[6], &[0; 6]),
        u32s(&[0; 6]),
        u32s(&[0; 6]),
        u32s(&[0; 6]),
        ints(DType::I32, &[6], &[0; 6]),
    ];
    run(&k, &Config::new(&[4]), &[], &t, &[Scalar::Int(6)]).unwrap();
    let (mut shl, mut shr, mut sra, mut mul, mut xor, mut not, mut sla) =
        (vec![], vec![], vec![], vec![], vec![], vec![], vec![]);
    for i in 0..6 {
        let (x, s, v) = (xs[i] as u32, shs[i] as u32, negs[i] as i32);
        shl.push(i64::from(x.checked_shl(s).unwrap_or(0)));
        shr.push(i64::from(x.checked_shr(s).unwrap_or(0)));
        sra.push(i64::from(if s < 32 { v >> s } else { v >> 31 }));
        mul.push(i64::from(x.wrapping_mul(0x9E37_79B9)));
        xor.push(i64::from(x.wrapping_add(1) ^ 0xFFFF_0000));
        not.push(i64::from(!(x | (s & 3))));
        sla.push(i64::from(v.checked_shl(s).unwrap_or(0)));
    }
    assert_eq!(t[3].values_i64(), shl, "<<");
    assert_eq!(t[4].values_i64(), shr, ">>");
    assert_eq!(t[5].values_i64(), sra, "i32 >>");
    assert_eq!(t[6].values_i64(), mul, "u32 *");
    assert_eq!(t[7].values_i64(), xor, "^");
    assert_eq!(t[8].values_i64(), not, "!");
    assert_eq!(t[9].values_i64(), sla, "i32 <<");
    // Spot checks of the edges.
    assert_eq!(t[3].get_i64(&[3]), Some(0), "u32 << 32");
    assert_eq!(t[5].get_i64(&[4]), Some(-1), "-8 >> 40");
    assert_eq!(t[7].get_i64(&[0]), Some(0xFFFF_0000), "u32::MAX + 1 wraps");
}

/// Narrow integers widen to i32 when computed (127 + 1 is 128), and wrap
/// when stored back; masks store as 0 and 1.
#[test]
fn narrow_integers_promote_and_masks_store_as_bytes() {
    let t_ = 0;
    let k = K {
        tensors: vec![
            tensor("x", 1),
            tensor("wide", 1),
            tensor("back", 1),
            tensor("mask", 1),
        ],
        scalars: vec!["n"],
        dims: vec![dim("t", Some(0))],
        grid: vec![t_],
        vars: vec![("y", false)],
    }
    .build(vec![
        let_(0, bin(BinOp::Add, load(0, vec![ti(t_)]), Expr::Int(1))),
        store(1, vec![ti(t_)], Expr::Var(0)),
        store(2, vec![ti(t_)], Expr::Var(0)),
        store(
            3,
            vec![ti(t_)],
            cmp(CmpOp::Gt, load(0, vec![ti(t_)]), Expr::Int(0)),
        ),
    ]);
    let t = [
        ints(DType::I8, &[4], &[127, -128, 0, 5]),
        ints(DType::I16, &[4], &[0; 4]),
        ints(DType::I8, &[4], &[0; 4]),
        ints(DType::U8, &[4], &[9; 4]),
    ];
    run(&k, &Config::new(&[4]), &[], &t, &[Scalar::Int(4)]).unwrap();
    assert_eq!(t[1].values_i64(), [128, -127, 1, 6]);
    assert_eq!(t[2].values_i64(), [-128, -127, 1, 6]);
    assert_eq!(t[3].values_i64(), [1, 0, 0, 1]);
}

/// `x.cast::<u8>()` saturates and takes NaN to 0; a store's `.cast()` to
/// bf16 rounds to nearest even.
#[test]
fn casts_saturate_into_integers_and_round_into_bf16() {
    let t_ = 0;
    let k = K {
        tensors: vec![tensor("x", 1), tensor("bytes", 1), tensor("halves", 1)],
        scalars: vec!["n"],
        dims: vec![dim("t", Some(0))],
        grid: vec![t_],
        vars: vec![],
    }
    .build(vec![
        store(1, vec![ti(t_)], cast(load(0, vec![ti(t_)]), DType::U8)),
        store(
            2,
            vec![ti(t_)],
            Expr::Cast {
                arg: b(load(0, vec![ti(t_)])),
                dtype: None,
            },
        ),
    ]);
    let x = [
        -5.0,
        0.7,
        255.9,
        300.0,
        f64::NAN,
        1.00390625,
        1.01171875,
        77.5,
    ];
    let t = [
        f32s(&[8], &x),
        ints(DType::U8, &[8], &[1; 8]),
        HostTensor::filled(DType::BF16, &[8], 0.0).unwrap(),
    ];
    run(&k, &Config::new(&[4]), &[], &t, &[Scalar::Int(8)]).unwrap();
    assert_eq!(t[1].values_i64(), [0, 0, 255, 255, 0, 1, 1, 77]);
    let h = t[2].values();
    // 1 + 2^-8 is a tie: to the even 1.0; 1 + 3·2^-8 to 1 + 2^-6.
    assert_eq!(h[5], 1.0);
    assert_eq!(h[6], 1.015625);
    assert_eq!(h[3], 300.0);
}

/// Integer reductions are exact (i64 beyond 2^53), wrap in their type
/// (i32 sums), start from the type's identity, and count only the elements
/// inside the extent of a partial tile.
#[test]
fn integer_reductions_are_exact_and_wrap() {
    let (tm, tn) = (0, 1);
    let red = |op, t| Expr::Reduce {
        op,
        arg: b(load(t, vec![ti(tm), ti(tn)])),
        dim: tn,
        at: "reduce".into(),
    };
    let k = K {
        tensors: vec![
            tensor("big", 2),
            tensor("small", 2),
            tensor("sum", 1),
            tensor("max", 1),
            tensor("min", 1),
            tensor("wrapped", 1),
        ],
        scalars: vec!["m", "n"],
        dims: vec![dim("tm", Some(0)), dim("tn", Some(1))],
        grid: vec![tm],
        vars: vec![("s", true), ("hi", true), ("lo", true), ("w", true)],
    }
    .build(vec![
        let_(0, zeros(vec![tm], DType::I64)),
        let_(
            1,
            Expr::Full {
                dims: vec![tm],
                dtype: DType::I64,
                value: -1e18,
            },
        ),
        let_(
            2,
            Expr::Full {
                dims: vec![tm],
                dtype: DType::I32,
                value: 1e9,
            },
        ),
        let_(3, zeros(vec![tm], DType::I32)),
        Stmt::Loop {
            dim: tn,
            body: vec![
                assign(0, bin(BinOp::Add, Expr::Var(0), red(ReduceOp::Sum, 0))),
                assign(1, bin(BinOp::Max, Expr::Var(1), red(ReduceOp::Max, 0))),
                assign(2, bin(BinOp::Min, Expr::Var(2), red(ReduceOp::Min, 1))),
                assign(3, bin(BinOp::Add, Expr::Var(3), red(ReduceOp::Sum, 1))),
            ],
            until: None,
            range: None,
        },
        store(2, vec![ti(tm)], Expr::Var(0)),
        store(3, vec![ti(tm)], Expr::Var(1)),
        store(4, vec![ti(tm)], Expr::Var(2)),
        store(5, vec![ti(tm)], Expr::Var(3)),
    ]);
    // 2 rows of 300: column blocks of 128 (what the row lowering takes with
    // one warp), so each row is reduced in three steps, the last partial.
    let (m, n) = (2usize, 300usize);
    let p = 1i64 << 60;
    let mut big: Vec<i64> = (0..m * n).map(|i| (i % n) as i64 * 3 - 100).collect();
    big[7] = p + 1;
    big[200] = p + 3;
    big[n + 5] = i64::MAX;
    big[n + 299] = -p;
    let mut small: Vec<i64> = (0..m * n).map(|i| -((i % 7) as i64)).collect();
    small[0] = i64::from(i32::MAX);
    small[1] = 2000;
    small[n + 150] = i64::from(i32::MIN);
    let t = [
        ints(DType::I64, &[m, n], &big),
        ints(DType::I32, &[m, n], &small),
        ints(DType::I64, &[m], &[0; 2]),
        ints(DType::I64, &[m], &[0; 2]),
        ints(DType::I64, &[m], &[0; 2]),
        ints(DType::I64, &[m], &[0; 2]),
    ];
    let cfg = Config::new(&[2, 128]).num_warps(1);
    run(
        &k,
        &cfg,
        &[],
        &t,
        &[Scalar::Int(m as i64), Scalar::Int(n as i64)],
    )
    .unwrap();
    let rows = |v: &[i64], f: &dyn Fn(&[i64]) -> i64| -> Vec<i64> { v.chunks(n).map(f).collect() };
    let sum = rows(&big, &|r| r.iter().fold(0i64, |s, &x| s.wrapping_add(x)));
    assert_eq!(
        sum[0],
        2 * p + 4 + (0..n as i64).map(|c| c * 3 - 100).sum::<i64>()
            - (7 * 3 - 100)
            - (200 * 3 - 100)
    );
    assert_eq!(t[2].values_i64(), sum);
    assert_eq!(t[3].values_i64(), [p + 3, i64::MAX]);
    assert_eq!(t[4].values_i64(), [-6, i64::from(i32::MIN)]);
    let wrap = rows(&small, &|r| {
        i64::from(r.iter().fold(0i32, |s, &x| s.wrapping_add(x as i32)))
    });
    assert_ne!(wrap[0], small[..n].iter().sum::<i64>(), "the i32 sum wraps");
    assert_eq!(t[5].values_i64(), wrap);
}

/// Scans along a loop's tile, carried across its blocks: an i32 prefix sum
/// wraps in its type as the GPU's does, an i64 running maximum is exact past
/// 2^53, and the last, partial block scans only the elements in the extent.
#[test]
fn scans_carried_across_blocks_are_exact_and_wrap() {
    let (tm, tn) = (0, 1);
    let scan = |op, t| Expr::Scan {
        op,
        arg: b(load(t, vec![ti(tm), ti(tn)])),
        dim: tn,
        at: "scan".into(),
    };
    let red = |op, t| Expr::Reduce {
        op,
        arg: b(load(t, vec![ti(tm), ti(tn)])),
        dim: tn,
        at: "reduce".into(),
    };
    let k = K {
        tensors: vec![
            tensor("small", 2),
            tensor("big", 2),
            tensor("sums", 2),
            tensor("maxima", 2),
        ],
        scalars: vec!["m", "n"],
        dims: vec![dim("tm", Some(0)), dim("tn", Some(1))],
        grid: vec![tm],
        vars: vec![("s", true), ("hi", true)],
    }
    .build(vec![
        let_(0, zeros(vec![tm], DType::I32)),
        let_(
            1,
            Expr::Full {
                dims: vec![tm],
                dtype: DType::I64,
                value: -1e18,
            },
        ),
        Stmt::Loop {
            dim: tn,
            body: vec![
                store(
                    2,
                    vec![ti(tm), ti(tn)],
                    bin(BinOp::Add, Expr::Var(0), scan(ReduceOp::Sum, 0)),
                ),
                store(
                    3,
                    vec![ti(tm), ti(tn)],
                    bin(BinOp::Max, Expr::Var(1), scan(ReduceOp::Max, 1)),
                ),
                assign(0, bin(BinOp::Add, Expr::Var(0), red(ReduceOp::Sum, 0))),
                assign(1, bin(BinOp::Max, Expr::Var(1), red(ReduceOp::Max, 1))),
            ],
            until: None,
            range: None,
        },
    ]);
    // Blocks of 128 columns: three steps a row, the last partial.
    let (m, n) = (2usize, 300usize);
    let p = 1i64 << 60;
    let mut small: Vec<i64> = (0..m * n).map(|i| (i % 11) as i64 - 5).collect();
    small[3] = i64::from(i32::MAX);
    small[n + 200] = i64::from(i32::MIN);
    let mut big: Vec<i64> = (0..m * n).map(|i| -((i % 13) as i64) * (p / 16)).collect();
    big[130] = p + 1;
    big[131] = p + 3;
    big[n + 299] = p - 1;
    let t = [
        ints(DType::I32, &[m, n], &small),
        ints(DType::I64, &[m, n], &big),
        ints(DType::I32, &[m, n], &vec![7; m * n]),
        ints(DType::I64, &[m, n], &vec![7; m * n]),
    ];
    let cfg = Config::new(&[2, 128]).num_warps(1);
    run(
        &k,
        &cfg,
        &[],
        &t,
        &[Scalar::Int(m as i64), Scalar::Int(n as i64)],
    )
    .unwrap();
    let mut sums = Vec::new();
    let mut maxima = Vec::new();
    for r in 0..m {
        let (mut s, mut hi) = (0i32, -1_000_000_000_000_000_000i64);
        for c in 0..n {
            s = s.wrapping_add(small[r * n + c] as i32);
            hi = hi.max(big[r * n + c]);
            sums.push(i64::from(s));
            maxima.push(hi);
        }
    }
    assert!(sums[10] < 0, "the i32 prefix sum wraps past i32::MAX");
    assert_eq!(t[2].values_i64(), sums);
    assert_eq!(maxima[n - 1], p + 3);
    assert_eq!(t[3].values_i64(), maxima);
}

/// `argmax`/`argmin` give the first index of the best value (ties are
/// common), never a NaN's; a block of NaNs only gives its first index.
#[test]
fn arg_reductions_pick_the_first_best_and_skip_nans() {
    let (tm, tn) = (0, 1);
    let pick = |op| Expr::ArgReduce {
        op,
        arg: b(load(0, vec![ti(tm), ti(tn)])),
        dim: tn,
        at: "pick".into(),
    };
    let mut row = dim("tn", Some(1));
    row.whole = true;
    let k = K {
        tensors: vec![tensor("x", 2), tensor("hi", 1), tensor("lo", 1)],
        scalars: vec!["m", "n"],
        dims: vec![dim("tm", Some(0)), row],
        grid: vec![tm, tn],
        vars: vec![],
    }
    .build(vec![
        store(1, vec![ti(tm)], pick(ReduceOp::Max)),
        store(2, vec![ti(tm)], pick(ReduceOp::Min)),
    ]);
    let nan = f64::NAN;
    #[rustfmt::skip]
    let x = [
        nan, 1.0, 3.0, 3.0, nan, -2.0, 5.0, -2.0,
        nan, nan, nan, nan, nan, nan, nan, nan,
        0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5,
    ];
    let t = [
        f32s(&[3, 8], &x),
        ints(DType::I64, &[3], &[-1; 3]),
        ints(DType::I64, &[3], &[-1; 3]),
    ];
    let cfg = Config::new(&[1, 8]).num_warps(1);
    run(&k, &cfg, &[], &t, &[Scalar::Int(3), Scalar::Int(8)]).unwrap();
    assert_eq!(t[1].values_i64(), [6, 0, 0]);
    assert_eq!(t[2].values_i64(), [5, 0, 0]);
}

// ---- matmul ----------------------------------------------------------------------

/// `addmm` on partial tiles, on the tensor-core path (the loop holds only
/// the `addmm`) and on the general one (it holds another statement too):
/// small integers, so every product and sum is exact in f32 and both give
/// the exact product.
#[test]
fn addmm_is_exact_on_small_integers_on_both_paths() {
    let (tm, tn, tk) = (0, 1, 2);
    let (m, n, kk) = (20usize, 24usize, 40usize);
    let kernel = |extra: bool| {
        let mut body = vec![assign(
            0,
            Expr::Addmm {
                acc: b(Expr::Var(0)),
                a: b(load(0, vec![ti(tm), ti(tk)])),
                b: b(load(1, vec![ti(tk), ti(tn)])),
                at: "addmm".into(),
            },
        )];
        if extra {
            body.push(let_(1, Expr::TileBegin(tk)));
        }
        K {
            tensors: vec![tensor("a", 2), tensor("b", 2), tensor("out", 2)],
            scalars: vec!["m", "n", "k"],
            dims: vec![dim("tm", Some(0)), dim("tn", Some(1)), dim("tk", Some(2))],
            grid: vec![tm, tn],
            vars: vec![("acc", true), ("x", false)],
        }
        .build(vec![
            let_(0, zeros(vec![tm, tn], DType::F32)),
            Stmt::Loop {
                dim: tk,
                body,
                until: None,
                range: None,
            },
            store(2, vec![ti(tm), ti(tn)], Expr::Var(0)),
        ])
    };
    let av: Vec<i64> = (0..m * kk).map(|i| (i % 7) as i64 - 3).collect();
    let bv: Vec<i64> = (0..kk * n).map(|i| (i % 11) as i64 - 5).collect();
    let mut want = vec![0i64; m * n];
    for i in 0..m {
        for j in 0..n {
            want[i * n + j] = (0..kk).map(|x| av[i * kk + x] * bv[x * n + j]).sum();
        }
    }
    let s = [
        Scalar::Int(m as i64),
        Scalar::Int(n as i64),
        Scalar::Int(kk as i64),
    ];
    for extra in [false, true] {
        let t = [
            ints(DType::BF16, &[m, kk], &av),
            ints(DType::BF16, &[kk, n], &bv),
            HostTensor::filled(DType::F32, &[m, n], f64::NAN).unwrap(),
        ];
        let cfg = Config::new(&[16, 16, 16]).num_warps(1);
        let spec = Spec {
            tensors: t
                .iter()
                .map(|x| TensorSpec::contiguous(x.dtype(), 2))
                .collect(),
            scalars: vec![ScalarKind::Int; 3],
            constexprs: vec![],
        };
        let path = tilefuse_codegen::lower(&kernel(extra), &spec, &cfg)
            .unwrap()
            .path;
        assert_eq!(path, if extra { "general" } else { "gemm/mma.sync" });
        run(&kernel(extra), &cfg, &[], &t, &s).unwrap();
        assert_eq!(t[2].values_i64(), want, "extra statement: {extra}");
    }
}

// ---- random numbers ---------------------------------------------------------

/// `randint`, `rand` and `randn` are Philox 4x32-10 bit for bit: the seed's
/// two words are the key, each offset (wrapped to u32) the counter.
#[test]
fn random_numbers_are_philox_bit_for_bit() {
    let t_ = 0;
    let rand = |kind, offset| Expr::Rand {
        kind,
        seed: b(Expr::Scalar(1)),
        offset: b(offset),
        at: "rand".into(),
    };
    let k = K {
        tensors: vec![tensor("bits", 1), tensor("u", 1), tensor("g", 1)],
        scalars: vec!["n", "seed", "base"],
        dims: vec![dim("t", Some(0))],
        grid: vec![t_],
        vars: vec![],
    }
    .build(vec![
        store(0, vec![ti(t_)], rand(RandKind::Bits, ti(t_))),
        store(
            1,
            vec![ti(t_)],
            rand(RandKind::Uniform, bin(BinOp::Add, ti(t_), Expr::Scalar(2))),
        ),
        store(2, vec![ti(t_)], rand(RandKind::Normal, ti(t_))),
    ]);
    let n = 37;
    let seed: i64 = 0x1234_5678_9ABC_DEF0;
    // Offsets past 2^32 wrap to u32.
    let base: i64 = (1 << 32) + 5;
    let t = [
        ints(DType::U32, &[n], &vec![0; n]),
        f32s(&[n], &vec![f64::NAN; n]),
        f32s(&[n], &vec![f64::NAN; n]),
    ];
    let s = [Scalar::Int(n as i64), Scalar::Int(seed), Scalar::Int(base)];
    run(&k, &Config::new(&[16]), &[], &t, &s).unwrap();
    // Four offsets share a counter (two for `randn`): word `o % 4` of `o / 4`.
    for i in 0..n {
        let o = i as u32;
        let c = philox(seed as u64, o / 4);
        assert_eq!(t[0].get_i64(&[i]), Some(i64::from(c[i % 4])), "randint {i}");
        let ou = (base + i as i64) as u32;
        let cu = philox(seed as u64, ou / 4);
        assert_eq!(
            t[1].get(&[i]),
            Some(f64::from(uniform(cu[(ou % 4) as usize]))),
            "rand {i}"
        );
        let cn = philox(seed as u64, o / 2);
        let j = 2 * (i % 2);
        assert_eq!(
            t[2].get(&[i]),
            Some(f64::from(normal(cn[j], cn[j + 1]))),
            "randn {i}"
        );
    }
}

// ---- control flow ---------------------------------------------------------------

/// A runtime `if` statement runs the branch its scalar chooses; a runtime
/// `if` value selects (a scalar branch broadcast over the tile).
#[test]
fn runtime_ifs_take_the_branch_their_scalars_choose() {
    let t_ = 0;
    let positive = || Cond::Cmp {
        op: CmpOp::Gt,
        lhs: Expr::Scalar(1),
        rhs: Expr::Int(0),
    };
    let x = || load(0, vec![ti(t_)]);
    let k = K {
        tensors: vec![tensor("x", 1), tensor("out", 1), tensor("out2", 1)],
        scalars: vec!["n", "s"],
        dims: vec![dim("t", Some(0))],
        grid: vec![t_],
        vars: vec![],
    }
    .build(vec![
        Stmt::If {
            cond: positive(),
            then: vec![store(1, vec![ti(t_)], x())],
            otherwise: vec![store(
                1,
                vec![ti(t_)],
                Expr::Unary {
                    op: UnOp::Neg,
                    arg: b(x()),
                },
            )],
            at: "if s > 0".into(),
        },
        store(
            2,
            vec![ti(t_)],
            Expr::IfConst {
                cond: Box::new(Cond::Not(Box::new(positive()))),
                then: b(x()),
                otherwise: b(Expr::Float(7.0)),
                at: "if !(s > 0) { x[t] } else { 7.0 }".into(),
            },
        ),
    ]);
    for s in [3i64, -3] {
        let t = [
            f32s(&[5], &[1.0, -2.0, 3.0, -4.0, 5.0]),
            HostTensor::filled(DType::F32, &[5], f64::NAN).unwrap(),
            HostTensor::filled(DType::F32, &[5], f64::NAN).unwrap(),
        ];
        run(
            &k,
            &Config::new(&[4]),
            &[],
            &t,
            &[Scalar::Int(5), Scalar::Int(s)],
        )
        .unwrap();
        if s > 0 {
            assert_eq!(t[1].values(), [1.0, -2.0, 3.0, -4.0, 5.0]);
            assert_eq!(t[2].values(), [7.0; 5]);
        } else {
            assert_eq!(t[1].values(), [-1.0, 2.0, -3.0, 4.0, -5.0]);
            assert_eq!(t[2].values(), [1.0, -2.0, 3.0, -4.0, 5.0]);
        }
    }
}

// ---- errors ----------------------------------------------------------------------

/// An integer division by zero is an error where its result is stored, and
/// none where a `select` discards it.
#[test]
fn a_used_division_by_zero_is_an_error_and_a_discarded_one_is_not() {
    let t_ = 0;
    let n = || load(0, vec![ti(t_)]);
    let d = || load(1, vec![ti(t_)]);
    let guarded = Expr::Select {
        mask: b(cmp(CmpOp::Ne, d(), Expr::Int(0))),
        then: b(bin(BinOp::Div, n(), d())),
        otherwise: b(Expr::Int(-1)),
        at: "select".into(),
    };
    let kernel = |value| {
        K {
            tensors: vec![tensor("n", 1), tensor("d", 1), tensor("out", 1)],
            scalars: vec!["len"],
            dims: vec![dim("t", Some(0))],
            grid: vec![t_],
            vars: vec![],
        }
        .build(vec![store(2, vec![ti(t_)], value)])
    };
    let args = || {
        [
            ints(DType::I32, &[4], &[7, -7, 9, 5]),
            ints(DType::I32, &[4], &[2, 2, 0, -5]),
            ints(DType::I32, &[4], &[0; 4]),
        ]
    };
    let t = args();
    run(
        &kernel(guarded),
        &Config::new(&[4]),
        &[],
        &t,
        &[Scalar::Int(4)],
    )
    .unwrap();
    assert_eq!(t[2].values_i64(), [3, -3, -1, -1]);
    let t = args();
    let e = run(
        &kernel(bin(BinOp::Rem, n(), d())),
        &Config::new(&[4]),
        &[],
        &t,
        &[Scalar::Int(4)],
    )
    .unwrap_err();
    assert!(matches!(e, InterpretError::DivideByZero { .. }), "{e}");
    assert!(
        e.to_string().contains("`%` divides an integer by zero"),
        "{e}"
    );
}

/// What the GPU's lowering refuses is refused here: the general lowering
/// takes power-of-two blocks and block 1 for an `each` dimension; a `wait`
/// on a flag outside its tensor is an error naming it.
#[test]
fn the_interpreter_refuses_what_the_gpu_refuses() {
    let k = K {
        tensors: vec![tensor("x", 1), tensor("out", 1)],
        scalars: vec!["n"],
        dims: vec![dim("t", Some(0))],
        grid: vec![0],
        vars: vec![],
    }
    .build(vec![store(
        1,
        vec![ti(0)],
        load(0, vec![bin(BinOp::Add, ti(0), Expr::Int(1))]),
    )]);
    let t = [f32s(&[6], &[0.0; 6]), f32s(&[6], &[0.0; 6])];
    let e = run(&k, &Config::new(&[3]), &[], &t, &[Scalar::Int(6)]).unwrap_err();
    assert!(matches!(e, InterpretError::Refused(_)), "{e}");
    assert!(e.to_string().contains("power of two"), "{e}");

    let k = K {
        tensors: vec![tensor("flags", 1), tensor("out", 1)],
        scalars: vec!["n"],
        dims: vec![each("i", Some(0))],
        grid: vec![0],
        vars: vec![],
    }
    .build(vec![
        Stmt::Wait {
            tensor: 0,
            index: bin(BinOp::Add, ti(0), Expr::Int(1)),
            end: None,
            value: Expr::Int(1),
            at: "wait(flags, i + 1, 1)".into(),
        },
        store(1, vec![ti(0)], Expr::Float(1.0)),
    ]);
    let t = [ints(DType::U32, &[3], &[1; 3]), f32s(&[3], &[0.0; 3])];
    let e = run(&k, &Config::new(&[2]), &[], &t, &[Scalar::Int(3)]).unwrap_err();
    assert!(matches!(e, InterpretError::Refused(_)), "{e}");
    let e = run_with(
        &k,
        &Config::new(&[1]),
        &[],
        &t,
        &[Scalar::Int(3)],
        &one_thread(),
    )
    .unwrap_err();
    assert!(matches!(e, InterpretError::OutOfBounds(_)), "{e}");
    assert!(
        e.to_string().contains("waits on `flags` at index [3]"),
        "{e}"
    );
    assert_eq!(t[1].values(), [1.0, 1.0, 0.0]);
}

/// A `u32` host scalar is computed as u32 (`x ^ seed` then a wrapping
/// multiply stays 32-bit), an `i32` one as i32, both on the GPU path too.
#[test]
fn host_scalars_keep_their_integer_type() {
    let k = K {
        tensors: vec![tensor("x", 1), tensor("out", 1)],
        scalars: vec!["n", "seed"],
        dims: vec![dim("t", Some(0))],
        grid: vec![0],
        vars: vec![],
    }
    .build(vec![store(
        1,
        vec![ti(0)],
        bin(
            BinOp::Mul,
            bin(BinOp::BitXor, load(0, vec![ti(0)]), Expr::Scalar(1)),
            Expr::Int(0x85eb_ca6b),
        ),
    )]);
    let xs = [1i64, 0xffff_ffff, 12345];
    let seed = 0xdead_beefu32;
    let x = ints(DType::U32, &[3], &xs);
    let out = ints(DType::U32, &[3], &[0, 0, 0]);
    let t = [x, out];
    run(
        &k,
        &Config::new(&[4]),
        &[],
        &t,
        &[Scalar::Int(3), Scalar::U32(seed)],
    )
    .unwrap();
    for (i, &xv) in xs.iter().enumerate() {
        let want = ((xv as u32) ^ seed).wrapping_mul(0x85eb_ca6b);
        assert_eq!(t[1].get_i64(&[i]), Some(i64::from(want)), "element {i}");
    }
    // The GPU path types it so too.
    let spec = Spec {
        tensors: vec![
            TensorSpec::contiguous(DType::U32, 1),
            TensorSpec::contiguous(DType::U32, 1),
        ],
        scalars: vec![ScalarKind::Int, ScalarKind::U32],
        constexprs: vec![],
    };
    let src = tilefuse_codegen::lower(&k, &spec, &Config::new(&[4]))
        .unwrap()
        .source;
    assert!(src.contains("(unsigned int)(s1)"), "{src}");
}
