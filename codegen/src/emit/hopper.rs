//! Device helpers shared by the Hopper (sm_90a) lowerings: `mbarrier`
//! handshakes, TMA tile loads and stores, clusters, and `wgmma` shared-memory
//! descriptors, `wgmma` wrappers.

use crate::dtype::DType;

pub const HELPERS: &str = r#"
struct __align__(64) tf_tmap { tf_u64 v[16]; };
// A word one warp of the block publishes to another (the GEMM's flag waiter).
__device__ __forceinline__ int tf_ld_acquire_cta(const int* p) {
  int v; asm volatile("ld.acquire.cta.shared.b32 %0, [%1];" : "=r"(v) : "r"((tf_u32)__cvta_generic_to_shared(p)) : "memory"); return v;
}
__device__ __forceinline__ void tf_st_release_cta(int* p, int v) {
  asm volatile("st.release.cta.shared.b32 [%0], %1;" :: "r"((tf_u32)__cvta_generic_to_shared(p)), "r"(v) : "memory");
}
__device__ __forceinline__ void tf_mbar_init(tf_u32 bar, tf_u32 count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" :: "r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void tf_mbar_expect_tx(tf_u32 bar, tf_u32 bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" :: "r"(bar), "r"(bytes) : "memory");
}
__device__ __forceinline__ void tf_mbar_arrive(tf_u32 bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" :: "r"(bar) : "memory");
}
__device__ __forceinline__ bool tf_mbar_test(tf_u32 bar, tf_u32 parity) {
  tf_u32 ok;
  asm volatile("{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2; selp.u32 %0, 1, 0, p; }"
               : "=r"(ok) : "r"(bar), "r"(parity) : "memory");
  return ok != 0;
}
// Waits that end: a barrier still short of its phase after 9-13 s means a
// lowering bug (a count or phase mismatch), and the kernel stops with an error
// (the host sees an illegal instruction). The producers wait this way; the
// consumers spin in their hot loops with `tf_mbar_spin`, and each block's
// producer finally waits for every consumer warp's arrival on a `done` barrier,
// so a consumer stuck anywhere still stops the kernel. (Bounded in the
// consumers, the waits cost attention 2-3%: ptxas laid the retry out inline;
// docs/perf-history.md, "Hopper barrier waits that end".) The clock is %globaltimer's high word (a
// tick is 2^32 ns, 4.3 s), read on every 4096th failed try. The stop is a
// store to a shared address outside every block's window, not `trap`: a loop
// holding a trap (or one left early to trap after it) makes ptxas put a
// `YIELD` at the head of the enclosing load loop, which cost a ping-pong GEMM
// 10% (docs/perf-history.md, "the barrier waits' cost found"). No call either: a call anywhere in a kernel makes ptxas
// serialize its `wgmma`s, so no printf or assert.
__device__ __forceinline__ void tf_mbar_wait(tf_u32 bar, tf_u32 parity) {
  tf_u32 n = 0, t0 = 0;
  while (!tf_mbar_test(bar, parity)) {
    asm volatile("{ .reg .pred p, q; .reg .b32 t, d;\n"
                 "add.u32 %0, %0, 1;\n"
                 "and.b32 d, %0, 4095;\n"
                 "setp.eq.u32 p, d, 0;\n"
                 "mov.u32 t, %1;\n"
                 "@p mov.u32 t, %%globaltimer_hi;\n"
                 "setp.eq.u32 q, %0, 4096;\n"
                 "@q mov.u32 %1, t;\n"
                 "sub.u32 d, t, %1;\n"
                 "setp.ge.and.u32 q, d, 3, p;\n"
                 "mov.u32 d, 0xfffffff0;\n"
                 "@q st.volatile.shared.u32 [d], d;\n"
                 "}" : "+r"(n), "+r"(t0) :: "memory");
  }
}
// The `done` barrier: every consumer warp arrives on it when it leaves, and
// the producer waits for that (bounded). Its address is taken at each use:
// kept in a variable, it stayed live through the consumers and made a fused op
// kernel spill.
__shared__ __align__(8) tf_u64 tf_done_bar;
__device__ __forceinline__ tf_u32 tf_done() { return tf_smem_u32(&tf_done_bar); }
// A consumer's wait: only safe where the block's producer watches (above).
__device__ __forceinline__ void tf_mbar_spin(tf_u32 bar, tf_u32 parity) { while (!tf_mbar_test(bar, parity)) {} }
__device__ __forceinline__ void tf_tma_2d(tf_u32 dst, const tf_tmap* map, int c0, int c1, tf_u32 bar) {
  asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];"
               :: "r"(dst), "l"((tf_u64)map), "r"(c0), "r"(c1), "r"(bar) : "memory");
}
// Clusters: this block's rank, a barrier over every thread of the cluster, an
// arrive on the barrier at the same offset in block `rank`, and a TMA load that
// lands at the same offset (and completes the same barrier) in every block of `mask`.
__device__ __forceinline__ tf_u32 tf_cluster_rank() { tf_u32 r; asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r)); return r; }
__device__ __forceinline__ void tf_cluster_sync() { asm volatile("barrier.cluster.arrive;\n\tbarrier.cluster.wait;" ::: "memory"); }
__device__ __forceinline__ void tf_mbar_arrive_in(tf_u32 bar, tf_u32 rank) {
  asm volatile("{ .reg .b32 ra; mapa.shared::cluster.u32 ra, %0, %1; mbarrier.arrive.shared::cluster.b64 _, [ra]; }"
               :: "r"(bar), "r"(rank) : "memory");
}
__device__ __forceinline__ void tf_tma_2d_multicast(tf_u32 dst, const tf_tmap* map, int c0, int c1, tf_u32 bar, tf_u16 mask) {
  asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster [%0], [%1, {%2, %3}], [%4], %5;"
               :: "r"(dst), "l"((tf_u64)map), "r"(c0), "r"(c1), "r"(bar), "h"(mask) : "memory");
}
// The TMA-store epilogue: a box of shared memory to the tensor at (c0, c1),
// clipped to the tensor, completing in this thread's bulk group.
__device__ __forceinline__ void tf_tma_store_2d(const tf_tmap* map, tf_u32 src, int c0, int c1) {
  asm volatile("cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [%0, {%1, %2}], [%3];"
               :: "l"((tf_u64)map), "r"(c0), "r"(c1), "r"(src) : "memory");
}
// A shared-memory matrix descriptor: 128-byte swizzle, byte offsets >> 4.
__device__ __forceinline__ tf_u64 tf_wgmma_desc(tf_u32 addr, tf_u32 lbo, tf_u32 sbo) {
  return (tf_u64)((addr & 0x3FFFF) >> 4) | ((tf_u64)(lbo >> 4) << 16) | ((tf_u64)(sbo >> 4) << 32) | (1ull << 62);
}
"#;

/// `tf_tma_{rank}d(dst, map, c0, …, bar)`: a TMA load of one box of a tensor of
/// `rank` dimensions (coordinates innermost first), completing on `bar`.
pub(super) fn tma_load_fn(rank: usize) -> String {
    let coords: Vec<String> = (0..rank).map(|i| format!("int c{i}")).collect();
    let slots: Vec<String> = (0..rank).map(|i| format!("%{}", i + 2)).collect();
    let ins: Vec<String> = (0..rank).map(|i| format!("\"r\"(c{i})")).collect();
    format!(
        r#"__device__ __forceinline__ void tf_tma_{rank}d(tf_u32 dst, const tf_tmap* map, {coords}, tf_u32 bar) {{
  asm volatile("cp.async.bulk.tensor.{rank}d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {{{slots}}}], [%{bar}];"
               :: "r"(dst), "l"((tf_u64)map), {ins}, "r"(bar) : "memory");
}}
"#,
        coords = coords.join(", "),
        slots = slots.join(", "),
        ins = ins.join(", "),
        bar = rank + 2,
    )
}

/// `tf_tma_add_{rank}d(map, src, c0, …)`: a box of shared memory added
/// element by element into the tensor at (c0, …) (coordinates innermost
/// first) by the TMA unit (`cp.reduce.async.bulk.tensor … .add`), clipped to
/// the tensor, completing in this thread's bulk group.
pub(super) fn tma_add_fn(rank: usize) -> String {
    let coords: Vec<String> = (0..rank).map(|i| format!("int c{i}")).collect();
    let slots: Vec<String> = (0..rank).map(|i| format!("%{}", i + 1)).collect();
    let ins: Vec<String> = (0..rank).map(|i| format!("\"r\"(c{i})")).collect();
    format!(
        r#"__device__ __forceinline__ void tf_tma_add_{rank}d(const tf_tmap* map, tf_u32 src, {coords}) {{
  asm volatile("cp.reduce.async.bulk.tensor.{rank}d.global.shared::cta.add.tile.bulk_group [%0, {{{slots}}}], [%{src}];"
               :: "l"((tf_u64)map), {ins}, "r"(src) : "memory");
}}
"#,
        coords = coords.join(", "),
        slots = slots.join(", "),
        ins = ins.join(", "),
        src = rank + 1,
    )
}

/// Where a `wgmma`'s A operand comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum WgmmaA {
    /// A shared-memory descriptor, K-major.
    Shared,
    /// A shared-memory descriptor, MN-major (16-bit types only): the
    /// one-pass attention backward's `dSᵀ`, stored as the scores lie.
    SharedTransposed,
    /// Four registers a thread (the `mma.m16n8k16` A fragment of each warp's 16 rows).
    Registers,
}

/// `name(d, a, db)`: `wgmma.m64n{n}k16` accumulating into the thread's `n / 2`
/// floats at `d`; `a` is a descriptor (`tf_u64`) or four registers
/// (`const tf_u32*`), `db` a descriptor of B, read transposed (MN-major) with
/// `trans_b`.
pub(super) fn wgmma_fn(name: &str, n: usize, dtype: DType, a: WgmmaA, trans_b: bool) -> String {
    wgmma_fn_of(name, n, dtype, a, trans_b, false)
}

/// [`wgmma_fn`] as `name(d, a, db, acc)`: it adds to `d` only where `acc` is
/// not 0, and overwrites it where it is (`wgmma`'s `scale-d`). A product's
/// first step with `acc` 0 needs no zeroed accumulators: zeroing them from one
/// constant register, which ptxas coalesces with an accumulator of a product
/// still in flight, made it wait for that product (its warning C7517).
pub(super) fn wgmma_fn_acc(name: &str, n: usize, dtype: DType, a: WgmmaA, trans_b: bool) -> String {
    wgmma_fn_of(name, n, dtype, a, trans_b, true)
}

fn wgmma_fn_of(name: &str, n: usize, dtype: DType, a: WgmmaA, trans_b: bool, acc: bool) -> String {
    let ty = if dtype == DType::BF16 { "bf16" } else { "f16" };
    let m = n / 2;
    let regs: Vec<String> = (0..m).map(|i| format!("%{i}")).collect();
    let outs: Vec<String> = (0..m).map(|i| format!("\"+f\"(d[{i}])")).collect();
    let tb = u8::from(trans_b);
    let (a_decl, a_slot, a_in, next, flags) = match a {
        WgmmaA::Shared | WgmmaA::SharedTransposed => (
            "tf_u64 da".to_string(),
            format!("%{m}"),
            "\"l\"(da)".to_string(),
            m + 1,
            format!("1, 1, {}, {tb}", u8::from(a == WgmmaA::SharedTransposed)),
        ),
        WgmmaA::Registers => (
            "const tf_u32* a".to_string(),
            format!("{{%{}, %{}, %{}, %{}}}", m, m + 1, m + 2, m + 3),
            "\"r\"(a[0]), \"r\"(a[1]), \"r\"(a[2]), \"r\"(a[3])".to_string(),
            m + 4,
            format!("1, 1, {tb}"),
        ),
    };
    format!(
        r#"__device__ __forceinline__ void {name}(float* d, {a_decl}, tf_u64 db{acc_decl}) {{
  asm volatile("{{ .reg .pred p; setp.ne.b32 p, %{s}, 0;\n"
               "wgmma.mma_async.sync.aligned.m64n{n}k16.f32.{ty}.{ty} {{{regs}}}, {a_slot}, %{db}, p, {flags}; }}"
               : {outs}
               : {a_in}, "l"(db), "r"({acc_in}));
}}
"#,
        acc_decl = if acc { ", int acc" } else { "" },
        acc_in = if acc { "acc" } else { "1" },
        s = next + 1,
        db = next,
        regs = regs.join(", "),
        outs = outs.join(", "),
    )
}
