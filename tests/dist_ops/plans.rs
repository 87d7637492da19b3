//! Distributed matmul plans: every supported distribution, with alpha, beta·C,
//! transposes and the epilogues (forward with aux, backward from an aux),
//! fused and unfused, planned and then reset with new operands, executed three
//! times each (queued, then replayed from both CUDA graphs), against
//! a float64 reference. Every rank draws the same global matrices and takes its
//! piece, so the reference needs no communication.

use super::{e, R};
use tilefuse::ops::plan::{
    DistributedMatmul, Distribution, EpilogueInputs, MatmulEpilogue, MatmulOptions,
};
use tilefuse::ops::Algorithm;
use tilefuse::prelude::*;
use tilefuse::runtime::dist::ProcessGroup;
use tilefuse_testkit::{matmul_f64, poisoned, random_vec, rel_error, Rng};
use Distribution::*;

/// A row-major host matrix.
#[derive(Clone)]
struct Host {
    v: Vec<bf16>,
    rows: usize,
    cols: usize,
}

impl Host {
    fn random(rng: &mut Rng, rows: usize, cols: usize, scale: f64) -> Host {
        Host {
            v: random_vec(rng, rows * cols, scale),
            rows,
            cols,
        }
    }

    /// This rank's piece under `dist`.
    fn piece(&self, dist: Distribution, r: usize, w: usize) -> Host {
        let (r0, rows, c0, cols) = match dist {
            Replicated => (0, self.rows, 0, self.cols),
            Rows => (r * self.rows / w, self.rows / w, 0, self.cols),
            Cols => (0, self.rows, r * self.cols / w, self.cols / w),
        };
        let v = (r0..r0 + rows)
            .flat_map(|i| self.v[i * self.cols + c0..i * self.cols + c0 + cols].to_vec())
            .collect();
        Host { v, rows, cols }
    }

    fn t(&self) -> Host {
        let v = (0..self.cols)
            .flat_map(|j| (0..self.rows).map(move |i| (i, j)))
            .map(|(i, j)| self.v[i * self.cols + j])
            .collect();
        Host {
            v,
            rows: self.cols,
            cols: self.rows,
        }
    }

    fn f64(&self) -> Vec<f64> {
        self.v.iter().map(|x| x.to_f64()).collect()
    }

    fn tensor(&self) -> R<Tensor<bf16>> {
        Tensor::from_slice(&self.v, [self.rows, self.cols]).map_err(e)
    }
}

struct Case {
    dists: [Distribution; 3],
    epilogue: MatmulEpilogue,
    transpose_a: bool,
    transpose_b: bool,
    with_c: bool,
}

fn gelu(x: f64) -> f64 {
    0.5 * x * (1.0 + erf(x / std::f64::consts::SQRT_2))
}

fn gelu_grad(x: f64) -> f64 {
    0.5 * (1.0 + erf(x / std::f64::consts::SQRT_2))
        + x * (-0.5 * x * x).exp() / (2.0 * std::f64::consts::PI).sqrt()
}

/// erf to ~1e-7 (Abramowitz–Stegun 7.1.26 is too coarse near 0; this is W. J. Cody's
/// rational form's cheaper cousin, good enough against bf16 outputs).
fn erf(x: f64) -> f64 {
    let t = 1.0 / (1.0 + 0.5 * x.abs());
    let y = 1.0
        - t * (-x * x - 1.26551223
            + t * (1.00002368
                + t * (0.37409196
                    + t * (0.09678418
                        + t * (-0.18628806
                            + t * (0.27886807
                                + t * (-1.13520398
                                    + t * (1.48851587 + t * (-0.82215223 + t * 0.17087277)))))))))
            .exp();
    if x >= 0.0 {
        y
    } else {
        -y
    }
}

/// D (and the aux) of the whole problem, in float64.
fn reference(
    [a, b, c]: [&Host; 3],
    bias: &[f64],
    aux_in: &[f64],
    o: &MatmulOptions,
    epi: MatmulEpilogue,
) -> (Vec<f64>, Vec<f64>) {
    let (m, k, n) = (a.rows, a.cols, b.cols);
    let ab = matmul_f64(&a.f64(), &b.f64(), m, k, n);
    let cf = c.f64();
    let mut d = vec![0.0; m * n];
    let mut aux = vec![0.0; m * n];
    use MatmulEpilogue as E;
    let biased = matches!(
        epi,
        E::Bias | E::ReluBias | E::GeluBias | E::ReluAuxBias | E::GeluAuxBias
    );
    for i in 0..m * n {
        let mut y = o.alpha as f64 * ab[i] + o.beta as f64 * cf[i];
        if biased {
            y += bias[i % n];
        }
        aux[i] = y;
        d[i] = match epi {
            E::Relu | E::ReluBias | E::ReluAux | E::ReluAuxBias => y.max(0.0),
            E::Gelu | E::GeluBias | E::GeluAux | E::GeluAuxBias => gelu(y),
            E::DRelu => y * if aux_in[i] > 0.0 { 1.0 } else { 0.0 },
            E::DGelu => y * gelu_grad(aux_in[i]),
            E::None | E::Bias => y,
        };
    }
    (d, aux)
}

/// This rank's piece under `dist` of a float64 `rows × cols` matrix.
fn piece_f64(
    v: &[f64],
    rows: usize,
    cols: usize,
    dist: Distribution,
    r: usize,
    w: usize,
) -> Vec<f64> {
    let (r0, rs, c0, cs) = match dist {
        Replicated => (0, rows, 0, cols),
        Rows => (r * rows / w, rows / w, 0, cols),
        Cols => (0, rows, r * cols / w, cols / w),
    };
    (r0..r0 + rs)
        .flat_map(|i| v[i * cols + c0..i * cols + c0 + cs].to_vec())
        .collect()
}

pub fn check_plans(pg: &ProcessGroup) -> R<()> {
    let (r, w) = (pg.rank(), pg.world_size());
    let seed = Rng::fresh().next_u64();
    let seeds = pg
        .all_gather_bytes("plan-seed", &seed.to_le_bytes())
        .map_err(e)?;
    let mut rng = Rng::new(u64::from_le_bytes(
        seeds[0][..8].try_into().map_err(|_| "seed")?,
    ));
    let (m, n, k) = (150 * w, 92 * w, 104 * w);
    use MatmulEpilogue as E;
    let case = |dists, epilogue, transpose_a, transpose_b, with_c| Case {
        dists,
        epilogue,
        transpose_a,
        transpose_b,
        with_c,
    };
    let cases = [
        case([Rows, Cols, Cols], E::GeluAuxBias, false, false, true),
        case(
            [Cols, Replicated, Replicated],
            E::ReluBias,
            true,
            false,
            false,
        ),
        case([Rows, Replicated, Replicated], E::Gelu, false, true, true),
        case([Cols, Rows, Rows], E::Bias, false, false, false),
        case([Cols, Rows, Cols], E::DGelu, false, false, true),
        case([Cols, Rows, Replicated], E::DRelu, true, true, true),
        case([Cols, Rows, Replicated], E::GeluBias, false, false, false),
        case([Rows, Replicated, Rows], E::ReluAux, false, false, true),
        case([Replicated, Cols, Cols], E::None, false, false, false),
    ];
    for c in &cases {
        for alg in [Algorithm::Fused, Algorithm::Unfused, Algorithm::Auto] {
            let options = MatmulOptions {
                alpha: 0.75,
                beta: if c.with_c { 0.5 } else { 0.0 },
                transpose_a: c.transpose_a,
                transpose_b: c.transpose_b,
                algorithm: alg,
                chunks: Some(3),
                blocking: true,
                ..MatmulOptions::default()
            };
            let [da, db, dd] = c.dists;
            let what = format!(
                "{:?} {:?} {alg:?} T({},{})",
                c.dists, c.epilogue, c.transpose_a, c.transpose_b
            );
            let mut plan: Option<DistributedMatmul<'_>> = None;
            for round in 0..2 {
                let a = Host::random(&mut rng, m, k, 1.0);
                let b = Host::random(&mut rng, k, n, 1.0);
                let cm = Host::random(&mut rng, m, n, 1.0);
                let bias = Host::random(&mut rng, 1, n, 0.5);
                let aux_g = Host::random(&mut rng, m, n, 1.5);
                let stored = |h: Host, t: bool| if t { h.t() } else { h };
                let a_l = stored(a.piece(da, r, w), c.transpose_a).tensor()?;
                let b_l = stored(b.piece(db, r, w), c.transpose_b).tensor()?;
                let c_l = cm.piece(dd, r, w).tensor()?;
                let d_cols = |h: &Host| match dd {
                    Cols => h.piece(Cols, r, w),
                    _ => h.clone(),
                };
                let bias_l =
                    Tensor::from_slice(&d_cols(&bias).v, [d_cols(&bias).cols]).map_err(e)?;
                let aux_l = aux_g.piece(dd, r, w).tensor()?;
                let inputs = EpilogueInputs {
                    bias: matches!(
                        c.epilogue,
                        E::Bias | E::ReluBias | E::GeluBias | E::ReluAuxBias | E::GeluAuxBias
                    )
                    .then_some(&bias_l),
                    aux: matches!(c.epilogue, E::DRelu | E::DGelu).then_some(&aux_l),
                };
                let c_opt = c.with_c.then_some(&c_l);
                let mm = match plan.as_mut() {
                    None => {
                        let mut mm =
                            DistributedMatmul::new(pg, &a_l, &b_l, c_opt, c.dists, options.clone())
                                .map_err(|x| format!("{what}: new: {x}"))?;
                        mm.plan(c.epilogue, inputs)
                            .map_err(|x| format!("{what}: plan: {x}"))?;
                        plan.insert(mm)
                    }
                    Some(mm) => {
                        // Round 2: released, then reset with new operands.
                        mm.release_operands();
                        if mm.execute().is_ok() {
                            return Err(format!(
                                "{what}: execute after release_operands succeeded"
                            ));
                        }
                        mm.reset_operands(Some(&a_l), Some(&b_l), c_opt, inputs)
                            .map_err(|x| format!("{what}: reset_operands: {x}"))?;
                        mm
                    }
                };
                let (want_d, want_aux) = reference(
                    [&a, &b, &cm],
                    &bias.f64(),
                    &aux_g.f64(),
                    &options,
                    c.epilogue,
                );
                let want = piece_f64(&want_d, m, n, dd, r, w);
                let want_aux = piece_f64(&want_aux, m, n, dd, r, w);
                // Call 0 queues its work and captures it; calls 1 and 2 replay
                // the graphs of both parities (fused and local paths).
                let mut line = String::new();
                for call in 0..3 {
                    // Poison D so unwritten elements show.
                    let poison = poisoned::<bf16>(mm.result().dims()).map_err(e)?;
                    mm.result().copy_from(&poison).map_err(e)?;
                    let d = mm
                        .execute()
                        .map_err(|x| format!("{what}: execute {call}: {x}"))?;
                    pg.synchronize("plan").map_err(e)?;
                    let have = d.to_vec().map_err(e)?;
                    let err = rel_error(&have, &want, |x| x.to_f64(), |x| x);
                    line = format!(
                        "rank {r}: plan {what} round {round} call {call}: rel error {err:.2e}"
                    );
                    if err.is_nan() || err > 1e-2 {
                        return Err(line);
                    }
                    if let Some(aux) = mm.aux() {
                        let have = aux.to_vec().map_err(e)?;
                        let err = rel_error(&have, &want_aux, |x| x.to_f64(), |x| x);
                        line += &format!(", aux {err:.2e}");
                        if err.is_nan() || err > 1e-2 {
                            return Err(line);
                        }
                    }
                }
                // Interpret mode has no CUDA graphs: every call runs as queued.
                let fused = mm.path() != Some(Algorithm::Unfused) && !pg.device().is_host();
                if fused != mm.replays() {
                    return Err(format!(
                        "{line}: path {:?} but replaying from graphs is {}",
                        mm.path(),
                        mm.replays()
                    ));
                }
                println!("{line} (path {:?}, replayed {})", mm.path(), mm.replays());
            }
        }
    }
    check_bad_plans(pg)
}

fn check_bad_plans(pg: &ProcessGroup) -> R<()> {
    let w = pg.world_size();
    let t = |r: usize, c: usize| Tensor::<bf16>::full([r, c], bf16::ONE).map_err(e);
    let o = MatmulOptions::default();
    let expect = |what: &str, r: tilefuse::Result<()>, needle: &str| -> R<()> {
        match r {
            Ok(()) => Err(format!("{what}: accepted")),
            Err(x) if x.to_string().contains(needle) => {
                println!("{what}: {x}");
                Ok(())
            }
            Err(x) => Err(format!("{what}: unclear error (wanted `{needle}`): {x}")),
        }
    };
    fn new(
        pg: &ProcessGroup,
        a: &Tensor<bf16>,
        b: &Tensor<bf16>,
        c: Option<&Tensor<bf16>>,
        d: [Distribution; 3],
        o: &MatmulOptions,
    ) -> tilefuse::Result<()> {
        DistributedMatmul::new(pg, a, b, c, d, o.clone()).map(|_| ())
    }
    expect(
        "distributions without an algorithm",
        new(pg, &t(64, 32)?, &t(32, 48)?, None, [Rows, Rows, Rows], &o),
        "argument `distributions`",
    )?;
    expect(
        "b of the wrong height",
        new(
            pg,
            &t(64, 32 / w.min(32))?,
            &t(33, 48)?,
            None,
            [Cols, Rows, Replicated],
            &o,
        ),
        "argument `b`",
    )?;
    expect(
        "c of the wrong shape",
        new(
            pg,
            &t(64, 32)?,
            &t(32, 48)?,
            Some(&t(63, 48)?),
            [Rows, Replicated, Rows],
            &o,
        ),
        "argument `c`",
    )?;
    let mut mm = DistributedMatmul::new(
        pg,
        &t(64, 32)?,
        &t(32, 48)?,
        None,
        [Rows, Replicated, Rows],
        o.clone(),
    )
    .map_err(e)?;
    expect(
        "a bias epilogue without a bias",
        mm.plan(MatmulEpilogue::GeluBias, EpilogueInputs::default()),
        "argument `inputs.bias`",
    )?;
    let bias = Tensor::<bf16>::full([47], bf16::ONE).map_err(e)?;
    expect(
        "a bias of the wrong length",
        mm.plan(
            MatmulEpilogue::Bias,
            EpilogueInputs {
                bias: Some(&bias),
                aux: None,
            },
        ),
        "argument `inputs.bias`",
    )?;
    if w > 1 {
        let mut ar = DistributedMatmul::new(
            pg,
            &t(64, 32)?,
            &t(32, 48)?,
            None,
            [Cols, Rows, Replicated],
            o.clone(),
        )
        .map_err(e)?;
        expect(
            "an aux output with a replicated D",
            ar.plan(MatmulEpilogue::ReluAux, EpilogueInputs::default()),
            "argument `epilogue`",
        )?;
        // A replicated D's bias differs between the ranks: each rank would
        // compute its slab with its own.
        let rank_bias = Tensor::<bf16>::full([48], bf16::from_f32(pg.rank() as f32)).map_err(e)?;
        expect(
            "a replicated D's bias that differs between ranks",
            ar.plan(
                MatmulEpilogue::Bias,
                EpilogueInputs {
                    bias: Some(&rank_bias),
                    aux: None,
                },
            ),
            "argument `inputs.bias`",
        )?;
    }
    mm.plan(MatmulEpilogue::None, EpilogueInputs::default())
        .map_err(e)?;
    expect(
        "reset_operands with a of another shape",
        mm.reset_operands(Some(&t(65, 32)?), None, None, EpilogueInputs::default()),
        "argument `a`",
    )?;
    Ok(())
}
