//! The registry: the general lowering comes last and takes every kernel, and
//! a kernel is planned once, by the first lowering that takes it.

use super::Planned;
use crate::dtype::DType;
use crate::emit::LOWERINGS;
use crate::ir::*;

/// `out[t] = x[t] * 2.0` over `t in tile(n)`: elementwise, no fast path's.
fn double() -> Kernel {
    let x = Expr::Load {
        tensor: 0,
        index: tile_index(&[0]),
        at: "x[t]".into(),
    };
    Kernel {
        name: "double".into(),
        tensors: vec![
            TensorParam {
                name: "x".into(),
                rank: 1,
                declared: Some(DType::F32),
            },
            TensorParam {
                name: "out".into(),
                rank: 1,
                declared: Some(DType::F32),
            },
        ],
        scalars: vec![ScalarParam::named("n")],
        constexprs: vec![],
        dims: vec![TileDim {
            name: "t".into(),
            extent: Some(0),
            whole: false,
            each: false,
        }],
        grid: vec![0],
        grid_start: vec![],
        vars: vec![],
        body: vec![Stmt::Store {
            tensor: 1,
            index: tile_index(&[0]),
            value: Expr::Binary {
                op: BinOp::Mul,
                lhs: Box::new(x),
                rhs: Box::new(Expr::Float(2.0)),
                at: "x[t] * 2.0".into(),
            },
            at: "out[t] = x[t] * 2.0".into(),
        }],
    }
}

/// A kernel with nothing in it.
fn empty() -> Kernel {
    Kernel::empty("empty")
}

#[test]
fn the_general_lowering_comes_last_and_takes_every_kernel() {
    let Some(last) = LOWERINGS.last() else {
        panic!("the registry is empty");
    };
    for k in [double(), empty()] {
        let chosen = last.try_plan(&k).expect("the general lowering takes it");
        assert_eq!(chosen.name(), "general");
    }
}

#[test]
fn a_kernel_no_fast_path_takes_is_planned_by_the_general_lowering() {
    for k in [double(), empty()] {
        let fast = &LOWERINGS[..LOWERINGS.len() - 1];
        assert!(fast.iter().all(|l| l.try_plan(&k).is_none()), "{}", k.name);
        let p = Planned::new(k);
        assert_eq!(p.lowering(), "general");
        let general = p.plan::<crate::emit::general::lowering::GeneralPlan>();
        assert!(general.is_some_and(|g| g.split.is_none()));
        assert_eq!(p.plan::<crate::emit::GemmShape>(), None);
    }
}

#[test]
fn a_kernel_without_branches_is_its_own_specialization() {
    let p = Planned::new(double());
    let s = p.specialize(&[]).expect("nothing to decide");
    assert!(matches!(s, std::borrow::Cow::Borrowed(_)));
}
