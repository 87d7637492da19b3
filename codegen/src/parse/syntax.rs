//! The untyped syntax tree the parser builds before names are resolved, and
//! the operators' precedences.

use crate::dtype::DType;
use crate::ir::*;

/// An expression as written, before its names are resolved: conditions and
/// values read the same syntax differently (`!x`, `(a < b)`).
#[derive(Debug)]
pub(super) struct Node {
    pub(super) kind: N,
    pub(super) start: usize,
    pub(super) end: usize,
}

#[derive(Debug)]
pub(super) enum N {
    Name(String),
    /// A scalar whose name is a host expression of several tokens (`a.size(0)`).
    HostScalar(ScalarId),
    Int(u128),
    Float(f64),
    /// `f32::NEG_INFINITY`, `i32::MIN`, …
    Path(Vec<String>),
    Paren(Box<Node>),
    /// `{ e }`.
    Block(Box<Node>),
    Tuple(Vec<Node>),
    Array(Vec<Node>),
    Neg(Box<Node>),
    Not(Box<Node>),
    Bin(Op, Box<Node>, Box<Node>),
    As(Box<Node>, DType),
    Call {
        name: String,
        ty: Option<DType>,
        args: Vec<Node>,
    },
    Method {
        recv: Box<Node>,
        name: String,
        name_at: usize,
        ty: Option<DType>,
        args: Vec<Node>,
    },
    Index(Box<Node>, Box<Node>),
    If(Box<Node>, Box<Node>, Box<Node>),
    /// `a..b` (`true`: `a..=b`), an argument of `wait`.
    Range(Box<Node>, Box<Node>, bool),
}

#[derive(Clone, Copy, Debug)]
pub(super) enum Op {
    Bin(BinOp),
    Cmp(CmpOp),
    And,
    Or,
}

/// Binary operators by token, with Rust's precedence (higher binds tighter).
pub(super) fn binary_op(p: &str) -> Option<(Op, u8)> {
    Some(match p {
        "||" => (Op::Or, 1),
        "&&" => (Op::And, 2),
        "==" => (Op::Cmp(CmpOp::Eq), 3),
        "!=" => (Op::Cmp(CmpOp::Ne), 3),
        "<" => (Op::Cmp(CmpOp::Lt), 3),
        "<=" => (Op::Cmp(CmpOp::Le), 3),
        ">" => (Op::Cmp(CmpOp::Gt), 3),
        ">=" => (Op::Cmp(CmpOp::Ge), 3),
        "|" => (Op::Bin(BinOp::BitOr), 4),
        "^" => (Op::Bin(BinOp::BitXor), 5),
        "&" => (Op::Bin(BinOp::BitAnd), 6),
        "<<" => (Op::Bin(BinOp::Shl), 7),
        ">>" => (Op::Bin(BinOp::Shr), 7),
        "+" => (Op::Bin(BinOp::Add), 8),
        "-" => (Op::Bin(BinOp::Sub), 8),
        "*" => (Op::Bin(BinOp::Mul), 9),
        "/" => (Op::Bin(BinOp::Div), 9),
        "%" => (Op::Bin(BinOp::Rem), 9),
        _ => return None,
    })
}

/// Compound assignments (`acc += x`).
pub(super) fn compound_op(p: &str) -> Option<BinOp> {
    Some(match p {
        "+=" => BinOp::Add,
        "-=" => BinOp::Sub,
        "*=" => BinOp::Mul,
        "/=" => BinOp::Div,
        "%=" => BinOp::Rem,
        "&=" => BinOp::BitAnd,
        "|=" => BinOp::BitOr,
        "^=" => BinOp::BitXor,
        "<<=" => BinOp::Shl,
        ">>=" => BinOp::Shr,
        _ => return None,
    })
}
