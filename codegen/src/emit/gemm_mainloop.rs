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
        "  const tf_u32 sA = tf_smem_u32(tf_smem), sB = sA + {};\n  const int KT = (int)((K + {bk} - 1) / {bk});",
        s * a_stage
    );

    // Per-thread loader state, computed once.
    if p.a_vec {
        let _ = write!(
            o,
            r#"  // A: {a_chunks} chunks of 16 B per stage, {ia} per thread.
  // Registers are scarce next to the accumulators: row validity is a bitmask, and
  // what only the ragged tile needs is recomputed there.
  const tf_u16* a_g[{ia}]; tf_u32 a_s[{ia}], a_ok = 0;
  #pragma unroll
  for (int i = 0; i < {ia}; ++i) {{
    const int c = tid + i * {nt}, row = c / {cpr_a}, ch = c % {cpr_a};
    const bool ok = c < {a_chunks} && {m0} + row < M;
    a_g[i] = (const tf_u16*)t{a} + (ok ? ({m0} + row) * t{a}_s0 : 0) + ch * 8;
    a_s[i] = (tf_u32)((row * {bk} + tf_swz_a(row, ch) * 8) * 2);
    a_ok |= (ok ? 1u : 0u) << i;
  }}
"#
        );
    }
    if p.b_vec {
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

    // load_stage(stage, kt): request tile kt into a ring slot.
    let _ = writeln!(
        o,
        "  auto load_stage = [&](int stage, int kt) {{\n    const long long k0 = (long long)kt * {bk};\n    const tf_u32 da = sA + stage * {a_stage}, db = sB + stage * {b_stage};\n    if (k0 + {bk} <= K) {{"
    );
    if p.a_vec {
        let _ = write!(
            o,
            r#"      #pragma unroll
      for (int i = 0; i < {ia}; ++i) if ({ga}) tf_cp_async16(da + a_s[i], a_g[i] + k0, ((a_ok >> i) & 1u) * 16u);
"#
        );
    }
    if p.b_vec {
        let _ = write!(
            o,
            r#"      const long long bo = k0 * t{b}_s0;
      #pragma unroll
      for (int i = 0; i < {ib}; ++i) if ({gb}) tf_cp_async16(db + b_s[i], b_g[i] + bo, b_bytes[i]);
"#
        );
    }
    let _ = writeln!(o, "    }} else {{  // the ragged last tile");
    if p.a_vec {
        let _ = write!(
            o,
            r#"      #pragma unroll
      for (int i = 0; i < {ia}; ++i) if ({ga}) {{
        const long long rem = K - (k0 + ((tid + i * {nt}) % {cpr_a}) * 8);
        const tf_u32 n = (((a_ok >> i) & 1u) && rem > 0) ? (rem >= 8 ? 16u : (tf_u32)(rem * 2)) : 0u;
        tf_cp_async16(da + a_s[i], n ? a_g[i] + k0 : a_g[i], n);
      }}
"#
        );
    }
    if p.b_vec {
        let _ = write!(
            o,
            r#"      #pragma unroll
      for (int i = 0; i < {ib}; ++i) if ({gb}) {{
        const tf_u32 n = (k0 + (tid + i * {nt}) / {cpr_b} < K) ? b_bytes[i] : 0u;
        tf_cp_async16(db + b_s[i], n ? b_g[i] + k0 * t{b}_s0 : b_g[i], n);
      }}
"#
        );
    }
    let _ = writeln!(o, "    }}");
    if !p.a_vec {
        let _ = write!(
            o,
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
    if !p.b_vec {
        let _ = write!(
            o,
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
    let _ = writeln!(o, "  }};");

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
  for (int i = 0; i < {pro}; ++i) {{ if (i < KT) load_stage(i, i); tf_cp_async_commit(); }}
  tf_cp_async_wait<{wait}>();
  __syncthreads();
  int rs = 0, ws = {pro};
{body}  tf_cp_async_wait<0>();
"#,
        body = if ki_n == 1 {
            single_step_loop(s, p.mma, mi, ni)
        } else {
            multi_step_loop(s, p.mma, ki_n, mi, ni)
        },
        b_kstep = 16 * bn * 2,
        a_istep = 16 * bk * 2,
        pro = s - 1,
        wait = s - 2,
    );
}

/// Tiles of several k-steps: fragments double-buffered across k-steps and tiles.
fn multi_step_loop(s: usize, mma: &str, ki_n: usize, mi: usize, ni: usize) -> String {
    let (pro, wait) = (s - 1, s - 2);
    format!(
        r#"  load_frags(0, 0, 0);
  #pragma unroll 1
  for (int kt = 0; kt < KT; ++kt) {{
    #pragma unroll
    for (int ki = 0; ki < {ki_n}; ++ki) {{
      if (ki == 0) {{
        // Refill the slot every thread finished reading before the last barrier.
        if (kt + {pro} < KT) load_stage(ws, kt + {pro});
        tf_cp_async_commit();
        ws = ws + 1 == {s} ? 0 : ws + 1;
      }}
      if (ki == {ki_n} - 1) {{
        // Tile kt + 1 has landed; everyone is done with tile kt's slot.
        tf_cp_async_wait<{wait}>();
        __syncthreads();
        rs = rs + 1 == {s} ? 0 : rs + 1;
      }}
      // Buffers alternate with ki: ki_n is even, so the parity carries over tiles.
      load_frags(rs, (ki + 1) % {ki_n}, (ki + 1) & 1);
{mmas}
    }}
  }}
"#,
        mmas = mma_block(mma, mi, ni, "ki & 1")
    )
}

/// Tiles of one k-step (a 16-wide K block): fragments are read right after the
/// barrier that hands the stage over, one buffer.
fn single_step_loop(s: usize, mma: &str, mi: usize, ni: usize) -> String {
    let (pro, wait) = (s - 1, s - 2);
    format!(
        r#"  #pragma unroll 1
  for (int kt = 0; kt < KT; ++kt) {{
    if (kt + {pro} < KT) load_stage(ws, kt + {pro});
    tf_cp_async_commit();
    ws = ws + 1 == {s} ? 0 : ws + 1;
    load_frags(rs, 0, 0);
{mmas}
    tf_cp_async_wait<{wait}>();
    __syncthreads();
    rs = rs + 1 == {s} ? 0 : rs + 1;
  }}
"#,
        mmas = mma_block(mma, mi, ni, "0")
    )
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
