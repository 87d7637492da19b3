//! The all-gather matmul (Helion's seed example, in Rust): every rank holds a
//! shard of A's rows; C = all_gather(A) · B, with the GEMM running while the copy
//! engine gathers A, each program waiting only for the chunks of A it reads.
//!
//! ```text
//! cargo build --release --workspace --examples --bins
//! target/release/tilefuse-run --nproc-per-node 2 target/release/examples/all_gather_matmul [M N K] [--bench]
//!     [--chunks-along rows|cols] [--splits-per-rank S] [--config JSON] [--ungrouped]
//!     [--copy-sms N]
//! ```
//!
//! The all-gather cuts each shard into bands of rows (`--chunks-along rows`, S
//! per rank: a GEMM of several waves runs this rank's own rows first while the
//! peers' arrive) or of columns (`cols`, S bands: a GEMM of one wave, every tile
//! started at once, waits per k-tile and runs on the first columns while the
//! later ones arrive); by default, columns when the GEMM's tiles make one wave
//! (`tilefuse::ops::chunks_along_k`), with 8 bands.
//!
//! Checks on every rank: the gathered A equals NCCL's all-gather bit for bit, and C
//! matches NCCL all-gather + cuBLAS within bf16 tolerance. Across nodes (no
//! symmetric memory) it falls back to NCCL's all-gather + the same GEMM and says so.
//! `--bench` also times, in one run: cuBLAS on the full A on one GPU (the floor),
//! the tilefuse GEMM alone on the gathered A, NCCL's all-gather alone, NCCL
//! all-gather then cuBLAS, and the fused op; then tilefuse's all-gather alone and
//! beside a GEMM that does not wait for it (what overlap could reach):
//! interleaved rounds (each variant a few runs per round, L2 flushed before
//! each), the median of the rounds' medians. Last, a timeline of one call on
//! every rank: when its barrier passed, each chunk's flag was set and the GEMM
//! ended (CUDA events on both streams).
//!
//! The fused GEMM visits its tiles a rank's rows at a time (its groups of tile
//! rows never span two ranks), so its first waves run on the rows already
//! here; `--ungrouped` keeps the config's own groups, for comparison.
//!
//! `--copy-sms N` copies the peers' chunks with N SMs (a small kernel on the
//! backend stream) instead of the copy engine, whose rate (about 135 GB/s on an
//! H200, in or out, from all peers together) bounds the overlap on 4 ranks; the
//! persistent GEMM then leaves those SMs free. By default 16 SMs copy beside a
//! GEMM of one wave that leaves them idle anyway, the copy engine otherwise
//! (`tilefuse::ops::copy_sms_for`); `--copy-sms 0` keeps the copy engine.

use std::process::ExitCode;
use tilefuse::prelude::*;
use tilefuse::runtime::dist::{AllGather, Chunks, ProcessGroup};
use tilefuse_testkit::{config_json, exit_code, poisoned, random_vec, rel_error_tensors, Rng};

/// C = A · B over the gathered A, reading A only where the all-gather's
/// progress flags say it has arrived (they reach `epoch`). Chunks along rows:
/// each program first waits for every chunk holding its rows. Chunks along K
/// (`along_k`; bands of `cols_per_chunk` columns of every rank's
/// `rows_per_chunk` rows, flag `band * ranks + rank`): each waits per k-tile
/// for the bands it reads. The tile order starts at `first_row`, this rank's
/// own rows, which need no copy.
#[fused_kernel]
#[allow(clippy::too_many_arguments)]
pub fn ag_matmul(
    a: &Tensor<bf16>,
    b: &Tensor<bf16>,
    out: &Tensor<bf16>,
    progress: &Tensor<u32>,
    rows_per_chunk: usize,
    cols_per_chunk: usize,
    ranks: usize,
    epoch: usize,
    first_row: usize,
    #[constexpr] along_k: bool,
) {
    let [m, k] = a.shape();
    let [_, n] = b.shape();
    for (tm, tn) in tile([m, n]).starting_at([first_row, 0]) {
        if !along_k {
            // Every chunk the tile's rows touch (a tile may span chunks and
            // ranks, which arrive in rotation, not in row order).
            wait(
                progress,
                tm.begin() / rows_per_chunk..=(tm.end() - 1) / rows_per_chunk,
                epoch,
            );
        }
        let mut acc = zeros::<f32>([tm, tn]);
        for tk in tile(k) {
            if along_k {
                // The bands this k-tile reads, of every rank the tile's rows
                // belong to (and those between: they arrive in the same round).
                wait(
                    progress,
                    tk.begin() / cols_per_chunk * ranks + tm.begin() / rows_per_chunk
                        ..=(tk.end() - 1) / cols_per_chunk * ranks
                            + (tm.end() - 1) / rows_per_chunk,
                    epoch,
                );
            }
            acc = addmm(acc, a[(tm, tk)], b[(tk, tn)]);
        }
        out[(tm, tn)] = acc.cast();
    }
}

/// Where the all-gather cuts its chunks (see the module docs).
#[derive(Clone, Copy, PartialEq, clap::ValueEnum)]
enum Along {
    Auto,
    Rows,
    Cols,
}

/// The flags the GEMM waits on and how to read them.
#[derive(Clone, Copy)]
struct Waits {
    rows_per_chunk: usize,
    cols_per_chunk: usize,
    ranks: usize,
    along_k: bool,
    /// Tiles are visited in bands of at most this many rows (a rank's), so
    /// that the first waves run on the rows already here; 0: the config's
    /// own order.
    group_rows: usize,
    /// SMs the GEMM leaves to an all-gather copied by SMs.
    sms_left: usize,
}

impl Waits {
    fn of(ag: &AllGather<bf16>, ranks: usize) -> Waits {
        Waits {
            rows_per_chunk: ag.rows_per_chunk(),
            cols_per_chunk: ag.cols_per_chunk(),
            ranks,
            along_k: matches!(ag.chunks(), Chunks::Cols(_)),
            group_rows: ag.shard().size(0),
            sms_left: ag.sms_in_use(),
        }
    }

    /// The GEMM alone, for reference: its config's own order, every SM.
    fn alone(self) -> Waits {
        Waits {
            sms_left: 0,
            ..self.ungrouped()
        }
    }

    /// The same waits in the config's own tile order (the GEMM alone).
    fn ungrouped(self) -> Waits {
        Waits {
            group_rows: 0,
            ..self
        }
    }

    /// `ag_matmul` on `a` with these waits.
    fn gemm(
        &self,
        a: &Tensor<bf16>,
        b: &Tensor<bf16>,
        c: &Tensor<bf16>,
        progress: &Tensor<u32>,
        epoch: usize,
        first_row: usize,
    ) -> tilefuse::Result<()> {
        let launch = || {
            ag_matmul(
                a,
                b,
                c,
                progress,
                self.rows_per_chunk,
                self.cols_per_chunk,
                self.ranks,
                epoch,
                first_row,
                self.along_k,
            )
        };
        let ordered = || match self.group_rows {
            0 => launch(),
            rows => ag_matmul::kernel().with_group_rows(rows, launch),
        };
        tilefuse::runtime::kernel::leaving_sms(self.sms_left, ordered)
    }
}

/// all_gather_matmul's command line (each rank parses it).
#[derive(clap::Parser)]
#[command(
    about = "C = all_gather(A) · B on every rank, the GEMM overlapping the copy-engine all-gather; checked against NCCL + cuBLAS"
)]
struct Args {
    /// The gathered rows, N and K (all three, or none for the defaults).
    #[arg(num_args = 3, value_names = ["M", "N", "K"])]
    mnk: Vec<usize>,
    /// Time it against NCCL + cuBLAS and the GEMM alone.
    #[arg(long)]
    bench: bool,
    /// Where the all-gather cuts its chunks.
    #[arg(long = "chunks-along", value_enum, default_value = "auto")]
    along: Along,
    /// Bands of rows per rank (default 4; 8 bands of columns along K).
    #[arg(long = "splits-per-rank", value_parser = positive)]
    splits: Option<usize>,
    /// The GEMM's config as JSON, instead of the default or the tuned one, e.g.
    /// {"block_sizes":[128,256,64],"num_warps":8,"num_stages":4,"group_m":8,"wgmma":true,"persistent":true}.
    #[arg(long, value_parser = config_json)]
    config: Option<Config>,
    /// The fused GEMM visits its tiles in the config's own order (groups of
    /// rows that may span ranks) instead of a rank's rows at a time: for
    /// comparison.
    #[arg(long)]
    ungrouped: bool,
    /// Copy the peers' chunks with this many SMs (even) instead of the copy
    /// engine; the GEMM leaves them free. 0: the copy engine. Default: 16
    /// beside a GEMM of one wave with room for them, else the copy engine
    /// (`tilefuse::ops::copy_sms_for`).
    #[arg(long = "copy-sms")]
    copy_sms: Option<usize>,
}

fn positive(s: &str) -> Result<usize, String> {
    match s.parse::<usize>() {
        Ok(v) if v > 0 => Ok(v),
        _ => Err(format!("`{s}`: expected a positive integer")),
    }
}

impl Args {
    /// M, N and K: as given, or the defaults (smaller in interpret mode).
    /// (Interpret mode: a size for the CPU, ragged against the blocks.)
    fn sizes(&self) -> [usize; 3] {
        tilefuse_testkit::sizes(&self.mnk, [4096, 6656, 16384], [240, 168, 136])
    }
}

fn run(args: Args) -> tilefuse::Result<bool> {
    match args.config.clone() {
        Some(c) => ag_matmul::kernel().with_config(c, || run_with(args)),
        None => run_with(args),
    }
}

fn run_with(args: Args) -> tilefuse::Result<bool> {
    let pg = ProcessGroup::init()?;
    let (rank, world) = (pg.rank(), pg.world_size());
    let [m, n, k] = args.sizes();
    if m % world != 0 {
        return Err(tilefuse::Error::Argument {
            context: "all_gather_matmul".into(),
            arg: "M".into(),
            message: format!("{m} rows do not split evenly over {world} ranks"),
        });
    }
    let rows = m / world;
    let dev = pg.device().clone();
    let on = match dev.is_host() {
        true => "the CPU (interpret mode)".to_string(),
        false => format!("GPU {} ({})", dev.ordinal(), dev.name()),
    };
    println!(
        "rank {rank}/{world} on {on}: C[{m}x{n}] = all_gather(A[{rows}x{k}] per rank) · B[{k}x{n}], bf16"
    );

    // Fresh inputs: B from rank 0's seed (the same on every rank), A's shard per rank.
    let seed = Rng::fresh().next_u64();
    let seeds = pg.all_gather_bytes("seed", &seed.to_le_bytes())?;
    let b_seed = u64::from_le_bytes(seeds[0][..8].try_into().unwrap_or([0; 8]));
    let b = Tensor::from_slice(
        &random_vec::<bf16>(&mut Rng::new(b_seed), k * n, 1.0),
        [k, n],
    )?;
    let shard_host = random_vec::<bf16>(&mut Rng::new(seed ^ rank as u64), rows * k, 1.0);

    // Reference: NCCL all-gather, then cuBLAS.
    let nccl = pg.nccl()?;
    let shard_plain = Tensor::from_slice(&shard_host, [rows, k])?;
    let gathered_ref = Tensor::<bf16>::empty([m, k])?;
    nccl.all_gather(&shard_plain, &gathered_ref)?;
    let mut c_ref = poisoned::<bf16>([m, n])?;
    tilefuse::cublas::matmul_into(&mut c_ref, &gathered_ref, &b)?;
    pg.synchronize("the reference")?;

    let c = poisoned::<bf16>([m, n])?;
    let single_node = pg.env().single_node();
    let mut ag = None;
    let gathered;
    let progress;
    let waits;
    if single_node {
        // A GEMM of few waves starts most tiles at once: chunks along K.
        let cols = match args.along {
            Along::Auto => tilefuse::ops::chunks_along_k(m, n, dev.sm_count()),
            along => along == Along::Cols,
        };
        let chunks = match (cols, args.splits) {
            (true, s) => Chunks::Cols(s.unwrap_or(8)),
            (false, s) => Chunks::Rows(s.unwrap_or(4)),
        };
        let mut a = AllGather::<bf16>::with_chunks(&pg, rows, k, chunks)?;
        let sms = args
            .copy_sms
            .unwrap_or_else(|| tilefuse::ops::copy_sms_for(m, n, dev.sm_count()));
        if sms > 0 {
            a.copy_with_sms(sms)?;
        }
        a.shard().clone().copy_from_slice(&shard_host)?;
        println!(
            "rank {rank}: all-gather chunks {:?}, copied by {}",
            a.chunks(),
            match a.sms_in_use() {
                0 => "the copy engine".to_string(),
                s => format!("{s} SMs"),
            }
        );
        waits = match args.ungrouped {
            true => Waits::of(&a, world).ungrouped(),
            false => Waits::of(&a, world),
        };
        ag = Some(a);
        let a = ag.as_mut().expect("just set");
        let epoch = a.start()?;
        waits.gemm(
            a.gathered(),
            &b,
            &c,
            a.progress(),
            epoch as usize,
            rank * rows,
        )?;
        a.finish()?;
        gathered = a.gathered().clone();
        progress = a.progress().clone();
    } else {
        println!(
            "rank {rank}: the ranks span {} nodes and symmetric memory spans one: falling back to NCCL all-gather + the tilefuse GEMM",
            world / pg.env().local_world_size
        );
        gathered = Tensor::<bf16>::empty([m, k])?;
        nccl.all_gather(&shard_plain, &gathered)?;
        progress = Tensor::<u32>::flags(1)?;
        progress.clone().copy_from_slice(&[1])?;
        waits = Waits {
            rows_per_chunk: m,
            cols_per_chunk: k,
            ranks: 1,
            along_k: false,
            group_rows: 0,
            sms_left: 0,
        };
        waits.gemm(&gathered, &b, &c, &progress, 1, rank * rows)?;
    }
    pg.synchronize("the all-gather matmul")?;

    let same = gathered.to_vec()? == gathered_ref.to_vec()?;
    let err = rel_error_tensors(&c, &c_ref)?;
    let ok = same && err <= 1e-2;
    println!(
        "rank {rank}: gathered A {} NCCL's bit for bit; ‖C − C_ref‖/‖C_ref‖ = {err:.2e} ({})",
        if same { "equals" } else { "DIFFERS FROM" },
        if ok { "ok" } else { "FAILED" }
    );
    let all_ok = pg.all_gather_bytes("ok", &[u8::from(ok)])?;
    let everyone = all_ok.iter().all(|v| v.first() == Some(&1));

    if args.bench && everyone {
        bench(
            &pg,
            &args,
            &b,
            &shard_plain,
            &gathered_ref,
            ag.as_mut(),
            &gathered,
            &progress,
            waits,
        )?;
    }
    Ok(everyone)
}

#[allow(clippy::too_many_arguments)]
fn bench(
    pg: &ProcessGroup,
    args: &Args,
    b: &Tensor<bf16>,
    shard: &Tensor<bf16>,
    gathered_ref: &Tensor<bf16>,
    mut ag: Option<&mut AllGather<bf16>>,
    gathered: &Tensor<bf16>,
    progress: &Tensor<u32>,
    waits: Waits,
) -> tilefuse::Result<()> {
    let dev = pg.device().clone();
    let [m, n, k] = args.sizes();
    let nccl = pg.nccl()?;
    let mut c = Tensor::<bf16>::empty([m, n])?;
    // The flags hold the last call's epoch: the GEMM's waits pass at once.
    let first_row = pg.rank() * m / pg.world_size();
    let done_epoch = progress.to_vec()?.into_iter().min().unwrap_or(0) as usize;
    let fused_too = ag.is_some();
    // 0 floor, 1 tilefuse GEMM alone, 2 NCCL all-gather alone, 3 unfused, 4 fused;
    // where the all-gather is ours, 5 it alone, and 6 it beside a GEMM that does
    // not wait for it (reading A as it is: only the time counts), the time the
    // two take together when neither waits on the other.
    let mut run = |i: usize| -> tilefuse::Result<()> {
        match i {
            0 => tilefuse::cublas::matmul_into(&mut c, gathered_ref, b),
            1 => waits
                .alone()
                .gemm(gathered, b, &c, progress, done_epoch, first_row),
            2 => nccl.all_gather(shard, gathered_ref),
            3 => {
                nccl.all_gather(shard, gathered_ref)?;
                tilefuse::cublas::matmul_into(&mut c, gathered_ref, b)
            }
            4 => {
                let Some(a) = ag.as_mut() else { return Ok(()) };
                let e = a.start()?;
                waits.gemm(a.gathered(), b, &c, a.progress(), e as usize, first_row)?;
                a.finish()
            }
            5 => {
                let Some(a) = ag.as_mut() else { return Ok(()) };
                a.start()?;
                a.finish()
            }
            _ => {
                let Some(a) = ag.as_mut() else { return Ok(()) };
                a.start()?;
                waits.gemm(a.gathered(), b, &c, a.progress(), 0, first_row)?;
                a.finish()
            }
        }
    };
    // Interleaved rounds, so that clocks drifting through the run (the GPU heats
    // up) do not favour whichever is timed first; the median of the rounds'
    // medians. Every rank times the same variant at once (a barrier before each).
    let variants = if fused_too { 7 } else { 4 };
    let (rounds, reps) = (6, 5);
    let mut medians = vec![Vec::with_capacity(rounds); variants];
    for _ in 0..rounds {
        for (i, out) in medians.iter_mut().enumerate() {
            pg.barrier("bench")?;
            out.push(tilefuse::time_gpu(&dev, 2, reps, true, || run(i))?.median_ms);
        }
    }
    let median = |v: &mut Vec<f64>| {
        v.sort_by(|x, y| x.total_cmp(y));
        v[v.len() / 2]
    };
    let times: Vec<f64> = medians.iter_mut().map(median).collect();
    let (floor, gemm_alone, ag_alone, unfused) = (times[0], times[1], times[2], times[3]);
    let fused = times.get(4).copied();
    if let Some(a) = ag.as_mut() {
        timeline(pg, a, b, &c, waits, first_row)?;
    }
    if pg.rank() == 0 {
        let tf = |ms: f64| 2.0 * (m * n * k) as f64 / ms / 1e9;
        println!(
            "\n{m}x{n}x{k}, {} ranks (ms; TFLOP/s of the whole product per GPU-time):",
            pg.world_size()
        );
        println!(
            "  cuBLAS, full A, one GPU (floor):      {floor:.3} ({:.0})",
            tf(floor)
        );
        println!(
            "  tilefuse GEMM alone on gathered A:    {gemm_alone:.3} ({:.0})",
            tf(gemm_alone)
        );
        println!("  NCCL all-gather alone:                {ag_alone:.3}");
        println!("  NCCL all-gather + cuBLAS (unfused):   {unfused:.3}");
        match fused {
            Some(f) => {
                println!(
                    "  tilefuse fused:                       {f:.3} ({:.0})",
                    tf(f)
                );
                let (ours, beside) = (times[5], times[6]);
                println!("  tilefuse all-gather alone:            {ours:.3}");
                println!("  GEMM beside it, not waiting:          {beside:.3}");
                println!(
                    "  fused/unfused {:.3}, fused/GEMM-alone {:.3}, fused/floor {:.3}",
                    f / unfused,
                    f / gemm_alone,
                    f / floor
                );
                println!(
                    "| {m}×{n}×{k} | {} | {floor:.3} | {gemm_alone:.3} | {ag_alone:.3} | {ours:.3} | {beside:.3} | {unfused:.3} | {f:.3} | {:.3} | {:.3} | {:.3} |",
                    pg.world_size(),
                    f / unfused,
                    f / gemm_alone,
                    f / floor
                );
            }
            None => println!("  (fused: not across nodes)"),
        }
    }
    Ok(())
}

/// One fused call traced on every rank: when the opening barrier passed, each
/// chunk's flag was set and the GEMM ended, in ms after the call was queued
/// (the last of three calls, each after a barrier of the ranks).
fn timeline(
    pg: &ProcessGroup,
    ag: &mut AllGather<bf16>,
    b: &Tensor<bf16>,
    c: &Tensor<bf16>,
    waits: Waits,
    first_row: usize,
) -> tilefuse::Result<()> {
    let dev = pg.device().clone();
    let mut points = Vec::new();
    for _ in 0..3 {
        dev.synchronize()?;
        pg.barrier("timeline")?;
        ag.trace_next(tilefuse::runtime::timing::Timeline::begin(&dev)?);
        let e = ag.start()?;
        waits.gemm(ag.gathered(), b, c, ag.progress(), e as usize, first_row)?;
        let mut t = ag
            .take_timeline()
            .ok_or_else(|| tilefuse::Error::Distributed {
                context: "all_gather_matmul timeline".into(),
                message: "the all-gather kept no timeline".into(),
            })?;
        t.mark(dev.stream()?, "GEMM done")?;
        ag.finish()?;
        dev.synchronize()?;
        points = t.read()?;
    }
    let line: Vec<String> = points
        .iter()
        .map(|(l, ms)| format!("{l} {ms:.3}"))
        .collect();
    println!("timeline rank {}: {}", pg.rank(), line.join(", "));
    Ok(())
}

fn main() -> ExitCode {
    // Library messages on stderr, filtered by TILEFUSE_LOG (default: warnings).
    tilefuse::runtime::log::init();
    match tilefuse_testkit::args::<Args>("all_gather_matmul") {
        Ok(args) => exit_code(run(args)),
        Err(code) => code,
    }
}
