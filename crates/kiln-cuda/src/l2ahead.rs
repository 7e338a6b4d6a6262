//! Which weights a decode step's kernels pull into L2 ahead of the GEMV
//! that reads them (`l2_ahead` in kernels/common.cu, `$KILN_CUDA_L2PF`).
//!
//! A one-token step reads every weight once, in a fixed order, while its
//! latency-bound kernels (the decode attention, act_mul) leave DRAM idle.
//! A kernel given a window asks the TMA unit to bring those bytes into L2,
//! so the GEMV that reads them next finds them there. The plan walks the
//! step's weights in reading order and hands a kernel the bytes from where
//! the previous window stopped up to `cap` bytes past the start of the next
//! GEMV's weights (crates/kiln-cuda/NOTES.md item 44 has the measurements).

use crate::gpu::Arg;

/// Up to two (pointer, bytes) ranges, the kernels' last four parameters
/// (`L2A_PARAMS`). Zero: nothing to prefetch.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Ahead(pub(crate) [u64; 4]);

impl Ahead {
    pub(crate) fn args(self) -> [Arg; 4] {
        self.0.map(Arg::P)
    }
}

/// The prefetch grain: bulk prefetches take 16-byte aligned ranges of
/// 16-byte multiples.
const GRAIN: u64 = 16;

/// A step's weights in reading order, cut into GEMV slots (built once:
/// the weights never move).
#[derive(Default)]
pub(crate) struct AheadPlan {
    /// (device pointer, bytes) of each weight matrix, in reading order.
    segs: Vec<(u64, u64)>,
    /// Offset into the concatenated reading order where segment i starts.
    seg_at: Vec<u64>,
    /// Offset where GEMV slot i's weights start.
    slot_at: Vec<u64>,
    total: u64,
}

/// One step's walk through an [`AheadPlan`].
pub(crate) struct Windows<'a> {
    plan: &'a AheadPlan,
    cap: u64,
    /// How far earlier windows reached.
    cursor: u64,
}

impl AheadPlan {
    /// `slots`: each GEMV's matrices as (pointer, bytes), in the order the
    /// step runs them.
    pub(crate) fn new(slots: &[Vec<(u64, u64)>]) -> AheadPlan {
        let (mut segs, mut seg_at, mut slot_at) = (Vec::new(), Vec::new(), Vec::new());
        let mut at = 0u64;
        for slot in slots {
            slot_at.push(at);
            for &(p, n) in slot {
                // Whole grains inside the matrix only (a partial first or
                // last line is left to the GEMV).
                let lo = p.next_multiple_of(GRAIN);
                let hi = (p + n) / GRAIN * GRAIN;
                let n = hi.saturating_sub(lo);
                if n > 0 {
                    segs.push((lo, n));
                    seg_at.push(at);
                    at += n;
                }
            }
        }
        AheadPlan {
            segs,
            seg_at,
            slot_at,
            total: at,
        }
    }

    /// A step's windows, each reaching at most `cap` bytes past the start
    /// of the GEMV it precedes (0: none).
    pub(crate) fn windows(&self, cap: u64) -> Windows<'_> {
        Windows {
            plan: self,
            cap,
            cursor: 0,
        }
    }
}

impl Windows<'_> {
    /// The window of a kernel that runs before GEMV slot `next`: from
    /// where the earlier windows stopped to `cap` bytes past that slot's
    /// start, cut to at most two ranges (the cursor stops where they end).
    pub(crate) fn before(&mut self, next: usize) -> Ahead {
        self.before_cap(next, self.cap)
    }

    /// [`Windows::before`] reaching `cap` bytes past the slot's start
    /// instead of the step's cap (the step's 0 still turns it off).
    pub(crate) fn before_cap(&mut self, next: usize, cap: u64) -> Ahead {
        let plan = self.plan;
        let Some(&start) = plan.slot_at.get(next) else {
            return Ahead::default();
        };
        if self.cap == 0 || cap == 0 {
            return Ahead::default();
        }
        let lo = self.cursor.max(start);
        let hi = (start + cap / GRAIN * GRAIN).min(plan.total);
        let mut out = [0u64; 4];
        let mut k = 0;
        let mut at = lo;
        // The segment holding `at`: the last one starting at or before it.
        let mut i = plan.seg_at.partition_point(|&s| s <= at).saturating_sub(1);
        while at < hi && k < 2 && i < plan.segs.len() {
            let (p, n) = plan.segs[i];
            let (s0, s1) = (plan.seg_at[i], plan.seg_at[i] + n);
            if at < s1 {
                let end = hi.min(s1);
                out[2 * k] = p + (at - s0);
                out[2 * k + 1] = end - at;
                k += 1;
                at = end;
            }
            i += 1;
        }
        self.cursor = self.cursor.max(at);
        Ahead(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan() -> AheadPlan {
        // Three slots: one matrix, two matrices, one matrix.
        AheadPlan::new(&[
            vec![(0x1000, 0x100)],
            vec![(0x8000, 0x40), (0x9000, 0x80)],
            vec![(0x20000, 0x1000)],
        ])
    }

    #[test]
    fn windows_follow_reading_order_without_overlap() {
        let plan = plan();
        let mut p = plan.windows(0x100);
        // Before slot 1: its two matrices (0xc0 bytes), then 0x40 of slot 2.
        assert_eq!(p.before(1), Ahead([0x8000, 0x40, 0x9000, 0x80]));
        // The same slot again: the cursor stopped after two ranges.
        assert_eq!(p.before(1), Ahead([0x20000, 0x40, 0, 0]));
        // Before slot 2: from the cursor to 0x100 past slot 2's start.
        assert_eq!(p.before(2), Ahead([0x20040, 0xc0, 0, 0]));
        // Nothing past the end.
        assert_eq!(p.before(3), Ahead::default());
    }

    #[test]
    fn zero_cap_and_unaligned_ranges() {
        assert_eq!(plan().windows(0).before(1), Ahead::default());
        let plan = AheadPlan::new(&[vec![(0x1008, 0x30)], vec![(0x2004, 0x20)]]);
        let mut p = plan.windows(1 << 20);
        // 0x1008..0x1038 keeps the grains 0x1010..0x1030; 0x2004..0x2024 keeps 0x2010..0x2020.
        assert_eq!(p.before(0), Ahead([0x1010, 0x20, 0x2010, 0x10]));
        assert_eq!(p.before(1), Ahead::default());
    }
}
