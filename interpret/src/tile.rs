//! Tile values: a dense block over named tile dimensions, broadcast by name.

use tilefuse_codegen::ir::DimId;

/// A value of the kernel: elements over `dims` (row-major, `lens[i]` along
/// `dims[i]`); a scalar has no dims. `int` marks integer values (indices,
/// comparisons, integer tensors), which arithmetic keeps exact.
#[derive(Clone, Debug)]
pub(crate) struct Tile {
    pub dims: Vec<DimId>,
    pub lens: Vec<usize>,
    pub int: bool,
    pub data: Vec<f64>,
}

impl Tile {
    pub fn scalar(v: f64, int: bool) -> Tile {
        Tile {
            dims: Vec::new(),
            lens: Vec::new(),
            int,
            data: vec![v],
        }
    }

    /// A tile over `dims` of `lens` with each element from `f(position)`,
    /// `position` one index per dim.
    pub fn build(
        dims: &[DimId],
        lens: &[usize],
        int: bool,
        mut f: impl FnMut(&[usize]) -> f64,
    ) -> Tile {
        let mut data = Vec::with_capacity(lens.iter().product());
        for_each_position(lens, |pos| data.push(f(pos)));
        Tile {
            dims: dims.to_vec(),
            lens: lens.to_vec(),
            int,
            data,
        }
    }

    /// The element at `pos`, an index per dim of some tile that has every dim of
    /// this one (`of` names those dims): this tile broadcast along the others.
    pub fn at(&self, of: &[DimId], pos: &[usize]) -> f64 {
        let mut at = 0usize;
        for (d, &n) in self.dims.iter().zip(&self.lens) {
            let i = of.iter().position(|x| x == d).map_or(0, |k| pos[k]);
            at = at * n + i;
        }
        self.data[at]
    }

    /// The dims and lens of `tiles` broadcast together: each tile's dims in
    /// order of first appearance.
    pub fn union(tiles: &[&Tile]) -> (Vec<DimId>, Vec<usize>) {
        let (mut dims, mut lens) = (Vec::new(), Vec::new());
        for t in tiles {
            for (&d, &n) in t.dims.iter().zip(&t.lens) {
                if !dims.contains(&d) {
                    dims.push(d);
                    lens.push(n);
                }
            }
        }
        (dims, lens)
    }

    /// `f` applied elementwise to `tiles` broadcast together.
    pub fn zip(tiles: &[&Tile], int: bool, mut f: impl FnMut(&[f64]) -> f64) -> Tile {
        let (dims, lens) = Tile::union(tiles);
        let mut args = vec![0.0; tiles.len()];
        Tile::build(&dims, &lens, int, |pos| {
            for (a, t) in args.iter_mut().zip(tiles) {
                *a = t.at(&dims, pos);
            }
            f(&args)
        })
    }

    pub fn map(&self, int: bool, mut f: impl FnMut(f64) -> f64) -> Tile {
        Tile {
            dims: self.dims.clone(),
            lens: self.lens.clone(),
            int,
            data: self.data.iter().map(|&v| f(v)).collect(),
        }
    }
}

/// Calls `f` on every position of a block of `lens`, in row-major order (the
/// order of a tile's `data`).
pub(crate) fn for_each_position(lens: &[usize], mut f: impl FnMut(&[usize])) {
    let n: usize = lens.iter().product();
    let mut pos = vec![0usize; lens.len()];
    for _ in 0..n {
        f(&pos);
        for d in (0..pos.len()).rev() {
            pos[d] += 1;
            if pos[d] < lens[d] {
                break;
            }
            pos[d] = 0;
        }
    }
}
