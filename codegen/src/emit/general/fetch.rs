//! Atomics whose old values the program keeps: `let slot =
//! atomic_add(counts[ids[tt]], 1);` (a token's place in its id's list, an
//! item's in its expert's). One atomic per element, by the element's owner
//! (as a store's), its result in the owner's register; where other threads
//! hold the same element (a value broadcast over another tile dimension, a
//! block smaller than the threads), the owners hand the results over through
//! shared memory, so that every copy reads what the one atomic returned.
//! Never the vector reductions nor the private copies: neither returns
//! anything.

use super::{Gen, Val};
use crate::error::CodegenError;
use crate::ir::*;
use crate::prims::AtomicOp;

impl Gen<'_, '_> {
    /// `let var = op(t[index], value);`: the atomic element by element, the
    /// old values into `var`'s registers (0 where a place is skipped).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn fetch(
        &mut self,
        t: TensorId,
        index: &[Expr],
        value: &Expr,
        (op, var): (AtomicOp, VarId),
        at: &str,
        l: usize,
        depth: usize,
    ) -> Result<(), CodegenError> {
        let ty = self.e.checked.vars[var].clone();
        let old = Val {
            name: format!("v{var}_{}", self.temps),
            dims: ty.dims.clone(),
            cty: ty.dtype.cty(),
            layout: l,
            raw: None,
            view: None,
        };
        self.temps += 1;
        let decl = self.decl(&old);
        self.w(depth, format!("{decl};"));
        let dims = self.access_dims(index, value);
        if dims != old.dims {
            return Err(self.unsupported(
                at,
                "internal: the old values' tiles are not the atomic's".to_string(),
            ));
        }
        self.store(t, index, value, (Some(op), Some(&old)), at, l, depth)?;
        let owner = self.owner_c(l, &dims);
        if owner != "true" {
            self.convert(&old, &old, depth)?;
        }
        self.vars.insert(var, old);
        Ok(())
    }
}
