//! Quantized weights times a batch of tokens on the tensor cores
//! (`mmq_*` in kernels/mmq.cu): the product of steps of 2-128 tokens
//! (batched decode, short prompt chunks), faster there than the few-token
//! GEMVs and than dequantize-then-cuBLAS.
//!
//! The kernels read each weight once per 64 tokens and take the GEMVs'
//! 8-bit activations. A matrix's units are cut into splits (so that small
//! matrices still fill the GPU); each split's sums go to a scratch of
//! floats and `mmq_reduce` adds them in split order. The split count
//! depends on the matrix and the GPU only, never on the token count, so a
//! token's result does not depend on the step it shares.

use crate::backend::REPACKED;
use crate::gpu::{Arg, CuResult, Gpu};
use cudarc::driver::sys::CUfunction;
use kiln_format::GgmlType;

/// Warps a block, 16 rows each (MMQ_WARPS in mmq.cu).
const WARPS: usize = 4;
/// Stages of a block's copy pipeline, a run of 8 units each (MMQ_STAGES),
/// two where that many would not leave room for a second block on an SM
/// (MMQ_SMEM_PAIR bytes between two).
const STAGES: usize = 3;
const SMEM_PAIR: usize = 116_736;
/// A token's bytes in a stage: 8-bit x of a run, padded (MMQ_XS), and its
/// scales and sums, padded (MMQ_DS).
const X_BYTES: usize = 272;
const D_BYTES: usize = 80;
/// The kernels' token tiles (a `mmq_{type}_{NT}` each); steps of more
/// tokens than the largest take several in the grid's third dimension.
pub(crate) const TOKENS: [usize; 4] = [8, 16, 32, 64];
/// Blocks of a product we aim for, per SM (two fit with 64 tokens).
const BLOCKS_PER_SM: usize = 2;
/// Most splits of a matrix, and fewest runs of 8 units a split (the copy
/// pipeline's depth and then some).
const MAX_SPLITS: usize = 8;
const MIN_RUNS: usize = 4;

/// A type with MMQ kernels.
#[derive(Clone, Copy)]
pub(crate) struct MmqType {
    /// Kernel-table index (the repacked layout's).
    pub id: usize,
    /// The kernels' name suffix.
    pub name: &'static str,
    /// Bytes of a run of 8 units of a row (Mq<T>::RB in mmq.cu).
    pub run_bytes: usize,
    /// Most tokens a step may have for these kernels to beat dequantization
    /// and cuBLAS (8B / 1B shapes on the H100, NOTES.md item 74: at 128
    /// tokens Q4_0 / Q8_0 / Q4_K gain 4-11% on the 8B, Q5_K loses 2.6%; Q3_K
    /// on the H200, NOTES.md item 95: 8B Q3_K_M at 128 sequences -3.3%,
    /// a 128-token prefill -6.8%; Q2_K, item 98: 8B at 128 sequences -21%,
    /// a 128-token prefill -25%).
    pub max_tokens: usize,
}

pub(crate) fn mmq_types() -> [MmqType; 7] {
    let t = |ty: GgmlType, name, run_bytes, max_tokens| MmqType {
        id: REPACKED + ty.id() as usize,
        name,
        run_bytes,
        max_tokens,
    };
    [
        t(GgmlType::Q4_0, "q4_0r", 144, 128),
        t(GgmlType::Q8_0, "q8_0r", 272, 128),
        t(GgmlType::Q4K, "q4_kr", 144, 128),
        t(GgmlType::Q5K, "q5_kr", 176, 64),
        t(GgmlType::Q6K, "q6_kr", 208, 128),
        t(GgmlType::Q3K, "q3_kr", 112, 64),
        t(GgmlType::Q2K, "q2_kr", 80, 64),
    ]
}

/// Dynamic shared memory of a block of the kernel for runs of `run_bytes`
/// a row and `tokens` tokens (MMQ_STAGES x mmq_stage_bytes in mmq.cu: the
/// rows' runs, the tokens' x and scales, a word a row).
pub(crate) fn smem_bytes(run_bytes: usize, tokens: usize) -> usize {
    let stage = 16 * WARPS * (run_bytes + 4) + tokens * (X_BYTES + D_BYTES);
    if STAGES * stage <= SMEM_PAIR {
        STAGES * stage
    } else {
        2 * stage
    }
}

/// The kernels of a type (`mmq_{name}_{NT}` for each of [`TOKENS`]), each
/// given its dynamic shared memory.
pub(crate) fn load(gpu: &mut Gpu, name: &str, run_bytes: usize) -> CuResult<[CUfunction; 4]> {
    let mut out = [std::ptr::null_mut(); 4];
    for (f, nt) in out.iter_mut().zip(TOKENS) {
        *f = gpu.func(&format!("mmq_{name}_{nt}"))?;
        gpu.set_dyn_smem(*f, smem_bytes(run_bytes, nt) as u32)?;
    }
    Ok(out)
}

/// The token tile (index into [`TOKENS`]) for a step of `n` tokens: the
/// smallest that holds them, else the largest.
pub(crate) fn tile_for(n: usize) -> usize {
    TOKENS
        .iter()
        .position(|&t| n <= t)
        .unwrap_or(TOKENS.len() - 1)
}

/// How many splits the units of a `rows` x `cols` matrix are cut into on a
/// GPU of `sms` SMs: enough blocks to fill it, each split at least
/// MIN_RUNS runs of 8 units where the row has them.
pub(crate) fn splits(rows: usize, cols: usize, sms: usize) -> usize {
    let blocks = rows.div_ceil(16 * WARPS);
    let runs = cols / 256;
    (BLOCKS_PER_SM * sms)
        .div_ceil(blocks)
        .clamp(1, (runs / MIN_RUNS).max(1))
        .min(MAX_SPLITS)
}

/// Floats of split sums a product over `tokens` tokens may leave for
/// `mmq_reduce` on a GPU of `sms` SMs, for any matrix: a split matrix has
/// fewer blocks than BLOCKS_PER_SM x sms, so splits x blocks stays below
/// twice that. (A matrix of one split writes y directly.)
pub(crate) fn part_floats(sms: usize, tokens: usize) -> usize {
    2 * BLOCKS_PER_SM * sms * 16 * WARPS * tokens
}

/// One product: `n` tokens of 8-bit activations (`xq`, `xd`, `xs` as
/// quantize_q8 writes them) times a repacked matrix; y[t][r] at `y + 4 (t
/// ystride + r)`, plus `bias` (0: none). `part`: scratch of `part_floats`
/// floats for the splits' sums.
pub(crate) struct MmqCall {
    pub w: u64,
    pub row_bytes: usize,
    pub rows: usize,
    pub cols: usize,
    pub xq: [Arg; 3],
    pub n: usize,
    pub y: u64,
    pub ystride: usize,
    pub bias: u64,
    pub part: u64,
    pub part_floats: usize,
}

impl MmqCall {
    /// Enqueues the product (`f`: the type's `mmq_*` for each of
    /// [`TOKENS`]), then `reduce` (`mmq_reduce`) where the matrix is split,
    /// unless `fold`: then the splits' sums stay in `part` for the kernel
    /// that reads y to add. Returns how many splits' sums `part` holds (1:
    /// y was written). A scratch too small for the splits takes fewer of
    /// them.
    pub(crate) fn launch(
        &self,
        gpu: &Gpu,
        f: &[CUfunction; 4],
        reduce: CUfunction,
        fold: bool,
    ) -> CuResult<usize> {
        let tile = tile_for(self.n);
        let mut s = splits(self.rows, self.cols, gpu.info.sms.max(1) as usize);
        while s > 1 && s * self.n * self.rows > self.part_floats {
            s -= 1;
        }
        let grid = (
            self.rows.div_ceil(16 * WARPS) as u32,
            s as u32,
            self.n.div_ceil(TOKENS[tile]) as u32,
        );
        let out = if s == 1 { self.y } else { self.part };
        gpu.launch(
            f[tile],
            grid,
            (32 * WARPS) as u32,
            &[
                Arg::P(self.w),
                Arg::P(self.row_bytes as u64),
                Arg::I(self.rows as i32),
                Arg::I(self.cols as i32),
                self.xq[0],
                self.xq[1],
                self.xq[2],
                Arg::I(self.n as i32),
                Arg::P(out),
                Arg::I(self.ystride as i32),
                Arg::P(self.bias),
                Arg::P(self.part),
            ],
        )?;
        if s == 1 || fold {
            return Ok(s);
        }
        let total = self.n * self.rows;
        gpu.launch(
            reduce,
            (total.div_ceil(256).clamp(1, 65535) as u32, 1, 1),
            256,
            &[
                Arg::P(self.part),
                Arg::I(s as i32),
                Arg::I(self.n as i32),
                Arg::I(self.rows as i32),
                Arg::P(self.y),
                Arg::I(self.ystride as i32),
                Arg::P(self.bias),
            ],
        )?;
        Ok(1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_fill_the_gpu_and_stay_whole_runs() {
        // Llama-3.1-8B on 132 SMs: QKV, O, gate|up, down.
        assert_eq!(splits(6144, 4096, 132), 3);
        assert_eq!(splits(4096, 4096, 132), 4);
        assert_eq!(splits(28672, 4096, 132), 1);
        assert_eq!(splits(4096, 14336, 132), 5);
        // Four runs a split at least: 512 columns are two runs, one split.
        assert_eq!(splits(64, 512, 132), 1);
        assert_eq!(splits(64, 2048, 132), 2);
    }

    #[test]
    fn split_sums_fit_their_bound() {
        for sms in [1, 2, 46, 132, 144] {
            let bound = part_floats(sms, 1);
            for rows in (64..40_000).step_by(61) {
                for cols in [256, 2048, 4096, 14_336, 65_536] {
                    let s = splits(rows, cols, sms);
                    if s > 1 {
                        assert!(s * rows <= bound, "{rows} x {cols} on {sms} SMs");
                    }
                }
            }
        }
    }

    #[test]
    fn tiles_and_shared_memory_match_the_kernels() {
        assert_eq!(tile_for(2), 0);
        assert_eq!(tile_for(8), 0);
        assert_eq!(tile_for(16), 1);
        assert_eq!(tile_for(17), 2);
        assert_eq!(tile_for(64), 3);
        assert_eq!(tile_for(100), 3);
        let src = include_str!("../kernels/mmq.cu");
        let define = |name: &str| -> usize {
            let line = src
                .lines()
                .find(|l| l.starts_with(&format!("#define {name} ")))
                .unwrap_or_else(|| panic!("{name} in mmq.cu"));
            line.split_whitespace().nth(2).unwrap().parse().unwrap()
        };
        assert_eq!(define("MMQ_WARPS"), WARPS);
        assert_eq!(define("MMQ_STAGES"), STAGES);
        assert_eq!(define("MMQ_SMEM_PAIR"), SMEM_PAIR);
        // Q8_0 with 64 tokens: two stages; Q4_0: three.
        assert_eq!(smem_bytes(272, 64), 2 * (64 * 276 + 64 * 352));
        assert_eq!(smem_bytes(144, 64), 3 * (64 * 148 + 64 * 352));
        assert_eq!(define("MMQ_XS"), X_BYTES);
        assert_eq!(define("MMQ_DS"), D_BYTES);
        let common = include_str!("../kernels/common.cu");
        assert!(common.contains(&format!("#define MMQ_MAX_SPLITS {MAX_SPLITS}\n")));
        for m in mmq_types() {
            let rb = m.run_bytes;
            assert!(
                src.contains(&format!("static constexpr int RB = {rb};"))
                    || src.contains(&format!(": MqRuns<{rb}>"))
            );
            for nt in TOKENS {
                let kernel = format!("MMQ({}, ", m.name);
                assert!(src
                    .lines()
                    .any(|l| l.starts_with(&kernel) && l.ends_with(&format!(", {nt})"))));
            }
        }
        // Within the H100's 227 KiB a block.
        assert!(smem_bytes(272, 64) <= 227 * 1024);
    }
}
