//! A tile loop's next tile loaded while this one computes (`num_stages` 2).
//!
//! A loop that loads a tile, then reduces it (`acc = acc + x[(tm, tn)]
//! .sum(tm)`), has its loads in flight only between the top of a step and
//! the first use: while a warp adds, nothing of its is on the way, and a
//! column sum with 16 one-warp programs an SM keeps DRAM 77% busy. With
//! two stages the loop loads its first tile before it starts; each step
//! takes the tile that arrived, issues the next tile's loads into the
//! freed registers, then computes, so a warp's loads are in flight while
//! it works. Taken: the loads [`Gen::prefetch`] would issue at the top of
//! the loop's body whose index moves with the loop's tile. The next tile
//! is loaded only where the loop will visit it (its start below the
//! loop's bound), with the masks of any step; a ring of more stages would
//! need the loop unrolled (a register copy of a load in flight waits for
//! it), so more stages do as two.

use super::{indent, Gen, Val};
use crate::error::CodegenError;
use crate::ir::*;

/// The registers one loop carries: a load's next tile, filled a step early.
pub(super) struct Ahead {
    load: Expr,
    next: Val,
}

impl Gen<'_, '_> {
    /// Whether a loop with this config loads a step ahead.
    pub(super) fn pipelined(&self) -> bool {
        self.e.cfg.num_stages >= 2
    }

    /// Before the loop over `dim` (its first tile at `begin`, none at or
    /// past `bound`): the loads of `body` that move with the tile, issued
    /// for the first tile into registers the steps carry.
    pub(super) fn load_first(
        &mut self,
        body: &[Stmt],
        dim: DimId,
        begin: &str,
        bound: &str,
        l: usize,
        depth: usize,
    ) -> Result<Vec<Ahead>, CodegenError> {
        let loads: Vec<Expr> = self
            .level_loads(body)
            .into_iter()
            .filter(|x| moves_with(x, dim))
            .cloned()
            .collect();
        let mut out = Vec::new();
        for x in loads {
            let (first, text) = self.captured_load(&x, l, depth + 1)?;
            let next = Val {
                name: self.temp("tf_nx"),
                ..first.clone()
            };
            let decl = self.decl(&next);
            self.w(
                depth,
                format!("{decl};  // the next tile of {}", load_name(self, &x)),
            );
            self.w(depth, format!("if ({begin} < {bound}) {{"));
            self.w(depth + 1, format!("const long long tb{dim} = {begin};"));
            self.body.push_str(&text);
            self.copy(&first, &next, depth + 1);
            self.w(depth, "}");
            out.push(Ahead { load: x, next });
        }
        Ok(out)
    }

    /// At the top of a step: each carried tile taken as this step's load
    /// (found by the statements in [`Gen::loaded`]), then the next tile's
    /// loads issued into the carried registers.
    pub(super) fn load_next(
        &mut self,
        ahead: &[Ahead],
        dim: DimId,
        bound: &str,
        l: usize,
        depth: usize,
    ) -> Result<(), CodegenError> {
        for a in ahead {
            let cur = Val {
                name: self.temp("tf_l"),
                ..a.next.clone()
            };
            let decl = self.decl(&cur);
            self.w(depth, format!("{decl};  // {}", load_name(self, &a.load)));
            self.copy(&a.next, &cur, depth);
            self.loaded.push((a.load.clone(), cur));
        }
        if ahead.is_empty() {
            return Ok(());
        }
        let b = self.block(dim);
        self.w(depth, format!("if (tb{dim} + {b} < {bound}) {{"));
        self.w(
            depth + 1,
            format!("const long long tf_nb{dim} = tb{dim} + {b};"),
        );
        self.w(depth + 1, "{");
        self.w(depth + 2, format!("const long long tb{dim} = tf_nb{dim};"));
        for a in ahead {
            let (v, text) = self.captured_load(&a.load, l, depth + 2)?;
            self.body.push_str(&text);
            self.copy(&v, &a.next, depth + 2);
        }
        self.w(depth + 1, "}");
        self.w(depth, "}");
        Ok(())
    }

    /// A load's code, written aside: its value's declaration must come
    /// first, outside the block the code runs in.
    fn captured_load(
        &mut self,
        x: &Expr,
        l: usize,
        depth: usize,
    ) -> Result<(Val, String), CodegenError> {
        let at = match x {
            Expr::Load { at, .. } => at.clone(),
            _ => String::new(),
        };
        let mut text = String::new();
        std::mem::swap(&mut text, &mut self.body);
        let v = self.load(x, &at, l, depth, &[]);
        std::mem::swap(&mut text, &mut self.body);
        Ok((v?, text))
    }

    /// `dst = src` element by element (both arrays of one shape).
    fn copy(&mut self, src: &Val, dst: &Val, depth: usize) {
        let n = self.len(src);
        self.w(
            depth,
            format!(
                "#pragma unroll\n{}for (int tf_i = 0; tf_i < {n}; ++tf_i) {}[tf_i] = {}[tf_i];",
                indent(depth),
                dst.name,
                src.name
            ),
        );
    }
}

/// Whether a load's index mentions the loop's tile (else every step loads
/// the same tile, and carrying it ahead gains nothing).
fn moves_with(x: &Expr, dim: DimId) -> bool {
    let mut found = false;
    x.walk(&mut |y| found |= matches!(y, Expr::TileIndex(d) if *d == dim));
    found
}

fn load_name(g: &Gen, x: &Expr) -> String {
    match x {
        Expr::Load { tensor, .. } => format!("`{}`", g.k().tensors[*tensor].name),
        _ => "a load".into(),
    }
}
