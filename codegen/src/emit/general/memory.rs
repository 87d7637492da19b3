//! Loads, stores and atomics of the general lowering.
//!
//! Each index component addresses its axis in one of three ways: a tile's
//! own index plus a scalar offset (`tn`, `tn + n1`), a scalar (`b`,
//! `offsets[b]`), or a computed integer per element (a gather, `ids[tt]`).
//! An element is read or written only where every tile is inside its extent
//! and every index inside the tensor (a tile's own index needs no test: the
//! launch checks that the tensor's size is the tile's extent); a masked load
//! reads zero. Where the last component is a tile's index that runs along
//! the layout's vectors and nothing else depends on it, a thread's run of
//! elements is contiguous in memory and moves in 16-byte pieces (8 or 4 where
//! the alignment allows no more), element by element at ragged edges.

use super::{Gen, Layout, Val};
use crate::dtype::DType;
use crate::emit::expr::{convert, narrow, widen, zero, CTy};
use crate::error::CodegenError;
use crate::ir::*;
use crate::prims::AtomicOp;

/// How one index component addresses its axis.
#[derive(Clone, Debug)]
pub(super) enum Comp {
    /// Dimension `d`'s index plus an offset (a C scalar), if any.
    Affine { d: DimId, off: Option<String> },
    /// The same index for every element (a C scalar).
    Scalar(String),
    /// An index per element.
    Gather(Val),
}

/// How a run's element is made from a value's C and type (narrowed to a
/// store's type, converted to an atomic's).
pub(super) type RunElem = dyn Fn(&str, CTy) -> String;

/// The tile dimension `c` runs along as a tile's own index, plus or minus a
/// scalar: `tn`, `tn + off`, `off + tn`, `tn - off` (`None` for anything else).
pub(super) fn affine_dim(k: &Kernel, c: &Expr) -> Option<DimId> {
    affine_parts(k, c).map(|(d, _)| d)
}

/// `(d, offset)`: see [`affine_dim`]; the offset negated for `tn - off`.
fn affine_parts(k: &Kernel, c: &Expr) -> Option<(DimId, Option<Expr>)> {
    let scalarish = |x: &Expr| {
        let mut ok = true;
        x.walk(&mut |y| match y {
            Expr::TileIndex(d) => ok &= k.is_each(*d),
            Expr::Var(_)
            | Expr::Load { .. }
            | Expr::Full { .. }
            | Expr::Reduce { .. }
            | Expr::Scan { .. }
            | Expr::ArgReduce { .. } => ok = false,
            _ => {}
        });
        ok
    };
    match c {
        Expr::TileIndex(d) if !k.is_each(*d) => Some((*d, None)),
        Expr::Binary {
            op: BinOp::Add,
            lhs,
            rhs,
            at,
        } => match (&**lhs, &**rhs) {
            (Expr::TileIndex(d), x) | (x, Expr::TileIndex(d)) if !k.is_each(*d) && scalarish(x) => {
                let _ = at;
                Some((*d, Some(x.clone())))
            }
            _ => None,
        },
        Expr::Binary {
            op: BinOp::Sub,
            lhs,
            rhs,
            at,
        } => match &**lhs {
            Expr::TileIndex(d) if !k.is_each(*d) && scalarish(rhs) => {
                let _ = at;
                Some((
                    *d,
                    Some(Expr::Unary {
                        op: UnOp::Neg,
                        arg: rhs.clone(),
                    }),
                ))
            }
            _ => None,
        },
        _ => None,
    }
}

/// The C bits of element `j` of a run of `dtype` values loaded as chunks
/// `tf_w{i}` of `chunk` bytes (`uint4`, `uint2` or `unsigned int`), widened.
fn unpack(dtype: DType, chunk: usize, j: usize) -> String {
    let es = dtype.size();
    let byte = j * es;
    let (ci, within) = (byte / chunk, byte % chunk);
    let word = |w: usize| -> String {
        match chunk {
            16 => format!("tf_w{ci}.{}", ["x", "y", "z", "w"][w]),
            8 => format!("tf_w{ci}.{}", ["x", "y"][w]),
            _ => format!("tf_w{ci}"),
        }
    };
    let (wi, bi) = (within / 4, within % 4);
    let w = word(wi);
    match dtype {
        DType::F32 => format!("__uint_as_float({w})"),
        DType::I32 => format!("(int)({w})"),
        DType::U32 => w,
        DType::BF16 => format!("tf_bf16_to_f32((tf_u16)({w} >> {}))", bi * 8),
        DType::F16 => format!("tf_f16_to_f32((tf_u16)({w} >> {}))", bi * 8),
        DType::I16 => format!("(int)(short)({w} >> {})", bi * 8),
        DType::I8 => format!("(int)(signed char)({w} >> {})", bi * 8),
        DType::U8 => format!("(int)(({w} >> {}) & 0xffu)", bi * 8),
        DType::Bool => format!("((({w} >> {}) & 0xffu) != 0u)", bi * 8),
        DType::I64 => format!(
            "(long long)(((unsigned long long){} << 32) | (unsigned long long){w})",
            word(wi + 1)
        ),
    }
}

/// Element `f` (a C index) of an array `name` of raw 32-bit words holding
/// `dtype` values, widened ([`super::Val::raw`]).
pub(super) fn unpack_word(dtype: DType, name: &str, f: &str) -> String {
    let es = dtype.size();
    if es == 8 {
        return format!(
            "(long long)(((unsigned long long){name}[({f}) * 2 + 1] << 32) | (unsigned long long){name}[({f}) * 2])"
        );
    }
    let per = 4 / es;
    let w = if per == 1 {
        format!("{name}[{f}]")
    } else {
        format!("({name}[({f}) / {per}] >> ((({f}) % {per}) * {}))", es * 8)
    };
    match dtype {
        DType::F32 => format!("__uint_as_float({w})"),
        DType::I32 => format!("(int)({w})"),
        DType::U32 => w,
        DType::BF16 => format!("tf_bf16_to_f32((tf_u16){w})"),
        DType::F16 => format!("tf_f16_to_f32((tf_u16){w})"),
        DType::I16 => format!("(int)(short){w}"),
        DType::I8 => format!("(int)(signed char){w}"),
        DType::U8 => format!("(int)({w} & 0xffu)"),
        DType::Bool => format!("(({w} & 0xffu) != 0u)"),
        DType::I64 => unreachable!("handled above"),
    }
}

/// The 32-bit pattern (`unsigned int`) of a stored element's bits `s` (the
/// storage type), placed at byte `b` of its word.
fn bits(dtype: DType, s: &str, b: usize) -> String {
    match dtype.size() {
        4 => match dtype {
            DType::F32 => format!("__float_as_uint({s})"),
            _ => format!("(unsigned int)({s})"),
        },
        2 => format!("((unsigned int)(unsigned short)({s}) << {})", b * 8),
        _ => format!("((unsigned int)(unsigned char)({s}) << {})", b * 8),
    }
}

impl Gen<'_, '_> {
    /// `(d, offset C)` when `c` is a tile's index plus a scalar.
    fn affine(
        &self,
        c: &Expr,
        l: usize,
        at: &str,
    ) -> Result<Option<(DimId, Option<String>)>, CodegenError> {
        let Some((d, off)) = affine_parts(self.k(), c) else {
            return Ok(None);
        };
        if self.ty(c).dims != vec![d] {
            return Ok(None);
        }
        let off = match off {
            Some(x) => {
                let (c, t) = self.ctx(l, &[]).emit(&x, at)?;
                Some(convert(&c, t, CTy::I64))
            }
            None => None,
        };
        Ok(Some((d, off)))
    }

    /// The components of `index`, with the gathered ones computed into registers.
    fn comps(
        &mut self,
        index: &[Expr],
        at: &str,
        l: usize,
        depth: usize,
        pre: &[(Expr, Val)],
    ) -> Result<Vec<Comp>, CodegenError> {
        let mut out = Vec::new();
        for c in index {
            if let Some((d, off)) = self.affine(c, l, at)? {
                out.push(Comp::Affine { d, off });
            } else if self.ty(c).dims.is_empty() {
                let (x, t) = self.ctx(l, pre).emit(c, at)?;
                let name = self.temp("tf_i");
                self.w(
                    depth,
                    format!("const long long {name} = {};", convert(&x, t, CTy::I64)),
                );
                out.push(Comp::Scalar(name));
            } else {
                // The index's own loads first, in 16-byte runs where they
                // run along the layout (`idx[tn]`), not element by element.
                let mut with = pre.to_vec();
                self.hoist_into(c, at, l, depth, &mut with)?;
                out.push(Comp::Gather(self.materialize(c, at, l, depth, &with)?));
            }
        }
        Ok(out)
    }

    /// Whether axis `a` of `tensor`, addressed by `comp`, needs no bounds test:
    /// a tile's own index (no offset) over a host extent, which the launch
    /// checks to be the axis's size.
    fn safe(&self, comp: &Comp) -> bool {
        matches!(comp, Comp::Affine { d, off: None } if self.k().dims[*d].extent.is_some())
    }

    /// The C index along one axis for the current element (`j` added to a
    /// vector run's start, when given).
    pub(super) fn comp_c(&self, comp: &Comp, l: usize) -> String {
        match comp {
            Comp::Affine { d, off } => {
                let c = self.coord_c(l, *d);
                match off {
                    Some(o) => format!("({c} + {o})"),
                    None => c,
                }
            }
            Comp::Scalar(s) => s.clone(),
            Comp::Gather(v) => format!("(long long)({})", self.access(v)),
        }
    }

    /// The bounds test of the current element's index (unsafe components only).
    pub(super) fn bounds_c(
        &self,
        t: TensorId,
        comps: &[Comp],
        l: usize,
        skip: Option<usize>,
    ) -> Vec<String> {
        comps
            .iter()
            .enumerate()
            .filter(|(a, c)| Some(*a) != skip && !self.safe(c))
            .map(|(a, c)| {
                format!(
                    "(unsigned long long)({}) < (unsigned long long)t{t}_n{a}",
                    self.comp_c(c, l)
                )
            })
            .collect()
    }

    /// The element offset of the current element in `tensor`.
    fn offset_of(&self, t: TensorId, comps: &[Comp], l: usize) -> String {
        let ts = &self.e.spec.tensors[t];
        let last = comps.len().saturating_sub(1);
        let terms: Vec<String> = comps
            .iter()
            .enumerate()
            .map(|(a, c)| match a == last && ts.last_contiguous {
                true => self.comp_c(c, l),
                false => format!("{} * t{t}_s{a}", self.comp_c(c, l)),
            })
            .collect();
        terms.join(" + ")
    }

    /// The run a vectorized access moves along: the last component's
    /// dimension, its position in layout `l`, and the chunk size in bytes.
    pub(super) fn vector_run(
        &self,
        t: TensorId,
        comps: &[Comp],
        l: usize,
    ) -> Option<(DimId, usize, usize)> {
        let ts = &self.e.spec.tensors[t];
        let Some(Comp::Affine { d, .. }) = comps.last() else {
            return None;
        };
        let lay = &self.layouts[l];
        let p = lay.pos(*d)?;
        let run = lay.spt[p] * ts.dtype.size();
        if !ts.last_contiguous || lay.spt[p] < 2 || run < 4 || lay.wraps(p) {
            return None;
        }
        // Nothing else may depend on `d`: the run's other indices are fixed.
        let others_free = comps[..comps.len() - 1].iter().all(|c| match c {
            Comp::Affine { d: x, .. } => x != d,
            Comp::Scalar(_) => true,
            Comp::Gather(v) => !v.dims.contains(d),
        });
        let chunk = [16, 8, 4]
            .into_iter()
            .find(|&c| c <= run && run % c == 0 && ts.align >= c)?;
        others_free.then_some((*d, p, chunk))
    }

    /// The uniform test that the runs of dimension `d` (plus `off`) start on
    /// a chunk boundary: true for tiles from 0, tested for computed starts.
    fn aligned_c(&self, d: DimId, off: &Option<String>, chunk_elems: usize) -> String {
        let mut start = Vec::new();
        if self.k().dims[d].extent.is_none() {
            start.push(format!("tf_beg{d}"));
        }
        if let Some(o) = off {
            start.push(o.clone());
        }
        if start.is_empty() || chunk_elems <= 1 {
            "true".into()
        } else {
            format!("(({}) % {chunk_elems} == 0)", start.join(" + "))
        }
    }

    /// Loads `x` (a `tensor[index]`) into registers of layout `l`.
    pub(super) fn load(
        &mut self,
        x: &Expr,
        at: &str,
        l: usize,
        depth: usize,
        pre: &[(Expr, Val)],
    ) -> Result<Val, CodegenError> {
        let Expr::Load { tensor, index, .. } = x else {
            return Err(self.unsupported(at, "internal: not a load"));
        };
        let t = *tensor;
        let dtype = self.e.spec.tensors[t].dtype;
        let mut v = Val {
            name: self.temp("tf_l"),
            dims: self.ty(x).dims,
            cty: dtype.cty(),
            layout: l,
            raw: None,
            view: None,
        };
        // The index components first (a gather's indices are loads too).
        // The last component's code apart: a staged gather issues its rows'
        // copies before its indices load (they overlap, and the indices are
        // not live across the copy loops).
        let mut head = String::new();
        std::mem::swap(&mut head, &mut self.body);
        let k = index.len().saturating_sub(1);
        let mut comps = self.comps(&index[..k], at, l, depth + 1, pre)?;
        let split = self.body.len();
        let staged = self.staged;
        comps.extend(self.comps(&index[k..], at, l, depth + 1, pre)?);
        let nested = self.staged != staged;
        std::mem::swap(&mut head, &mut self.body);
        let mut run = self.vector_run(t, &comps, l);
        // A tile that runs along another dimension than the scope's vectors
        // (`x[(tm, tn)]` where the output is `out[(tn, tm)]`): loaded in 16-byte
        // pieces in a layout of its own, then moved to the scope's through
        // shared memory, as a transpose does.
        let mut moved_to = None;
        if run.is_none() {
            if let Some(l2) = self.run_layout(t, &comps, l, &v.dims) {
                run = self.vector_run(t, &comps, l2);
                if run.is_some() {
                    moved_to = Some(v.clone());
                    v.layout = l2;
                    v.name = self.temp("tf_l");
                }
            }
        }
        // Runs along the value's last dimension are consecutive registers:
        // they keep the raw words the vector loads bring. A run along another
        // of its dimensions (the columns of `x[(tm, tn)]` in a column program,
        // whose grid tile `tn` comes first) is moved last: a value's
        // registers may go in any order of its dimensions.
        if let Some((d, _, _)) = run {
            if let Some(i) = v.dims.iter().position(|&x| x == d) {
                let d = v.dims.remove(i);
                v.dims.push(d);
                v.raw = Some(dtype);
            }
        }
        // Gathered values narrower than a word are kept raw too, two or four
        // to a register (index_select's 16 gathered bf16 a thread spilled at
        // its 40 registers as floats, 52 bytes).
        let gathered = comps.iter().any(|c| matches!(c, Comp::Gather(_)));
        if run.is_none() && gathered && dtype.size() < 4 && self.size(l, &v.dims) > 1 {
            v.raw = Some(dtype);
        }
        let decl = self.decl(&v);
        self.w(depth, format!("{decl};  // {}", crate::emit::one_line(at)));
        self.w(depth, "{");
        let d1 = depth + 1;
        if v.raw.is_some() && run.is_none() {
            let n = self.len(&v);
            self.w(
                d1,
                format!(
                    "#pragma unroll\n{}for (int tf_k = 0; tf_k < {n}; ++tf_k) {}[tf_k] = 0u;",
                    super::indent(d1),
                    v.name
                ),
            );
        }
        match run {
            Some((d, p, chunk)) => {
                self.body.push_str(&head);
                self.load_runs(&v, t, &comps, d, p, chunk, d1)
            }
            None => {
                let (rows, mut last) = head.split_at(split);
                self.body.push_str(rows);
                if nested {
                    self.body.push_str(last);
                    last = "";
                }
                if !self.staged_gather(&v, t, &comps, l, d1, last)? {
                    self.body.push_str(last);
                    self.gather_direct(&v, t, &comps, l, d1);
                }
            }
        }
        self.w(depth, "}");
        match moved_to {
            Some(dst) => {
                let decl = self.decl(&dst);
                self.w(depth, format!("{decl};  // in the scope's layout"));
                self.convert(&v, &dst, depth)?;
                Ok(dst)
            }
            None => Ok(v),
        }
    }

    /// Loads `v` (`tensor[comps]`) element by element, masked.
    pub(super) fn gather_direct(
        &mut self,
        v: &Val,
        t: TensorId,
        comps: &[Comp],
        l: usize,
        depth: usize,
    ) {
        let dtype = self.e.spec.tensors[t].dtype;
        let n = self.open(l, &v.dims, depth);
        let mut mask = vec![self.live_c(l, &v.dims)];
        mask.extend(self.bounds_c(t, comps, l, None));
        let elem = format!("t{t}[{}]", self.offset_of(t, comps, l));
        let put = self.put_masked(v, dtype, &mask.join(" && "), &elem);
        self.w(depth + n, put);
        self.close(n, depth);
    }

    /// The statement that sets `v`'s current element to `elem` (a C lvalue of
    /// `dtype`'s storage) where `mask` holds, else to zero: widened, or into
    /// its word's bits where `v` keeps raw words (zeroed before).
    pub(super) fn put_masked(&self, v: &Val, dtype: DType, mask: &str, elem: &str) -> String {
        match v.raw {
            Some(dt) if dt.size() < 4 => {
                let (per, bits) = (4 / dt.size(), dt.size() * 8);
                let f = self.flat(v.layout, &v.dims);
                let f = f.trim_start_matches('[').trim_end_matches(']');
                let f = if f.is_empty() { "0" } else { f };
                format!(
                    "{}[({f}) / {per}] |= (({mask}) ? (unsigned int)({})({elem}) : 0u) << ((({f}) % {per}) * {bits});",
                    v.name,
                    if bits == 8 { "unsigned char" } else { "tf_u16" },
                )
            }
            _ => {
                let (val, ty) = widen(dtype, elem);
                format!("{} = ({mask}) ? {val} : {};", self.access(v), zero(ty))
            }
        }
    }

    /// A layout like `l` with 16-byte runs along the dimension of `t`'s
    /// contiguous last index, for a load `l` cannot vectorize: the index is a
    /// tile's own (plus offsets or scalars, no gathers), the value spans that
    /// dimension, and its block holds at least 16 bytes.
    fn run_layout(
        &mut self,
        t: TensorId,
        comps: &[Comp],
        l: usize,
        dims: &[DimId],
    ) -> Option<usize> {
        let ts = &self.e.spec.tensors[t];
        let Some(Comp::Affine { d, .. }) = comps.last() else {
            return None;
        };
        // A value over fewer dimensions (`ids[tn]` beside a `[tn, td]` tile)
        // is small: loaded in place.
        if !ts.last_contiguous
            || !dims.contains(d)
            || dims.len() != self.layouts[l].dims.len()
            || comps.iter().any(|c| matches!(c, Comp::Gather(_)))
        {
            return None;
        }
        let lay = self.layouts[l].clone();
        let p = lay.pos(*d)?;
        let es = ts.dtype.size();
        if lay.block[p] * es < 16 || lay.spt[p] * es >= 16 {
            return None;
        }
        let others: Vec<usize> = lay.order.iter().copied().filter(|&q| q != p).collect();
        let l2 = Layout::blocked(
            &lay.dims,
            &lay.block,
            Some(p),
            16 / es,
            self.e.cfg.num_warps,
            &others,
            &[],
        );
        Some(self.intern(l2))
    }

    /// A vectorized load: per run of `spt` elements along `d`, whole chunks
    /// where the run is inside the extent and the tensor, else element by element.
    #[allow(clippy::too_many_arguments)]
    fn load_runs(
        &mut self,
        v: &Val,
        t: TensorId,
        comps: &[Comp],
        d: DimId,
        p: usize,
        chunk: usize,
        depth: usize,
    ) {
        let l = v.layout;
        let lay = self.layouts[l].clone();
        let (spt, runs) = (lay.spt[p], lay.per_thread(p) / lay.spt[p]);
        let dtype = self.e.spec.tensors[t].dtype;
        let es = dtype.size();
        let others: Vec<DimId> = v.dims.iter().copied().filter(|&x| x != d).collect();
        let n = self.open(l, &others, depth);
        let d1 = depth + n;
        self.w(
            d1,
            format!(
                "#pragma unroll\n{}for (int tf_q = 0; tf_q < {runs}; ++tf_q) {{",
                super::indent(d1)
            ),
        );
        let d2 = d1 + 1;
        let Some(Comp::Affine { off, .. }) = comps.last() else {
            return;
        };
        // The run's first element: register `tf_q * spt`.
        self.rsub.insert(d, format!("(tf_q * {spt})"));
        let off = off.clone();
        let ok = vec![self.live_c(l, &others)];
        let (mask, _) = self.run_head(t, comps, (d, spt, chunk), &off, ok, "const ", l, d2);
        let (ctype, nchunks) = (
            match chunk {
                16 => "uint4",
                8 => "uint2",
                _ => "unsigned int",
            },
            spt * es / chunk,
        );
        // A tensor read once along a walk streams past the caches (`stream`);
        // rows read through a gathered index are kept in L2 (`kept`): ids
        // repeat, and an embedding's table rows came from DRAM again once the
        // output's stores had pushed them out (0.0707 → 0.0672 ms for a
        // hand-written embedding of 16384 tokens of 32000 × 4096 bf16 rows on
        // an H200, `scripts/experiments/gather_variants.py`).
        let streamed = self.streamed.contains(&t);
        let kept = !streamed && comps.iter().any(|c| matches!(c, Comp::Gather(_)));
        for c in 0..nchunks {
            let p = format!("(const {ctype}*)(tf_p + {})", c * chunk / es);
            let read = match (streamed, kept) {
                (true, _) => format!("__ldcs({p})"),
                (false, true) => format!("tf_ld_l2_last({p})"),
                (false, false) => format!("*{p}"),
            };
            self.w(d2 + 1, format!("const {ctype} tf_w{c} = {read};"));
        }
        if v.raw.is_some() {
            // The run's first word, then the chunks' words in order.
            let f = self.flat(l, &v.dims);
            let f = f.trim_start_matches('[').trim_end_matches(']').to_string();
            let fields: &[&str] = match chunk {
                16 => &["x", "y", "z", "w"],
                8 => &["x", "y"],
                _ => &[""],
            };
            for c in 0..nchunks {
                for (w, field) in fields.iter().enumerate() {
                    let src = if field.is_empty() {
                        format!("tf_w{c}")
                    } else {
                        format!("tf_w{c}.{field}")
                    };
                    let word = c * chunk / 4 + w;
                    self.w(
                        d2 + 1,
                        format!("{}[({f}) * {es} / 4 + {word}] = {src};", v.name),
                    );
                }
            }
        } else {
            for j in 0..spt {
                self.rsub.insert(d, format!("(tf_q * {spt} + {j})"));
                let access = self.access(v);
                self.w(d2 + 1, format!("{access} = {};", unpack(dtype, chunk, j)));
            }
        }
        self.rsub.insert(d, format!("(tf_q * {spt})"));
        self.w(d2, "} else {");
        if v.raw.is_some() {
            // Element by element into the run's words (zeros outside): the
            // elements' bits, read as unsigned integers of their size (an f32
            // converted to an integer would lose them).
            let f = self.flat(l, &v.dims);
            let f = f.trim_start_matches('[').trim_end_matches(']').to_string();
            let per = (4 / es).max(1);
            let words = spt * es / 4;
            self.w(
                d2 + 1,
                format!(
                    "#pragma unroll\n{}for (int tf_k = 0; tf_k < {words}; ++tf_k) {}[({f}) * {es} / 4 + tf_k] = 0u;",
                    super::indent(d2 + 1),
                    v.name
                ),
            );
            let mask_j = mask.replace("tf_j", "tf_e");
            let bits = if es == 8 {
                format!(
                    "{{ const unsigned long long tf_b = ({mask_j}) ? ((const unsigned long long*)tf_p)[tf_e] : 0ull; \
                     {n}[({f}) * 2 + tf_e * 2] = (unsigned int)tf_b; {n}[({f}) * 2 + tf_e * 2 + 1] = (unsigned int)(tf_b >> 32); }}",
                    n = v.name
                )
            } else {
                format!(
                    "if ({mask_j}) {n}[(({f}) + tf_e) / {per}] |= ((unsigned int)((const {st}*)tf_p)[tf_e]) << (((({f}) + tf_e) % {per}) * {bits});",
                    n = v.name,
                    st = match es {
                        1 => "unsigned char",
                        2 => "unsigned short",
                        _ => "unsigned int",
                    },
                    bits = es * 8
                )
            };
            self.w(
                d2 + 1,
                format!(
                    "#pragma unroll\n{}for (int tf_e = 0; tf_e < {spt}; ++tf_e) {bits}",
                    super::indent(d2 + 1)
                ),
            );
        } else {
            let (val, ty) = widen(dtype, "tf_p[tf_j]");
            self.rsub.insert(d, format!("(tf_q * {spt} + tf_j)"));
            let access = self.access(v);
            self.w(
                d2 + 1,
                format!(
                    "#pragma unroll\n{}for (int tf_j = 0; tf_j < {spt}; ++tf_j) {access} = ({mask}) ? {val} : {};",
                    super::indent(d2 + 1),
                    zero(ty)
                ),
            );
        }
        self.rsub.remove(&d);
        self.w(d2, "}");
        self.w(d1, "}");
        self.close(n, depth);
    }

    /// `tensor[index] = value` (or an atomic `op`), element by element of the
    /// index's tiles, by one thread per element. With `old`, the atomic's
    /// old values go to its registers (0 where skipped), one atomic an
    /// element (no vector reduction: it returns nothing).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn store(
        &mut self,
        t: TensorId,
        index: &[Expr],
        value: &Expr,
        (op, old): (Option<AtomicOp>, Option<&Val>),
        at: &str,
        l: usize,
        depth: usize,
    ) -> Result<(), CodegenError> {
        let dtype = self.e.spec.tensors[t].dtype;
        let mut pre = self.hoist(value, at, l, depth)?;
        for c in index {
            self.hoist_into(c, at, l, depth, &mut pre)?;
        }
        self.w(depth, "{");
        let d1 = depth + 1;
        let comps = self.comps(index, at, l, d1, &pre)?;
        // The elements written: the index's tiles (the value broadcast over them).
        let dims = self.access_dims(index, value);
        let owner = self.owner_c(l, &dims);
        let run = self.vector_run(t, &comps, l).filter(|_| old.is_none());
        match (op, run) {
            (None, Some((d, p, chunk))) if dims.contains(&d) => {
                let value = (value, pre.as_slice(), at);
                self.store_runs(t, &comps, &dims, (d, p, chunk), &owner, value, l, d1)?;
            }
            (Some(AtomicOp::Add), Some((d, p, chunk)))
                if dims.contains(&d)
                    && dtype == DType::F32
                    && chunk == 16
                    && self.layouts[l].spt[p] % 4 == 0 =>
            {
                let value = (value, pre.as_slice(), at);
                self.atomic_add_runs(t, &comps, &dims, (d, p, chunk), &owner, value, l, d1)?;
            }
            _ => {
                let n = self.open(l, &dims, d1);
                let mut mask = vec![owner.clone(), self.live_c(l, &dims)];
                mask.extend(self.bounds_c(t, &comps, l, None));
                let (v, ty) = self.stored(value, &pre, at, l)?;
                let offset = self.offset_of(t, &comps, l);
                let code = match op {
                    None => format!("t{t}[{offset}] = {};", narrow(dtype, "tf_v", ty)),
                    Some(op) => {
                        let cv = convert("tf_v", ty, dtype.cty());
                        let cs: Vec<String> = comps.iter().map(|c| self.comp_c(c, l)).collect();
                        let local = self.private_offset(t, &cs);
                        let code = self.atomic_stmt(t, op, local.as_deref(), &offset, &cv);
                        match old {
                            // A fetch is never privatized: the call is the value.
                            Some(o) => {
                                format!("{} = {};", self.access(o), code.trim_end_matches(';'))
                            }
                            None => code,
                        }
                    }
                };
                let otherwise = match old {
                    Some(o) => format!(" else {} = 0;", self.access(o)),
                    None => String::new(),
                };
                self.w(
                    d1 + n,
                    format!(
                        "if ({}) {{ const {} tf_v = {v}; {code} }}{otherwise}",
                        mask.join(" && "),
                        ty.c()
                    ),
                );
                self.close(n, d1);
            }
        }
        self.w(depth, "}");
        Ok(())
    }

    /// Opens a vector run (its first register is [`Gen::rsub`]'s): `tf_ok`,
    /// whether the run's other indices are in bounds (`ok` and the tensor's
    /// sizes), `tf_p` (`qual`-qualified), its first element, and `if (…) {`
    /// taking the run whole where it lies inside the extent and the tensor
    /// and starts aligned. Returns the test of element `tf_j` of the run, for
    /// the element-by-element branch, and the C of the run's element offset
    /// (`tf_p`'s from the tensor's base).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn run_head(
        &mut self,
        t: TensorId,
        comps: &[Comp],
        (d, spt, chunk): (DimId, usize, usize),
        off: &Option<String>,
        mut ok: Vec<String>,
        qual: &str,
        l: usize,
        depth: usize,
    ) -> (String, String) {
        let dtype = self.e.spec.tensors[t].dtype;
        let last = comps.len() - 1;
        ok.extend(self.bounds_c(t, comps, l, Some(last)));
        let c0 = self.comp_c(&comps[last], l);
        let coord = self.coord_c(l, d);
        let end = self.e.end(d);
        let mut whole = vec![
            format!("{coord} + {spt} <= {end}"),
            self.aligned_c(d, off, chunk / dtype.size()),
        ];
        let mut mask = format!("tf_ok && {coord} + tf_j < {end}");
        if !self.safe(&comps[last]) {
            whole.push(format!("{c0} >= 0 && {c0} + {spt} <= t{t}_n{last}"));
            mask.push_str(&format!(
                " && (unsigned long long)({c0} + tf_j) < (unsigned long long)t{t}_n{last}"
            ));
        }
        let offset = self.offset_of(t, comps, l);
        self.w(depth, format!("const bool tf_ok = {};", ok.join(" && ")));
        self.w(
            depth,
            format!("{qual}{}* tf_p = t{t} + ({offset});", dtype.c_storage()),
        );
        self.w(depth, format!("if (tf_ok && {}) {{", whole.join(" && ")));
        (mask, offset)
    }

    /// The C of the current element of a stored `value` (a `.cast()` with no
    /// type is the store's own narrowing).
    pub(super) fn stored(
        &self,
        value: &Expr,
        pre: &[(Expr, Val)],
        at: &str,
        l: usize,
    ) -> Result<(String, CTy), CodegenError> {
        let ctx = self.ctx(l, pre);
        match value {
            Expr::Cast { arg, dtype: None } => ctx.emit(arg, at),
            _ => ctx.emit(value, at),
        }
    }

    /// Opens the runs of a vectorized write of `value` to `t[comps]` over
    /// `dims`: the loops over the other dimensions and the runs, the run's
    /// values in `tf_s[spt]` (each as `elem` makes it from the element's C and
    /// type, in C type `ty`), then [`Gen::run_head`]'s `if (…) {` of a whole
    /// run. Returns `(loops to close, the run's depth, the element mask, the
    /// run's element offset)`; the caller writes the whole run, then
    /// [`Gen::close_run`].
    #[allow(clippy::too_many_arguments)]
    pub(super) fn open_run(
        &mut self,
        t: TensorId,
        comps: &[Comp],
        dims: &[DimId],
        (d, p, chunk): (DimId, usize, usize),
        owner: &str,
        (value, pre, at): (&Expr, &[(Expr, Val)], &str),
        (ty, elem): (&str, &RunElem),
        l: usize,
        depth: usize,
    ) -> Result<Option<(usize, usize, String, String)>, CodegenError> {
        let lay = self.layouts[l].clone();
        let (spt, runs) = (lay.spt[p], lay.per_thread(p) / lay.spt[p]);
        let others: Vec<DimId> = dims.iter().copied().filter(|&x| x != d).collect();
        let Some(Comp::Affine { off, .. }) = comps.last() else {
            return Ok(None);
        };
        let off = off.clone();
        let n = self.open(l, &others, depth);
        let d1 = depth + n;
        self.w(
            d1,
            format!(
                "#pragma unroll\n{}for (int tf_q = 0; tf_q < {runs}; ++tf_q) {{",
                super::indent(d1)
            ),
        );
        let d2 = d1 + 1;
        self.w(d2, format!("{ty} tf_s[{spt}];"));
        self.w(
            d2,
            format!(
                "#pragma unroll\n{}for (int tf_j = 0; tf_j < {spt}; ++tf_j) {{",
                super::indent(d2)
            ),
        );
        self.rsub.insert(d, format!("(tf_q * {spt} + tf_j)"));
        let (v, vty) = self.stored(value, pre, at, l)?;
        self.w(d2 + 1, format!("const {} tf_v = {v};", vty.c()));
        self.w(d2 + 1, format!("tf_s[tf_j] = {};", elem("tf_v", vty)));
        self.w(d2, "}");
        self.rsub.insert(d, format!("(tf_q * {spt})"));
        let ok = vec![owner.to_string(), self.live_c(l, &others)];
        let (mask, offset) = self.run_head(t, comps, (d, spt, chunk), &off, ok, "", l, d2);
        Ok(Some((n, d2, mask, offset)))
    }

    /// Closes what [`Gen::open_run`] opened, after the element-by-element
    /// branch `slow` (one statement, for element `tf_j` under `mask`).
    pub(super) fn close_run(
        &mut self,
        d: DimId,
        spt: usize,
        (n, d2): (usize, usize),
        mask: &str,
        slow: &str,
        depth: usize,
    ) {
        self.w(d2, "} else {");
        self.w(
            d2 + 1,
            format!(
                "#pragma unroll\n{}for (int tf_j = 0; tf_j < {spt}; ++tf_j) if ({mask}) {slow}",
                super::indent(d2 + 1)
            ),
        );
        self.rsub.remove(&d);
        self.w(d2, "}");
        self.w(d2 - 1, "}");
        self.close(n, depth);
    }

    /// A vectorized store (see [`Gen::load_runs`]): each run's values are
    /// narrowed and packed into words, stored whole where the run is inside
    /// the extent and the tensor, else element by element.
    #[allow(clippy::too_many_arguments)]
    fn store_runs(
        &mut self,
        t: TensorId,
        comps: &[Comp],
        dims: &[DimId],
        (d, p, chunk): (DimId, usize, usize),
        owner: &str,
        value: (&Expr, &[(Expr, Val)], &str),
        l: usize,
        depth: usize,
    ) -> Result<(), CodegenError> {
        let spt = self.layouts[l].spt[p];
        let dtype = self.e.spec.tensors[t].dtype;
        let es = dtype.size();
        // 16-bit floats keep the run's values as f32 and narrow them two at a
        // time, one `cvt.rn.bf16x2.f32` (or f16x2) a word: half the
        // conversions, and no shifts to pack the halves.
        let half = match dtype {
            DType::BF16 => Some("tf_pack_bf16x2"),
            DType::F16 => Some("tf_pack_f16x2"),
            _ => None,
        }
        .filter(|_| spt % 2 == 0);
        // The run's values, narrowed to the tensor's type (or as f32).
        let narrowed = move |v: &str, ty: CTy| match half {
            Some(_) => convert(v, ty, CTy::F32),
            None => narrow(dtype, v, ty),
        };
        let storage = if half.is_some() {
            "float"
        } else {
            dtype.c_storage()
        };
        let run = (d, p, chunk);
        let Some((n, d2, mask, offset)) = self.open_run(
            t,
            comps,
            dims,
            run,
            owner,
            value,
            (storage, &narrowed),
            l,
            depth,
        )?
        else {
            return Ok(());
        };
        let ctype = match chunk {
            16 => "uint4",
            8 => "uint2",
            _ => "unsigned int",
        };
        for c in 0..(spt * es / chunk) {
            let words: Vec<String> = (0..chunk / 4)
                .map(|w| {
                    let byte = c * chunk + w * 4;
                    if let Some(pack) = half {
                        format!("{pack}(tf_s[{}], tf_s[{}])", byte / 2, byte / 2 + 1)
                    } else if es == 8 {
                        format!(
                            "(unsigned int)((unsigned long long)tf_s[{}] >> {})",
                            byte / 8,
                            (byte % 8) * 8
                        )
                    } else {
                        (0..4 / es)
                            .map(|b| bits(dtype, &format!("tf_s[{}]", byte / es + b), b * es))
                            .collect::<Vec<_>>()
                            .join(" | ")
                    }
                })
                .collect();
            let value = if chunk == 4 {
                format!("({})", words[0])
            } else {
                format!("make_{ctype}({})", words.join(", "))
            };
            // A word of several elements is stored as an element of the
            // tensor viewed as words (the base address and every stride but
            // the last are multiples of the word: `TensorSpec::align`), not
            // through a cast of the element's address: NVVM split such a
            // 16-byte store of a run into four 4-byte ones where the run's
            // offset had no stride product, and in batched_softmax even
            // with one (in every corpus kernel's PTX the words' form keeps
            // each store whole).
            let at = c * chunk / es;
            let store = match chunk / es {
                1 => format!("*({ctype}*)(tf_p + {at})"),
                per => {
                    if c == 0 {
                        self.w(
                            d2 + 1,
                            format!("__builtin_assume((({offset}) & {}) == 0);", per - 1),
                        );
                    }
                    format!("(({ctype}*)t{t})[(({offset}) + {at}) >> {}]", per.ilog2())
                }
            };
            self.w(d2 + 1, format!("{store} = {value};"));
        }
        let slow = match half {
            Some(_) => format!("tf_p[tf_j] = {};", narrow(dtype, "tf_s[tf_j]", CTy::F32)),
            None => "tf_p[tf_j] = tf_s[tf_j];".into(),
        };
        self.close_run(d, spt, (n, d2), &mask, &slow, depth);
        Ok(())
    }
}
