//! How a launch runs a kernel's private copies of atomically added tensors
//! (the general lowering's `private`): whether they get shared memory, and
//! how many programs walk the grid. The kernel-independent arithmetic, apart
//! from the driver's occupancy query, so that it is tested without a GPU.

/// A launch that gives the private copies room: its shared memory in all and
/// its programs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PrivatePlan {
    pub shared_bytes: usize,
    pub blocks: u64,
}

/// What the plan is made from.
#[derive(Clone, Copy, Debug)]
pub struct PrivateLaunchShape {
    /// The copies' entries and bytes at this launch's shapes.
    pub entries: usize,
    pub bytes: usize,
    /// The kernel's own shared memory, and the most a block may have.
    pub base_bytes: usize,
    pub most_bytes: usize,
    /// The grid's programs (tiles), the tiles of the dimensions the copies
    /// keep, and the elements of one tile.
    pub programs: u64,
    pub kept_tiles: u64,
    pub tile_elems: usize,
    /// Whether the programs may walk the grid.
    pub walk: bool,
}

/// The plan for `s`, `wave(shared_bytes)` giving how many programs the GPU
/// holds at once with that much shared memory each: `None` where the copies
/// do not fit, or where a program's elements (the tiles it walks) are fewer
/// than the copies' entries it zeroes and flushes. A walking launch starts at
/// most one wave of programs, a multiple of the kept tiles' count (each
/// program then keeps its tiles: the last grid dimensions move fastest).
///
/// ```
/// use tilefuse_runtime::private_copies::{plan, PrivateLaunchShape, PrivatePlan};
/// // A histogram's 256 bins, 32768 tiles of 4096 values, 1056 programs a wave.
/// let s = PrivateLaunchShape {
///     entries: 256, bytes: 1024, base_bytes: 0, most_bytes: 227 << 10,
///     programs: 32768, kept_tiles: 1, tile_elems: 4096, walk: true,
/// };
/// let p = plan(&s, |_| Ok::<u64, ()>(1056)).unwrap();
/// assert_eq!(p, Some(PrivatePlan { shared_bytes: 1024, blocks: 1056 }));
/// ```
pub fn plan<E>(
    s: &PrivateLaunchShape,
    wave: impl FnOnce(usize) -> Result<u64, E>,
) -> Result<Option<PrivatePlan>, E> {
    let total = s.base_bytes.next_multiple_of(16).saturating_add(s.bytes);
    if s.entries == 0 || s.programs == 0 || total > s.most_bytes {
        return Ok(None);
    }
    let mut blocks = s.programs;
    if s.walk {
        let kept = s.kept_tiles.max(1);
        let wave = wave(total)?.max(1);
        blocks = blocks.min((wave / kept).max(1).saturating_mul(kept));
    }
    let walked = s.programs.div_ceil(blocks);
    if walked.saturating_mul(s.tile_elems as u64) < s.entries as u64 {
        return Ok(None);
    }
    Ok(Some(PrivatePlan {
        shared_bytes: total,
        blocks,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape() -> PrivateLaunchShape {
        // 2000 segments by 16 columns; 16384 row tiles by 8 column tiles.
        PrivateLaunchShape {
            entries: 2000 * 16,
            bytes: 2000 * 16 * 4,
            base_bytes: 100,
            most_bytes: 227 << 10,
            programs: 16384 * 8,
            kept_tiles: 8,
            tile_elems: 1024,
            walk: true,
        }
    }

    #[test]
    fn a_walking_launch_is_a_wave_that_keeps_each_programs_tiles() {
        let p = plan(&shape(), |bytes| {
            assert_eq!(bytes, 112 + 128_000);
            Ok::<u64, ()>(132)
        })
        .unwrap()
        .unwrap();
        // 132 programs a wave: 16 per kept tile, 128 in all.
        assert_eq!(p.blocks, 128);
        assert_eq!(p.blocks % 8, 0);
        assert_eq!(p.shared_bytes, 128_112);
    }

    #[test]
    fn fewer_slots_than_kept_tiles_still_start_each_kept_tile() {
        let p = plan(&shape(), |_| Ok::<u64, ()>(3)).unwrap().unwrap();
        assert_eq!(p.blocks, 8);
    }

    #[test]
    fn copies_that_do_not_fit_or_do_not_pay_are_not_given_room() {
        let big = PrivateLaunchShape {
            bytes: 300 << 10,
            ..shape()
        };
        assert_eq!(plan(&big, |_| Ok::<u64, ()>(132)), Ok(None));
        // Without the walk each program adds one tile: fewer elements than entries.
        let one = PrivateLaunchShape {
            walk: false,
            ..shape()
        };
        assert_eq!(plan(&one, |_| Ok::<u64, ()>(132)), Ok(None));
        let empty = PrivateLaunchShape {
            entries: 0,
            ..shape()
        };
        assert_eq!(plan(&empty, |_| Ok::<u64, ()>(132)), Ok(None));
        // The occupancy query's error is the caller's.
        assert_eq!(plan(&shape(), |_| Err::<u64, _>("no GPU")), Err("no GPU"));
    }
}
