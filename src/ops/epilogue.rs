//! What the GEMM that finishes a result applies before it stores, and the
//! launches of the op kernels with it (see [`super::kernels`]).

use super::kernels::{act, epilogue, gemm_fused};
use super::with_gemm_config;
use crate::{bf16, Config, Result, Tensor};
use tilefuse_runtime::dist::Exchange;

/// `out = act(alpha·acc + bias_m + bias_n + beta·c)`, the pre-activation kept
/// in `aux_out`, or for the backward activations read from `aux_in`.
#[derive(Clone, Debug)]
pub(crate) struct Epilogue {
    pub alpha: f32,
    /// Zeros when there is no bias along that dimension.
    pub bias_m: Tensor<bf16>,
    pub bias_n: Tensor<bf16>,
    /// Whether a bias was given (the unfused path then needs its kernel).
    pub biased: bool,
    /// `beta` and `C`.
    pub c: Option<(f32, Tensor<bf16>)>,
    pub aux_out: Option<Tensor<bf16>>,
    /// One of [`act`]'s codes; `DRELU` and `DGELU` read `aux_in`.
    pub act: usize,
    pub aux_in: Option<Tensor<bf16>>,
}

/// The flags a GEMM waits on before each tile (see [`super::kernels`]).
pub(crate) struct Wait<'a> {
    pub flags: &'a Tensor<u32>,
    pub rows_per_chunk: usize,
    pub flags_per_chunk: usize,
    pub first_row: usize,
    /// Chunks along K: `(columns per band, blocks of rows_per_chunk rows)`, flag
    /// `band * blocks + block`, waited for per k-tile.
    pub along_k: Option<(usize, usize)>,
    /// Rows that arrive as one (a rank's shard): the tile order finishes each
    /// such band before the next (`KernelDef::with_group_rows`), so that the
    /// GEMM's first waves run on the rows already here instead of spreading
    /// over every rank's rows at once and waiting.
    pub group_rows: Option<usize>,
}

/// Counters the GEMM's tiles add their area to, per chunk of rows (see
/// [`super::kernels`]).
pub(crate) struct Signal<'a> {
    pub counters: &'a Tensor<u32>,
    pub rows_per_signal: usize,
}

/// Stand-ins for the tensors a launch switches off, and for flags never waited on.
#[derive(Clone, Debug)]
pub(crate) struct Unused {
    pub matrix: Tensor<bf16>,
    pub flags: Tensor<u32>,
}

impl Unused {
    pub fn new(dev: &std::sync::Arc<crate::Device>) -> Result<Unused> {
        Ok(Unused {
            matrix: Tensor::<bf16>::zeros_on(dev, [1, 1])?,
            flags: Tensor::<u32>::zeros_on(dev, [1])?,
        })
    }
}

impl Epilogue {
    /// Only a bias (zeros standing in for a missing one): what the ops apply.
    pub fn bias(bias_m: Tensor<bf16>, bias_n: Tensor<bf16>, biased: bool) -> Epilogue {
        Epilogue {
            alpha: 1.0,
            bias_m,
            bias_n,
            biased,
            c: None,
            aux_out: None,
            act: act::NONE,
            aux_in: None,
        }
    }

    /// The part applied to each partial product before a reduction: `alpha`,
    /// and the bias when `with_bias`.
    pub fn partial(
        &self,
        with_bias: bool,
        zeros_m: &Tensor<bf16>,
        zeros_n: &Tensor<bf16>,
    ) -> Epilogue {
        let (bias_m, bias_n) = if with_bias {
            (self.bias_m.clone(), self.bias_n.clone())
        } else {
            (zeros_m.clone(), zeros_n.clone())
        };
        Epilogue {
            alpha: self.alpha,
            biased: with_bias && self.biased,
            ..Epilogue::bias(bias_m, bias_n, false)
        }
    }

    /// The part applied after a reduction of partials that had [`Epilogue::partial`]
    /// with `bias_applied` (alpha is in the partials already).
    pub fn after_reduce(
        &self,
        bias_applied: bool,
        zeros_m: &Tensor<bf16>,
        zeros_n: &Tensor<bf16>,
    ) -> Epilogue {
        let mut e = self.clone();
        e.alpha = 1.0;
        if bias_applied {
            e.bias_m = zeros_m.clone();
            e.bias_n = zeros_n.clone();
            e.biased = false;
        }
        e
    }

    /// Nothing to do after a plain product.
    pub fn is_identity(&self) -> bool {
        self.alpha == 1.0
            && !self.biased
            && self.c.is_none()
            && self.aux_out.is_none()
            && self.act == act::NONE
    }

    fn aux<'a>(&'a self, unused: &'a Unused) -> &'a Tensor<bf16> {
        self.aux_out
            .as_ref()
            .or(self.aux_in.as_ref())
            .unwrap_or(&unused.matrix)
    }

    fn c_or<'a>(&'a self, unused: &'a Unused) -> (f32, &'a Tensor<bf16>) {
        match &self.c {
            Some((beta, c)) => (*beta, c),
            None => (0.0, &unused.matrix),
        }
    }
}

/// The tensors of one GEMM launch.
pub(crate) struct Gemm<'a> {
    pub a: &'a Tensor<bf16>,
    pub b: &'a Tensor<bf16>,
    pub out: &'a Tensor<bf16>,
    /// More stores of the result, at most [`MAX_COPIES`]: a buffer peers
    /// read, or the peers' own buffers (written over NVLink).
    pub copies: &'a [Tensor<bf16>],
    /// Added before the epilogue's bias and `C` (a partial sum from another rank).
    pub addend: Option<&'a Tensor<bf16>>,
    /// Per-chunk completion counters for the backend stream.
    pub signal: Option<Signal<'a>>,
}

/// The most stores of a result beside `out` that [`gemm_fused`] makes.
pub(crate) const MAX_COPIES: usize = 3;

/// Launches [`gemm_fused`] for `g` with `epi`, after `wait`'s flags (none: no wait).
pub(crate) fn gemm(
    g: Gemm<'_>,
    epi: &Epilogue,
    wait: Option<Wait<'_>>,
    unused: &Unused,
    config: &Option<Config>,
) -> Result<()> {
    // Flags of an exchange are ready when set; with no wait every tile's rows
    // are in chunk 0, whose flag passes a wait for 0 at once.
    let ready = match wait {
        Some(_) => Exchange::SET as usize,
        None => 0,
    };
    let w = wait.unwrap_or(Wait {
        flags: &unused.flags,
        rows_per_chunk: g.a.size(0).max(1),
        flags_per_chunk: 1,
        first_row: 0,
        along_k: None,
        group_rows: None,
    });
    let (cols_per_chunk, ranks) = w.along_k.unwrap_or((g.a.size(1).max(1), 1));
    let (beta, c) = epi.c_or(unused);
    if g.copies.len() > MAX_COPIES {
        return Err(crate::Error::Definition {
            kernel: "gemm_fused".into(),
            message: format!(
                "stores at most {MAX_COPIES} copies of its result; asked for {}",
                g.copies.len()
            ),
        });
    }
    let copy = |i: usize| g.copies.get(i).unwrap_or(&unused.matrix);
    let launch = || {
        gemm_fused(
            g.a,
            g.b,
            g.out,
            copy(0),
            copy(1),
            copy(2),
            g.addend.unwrap_or(&unused.matrix),
            c,
            epi.aux(unused),
            &epi.bias_m,
            &epi.bias_n,
            w.flags,
            g.signal.as_ref().map_or(&unused.flags, |s| s.counters),
            w.rows_per_chunk,
            w.flags_per_chunk,
            cols_per_chunk,
            ranks,
            g.signal.as_ref().map_or(1, |s| s.rows_per_signal.max(1)),
            ready,
            w.first_row,
            epi.alpha,
            beta,
            w.along_k.is_some(),
            g.signal.is_some(),
            g.copies.len(),
            g.addend.is_some(),
            epi.c.is_some(),
            epi.aux_out.is_some(),
            epi.act,
        )
    };
    let kernel = gemm_fused::kernel();
    // Bands of whole chunks complete one after the other; bands that arrive
    // together are computed together.
    let group = [g.signal.as_ref().map(|s| s.rows_per_signal), w.group_rows]
        .into_iter()
        .flatten()
        .min();
    with_gemm_config(kernel, config, || match group {
        Some(rows) => kernel.with_group_rows(rows, launch),
        None => launch(),
    })
}

/// Rows a signalled chunk is a multiple of: every block size along M the
/// configs use divides it, so that no tile straddles two chunks.
pub(crate) const SIGNAL_ROWS: usize = 256;

/// The rows per chunk when `rows` are cut into at most `chunks` chunks of
/// whole [`SIGNAL_ROWS`] bands (the last one shorter), and their count.
pub(crate) fn signal_chunks(rows: usize, chunks: usize) -> (usize, usize) {
    let per = rows
        .div_ceil(chunks.clamp(1, rows.max(1)))
        .div_ceil(SIGNAL_ROWS)
        * SIGNAL_ROWS;
    (per, rows.div_ceil(per).max(1))
}

/// The count a chunk of `rows × cols` reaches once its tiles have signalled
/// (their areas): it must fit the 32-bit counter.
pub(crate) fn chunk_area(op: &str, rows: usize, cols: usize) -> Result<u32> {
    u32::try_from(rows * cols).map_err(|_| {
        super::check::arg(
            op,
            "config.chunks",
            format!(
                "a chunk of {rows}×{cols} elements overflows the fused path's 32-bit chunk counters; ask for more chunks"
            ),
        )
    })
}

/// Refuses a fused-path GEMM config whose blocks along M do not divide
/// [`SIGNAL_ROWS`] (its tiles would straddle the chunks the schedule signals).
pub(crate) fn check_signal_config(op: &str, config: &Option<Config>) -> Result<()> {
    if let Some(c) = config {
        let bm = c.block_sizes.first().copied().unwrap_or(0);
        if bm == 0 || SIGNAL_ROWS % bm != 0 {
            return Err(super::check::arg(
                op,
                "config.gemm",
                format!(
                    "its block along M is {bm} rows; the fused path signals chunks of {SIGNAL_ROWS}-row bands, so it must divide {SIGNAL_ROWS} (e.g. 64 or 128)"
                ),
            ));
        }
    }
    Ok(())
}

/// Applies `epi` to `x` in place (nothing when it is the identity).
pub(crate) fn apply(x: &Tensor<bf16>, epi: &Epilogue, unused: &Unused) -> Result<()> {
    if epi.is_identity() {
        return Ok(());
    }
    apply_with(x, None, epi, unused)
}

/// `x = epi(x + addend)` in place (`addend`: another partial sum of `x`'s product).
pub(crate) fn apply_with(
    x: &Tensor<bf16>,
    addend: Option<&Tensor<bf16>>,
    epi: &Epilogue,
    unused: &Unused,
) -> Result<()> {
    let (beta, c) = epi.c_or(unused);
    epilogue(
        x,
        addend.unwrap_or(&unused.matrix),
        c,
        epi.aux(unused),
        &epi.bias_m,
        &epi.bias_n,
        epi.alpha,
        beta,
        addend.is_some(),
        epi.c.is_some(),
        epi.aux_out.is_some(),
        epi.act,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signal_chunks_are_whole_bands() {
        // 2048 rows in 4 chunks of 512; 4096 in 4 of 1024.
        assert_eq!(signal_chunks(2048, 4), (512, 4));
        assert_eq!(signal_chunks(4096, 4), (1024, 4));
        // Rounded up to bands of 256: fewer, longer chunks.
        assert_eq!(signal_chunks(1000, 4), (256, 4));
        assert_eq!(signal_chunks(1100, 4), (512, 3));
        assert_eq!(signal_chunks(300, 3), (256, 2));
        // Short slabs are one chunk.
        assert_eq!(signal_chunks(150, 3), (256, 1));
        assert_eq!(signal_chunks(1, 8), (256, 1));
        for rows in 1..3000 {
            for chunks in 1..9 {
                let (per, n) = signal_chunks(rows, chunks);
                assert!(
                    per % SIGNAL_ROWS == 0
                        && n <= chunks
                        && (n - 1) * per < rows
                        && n * per >= rows
                );
            }
        }
    }

    #[test]
    fn chunk_areas_fit_the_counters() {
        assert_eq!(chunk_area("op", 1024, 6656).ok(), Some(1024 * 6656));
        let err = chunk_area("op", 1 << 17, 1 << 16)
            .expect_err("2^33 elements overflow")
            .to_string();
        assert!(err.contains("config.chunks"), "{err}");
    }

    #[test]
    fn configs_whose_tiles_straddle_chunks_are_refused() {
        assert!(check_signal_config("op", &None).is_ok());
        assert!(check_signal_config("op", &Some(Config::new(&[128, 256, 64]))).is_ok());
        let err = check_signal_config("op", &Some(Config::new(&[96, 256, 64])))
            .expect_err("96 does not divide 256")
            .to_string();
        assert!(err.contains("config.gemm") && err.contains("96"), "{err}");
    }
}
