//! Tile values: a dense block over named tile dimensions, broadcast by name,
//! each element held exactly as the GPU holds it in its dtype.

use std::sync::Arc;
use tilefuse_codegen::ir::DimId;
use tilefuse_codegen::prims::cast::Num;
use tilefuse_codegen::DType;

/// A value of the kernel: elements over `dims` (row-major, `lens[i]` along
/// `dims[i]`); a scalar has no dims. `dtype` is the checker's type of the
/// value; each element is exact in it: floats as f64 holding an f32 (or
/// bf16/f16) value, integers and masks (0 or 1) as exact i64 (a `u32` as its
/// unsigned value).
#[derive(Clone, Debug)]
pub(crate) struct Tile {
    pub dims: Vec<DimId>,
    pub lens: Vec<usize>,
    pub dtype: DType,
    pub data: Vec<Num>,
    /// Elements that are the result of an integer division by zero (an
    /// unspecified value on the GPU): an error where one is used, none where
    /// a `select` discards it.
    pub poison: Option<Arc<Poison>>,
}

/// Which elements of a tile are poisoned, and by which division.
#[derive(Debug)]
pub(crate) struct Poison {
    /// The division as written.
    pub at: String,
    pub bad: Vec<bool>,
}

impl Tile {
    pub fn scalar(v: Num, dtype: DType) -> Tile {
        Tile {
            dims: Vec::new(),
            lens: Vec::new(),
            dtype,
            data: vec![v],
            poison: None,
        }
    }

    /// The division that poisoned element `i`, if it is poisoned.
    pub fn bad(&self, i: usize) -> Option<&str> {
        match &self.poison {
            Some(p) if p.bad[i] => Some(&p.at),
            _ => None,
        }
    }

    /// The division that poisoned some element, if one is.
    pub fn any_bad(&self) -> Option<&str> {
        self.poison
            .as_ref()
            .filter(|p| p.bad.contains(&true))
            .map(|p| p.at.as_str())
    }

    /// This tile's element strides along `dims` (of `lens`), 0 along the
    /// dimensions it lacks, for broadcasting it over them; `None` if it has a
    /// dimension outside `dims` or another length along one.
    pub fn strides_in(&self, dims: &[DimId], lens: &[usize]) -> Option<Vec<usize>> {
        let mut st = vec![0; dims.len()];
        let mut s = 1;
        for (d, &n) in self.dims.iter().zip(&self.lens).rev() {
            let p = dims.iter().position(|x| x == d)?;
            if lens[p] != n {
                return None;
            }
            st[p] = s;
            s *= n;
        }
        Some(st)
    }
}

/// Poisoned elements of a tile being built.
pub(crate) struct BadSet {
    n: usize,
    at: Option<String>,
    bad: Vec<bool>,
}

impl BadSet {
    pub fn new(n: usize) -> BadSet {
        BadSet {
            n,
            at: None,
            bad: Vec::new(),
        }
    }

    /// Element `i` is poisoned, by the division `at`.
    pub fn mark(&mut self, i: usize, at: &str) {
        if self.bad.is_empty() {
            self.bad = vec![false; self.n];
        }
        self.bad[i] = true;
        if self.at.is_none() {
            self.at = Some(at.to_string());
        }
    }

    pub fn finish(self) -> Option<Arc<Poison>> {
        self.at.map(|at| Arc::new(Poison { at, bad: self.bad }))
    }
}

/// Calls `f(i, position, offsets)` on every position of a block of `lens`
/// in row-major order (`i` counting them), with `offsets[t]` the element of
/// input `t` there: the sum of `position[p] * strides[t][p]`. Stops at the
/// first error.
pub(crate) fn walk<E>(
    lens: &[usize],
    strides: &[Vec<usize>],
    mut f: impl FnMut(usize, &[usize], &[usize]) -> Result<(), E>,
) -> Result<(), E> {
    let n: usize = lens.iter().product();
    let mut pos = vec![0usize; lens.len()];
    let mut offs = vec![0usize; strides.len()];
    for i in 0..n {
        f(i, &pos, &offs)?;
        for d in (0..lens.len()).rev() {
            pos[d] += 1;
            for (o, s) in offs.iter_mut().zip(strides) {
                *o += s[d];
            }
            if pos[d] < lens[d] {
                break;
            }
            for (o, s) in offs.iter_mut().zip(strides) {
                *o -= s[d] * lens[d];
            }
            pos[d] = 0;
        }
    }
    Ok(())
}

/// Calls `f` on every position of a block of `lens`, in row-major order (the
/// order of a tile's `data`).
pub(crate) fn for_each_position(lens: &[usize], mut f: impl FnMut(&[usize])) {
    let r: Result<(), std::convert::Infallible> = walk(lens, &[], |_, pos, _| {
        f(pos);
        Ok(())
    });
    let Ok(()) = r;
}
