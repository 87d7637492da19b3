//! The K loop of the portable GEMM: a multistage `cp.async` ring in shared memory
//! feeding `ldmatrix` + `mma.sync`, in the shape of CUTLASS's sm80 multistage
//! mainloop:
//!
//! - stage `kt + S - 1` is requested at the first k-step of tile `kt`, so `S - 1`
//!   tiles are always in flight;
//! - fragments are double-buffered in registers: the k-step `ki + 1` (or the next
//!   tile's first k-step) is read from shared memory while `ki` runs on the tensor
//!   cores, and the barrier that hands over a stage sits before the last k-step;
//! - interior k-tiles issue one 64-bit add and one `cp.async` per 16-byte chunk
//!   (pointers, masks and shared offsets are computed once); only the ragged last
//!   tile takes the masked path.

use std::fmt::Write;

/// What the mainloop needs from the GEMM lowering.
pub(super) struct Mainloop<'a> {
    pub bm: usize,
    pub bn: usize,
    pub bk: usize,
    pub mi: usize,
    pub ni: usize,
    pub threads: usize,
    pub stages: usize,
    /// Tensor ids of A (`[m][k]`, k contiguous) and B (`[k][n]`, n contiguous).
    pub a: usize,
    pub b: usize,
    /// Rows are 16-byte aligned: `cp.async` of 16-byte chunks (else element loads).
    pub a_vec: bool,
    pub b_vec: bool,
    /// C names of the output tile's first row and column.
    pub m0: String,
    pub n0: String,
    /// `tf_mma_bf16` or `tf_mma_f16`.
    pub mma: &'a str,
    /// A `kwait(kt)` lambda is defined: call it before k-tile `kt`'s loads.
    pub k_wait: bool,
}

pub(super) fn emit(o: &mut String, p: &Mainloop) {
    let Mainloop {
        bm,
        bn,
        bk,
        mi,
        ni,
        threads: nt,
        stages: s,
        a,
        b,
        ..
    } = *p;
    let (m0, n0) = (&p.m0, &p.n0);
    let (a_stage, b_stage) = (bm * bk * 2, bk * bn * 2);
    let (cpr_a, cpr_b) = (bk / 8, bn / 8);
    let (a_chunks, b_chunks) = (bm * cpr_a, bk * cpr_b);
    let (ia, ib) = (a_chunks.div_ceil(nt), b_chunks.div_ceil(nt));
    let guard = |chunks: usize| {
        if chunks % nt == 0 {
            "true".to_string()
        } else {
            format!("tid + i * {nt} < {chunks}")
        }
    };
    let (ga, gb) = (guard(a_chunks), guard(b_chunks));
    let _ = writeln!(
        o,
        "  const tf_u32 sA = tf_smem_u32(tf_smem), sB = sA + {};\n  // This program's K tiles: all of them, or its part of a split tile.\n  const int KT_all = (int)((K + {bk} - 1) / {bk});\n  const int kt_lo = (int)((long long)tf_part * KT_all / tf_w), KT = (int)((long long)(tf_part + 1) * KT_all / tf_w);",
        s * a_stage
    );

    // Per-thread loader state, computed once. When every pass of the block's
    // threads covers a multiple of 8 rows and all chunks are in use ("uniform"),
    // a thread's chunks share their column and swizzle: shared offsets are one
    // base plus constants, and B's chunks one pointer plus a row step. That keeps
    // the loader in a few registers next to the accumulators.
    let uniform =
        |chunks: usize, cpr: usize| chunks % nt == 0 && nt % cpr == 0 && (nt / cpr) % 8 == 0;
    let (a_uni, b_uni) = (uniform(a_chunks, cpr_a), uniform(b_chunks, cpr_b));
    let (a_rpp, b_rpp) = (nt / cpr_a.max(1), nt / cpr_b.max(1));
    let a_soff = if a_uni {
        format!("a_s0 + i * {}", a_rpp * bk * 2)
    } else {
        "a_s[i]".to_string()
    };
    if p.a_vec {
        let (decl, set) = if a_uni {
            (
                "tf_u32 a_s0 = 0;".to_string(),
                format!("if (i == 0) a_s0 = (tf_u32)((row * {bk} + tf_swz_a(row, ch) * 8) * 2);"),
            )
        } else {
            (
                format!("tf_u32 a_s[{ia}];"),
                format!("a_s[i] = (tf_u32)((row * {bk} + tf_swz_a(row, ch) * 8) * 2);"),
            )
        };
        let _ = write!(
            o,
            r#"  // A: {a_chunks} chunks of 16 B per stage, {ia} per thread. Row validity is
  // a bitmask; what only the ragged tile needs is recomputed there.
  const tf_u16* a_g[{ia}]; {decl} tf_u32 a_ok = 0;
  #pragma unroll
  for (int i = 0; i < {ia}; ++i) {{
    const int c = tid + i * {nt}, row = c / {cpr_a}, ch = c % {cpr_a};
    const bool ok = c < {a_chunks} && {m0} + row < M;
    a_g[i] = (const tf_u16*)t{a} + (ok ? ({m0} + row) * t{a}_s0 : 0) + ch * 8;
    {set}
    a_ok |= (ok ? 1u : 0u) << i;
  }}
"#
        );
    }
    if p.b_vec && b_uni {
        let _ = write!(
            o,
            r#"  // B: {b_chunks} chunks of 16 B per stage, {ib} per thread, {b_rpp} rows apart.
  const tf_u16* b_g0; tf_u32 b_s0, b_nb;
  {{
    const int row = tid / {cpr_b}, ch = tid % {cpr_b};
    const long long rem = N - ({n0} + ch * 8);
    b_nb = rem > 0 ? (rem >= 8 ? 16u : (tf_u32)(rem * 2)) : 0u;
    b_g0 = (const tf_u16*)t{b} + (long long)row * t{b}_s0 + (b_nb ? {n0} + ch * 8 : 0);
    b_s0 = (tf_u32)((row * {bn} + tf_swz_b(row, ch) * 8) * 2);
  }}
"#
        );
    } else if p.b_vec {
        let _ = write!(
            o,
            r#"  // B: {b_chunks} chunks of 16 B per stage, {ib} per thread.
  const tf_u16* b_g[{ib}]; tf_u32 b_s[{ib}], b_bytes[{ib}];
  #pragma unroll
  for (int i = 0; i < {ib}; ++i) {{
    const int c = tid + i * {nt}, row = c / {cpr_b}, ch = c % {cpr_b};
    const long long rem = N - ({n0} + ch * 8);
    const tf_u32 nb = (c < {b_chunks} && rem > 0) ? (rem >= 8 ? 16u : (tf_u32)(rem * 2)) : 0u;
    b_g[i] = (const tf_u16*)t{b} + (long long)(c < {b_chunks} ? row : 0) * t{b}_s0 + (nb ? {n0} + ch * 8 : 0);
    b_s[i] = (tf_u32)((row * {bn} + tf_swz_b(row, ch) * 8) * 2);
    b_bytes[i] = nb;
  }}
"#
        );
    }

    // Two loaders. `load_full(stage, kt, part)` is for tiles wholly inside K, and
    // issues the chunks `i` with `i % parts == part`: the steady-state loop can
    // spread a tile's copies over its k-steps (part = k-step), so each batch of
    // integer work has MMAs to hide behind. No K test, no branch around it: ptxas
    // interleaves it with the MMAs (a guarded loader in the loop was if-converted,
    // both paths issued, predicated, every tile). `load_any(stage, kt)` also takes
    // the ragged last tile; only the prologue and the tail loop call it.
    // Measured on an H200 (docs/PERFORMANCE.md): spreading helps 4-warp blocks
    // (128x128x64: 444 -> 470 TFLOP/s, two blocks per SM hide each other's
    // barriers) and hurts 8-warp ones (128x256x64: 494 -> 477), whose copies then
    // start later; those issue the whole tile at the first k-step.
    let parts = if nt <= 128 { bk / 16 } else { 1 };
    let fast = |parts: usize| -> String {
        let mut f = String::new();
        if p.a_vec {
            let _ = write!(
                f,
                r#"    #pragma unroll
    for (int i = 0; i < {ia}; ++i)
      if (i % {parts} == part && ({ga})) tf_cp_async16(da + {a_soff}, a_g[i] + k0, ((a_ok >> i) & 1u) * 16u);
"#
            );
        }
        if p.b_vec && b_uni {
            let _ = write!(
                f,
                r#"    const tf_u16* bp = b_g0 + (k0 + part * {b_rpp}) * t{b}_s0;
    const long long b_step = {step_rows} * t{b}_s0;
    #pragma unroll
    for (int i = 0; i < {ib}; ++i)
      if (i % {parts} == part) {{ tf_cp_async16(db + b_s0 + i * {b_pass}, bp, b_nb); bp += b_step; }}
"#,
                step_rows = parts * b_rpp,
                b_pass = b_rpp * bn * 2
            );
        } else if p.b_vec {
            let _ = write!(
                f,
                r#"    const long long bo = k0 * t{b}_s0;
    #pragma unroll
    for (int i = 0; i < {ib}; ++i)
      if (i % {parts} == part && ({gb})) tf_cp_async16(db + b_s[i], b_g[i] + bo, b_bytes[i]);
"#
            );
        }
        f
    };
    let mut ragged = String::new();
    let mut sync = String::new();
    if p.a_vec {
        let _ = write!(
            ragged,
            r#"    #pragma unroll
    for (int i = 0; i < {ia}; ++i) if ({ga}) {{
      const long long rem = K - (k0 + ((tid + i * {nt}) % {cpr_a}) * 8);
      const tf_u32 n = (((a_ok >> i) & 1u) && rem > 0) ? (rem >= 8 ? 16u : (tf_u32)(rem * 2)) : 0u;
      tf_cp_async16(da + {a_soff}, n ? a_g[i] + k0 : a_g[i], n);
    }}
"#
        );
    } else {
        let _ = write!(
            sync,
            r#"    // A rows are not 16-byte aligned: element loads (synchronous).
    for (int e = tid; e < {n}; e += {nt}) {{
      const int row = e / {bk}, col = e % {bk};
      const long long gr = {m0} + row, gc = k0 + col;
      const tf_u16 v = (gr < M && gc < K) ? ((const tf_u16*)t{a})[gr * t{a}_s0 + gc] : (tf_u16)0;
      ((tf_u16*)(tf_smem + stage * {a_stage}))[row * {bk} + tf_swz_a(row, col >> 3) * 8 + (col & 7)] = v;
    }}
"#,
            n = bm * bk
        );
    }
    if p.b_vec && b_uni {
        let _ = write!(
            ragged,
            r#"    const long long row0 = k0 + tid / {cpr_b};
    #pragma unroll
    for (int i = 0; i < {ib}; ++i) {{
      const tf_u32 n = row0 + i * {b_rpp} < K ? b_nb : 0u;
      tf_cp_async16(db + b_s0 + i * {b_pass}, n ? b_g0 + (k0 + i * {b_rpp}) * t{b}_s0 : b_g0, n);
    }}
"#,
            b_pass = b_rpp * bn * 2
        );
    } else if p.b_vec {
        let _ = write!(
            ragged,
            r#"    #pragma unroll
    for (int i = 0; i < {ib}; ++i) if ({gb}) {{
      const tf_u32 n = (k0 + (tid + i * {nt}) / {cpr_b} < K) ? b_bytes[i] : 0u;
      tf_cp_async16(db + b_s[i], n ? b_g[i] + k0 * t{b}_s0 : b_g[i], n);
    }}
"#
        );
    } else {
        let _ = write!(
            sync,
            r#"    // B rows are not 16-byte aligned: element loads (synchronous).
    for (int e = tid; e < {n}; e += {nt}) {{
      const int row = e / {bn}, col = e % {bn};
      const long long gr = k0 + row, gc = {n0} + col;
      const tf_u16 v = (gr < K && gc < N) ? ((const tf_u16*)t{b})[gr * t{b}_s0 + gc] : (tf_u16)0;
      ((tf_u16*)(tf_smem + {a_all} + stage * {b_stage}))[row * {bn} + tf_swz_b(row, col >> 3) * 8 + (col & 7)] = v;
    }}
"#,
            n = bk * bn,
            a_all = s * a_stage
        );
    }
    let head = format!(
        "    const long long k0 = (long long)kt * {bk};\n    const tf_u32 da = sA + stage * {a_stage}, db = sB + stage * {b_stage};\n    (void)da; (void)db;\n"
    );
    // The synchronous element loads (rows not 16-byte aligned) go with part 0.
    let sync_part = if sync.is_empty() {
        String::new()
    } else {
        format!("    if (part == 0) {{\n{sync}    }}\n")
    };
    let _ = write!(
        o,
        "  auto load_full = [&](int stage, int kt, int part) {{\n{head}{}{sync_part}  }};\n",
        fast(parts)
    );
    let _ = write!(
        o,
        "  auto load_any = [&](int stage, int kt) {{\n{head}    if (k0 + {bk} <= K) {{\n      [[maybe_unused]] const int part = 0;\n{}    }} else {{\n{ragged}    }}\n{sync}  }};\n",
        fast(1)
    );
    // Tiles wholly inside K; the loop loads tile kt + S - 1 with `load_full` while
    // that one is full, then finishes in a tail loop with `load_any`.
    let _ = writeln!(
        o,
        "  const int KT_full = (int)tf_min_i((long long)(K / {bk}), (long long)KT);"
    );

    // Fragment addresses: the swizzle term depends on the lane only (rows of a
    // fragment start at multiples of 16), so everything but the stage is hoisted.
    let ki_n = bk / 16;
    let nj = ni / 2;
    let _ = write!(
        o,
        r#"  const int xa = tf_swz_a(lane & 15, 0), xb = tf_swz_b(lane & 15, 0);
  const tf_u32 a_row = (tf_u32)((wm0 + (lane & 15)) * {bk} * 2), b_row_lane = (tf_u32)((lane & 15) * {bn} * 2);
  tf_u32 a_col_off[{ki_n}], b_col_off[{nj}];
  #pragma unroll
  for (int ki = 0; ki < {ki_n}; ++ki) a_col_off[ki] = (tf_u32)(((ki * 2 + (lane >> 4)) ^ xa) * 16);
  #pragma unroll
  for (int j = 0; j < {nj}; ++j) b_col_off[j] = (tf_u32)((((wn0 >> 3) + j * 2 + (lane >> 4)) ^ xb) * 16);
  tf_u32 af[2][{mi}][4], bf[2][{ni}][2];
  auto load_frags = [&](int stage, int ki, int buf) {{
    const tf_u32 a_st = sA + stage * {a_stage} + a_row + a_col_off[ki];
    const tf_u32 b_st = sB + stage * {b_stage} + b_row_lane + ki * {b_kstep} ;
    #pragma unroll
    for (int i = 0; i < {mi}; ++i) tf_ldmatrix_x4(af[buf][i], a_st + i * {a_istep});
    #pragma unroll
    for (int j = 0; j < {nj}; ++j) {{
      tf_u32 r[4];
      tf_ldmatrix_x4_trans(r, b_st + b_col_off[j]);
      bf[buf][2 * j][0] = r[0]; bf[buf][2 * j][1] = r[1]; bf[buf][2 * j + 1][0] = r[2]; bf[buf][2 * j + 1][1] = r[3];
    }}
  }};
  #pragma unroll
  for (int i = 0; i < {pro}; ++i) {{ if (kt_lo + i < KT) {{ {kw_pro}load_any(i, kt_lo + i); }} tf_cp_async_commit(); }}
  tf_cp_async_wait<{wait}>();
  __syncthreads();
  int rs = 0, ws = {pro};
{body}  tf_cp_async_wait<0>();
"#,
        body = if ki_n == 1 {
            single_step_loop(s, p.mma, mi, ni, p.k_wait)
        } else {
            multi_step_loop(s, p.mma, ki_n, mi, ni, p.k_wait)
        },
        kw_pro = if p.k_wait { "kwait(kt_lo + i); " } else { "" },
        b_kstep = 16 * bn * 2,
        a_istep = 16 * bk * 2,
        pro = s - 1,
        wait = s - 2,
    );
}

/// The steady-state loop (loads of full tiles, straight-line body) and the tail
/// loop (at most S iterations: the ragged tile, or no load at all), around one
/// body; `body(true)` is the steady-state one.
fn two_loops(pro: usize, body: impl Fn(bool) -> String) -> String {
    format!(
        r#"  int kt = kt_lo;
  #pragma unroll 1
  for (; kt + {pro} < KT_full; ++kt) {{
{steady}  }}
  #pragma unroll 1
  for (; kt < KT; ++kt) {{
{tail}  }}
"#,
        steady = body(true),
        tail = body(false),
    )
}

/// Tiles of several k-steps: fragments double-buffered across k-steps and tiles.
fn multi_step_loop(s: usize, mma: &str, ki_n: usize, mi: usize, ni: usize, kw: bool) -> String {
    let (pro, wait) = (s - 1, s - 2);
    let mmas = mma_block(mma, mi, ni, "ki & 1");
    let body = |steady: bool| {
        let load = match (steady, kw) {
            (true, false) => format!("load_full(ws, kt + {pro}, ki);"),
            (true, true) => {
                format!("if (ki == 0) kwait(kt + {pro});\n      load_full(ws, kt + {pro}, ki);")
            }
            (false, false) => format!("if (ki == 0 && kt + {pro} < KT) load_any(ws, kt + {pro});"),
            (false, true) => format!(
                "if (ki == 0 && kt + {pro} < KT) {{ kwait(kt + {pro}); load_any(ws, kt + {pro}); }}"
            ),
        };
        format!(
            r#"    #pragma unroll
    for (int ki = 0; ki < {ki_n}; ++ki) {{
      // Refill the slot every thread finished reading before the last barrier,
      // a part per k-step.
      {load}
      if (ki == {ki_n} - 1) {{
        tf_cp_async_commit();
        ws = ws + 1 == {s} ? 0 : ws + 1;
        // Tile kt + 1 has landed; everyone is done with tile kt's slot.
        tf_cp_async_wait<{wait}>();
        __syncthreads();
        rs = rs + 1 == {s} ? 0 : rs + 1;
      }}
      // Buffers alternate with ki: ki_n is even, so the parity carries over tiles.
      load_frags(rs, (ki + 1) % {ki_n}, (ki + 1) & 1);
{mmas}
    }}
"#
        )
    };
    format!("  load_frags(0, 0, 0);\n{}", two_loops(pro, body))
}

/// Tiles of one k-step (a 16-wide K block): fragments are read right after the
/// barrier that hands the stage over, one buffer.
fn single_step_loop(s: usize, mma: &str, mi: usize, ni: usize, kw: bool) -> String {
    let (pro, wait) = (s - 1, s - 2);
    let mmas = mma_block(mma, mi, ni, "0");
    let kwait = if kw {
        format!("kwait(kt + {pro}); ")
    } else {
        String::new()
    };
    let body = |steady: bool| {
        let load = if steady {
            format!("{kwait}load_full(ws, kt + {pro}, 0);")
        } else {
            format!("if (kt + {pro} < KT) {{ {kwait}load_any(ws, kt + {pro}); }}")
        };
        format!(
            r#"    {load}
    tf_cp_async_commit();
    ws = ws + 1 == {s} ? 0 : ws + 1;
    load_frags(rs, 0, 0);
{mmas}
    tf_cp_async_wait<{wait}>();
    __syncthreads();
    rs = rs + 1 == {s} ? 0 : rs + 1;
"#
        )
    };
    two_loops(pro, body)
}

fn mma_block(mma: &str, mi: usize, ni: usize, buf: &str) -> String {
    format!(
        r#"      #pragma unroll
      for (int i = 0; i < {mi}; ++i)
        #pragma unroll
        for (int j = 0; j < {ni}; ++j) {{
          // Serpentine order: neighbouring MMAs share a B fragment.
          const int jj = (i & 1) ? {ni} - 1 - j : j;
          {mma}(acc[i][jj], af[{buf}][i], bf[{buf}][jj]);
        }}"#
    )
}
