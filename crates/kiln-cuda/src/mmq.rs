//! Quantized weights times a batch of tokens on the tensor cores
//! (`mmq_*` in kernels/mmq.cu): the product of batched decode steps too big
//! for the few-token GEMVs and too small for dequantize-then-cuBLAS to pay.
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
/// Tokens a block (MMQ_TOK in mmq.cu): the grid's third dimension covers more.
const TOKENS: usize = 64;
/// Blocks of a product we aim for, per SM: three fit (the kernels' launch
/// bounds), one more covers the uneven end.
const BLOCKS_PER_SM: usize = 4;
/// Most splits of a matrix.
const MAX_SPLITS: usize = 8;

/// Kernel-table indices with an MMQ kernel, and its name suffix.
pub(crate) fn mmq_types() -> [(usize, &'static str); 2] {
    [
        (REPACKED + GgmlType::Q4_0.id() as usize, "q4_0r"),
        (REPACKED + GgmlType::Q8_0.id() as usize, "q8_0r"),
    ]
}

/// How many splits the units of a `rows` x `cols` matrix are cut into on a
/// GPU of `sms` SMs: enough blocks to fill it, each split at least two runs
/// of 8 units.
pub(crate) fn splits(rows: usize, cols: usize, sms: usize) -> usize {
    let blocks = rows.div_ceil(16 * WARPS);
    let runs = cols / 256;
    (BLOCKS_PER_SM * sms)
        .div_ceil(blocks)
        .clamp(1, (runs / 2).max(1))
        .min(MAX_SPLITS)
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
    /// Enqueues the product (`f`: the type's `mmq_*`), then `reduce`
    /// (`mmq_reduce`) where the matrix is split. A scratch too small for
    /// the splits takes fewer of them.
    pub(crate) fn launch(&self, gpu: &Gpu, f: CUfunction, reduce: CUfunction) -> CuResult<()> {
        let mut s = splits(self.rows, self.cols, gpu.info.sms.max(1) as usize);
        while s > 1 && s * self.n * self.rows > self.part_floats {
            s -= 1;
        }
        let grid = (
            self.rows.div_ceil(16 * WARPS) as u32,
            s as u32,
            self.n.div_ceil(TOKENS) as u32,
        );
        let out = if s == 1 { self.y } else { self.part };
        gpu.launch(
            f,
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
        if s == 1 {
            return Ok(());
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
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_fill_the_gpu_and_stay_whole_runs() {
        // Llama-3.1-8B on 132 SMs: QKV, O, gate|up, down.
        assert_eq!(splits(6144, 4096, 132), 6);
        assert_eq!(splits(4096, 4096, 132), 8);
        assert_eq!(splits(28672, 4096, 132), 2);
        assert_eq!(splits(4096, 14336, 132), 8);
        // Two runs a split at least: 512 columns are two runs, one split.
        assert_eq!(splits(64, 512, 132), 1);
        assert_eq!(splits(64, 2048, 132), 4);
    }
}
