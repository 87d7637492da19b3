//! Interpret mode: a kernel's tile IR executed on the CPU, program by program
//! and tile by tile, with the semantics of the CUDA C that `tilefuse-codegen`
//! emits from the same IR:
//!
//! - the block sizes come from the [`Config`], so tiles on ragged edges are
//!   clipped to the extent exactly where the GPU masks them;
//! - values are f32 (integers where the GPU has integers): every float
//!   operation is rounded to f32, `addmm` accumulates in f32 per K step, a cast
//!   to bf16/f16 and a store to a bf16/f16 tensor round to nearest even;
//! - reductions see a tile's in-bounds elements only.
//!
//! Tensors are views of [`HostMemory`], which other threads and processes may
//! write while a kernel runs: a `wait` blocks until its flag is set (by a copy
//! thread, another rank) or its timeout passes, with the GPU's message.
//!
//! Where the GPU is silent, this is not: a load or store outside its tensor is
//! an error naming the access, the tile and the index (the GPU reads zeros and
//! drops the write).
//!
//! Differences in the last bits: the GPU's `exp` is `ex2.approx` and its f32
//! division `div.full` (2 ulp), tensor cores and warp reductions add in their
//! own order; here they are exact and in index order. Both are well inside the
//! bf16 tolerance that results are compared at.
//!
//! ```
//! use tilefuse_codegen::{ir::*, Config, DType};
//! use tilefuse_interpret::{run, HostTensor, Scalar};
//! // out[i] = x[i] * 2 over tiles of 4: a 1-D kernel written as IR.
//! let k = Kernel {
//!     name: "double".into(),
//!     tensors: vec![
//!         TensorParam { name: "x".into(), rank: 1, declared: Some(DType::F32) },
//!         TensorParam { name: "out".into(), rank: 1, declared: Some(DType::F32) },
//!     ],
//!     scalars: vec![ScalarParam { name: "n".into() }],
//!     constexprs: vec![],
//!     dims: vec![TileDim { name: "t".into(), extent: 0, whole: false }],
//!     grid: vec![0],
//!     grid_start: vec![],
//!     vars: vec![],
//!     body: vec![Stmt::Store {
//!         tensor: 1,
//!         index: vec![0],
//!         value: Expr::Binary {
//!             op: BinOp::Mul,
//!             lhs: Box::new(Expr::Load { tensor: 0, index: vec![0], at: "x[t]".into() }),
//!             rhs: Box::new(Expr::Float(2.0)),
//!             at: "x[t] * 2.0".into(),
//!         },
//!         at: "out[t] = x[t] * 2.0".into(),
//!     }],
//! };
//! let x = HostTensor::from_f64(DType::F32, &[10], (0..10).map(f64::from).collect()).unwrap();
//! let out = HostTensor::filled(DType::F32, &[10], f64::NAN);
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
