//! How many programs share a general kernel's reduction loop at a launch.
//!
//! A column sum of a 16384×8192 matrix in 256-column tiles has 32 programs,
//! each walking 16384 rows: a quarter of an H200's SMs, a few loads in
//! flight on each. The general lowering can compile such a loop so that
//! `ways` programs share it, each walking a contiguous share of its tiles
//! (`tilefuse_codegen::emit::SplitLoopLaunch`); the last of them to finish
//! adds the shares in order and runs the rest of the program. This picks
//! `ways` from the launch: as many programs as one wave of the GPU holds,
//! each share long enough to keep its loads streaming. Never more than one
//! wave: the shares are equal, so a second, partial wave of them doubles
//! the time (64 column tiles 44 ways on 2772 slots ran a col_max_count 30%
//! slower than 33 ways on 2112 slots; docs/perf-history.md, "The whole
//! corpus again; … split loops stay within one wave; …", 2026-11-29).

/// Each share keeps at least this many of the loop's tiles: shorter shares
/// spend more on writing and re-reading their partial results than they
/// save.
const MIN_TILES_PER_SHARE: u64 = 4;

/// Programs per grid tile for a launch of `programs` grid tiles whose loop
/// has `tiles` tiles, on a GPU that runs `slots` such programs at once, at
/// most `most` (the config's `split`): the most that fit in one wave, 1 when
/// the grid fills a wave already.
///
/// ```
/// use tilefuse_runtime::split_loop::ways;
/// // 32 column tiles over 1024 row tiles, 2112 slots (132 SMs × 16): up to 32.
/// assert_eq!(ways(32, 1024, 2112, 32), 32);
/// // 64 column tiles on 2772 slots (132 SMs × 21): 43 ways (2752 programs), one wave.
/// assert_eq!(ways(64, 8192, 2772, 64), 43);
/// // A grid of 4096 row programs fills the GPU by itself.
/// assert_eq!(ways(4096, 64, 2112, 32), 1);
/// // A short loop keeps 4 tiles a share.
/// assert_eq!(ways(32, 12, 2112, 32), 3);
/// ```
pub fn ways(programs: u64, tiles: u64, slots: u64, most: usize) -> u64 {
    if programs == 0 || programs >= slots {
        return 1;
    }
    (slots / programs)
        .min(tiles / MIN_TILES_PER_SHARE)
        .min(most as u64)
        .max(1)
}

#[cfg(test)]
mod tests {
    use super::ways;

    #[test]
    fn never_more_than_the_config_allows_nor_zero() {
        assert_eq!(ways(1, 1 << 20, 1 << 20, 128), 128);
        assert_eq!(ways(1, 1 << 20, 1 << 20, 0), 1);
        assert_eq!(ways(1, 0, 100, 32), 1);
        assert_eq!(ways(0, 100, 100, 32), 1);
    }

    #[test]
    fn as_many_programs_as_one_wave_holds() {
        // 100 programs on 264 slots: 2 each (200 programs); 3 would start
        // 36 programs in a second wave, each with a third of the work.
        assert_eq!(ways(100, 1000, 264, 32), 2);
        for (programs, slots) in [(64, 2772), (64, 2640), (64, 2112), (7, 2112), (300, 2112)] {
            let w = ways(programs, 1 << 20, slots, 1 << 20);
            assert!(
                programs * w <= slots && programs * (w + 1) > slots,
                "{programs} on {slots}: {w}"
            );
        }
    }
}
