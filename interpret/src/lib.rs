//! Interpret mode: a kernel's tile IR executed on the CPU, program by program
//! and tile by tile, with the semantics of the CUDA C that `tilefuse-codegen`
//! emits from the same IR. Each primitive computes with its table's CPU
//! function ([`tilefuse_codegen::prims`]), next to the CUDA C the GPU runs,
//! and every value has the type the checker gives it, so the two cannot
//! disagree:
//!
//! - a run first checks and lowers the kernel for its arguments and config
//!   as a GPU launch would (`tilefuse_codegen::lower`): what the GPU refuses
//!   is refused here ([`InterpretError::Refused`], [`InterpretError::Argument`]);
//! - the block sizes come from the [`Config`], so tiles on ragged edges are
//!   clipped to the extent exactly where the GPU masks them (the tiles of a
//!   `tile(begin..end)` loop at its `end`; `.until(bound)` walks the tiles
//!   that begin before the bound, clipped at the extent); `each` dimensions
//!   and `for i in begin..end` loops take one index at a time;
//! - values are exact in their dtype: floats are f32 (bf16/f16 where loaded
//!   or cast so) and every float operation is rounded to f32; integers are
//!   exact 64-bit values wrapped to their type after each operation (C's
//!   promotions, `i64` beyond 2^53 and `u32` bit tricks included), shifts by
//!   the width or more give 0 (or -1), comparisons give masks (`bool`); a
//!   cast, an assignment to a variable of another type and a store convert
//!   as Rust's `as` does (bf16/f16 round to nearest even, floats into
//!   integers saturate, integers wrap);
//! - loads, stores and atomics take any index per dimension (a tile's
//!   indices, `tn + off`, a gathered `ids[tt]`, a scalar); where an index
//!   leaves its tensor a load reads zero and a store or an atomic skips the
//!   element, as on the GPU;
//! - `atomic_add`/`atomic_max`/`atomic_min` update the host memory atomically
//!   (compare-and-swap loops), so programs on several threads lose nothing;
//! - reductions see a tile's in-bounds elements only, from the identity
//!   (floats: 0, 1, -inf, +inf; integers: 0, 1, the type's min and max);
//!   `addmm` accumulates in f32;
//! - `rand`/`randn`/`randint` are the GPU's Philox numbers, bit for bit;
//! - a runtime `if` statement runs the branch its scalars choose; a runtime
//!   `if` value is a `select`.
//!
//! Tensors are views of [`HostMemory`], which other threads and processes may
//! write while a kernel runs: a `wait` blocks until its flag is set (by a copy
//! thread, another rank) or its timeout passes, with the GPU's message.
//!
//! Where the GPU is silent, this is not: a `wait` on a flag outside its
//! tensor is an error naming it ([`InterpretError::OutOfBounds`]), and an
//! integer division by zero whose result is used (stored, reduced, an index,
//! a bound) is an error naming the division
//! ([`InterpretError::DivideByZero`]); one that a `select` discards is not.
//!
//! Differences in the last bits: the GPU's `exp` is `ex2.approx` and its f32
//! division `div.full` (2 ulp), tensor cores and warp reductions add in their
//! own order; here they are exact and in index order. Both are well inside the
//! bf16 tolerance that results are compared at.
//!
//! ```
//! use tilefuse_codegen::{ir::*, Config, DType, Planned};
//! use tilefuse_interpret::{run, HostTensor, Scalar};
//! // out[i] = x[i] * 2 over tiles of 4: a 1-D kernel written as IR.
//! let k = Planned::new(Kernel {
//!     name: "double".into(),
//!     tensors: vec![
//!         TensorParam { name: "x".into(), rank: 1, declared: Some(DType::F32) },
//!         TensorParam { name: "out".into(), rank: 1, declared: Some(DType::F32) },
//!     ],
//!     scalars: vec![ScalarParam::named("n")],
//!     constexprs: vec![],
//!     dims: vec![TileDim { name: "t".into(), extent: Some(0), whole: false, each: false }],
//!     grid: vec![0],
//!     grid_start: vec![],
//!     vars: vec![],
//!     body: vec![Stmt::Store {
//!         tensor: 1,
//!         index: tile_index(&[0]),
//!         value: Expr::Binary {
//!             op: BinOp::Mul,
//!             lhs: Box::new(Expr::Load { tensor: 0, index: tile_index(&[0]), at: "x[t]".into() }),
//!             rhs: Box::new(Expr::Float(2.0)),
//!             at: "x[t] * 2.0".into(),
//!         },
//!         at: "out[t] = x[t] * 2.0".into(),
//!     }],
//! });
//! let x = HostTensor::from_f64(DType::F32, &[10], (0..10).map(f64::from).collect()).unwrap();
//! let out = HostTensor::filled(DType::F32, &[10], f64::NAN).unwrap();
//! let tensors = [x, out];
//! run(&k, &Config::new(&[4]), &[], &tensors, &[Scalar::Int(10)]).unwrap();
//! assert_eq!(tensors[1].get(&[9]), Some(18.0));
//! assert_eq!(tensors[1].get(&[10]), None);
//! ```

mod error;
mod eval;
mod exec;
mod memory;
mod tensor;
mod tile;

pub use error::{InterpretError, OutOfBounds};
pub use exec::{run, run_with, Options, Scalar};
pub use memory::HostMemory;
pub use tensor::HostTensor;
pub use tilefuse_codegen::Config;
