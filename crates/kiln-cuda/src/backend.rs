//! `CudaBackend`: the decoder of every architecture, as kernels over
//! weights kept in device memory as stored (quantized blocks included).
//!
//! Load-time choices: Q|K|V and gate|up are concatenated into one weight
//! when their types agree (one GEMV launch each), norms and biases are
//! decoded to f32, HF `Conv1D` weights are transposed to f32, RoPE tables are
//! taken from kiln-core's `RopeTable` (so both backends rotate identically).
//!
//! Per call: one upload of a small block of u32 inputs (tokens, positions,
//! block tables) to fixed device addresses, the kernels, one download of the
//! logits (or of the greedy token ids). Single-token-per-sequence steps
//! where every token wants logits are captured as a CUDA graph per batch
//! size and replayed, since nothing that changes between steps is a kernel
//! argument.

use std::sync::Arc;

use kiln_core::kv::{KvLayout, KvTables, KvType, KvTypes};
use kiln_core::rope::{inv_freqs, RopeTable};
use kiln_core::{ArchDescriptor, Backend, Batch, EngineError, Result};
use kiln_format::dequant::{dequantize_to_vec, is_supported};
use kiln_format::{Activation, GgmlType, Model, ModelTensor, NormKind, RopeStyle, TensorType};

use crate::gpu::{Arg, CuResult, CudaError, DevBuf, Gpu, Graph};
use crate::l2ahead::{Ahead, AheadPlan};
use crate::mmq::{mmq_types, MmqCall};

/// Types the GEMV / embedding kernels read directly.
pub fn kernel_type_name(ty: GgmlType) -> Option<&'static str> {
    use GgmlType::*;
    Some(match ty {
        F32 => "f32",
        F16 => "f16",
        BF16 => "bf16",
        Q4_0 => "q4_0",
        Q4_1 => "q4_1",
        Q5_0 => "q5_0",
        Q5_1 => "q5_1",
        Q8_0 => "q8_0",
        Q2K => "q2_k",
        Q3K => "q3_k",
        Q4K => "q4_k",
        Q5K => "q5_k",
        Q6K => "q6_k",
        _ => return None,
    })
}

/// Float types read by the 16-byte-load GEMV (`mvf_*`).
pub(crate) fn mvf_type_name(ty: GgmlType) -> Option<&'static str> {
    use GgmlType::*;
    Some(match ty {
        F32 => "f32",
        F16 => "f16",
        BF16 => "bf16",
        _ => return None,
    })
}

/// Quantized types with an 8-bit-activation GEMV (`mvq_*`).
pub(crate) fn mvq_type_name(ty: GgmlType) -> Option<&'static str> {
    use GgmlType::*;
    Some(match ty {
        Q4_0 => "q4_0",
        Q4_1 => "q4_1",
        Q5_0 => "q5_0",
        Q5_1 => "q5_1",
        Q8_0 => "q8_0",
        Q2K => "q2_k",
        Q3K => "q3_k",
        Q4K => "q4_k",
        Q5K => "q5_k",
        Q6K => "q6_k",
        _ => return None,
    })
}

/// Most blocks the greedy argmax splits one logits row over.
pub(crate) const ARGMAX_SLICES: usize = 64;

/// Blocks per logits row of `argmax_rows`: one per ~4096 entries.
pub(crate) fn argmax_slices(cols: usize) -> usize {
    cols.div_ceil(4096).clamp(1, ARGMAX_SLICES)
}

/// Kernel-table index of a repacked matrix: this plus its ggml type id.
pub(crate) const REPACKED: usize = 48;

/// Quantized types whose matrices are repacked at load, and their kernels'
/// name suffix. Q8_0 / Q5_0 / Q4_1 / Q5_1 (`repack8` / `repack8_to`
/// in repack.cu): each run of 8 blocks as 8 quant arrays, then Q5_0's 8
/// words of fifth bits, Q4_1's 8 minimums or Q5_1's 8 minimum-and-fifth-bits
/// fields, then 8 scales, so the GEMVs read a
/// block's quants with one 16-byte load. Q4_0 (`repack_q4f`): flat, a row's
/// blocks' 16 quant bytes, then their scales, so that a warp's loads fall on
/// whole 32-byte sectors. Q4_K / Q5_K (`repack_q4k` / `repack_q5k`): each
/// super-block's nibbles as one 16-byte run per 32-value unit behind its
/// unchanged header (Q5_K: then a word of fifth bits per unit). Q6_K
/// (`repack_q6k`): the super-blocks' f16 scales moved aside so that the rest
/// of each starts 16-byte aligned, a unit's 6-bit quants as one 16-byte and
/// one 8-byte word. Q3_K (`repack_q3k`, into a new buffer): each
/// super-block 112 bytes instead of 110, its scales re-laid for shifts
/// behind d in a 16-byte header, then a unit's 2-bit values as one 8-byte
/// word and its high bits as one 4-byte word. Q2_K (`repack_q2k`, into a
/// new buffer): runs of 4 super-blocks (336 bytes, 16-byte aligned), their
/// units' 2-bit values, then their scale bytes, then their d / dmin pairs.
pub(crate) fn repacked_name(ty: GgmlType) -> Option<&'static str> {
    match ty {
        GgmlType::Q4_0 => Some("q4_0r"),
        GgmlType::Q8_0 => Some("q8_0r"),
        GgmlType::Q5_0 => Some("q5_0r"),
        GgmlType::Q4_1 => Some("q4_1r"),
        GgmlType::Q5_1 => Some("q5_1r"),
        GgmlType::Q6K => Some("q6_kr"),
        GgmlType::Q4K => Some("q4_kr"),
        GgmlType::Q5K => Some("q5_kr"),
        GgmlType::Q3K => Some("q3_kr"),
        GgmlType::Q2K => Some("q2_kr"),
        _ => None,
    }
}

/// How rows of `cols` values of `ty` are repacked, when they are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Repack {
    /// `repack8`: whole runs of 8 blocks of this many quant bytes.
    Runs8(usize),
    /// `repack8_to`: into a new buffer of rows of whole runs of 8 blocks of
    /// `qb` quant bytes and an `hb`-byte second field (Q5_0's fifth bits,
    /// Q4_1's minimum, Q5_1's minimum and fifth bits): rows that are not
    /// whole runs, and Q5_0 / Q4_1 / Q5_1, whose runs are not their blocks'
    /// bytes.
    Runs8To {
        qb: usize,
        hb: usize,
    },
    /// `repack_q4f`: Q4_0 rows of this many blocks, flat (their quants,
    /// then their scales), in place (rows whose bytes are a multiple of 16).
    Q4F(usize),
    /// `repack_q4f` into a new buffer of rows padded to 16 bytes.
    Q4FTo(usize),
    /// `repack_q6k`: rows of this many super-blocks (whole runs of 8), in
    /// place.
    Q6K(usize),
    /// `repack_q6k` into a new buffer of rows padded to 16 bytes: rows of
    /// this many super-blocks, not whole runs of 8.
    Q6KTo(usize),
    /// `repack_q4k` / `repack_q5k`: each super-block in its place.
    Q4K,
    Q5K,
    /// `repack_q3k`: rows of this many super-blocks into a new buffer of
    /// 112 bytes a super-block.
    Q3K(usize),
    /// `repack_q2k`: rows of this many super-blocks into a new buffer of
    /// rows of whole runs of 4 ([`Q2KR_RUN`] bytes each).
    Q2K(usize),
}

/// Most super-blocks a Q6_K row may have to be repacked: what `repack_q6k`
/// holds in shared memory (Q6KR_MAX_SB in quant.cu). Rows of whole runs of 8
/// are repacked in place, others into rows padded to 16 bytes.
const Q6KR_MAX_SB: usize = 234;

/// Blocks a Q4_0 row may have to be repacked: what `repack_q4f` holds in
/// shared memory (Q4F_MAX_UNITS in quant.cu). Longer rows stay as they are.
const Q4F_MAX_UNITS: usize = 2730;

/// The repacked layout of rows of `cols` values of `ty`, when they have one.
pub(crate) fn repack_layout(ty: GgmlType, cols: usize) -> Option<Repack> {
    #[allow(clippy::manual_is_multiple_of)] // rust-version 1.85
    let (whole, blocks) = (cols % 256 == 0, cols % 32 == 0);
    let units = cols / 32;
    match ty {
        GgmlType::Q4_0 if blocks && (1..=Q4F_MAX_UNITS).contains(&units) => Some(if whole {
            Repack::Q4F(units)
        } else {
            Repack::Q4FTo(units)
        }),
        GgmlType::Q8_0 if whole => Some(Repack::Runs8(32)),
        GgmlType::Q8_0 if blocks => Some(Repack::Runs8To { qb: 32, hb: 0 }),
        GgmlType::Q5_0 if blocks => Some(Repack::Runs8To { qb: 16, hb: 4 }),
        GgmlType::Q4_1 if blocks => Some(Repack::Runs8To { qb: 16, hb: 2 }),
        GgmlType::Q5_1 if blocks => Some(Repack::Runs8To { qb: 16, hb: 6 }),
        GgmlType::Q6K if whole && (1..=Q6KR_MAX_SB).contains(&(cols / 256)) => {
            let nsb = cols / 256;
            #[allow(clippy::manual_is_multiple_of)] // rust-version 1.85
            let whole_runs = nsb % 8 == 0;
            Some(if whole_runs {
                Repack::Q6K(nsb)
            } else {
                Repack::Q6KTo(nsb)
            })
        }
        GgmlType::Q4K if whole => Some(Repack::Q4K),
        GgmlType::Q5K if whole => Some(Repack::Q5K),
        GgmlType::Q3K if whole && cols > 0 => Some(Repack::Q3K(cols / 256)),
        GgmlType::Q2K if whole && cols > 0 => Some(Repack::Q2K(cols / 256)),
        _ => None,
    }
}

/// Bytes a row of `cols` values of `ty` takes where its repacked layout
/// writes rows out of place ([`Repack::Runs8To`], [`Repack::Q4FTo`],
/// [`Repack::Q6KTo`], [`Repack::Q3K`], [`Repack::Q2K`]): [`repack`]
/// allocates them from it.
pub(crate) fn padded_row_bytes(ty: GgmlType, cols: usize) -> Option<usize> {
    match repack_layout(ty, cols)? {
        Repack::Runs8To { qb, hb } => Some(runs8_row_bytes(cols, qb, hb)),
        Repack::Q4FTo(units) => Some((units * 18).next_multiple_of(16)),
        Repack::Q6KTo(nsb) => Some(q6k_padded_row_bytes(nsb)),
        Repack::Q3K(nsb) => Some(nsb * Q3KR_BYTES),
        Repack::Q2K(nsb) => Some(nsb.div_ceil(4) * Q2KR_RUN),
        _ => None,
    }
}

/// Bytes of a repacked Q3_K super-block (the file's 110 and 2 to align).
const Q3KR_BYTES: usize = 112;

/// Bytes of a run of 4 repacked Q2_K super-blocks (4 x 84).
const Q2KR_RUN: usize = 336;

/// Bytes of a run of 4 repacked Q6_K super-blocks' units (Q6KR_RUN in
/// quant.cu); their 4 f16 d's sit after the row's runs.
const Q6KR_RUN: usize = 832;

/// A Q6_K row of `nsb` super-blocks padded to 16 bytes: its runs with
/// their d's.
fn q6k_padded_row_bytes(nsb: usize) -> usize {
    (nsb.div_ceil(4) * (Q6KR_RUN + 8)).next_multiple_of(16)
}

/// A row of `cols` values as whole runs of 8 blocks of `qb` quant bytes, an
/// `hb`-byte second field and an f16 scale.
fn runs8_row_bytes(cols: usize, qb: usize, hb: usize) -> usize {
    (cols / 32).div_ceil(8) * 8 * (qb + hb + 2)
}

/// The load-time repacking kernels.
#[derive(Clone, Copy)]
pub(crate) struct Repackers {
    runs8: cudarc::driver::sys::CUfunction,
    runs8_to: cudarc::driver::sys::CUfunction,
    q4f: cudarc::driver::sys::CUfunction,
    q6k: cudarc::driver::sys::CUfunction,
    q4k: cudarc::driver::sys::CUfunction,
    q5k: cudarc::driver::sys::CUfunction,
    q3k: cudarc::driver::sys::CUfunction,
    q2k: cudarc::driver::sys::CUfunction,
}

impl Repackers {
    pub(crate) fn load(gpu: &mut Gpu) -> CuResult<Repackers> {
        Ok(Repackers {
            runs8: gpu.func("repack8")?,
            runs8_to: gpu.func("repack8_to")?,
            q4f: gpu.func("repack_q4f")?,
            q6k: gpu.func("repack_q6k")?,
            q4k: gpu.func("repack_q4k")?,
            q5k: gpu.func("repack_q5k")?,
            q3k: gpu.func("repack_q3k")?,
            q2k: gpu.func("repack_q2k")?,
        })
    }
}

/// A matrix in the repacked layout.
pub(crate) struct Repacked {
    /// Its kernel-table index.
    pub(crate) kernel: usize,
    /// Where it was written out of place ([`padded_row_bytes`]): the new
    /// buffer and its padded bytes a row; the old bytes are left as they
    /// were.
    pub(crate) moved: Option<(DevBuf, usize)>,
}

/// Rearranges `rows` x `cols` values of `ty` at `ptr` into the repacked
/// layout, in place or into a new buffer; None (and the bytes left as they
/// are) when `ty` or `cols` has no repacked layout.
pub(crate) fn repack(
    gpu: &Gpu,
    f: &Repackers,
    ty: GgmlType,
    ptr: u64,
    rows: usize,
    cols: usize,
) -> CuResult<Option<Repacked>> {
    let Some(layout) = repack_layout(ty, cols) else {
        return Ok(None);
    };
    #[allow(clippy::manual_is_multiple_of)] // rust-version 1.85
    if ptr % 16 != 0 {
        return Ok(None);
    }
    // repack8 / repack_q4k / repack_q5k / repack_q3k: a thread per run of 8
    // blocks / super-block (grid-stride); one of either per 256 values.
    let units = rows * cols / 256;
    let per_unit = (units.div_ceil(256).clamp(1, 65535) as u32, 1, 1);
    // A thread per `per_row` pieces of each row (grid-stride).
    let per_rows = |per_row: usize| ((rows * per_row).div_ceil(256).clamp(1, 65535) as u32, 1, 1);
    // The layouts written out of place: a new buffer of padded rows.
    let moved = padded_row_bytes(ty, cols)
        .map(|rb| DevBuf::alloc(rows * rb).map(|b| (b, rb)))
        .transpose()?;
    let (dst, row_bytes) = moved.as_ref().map_or((ptr, 0), |(b, rb)| (b.ptr, *rb));
    match layout {
        Repack::Runs8(qb) => gpu.launch(
            f.runs8,
            per_unit,
            256,
            &[Arg::P(ptr), Arg::P(units as u64), Arg::I(qb as i32)],
        )?,
        Repack::Runs8To { qb, hb } => {
            let blocks = cols / 32;
            gpu.launch(
                f.runs8_to,
                per_rows(blocks.div_ceil(8)),
                256,
                &[
                    Arg::P(ptr),
                    Arg::P(dst),
                    Arg::I(rows as i32),
                    Arg::I(blocks as i32),
                    Arg::I(qb as i32),
                    Arg::I(hb as i32),
                    Arg::P(row_bytes as u64),
                ],
            )?
        }
        Repack::Q4F(units) => repack_rows(gpu, f.q4f, (ptr, ptr), rows, (units, 18), units * 18)?,
        Repack::Q4FTo(units) => repack_rows(gpu, f.q4f, (ptr, dst), rows, (units, 18), row_bytes)?,
        Repack::Q6K(nsb) => repack_rows(gpu, f.q6k, (ptr, ptr), rows, (nsb, 210), nsb * 210)?,
        Repack::Q6KTo(nsb) => repack_rows(gpu, f.q6k, (ptr, dst), rows, (nsb, 210), row_bytes)?,
        Repack::Q4K => gpu.launch(f.q4k, per_unit, 256, &[Arg::P(ptr), Arg::P(units as u64)])?,
        Repack::Q5K => gpu.launch(f.q5k, per_unit, 256, &[Arg::P(ptr), Arg::P(units as u64)])?,
        Repack::Q3K(_) => gpu.launch(
            f.q3k,
            per_unit,
            256,
            &[Arg::P(ptr), Arg::P(dst), Arg::P(units as u64)],
        )?,
        Repack::Q2K(nsb) => gpu.launch(
            f.q2k,
            per_rows(nsb.div_ceil(4)),
            256,
            &[
                Arg::P(ptr),
                Arg::P(dst),
                Arg::I(rows as i32),
                Arg::I(nsb as i32),
            ],
        )?,
    }
    Ok(Some(Repacked {
        kernel: REPACKED + ty.id() as usize,
        moved,
    }))
}

/// A block-a-row repacking kernel (`repack_q4f`, `repack_q6k`): the file's
/// rows of `n` blocks (Q4_0) or super-blocks (Q6_K) of `bytes` bytes each at
/// `src` into rows of `dst_rb` bytes at `dst`.
fn repack_rows(
    gpu: &Gpu,
    func: cudarc::driver::sys::CUfunction,
    (src, dst): (u64, u64),
    rows: usize,
    (n, bytes): (usize, usize),
    dst_rb: usize,
) -> CuResult<()> {
    gpu.launch(
        func,
        (rows.clamp(1, 65535) as u32, 1, 1),
        256,
        &[
            Arg::P(src),
            Arg::P(dst),
            Arg::I(rows as i32),
            Arg::I(n as i32),
            Arg::P((n * bytes) as u64),
            Arg::P(dst_rb as u64),
        ],
    )
}

/// Rows per warp of the `mvq_*` kernels.
pub(crate) const MVQ_ROWS: usize = 1;

/// The float GLU kernel (`mvfg_*`: gate and up rows on warp pairs, act_mul's
/// work at their end) for gate|up rows of at least this many bytes, four
/// steps of `mvf_row`'s loads. Measured (NOTES.md item 114, tg256): 8B bf16
/// (8 KB rows) 251.3 -> 257.3; 1B (4 KB) 1,213 -> 1,187, Qwen3-0.6B (2 KB)
/// 1,373 -> 1,355, whose act_mul launch costs less than the pairs' lockstep.
const MVFG_MIN_ROW_BYTES: usize = 8192;

/// Widest row the streaming one-token GEMVs (`mvqs*`) stage x for
/// (MVQS_COLS in gemv.cu), and their threads per block (a row per warp).
const MVQS_COLS: usize = 16384;
pub(crate) const MVQS_THREADS: u32 = 512;
/// Token counts of the plain streaming kernel's several-token forms
/// (`mvqst*`, [`CudaBackend::streaming_nt`]).
const MVQST_MIN: usize = 2;
const MVQST_MAX: usize = 4;

/// Dynamic shared memory of `mvqst{nt}` for rows of up to `cols` columns:
/// each token's 8-bit x and its scales and sums (gemv.cu mvqst_impl).
fn mvqst_smem(nt: usize, cols: usize) -> usize {
    nt * (cols + cols / 4)
}

/// The matrices the streaming one-token GEMV (`mvqs{U}_*` in gemv.cu)
/// takes: kernel-table index and name suffix.
fn mvqs_types() -> [(usize, &'static str); 1] {
    [(REPACKED + GgmlType::Q4_0.id() as usize, "q4_0r")]
}

/// Blocks per lane in flight (U) and the kernels' name suffix of the
/// streaming one-token GEMV for a matrix of `ty` with `cols` columns
/// (`repacked`: in the repacked layout), when that kernel takes it, else
/// None (`mvq_*`). Chosen per shape from `cuda_check --gemv-micro` (8B / 1B
/// layer matrices on the H100) and decode tok/s: Q4_0 always, 4 blocks up
/// to 4096 columns (more cost occupancy), 8 beyond. Q8_0 never: with two
/// blocks per lane in flight the register-preloading `mvq_q8_0r` beats it
/// on every 8B / 1B matrix (8B chain 2.67 ms against 2.76).
pub(crate) fn mvqs_kernel(
    ty: GgmlType,
    repacked: bool,
    cols: usize,
) -> Option<(usize, &'static str)> {
    if cols > MVQS_COLS {
        return None;
    }
    match (ty, repacked) {
        (GgmlType::Q4_0, true) => Some((if cols <= 4096 { 4 } else { 8 }, "q4_0r")),
        _ => None,
    }
}

/// The plain one-token streaming kernel (`mvqs*_q4_0r`, taken where
/// [`CudaOptions::fuse_norm`] is off: post-norms, hidden > 4,096) for rows of
/// `cols` columns of type `ty`: whether it is `mvqs4s_q4_0r` (the shifted nibble dot
/// product; rows of four units a lane) and its threads a block (a warp a
/// row). Measured as whole models (NOTES.md item 73, tg256, fuse_norm off,
/// against one kernel at 512 threads): the 8B shape (4,096 / 14,336 columns)
/// 450.8 -> 461.2 tok/s with the shifted kernel at 512 threads, the 1B shape
/// (2,048 / 8,192) 1,737 -> 1,753 with 256-thread blocks (its 2,048-row
/// products are 128 blocks of 512 on 132 SMs). Both forms sum the same
/// integers: the same bits.
fn plain_streaming(ty: GgmlType, cols: usize) -> (bool, u32) {
    let shifted = ty == GgmlType::Q4_0 && cols > 2048 && cols <= 4096;
    let threads = if cols <= 2048 || (cols > 4096 && cols <= 8192) {
        256
    } else {
        MVQS_THREADS
    };
    (shifted, threads)
}

/// The fused-norm kernels (`mvqsn{U}_*`, the staging streaming kernel) and
/// residual-add kernels (`mvqsr{U}_*`, the streaming kernel on a resident
/// grid; `mvqa_*`, the register-preloading one, with `KILN_CUDA_KRES=0`) of
/// the types whose one-token GEMV is the register-preloading `mvq_*r`:
/// kernel-table index, name suffix and units a lane in flight
/// (`mvqr_impl`'s, so the same words in flight). The streaming residual
/// kernel: 8B Q4_K_M tg256 445 -> 457 tok/s, 1B 1,822 -> 1,830 (NOTES.md
/// item 70). Q8_0 is left out: staged, its products lost to `mvq_q8_0r`
/// fed by a separate add_norm (8B tg256 303.6 -> 294.1 tok/s, 289.9-291.2
/// with the GLU epilogue; NOTES.md item 38; again at item 70: 316 -> 306,
/// 294 with `mvqsr2`), as `mvqs_kernel` found for its plain GEMV.
fn mvqp_fused_types() -> [(usize, &'static str, usize); 8] {
    let r = |t: GgmlType| REPACKED + t.id() as usize;
    [
        (r(GgmlType::Q4K), "q4_kr", 2),
        (r(GgmlType::Q5K), "q5_kr", 2),
        (r(GgmlType::Q6K), "q6_kr", 4),
        (r(GgmlType::Q5_0), "q5_0r", 4),
        (r(GgmlType::Q4_1), "q4_1r", 4),
        (r(GgmlType::Q5_1), "q5_1r", 4),
        (r(GgmlType::Q3K), "q3_kr", 2),
        (r(GgmlType::Q2K), "q2_kr", 4),
    ]
}

/// The types with only the fused-norm kernel (`mvqsn{U}_*`): Q8_0, whose
/// products in a Q8_0 model keep add_norm (no residual kernel, so such a
/// model is not [`CudaBackend::norm_fusable`]; see [`mvqp_fused_types`]),
/// while the Q8_0 V product of a k-quant mix on rows of 960 or 1,152
/// columns (Q5_0 Q|K) stages the norm beside them.
fn mvqp_norm_types() -> [(usize, &'static str, usize); 1] {
    [(REPACKED + GgmlType::Q8_0.id() as usize, "q8_0r", 2)]
}

/// The two-matrix norm-staging kernels (`mvqsnp_*`): the kernel-table
/// indices of the first and second matrix, and the kernel's name suffix.
fn mvqsnp_types() -> [((usize, usize), &'static str); 5] {
    let r = |t: GgmlType| REPACKED + t.id() as usize;
    [
        ((r(GgmlType::Q4K), r(GgmlType::Q6K)), "q4_kr_q6_kr"),
        ((r(GgmlType::Q5K), r(GgmlType::Q6K)), "q5_kr_q6_kr"),
        ((r(GgmlType::Q5_0), r(GgmlType::Q8_0)), "q5_0r_q8_0r"),
        ((r(GgmlType::Q3K), r(GgmlType::Q4K)), "q3_kr_q4_kr"),
        ((r(GgmlType::Q3K), r(GgmlType::Q5K)), "q3_kr_q5_kr"),
    ]
}

/// The types whose GLU streaming kernel and QKV pair have short-row
/// versions (`mvqsg{U}x{R}_*` for R = 2 and 4, the pairs `mvqsnpx{R}_*`):
/// llama.cpp's fallback for Q4_K rows that are not whole super-blocks
/// (Q5_0, on the 576-1,152-column rows of SmolLM2, Qwen2.5-0.5B and Gemma 3
/// 1B). SmolLM2-135M Q4_K_M tg256 +3.5%, SmolLM2-360M +2.3%, Q5_0 +2.9% /
/// +1.6%; the other families' versions (QKV alone, the residual O and down,
/// behind Gemma's post-norms) lost or were even (NOTES.md item 109).
fn mvqs_short_types() -> [usize; 1] {
    [REPACKED + GgmlType::Q5_0.id() as usize]
}

/// Rows a chunk (`mvqs_impl`'s R) for a streaming kernel of `u` units a
/// lane on rows of `cols` columns: the most (up to 4, a power of two) whose
/// U / R units a lane still cover a row's cols / 32, so that a warp has
/// `u` units of some row in flight a lane rather than a row's few (1 on
/// rows of more than 16 u units).
fn mvqs_rows(u: usize, cols: usize) -> usize {
    let units = cols / 32;
    let mut r = 1;
    while r < 4 && 2 * r <= u && units <= 32 * (u / (2 * r)) {
        r *= 2;
    }
    r
}

/// The rows a chunk the short-row kernels are built for (`x{R}` in their
/// names), in the order of their tables' slots.
const MVQS_SHORT_ROWS: [usize; 2] = [2, 4];

/// The short-row tables' slot for a matrix of kernel-table index `id` (one
/// of [`mvqp_fused_types`]) and `cols` columns; None where it keeps one row
/// a chunk.
fn short_slot(id: usize, cols: usize) -> Option<usize> {
    let (_, _, u) = mvqp_fused_types().into_iter().find(|&(t, _, _)| t == id)?;
    let r = mvqs_rows(u, cols);
    MVQS_SHORT_ROWS.iter().position(|&s| s == r)
}

/// A two-matrix norm-staging kernel (`mvqsnp_*`): the kernel-table indices
/// of its matrices, the kernel, its short-row versions by
/// [`MVQS_SHORT_ROWS`] slot where the first type has them, and its version
/// behind a post-norm (`mvqsnpq_*`, [`Post`]).
#[derive(Clone, Copy)]
struct NormPair {
    ids: (usize, usize),
    f: cudarc::driver::sys::CUfunction,
    short: [Option<cudarc::driver::sys::CUfunction>; 2],
    post: cudarc::driver::sys::CUfunction,
}

/// How a [`CudaBackend::fused_kernel`] launches.
#[derive(Clone, Copy, PartialEq, Eq)]
enum FusedLaunch {
    /// The streaming kernel (`mvqs*`): MVQS_THREADS a block, x staged.
    Staged,
    /// The register-preloading `mvqa_*`: 8 warps, a row each, 8-bit x.
    Preload,
    /// The float kernels (`mvf*`): 8 warps, f32 x.
    Float,
}

/// Widest row the two-units-in-flight one-token GEMV (`mvq2_*`) takes.
const MVQ_NARROW_COLS: usize = 2048;

/// The matrices with a two-units-in-flight one-token GEMV (`mvq2_*` in
/// gemv.cu): kernel-table index and name suffix.
fn mvq2_types() -> [(usize, &'static str); 1] {
    [(REPACKED + GgmlType::Q6K.id() as usize, "q6_kr")]
}

/// Whether the one-token product with a matrix of `ty` with `cols` columns
/// (`repacked`: in the repacked layout) takes `mvq2_*` rather than `mvq_*`:
/// repacked Q6_K rows of at most 2,048 columns, where a lane never has more
/// than two units and `mvq_q6_kr`'s registers for four cost occupancy
/// (`cuda_check --gemv-micro`, 1B shape on the H100: gate|up 13.5 -> 10.8 µs).
pub(crate) fn mvq_narrow(ty: GgmlType, repacked: bool, cols: usize) -> bool {
    ty == GgmlType::Q6K && repacked && cols <= MVQ_NARROW_COLS
}

/// Batches of up to this many tokens (and fewer than `gemm_min`) use the
/// decode GEMVs (`mvf_nt_*` / `mvq_nt_*`: the one-token arithmetic, each
/// weight load shared by 8 tokens), so a sequence's result does not depend
/// on the batch it is in.
const MV_TOKENS_MAX: usize = 64;
/// Most tokens a step may have for the tensor-core products of quantized
/// weights ([`CudaBackend::uses_mmq`]; `$KILN_CUDA_MMQ_MAX` sets it,
/// `$KILN_CUDA_MMQ=0` turns them off).
const MMQ_TOKENS_MAX: usize = 128;
/// Fewest tokens a step needs for them (`$KILN_CUDA_MMQ_MIN`, at least 2).
/// They beat the few-token GEMVs from 2 tokens (8B Q4_0 on the H100, 2 / 8
/// sequences: 461 -> 669 / 892 -> 2,325 generated tok/s; NOTES.md item 75),
/// so a sequence's products in a batched step differ from its one-token
/// ones in the last bits; `CudaOptions::invariant` keeps the GEMVs.
const MMQ_TOKENS_MIN: usize = 2;
/// Tokens per block row of `mv*_nt_*` (MV_NT in gemv.cu).
const MV_NT: usize = 8;
/// Rows per warp of `mvf_nt_*` (MVF_NT_R in gemv.cu).
pub(crate) const MVF_NT_ROWS: usize = 4;

/// A kernel argument list assembled from parts without allocating.
struct ArgList {
    a: [Arg; 40],
    n: usize,
}

impl ArgList {
    /// The parts in order (at most 40 arguments, as `Gpu::launch`).
    fn of(parts: &[&[Arg]]) -> ArgList {
        let mut l = ArgList {
            a: [Arg::I(0); 40],
            n: 0,
        };
        for &a in parts.iter().flat_map(|p| p.iter()) {
            l.a[l.n] = a;
            l.n += 1;
        }
        l
    }

    fn get(&self) -> &[Arg] {
        &self.a[..self.n]
    }
}

/// The L2 window of the decode attention: this many bytes of the O
/// projection's weights (and on) when they are float. act_mul's window
/// before the down projection is a quarter of that matrix, at most
/// L2_AHEAD_ACT_MAX. (H100, tg256: 8 MiB for the attention beat 4 and 16;
/// act_mul's best was 8 MiB at 1B, down 33.5 MB, and 24 at 8B, down 117
/// MB; 1B lost 2-11% from 12 MiB up. Quantized GEMVs preload their rows
/// before waiting and gained nothing. NOTES.md item 44.)
const L2_AHEAD: usize = 8 << 20;
const L2_AHEAD_ACT_MAX: usize = 24 << 20;

/// Peak memory rate from which the L2 windows are off: on the H200 (4.9
/// TB/s by its clock and bus, 4.16 measured) tg256 gained without them, 8B
/// bf16 248.8 -> 252.1, 1B bf16 1,209.6 -> 1,216.5, where the H100 (3.35)
/// gained with them (NOTES.md items 44, 87).
const L2_AHEAD_MAX_BANDWIDTH: f64 = 4.0e12;

/// The L2 window's reach on Hopper (bulk L2 prefetch) unless
/// `$KILN_CUDA_L2PF` sets it: none on memory of [`L2_AHEAD_MAX_BANDWIDTH`]
/// or more (a rate the driver does not report, 0, keeps them).
fn l2_ahead_default(peak_bandwidth: f64) -> usize {
    if peak_bandwidth >= L2_AHEAD_MAX_BANDWIDTH {
        0
    } else {
        L2_AHEAD
    }
}

/// Prefill chunks of one sequence from position 0 with at least this many
/// tokens run attention as two cuBLAS GEMMs around a softmax kernel
/// (`$KILN_CUDA_ATT_GEMM_MIN`; 0 turns it off).
const ATT_GEMM_MIN: usize = 64;
/// Scores scratch for that path (f32 + f16 per head and position pair).
const ATT_GEMM_MAX_BYTES: usize = 1 << 30;
/// Query rows per block of the flash-attention kernel (FA_BR in flash.cu).
const FLASH_ROWS: usize = 64;

/// One launch of a flash-attention kernel (`flash_d*` in flash.cu): `n`
/// query rows at `q` (f32, row stride `qstride`, head h at h x head dim,
/// RoPE applied), the sequence's first `keys` K and V rows as f16 (row
/// stride `kvd`), the chunk starting at position `p0`, `group` query heads
/// per KV head; f32 output rows at `out` (row stride `ostride`).
pub(crate) struct FlashCall {
    pub q: u64,
    pub qstride: usize,
    pub k: u64,
    pub v: u64,
    pub kvd: usize,
    pub heads: usize,
    pub n: usize,
    pub keys: usize,
    pub p0: usize,
    pub group: usize,
    pub scale: f32,
    pub softcap: f32,
    pub window: i32,
    pub out: u64,
    pub ostride: usize,
}

impl FlashCall {
    pub(crate) fn launch(&self, gpu: &Gpu, f: cudarc::driver::sys::CUfunction) -> CuResult<()> {
        gpu.launch(
            f,
            (self.n.div_ceil(FLASH_ROWS) as u32, self.heads as u32, 1),
            128,
            &[
                Arg::P(self.q),
                Arg::I(self.qstride as i32),
                Arg::P(self.k),
                Arg::P(self.v),
                Arg::I(self.kvd as i32),
                Arg::I(self.n as i32),
                Arg::I(self.keys as i32),
                Arg::I(self.p0 as i32),
                Arg::I(self.group as i32),
                Arg::F(self.scale),
                Arg::F(self.softcap),
                Arg::I(self.window),
                Arg::P(self.out),
                Arg::I(self.ostride as i32),
            ],
        )
    }
}

/// `$name` parsed as a T (surrounding blanks ignored); None when unset or
/// not a T.
fn env_parse<T: std::str::FromStr>(name: &str) -> Option<T> {
    std::env::var(name).ok().and_then(|v| v.trim().parse().ok())
}

/// Most slices one decode attention (query head, token) is split into.
const ATT_SPLIT_MAX: usize = 16;
/// Most that `$KILN_CUDA_ATT_SPLIT` may ask for: what att_merge takes.
const ATT_SPLIT_FORCED_MAX: usize = 32;
/// Decode steps whose positions are all below this merge split attention
/// slices inside a cluster (head dims 65-128); later ones through global
/// memory (the same arithmetic: logits do not change). 8B Q4_0: the
/// cluster gains 1.1% at positions 16-272 and loses 1.4% at 256-512, 5% at
/// 1,024-1,280, 21% at 8,192-8,448 (NOTES.md item 60).
const ATT_CLUSTER_CTX: usize = 256;
/// Decode steps reaching this position or further take the grouped decode
/// attention (four query heads a block, [`AttReach::Long`]), head dims up to
/// 128. Below, it loses to a block per head: with 16 warps and 128 registers
/// a block fills an SM, which then takes none of the next GEMV's blocks
/// early (always grouped, positions 16-272: 8B Q4_0 475 -> 466 tok/s, 1B
/// bf16 932 -> 915). Past it, its shared loads and split-lane walk win (8B
/// Q4_0 at 512-768: 443 -> 460, 8B bf16 179 -> 181; 1B bf16 at 256-512
/// neutral, at 128-384 -1%). NOTES.md items 62-63.
const ATT_GROUP_CTX: usize = 512;
/// The bound where no layer's O projection reads float weights, for head
/// dims up to 64 and up to 128: there the grouped kernels pay from fewer
/// positions (1B Q4_0 at 128-384: 1,794 -> 1,837 tok/s; tg256 from an empty
/// cache, Q4_0 / Q4_K_M / Q8_0 +0.6 / +0.4 / +1.3%; 8B Q4_0 at 256-512: 455
/// -> 459).
const ATT_GROUP_CTX_Q8: [usize; 2] = [128, 256];
/// Split decode attention steps at head dim 256 whose blocks ((query head,
/// token, slice) triples) are at most the SMs' count over this take the
/// deep kernels (16 warps a block against 4: a block then holds an SM
/// alone). Gemma-3-1B (4 heads, 16 slices), one sequence, S_TG at P = 256 /
/// 1,024 / 4,096: Q4_K_M 1,010 / 992 / 955 against 4 warps' 1,002 / 923 /
/// 804; two to eight sequences (128-512 blocks) lost 8-21% with blocks
/// that held an SM alone (8 warps; NOTES.md item 113). `$KILN_CUDA_ATT_DEEP=0`:
/// never.
const ATT_DEEP_SM_SHARE: usize = 2;
/// Steps whose split attention at head dim 256 has more blocks than the
/// deep kernels take, but would fit them with this many slices or more,
/// take that split and the deep kernels (`$KILN_CUDA_ATT_DEEP_MIN_SPLIT`).
/// Gemma-3-1B, two sequences (8 slices instead of 16), S_TG at P = 256 /
/// 1,024 / 4,096: Q4_K_M 973 / 930 / 864 -> 969 / 948 / 919, bf16 826 / 794
/// / 747 -> 833 / 813 / 790; 4 (four sequences) read within 1% (Q4_K_M) and
/// bf16 +2.5% at 4,096, measured once (NOTES.md item 113).
const ATT_DEEP_MIN_SPLIT: usize = 8;
/// Steps of up to ATT_WIDE_TOKENS tokens whose positions are all below this
/// take the wide decode attention ([`AttReach::Wide`], head dims 64, 128
/// and 256, fused): a block of 32 / 16 warps per query head and token, no slices, so no merge
/// through global memory. [0]: no layer's O projection reads float weights
/// (tg256 from 16: 1B Q4_0 1,929 -> 2,011 tok/s, Q4_K_M +3.8%, Q8_0 +3.3%,
/// bounds 128 and 512 gained 0.2% less; 8B Q4_0 501 -> 514, Q8_0 310 ->
/// 316, bound 128 0.3% less); [1]: some does (1B bf16 +0.4% with 128, +0.1%
/// with 256; 8B bf16 +0.1% with 128, -0.6% with 256: the sliced kernels'
/// blocks issue the O projection's L2 window, which the attention's time then
/// hides). Past 256 the grouped kernels win (positions 256-512, bound 512
/// against 256: 1B Q4_0 -5.5%, 8B -4.3%). NOTES.md item 67.
/// `$KILN_CUDA_ATT_WIDE=0` never, `$KILN_CUDA_ATT_WIDE_CTX` the bound.
const ATT_WIDE_CTX: [usize; 2] = [256, 128];
/// Most tokens a step may have for the wide decode attention (its grid is
/// one block per query head and token): `kiln bench --batch 1,2,4 -p 128
/// -n 128`, 1B Q4_0, aggregate tg +1.5 / +5.5 / +11.6% against the sliced
/// kernels; `--batch 8 -p 64`: 1B Q4_0 3,677 -> 4,060 (+10.5%), 8B Q4_0 869 ->
/// 895 (+3%). From 16 tokens the GQA-sharing kernels take the step
/// (`att_gqa_min`). `$KILN_CUDA_ATT_WIDE_TOKENS` sets it (NOTES.md item 67).
const ATT_WIDE_TOKENS: usize = 8;

/// How a decode step's attention is laid out, by how far its positions
/// reach; graphs are keyed by it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum AttReach {
    /// Every position below `att_cluster_ctx`: split slices may merge
    /// inside a thread-block cluster.
    Short = 0,
    /// A block per query head, slices merged through global memory.
    Mid = 1,
    /// Some position at `att_group_ctx` or past: a block per four query
    /// heads of a KV group (`attention_*g*`).
    Long = 2,
    /// Few tokens, every position below `att_wide_ctx`: a block of 32 (head
    /// dim 64) or 16 (128, 256) warps per query head, one slice
    /// (`attention_fw*` / `flw*`).
    Wide = 3,
    /// Long, and some position at `att_tc_ctx` or past: the grouped
    /// kernels' tensor-core walk (f16 cache, head dim 128).
    Far = 4,
}
/// AttReach's values, for the graphs' keys.
const ATT_REACHES: usize = AttReach::Far as usize + 1;
/// Steps reaching this position or further take the grouped kernels'
/// tensor-core walk where it applies ([`AttReach::Far`]); below, their
/// CUDA-core walk is ahead. f16 cache, S_TG after P positions, tensor-core
/// against CUDA-core walk: 8B Q4_K_M P = 256 / 512 / 1,024 / 2,048 / 8,192
/// 512 / 511 / 504 / 488 / 433 against 520 / 518 / 504 / 479 / 366;
/// Qwen3-0.6B Q4_K_M (groups of two) 1,300 / 1,294 / 1,267 / 1,207 / 914
/// against 1,352 / 1,331 / 1,292 / 1,181 / 691 (NOTES.md item 117).
/// `$KILN_CUDA_ATT_TC_CTX` sets it.
const ATT_TC_CTX: usize = 2048;

/// Threads a block of the split decode attention (`attention_d*` /
/// `attention_f*` / `attention_c*`) for head dims up to 64 (`dpl` 0), 128,
/// 256: 32 * ATT_DEC_WARPS(DPL, G) in attention.cu; `grouped`: the G = 4
/// kernels, or at head dim 256 the deep ones (16 warps, ATTENTION_DEEP).
fn att_dec_threads(dpl: usize, grouped: bool) -> u32 {
    match (grouped, dpl) {
        (true, _) => 512,
        (false, 0) => 256,
        _ => 128,
    }
}
/// The decode attention kernels' size class for a head dim: up to 64 (0),
/// 128 (1), 256 (2); attention.cu's DPL 2, 4, 8.
fn att_dpl(head_dim: usize) -> usize {
    match head_dim {
        0..=64 => 0,
        65..=128 => 1,
        _ => 2,
    }
}
/// Blocks of query heads the split decode attention's grid has per token:
/// one per head (`per` 1), or one per up to `per` (4, or 8 for the
/// tensor-core walk's groups of 5-8) heads of a KV group, a larger group
/// splitting evenly over ceil(group / per) blocks (attention_impl's G in
/// attention.cu).
fn att_head_blocks(n_heads: usize, n_kv: usize, per: usize) -> usize {
    if per > 1 {
        n_kv * (n_heads / n_kv.max(1)).div_ceil(per)
    } else {
        n_heads
    }
}
/// The most slices a context of `max_ctx` positions is split into: one per
/// this many positions (up to ATT_SPLIT_MAX).
const ATT_SLICE_MIN: usize = 16;
/// Decode attention blocks ((query head, token, slice) triples) a step aims
/// at, per multiprocessor.
const ATT_BLOCKS_PER_SM: usize = 4;
/// Batches up to this many tokens use the split decode attention.
const ATT_SPLIT_MAX_TOKENS: usize = 16;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CudaOptions {
    /// Device ordinal.
    pub device: usize,
    /// Replay decode steps as CUDA graphs.
    pub graphs: bool,
    /// Most device bytes the backend may plan for (weights + KV pool +
    /// scratch); `None`: the device's free memory less a margin.
    /// `$KILN_GPU_MEM` (bytes, or with a K/M/G suffix) sets the default.
    pub gpu_mem: Option<usize>,
    /// Batches of at least this many tokens go through cuBLAS GEMMs
    /// (quantized weights dequantized to f16 in row chunks); smaller ones
    /// through the GEMV kernels. Repacked Q4_0 / Q8_0 / Q4_K / Q5_K / Q6_K
    /// matrices take the tensor-core `mmq_*` kernels instead in steps of
    /// 2-128 tokens (MMQ_TOKENS_MIN / MAX). `$KILN_CUDA_GEMM_MIN` sets the
    /// default (16); 0 turns cuBLAS off.
    pub gemm_min: usize,
    /// The same for float weights (F32/F16/BF16), whose GEMMs need no
    /// dequantization: `$KILN_CUDA_GEMM_MIN_FLOAT` (default 8; 0: never).
    /// There the activations are rounded to the weights' 16-bit type
    /// (~1e-2 relative on logits, as in llama.cpp and vLLM) and a sequence's
    /// numerics depend on whether its step has fewer tokens than this; below
    /// it the GEMV kernels give each sequence its one-token result bit for
    /// bit. 8 sequences of the 8B bf16 shape: 1,273 aggregate tok/s through
    /// the GEMVs, 2,044 through cuBLAS.
    pub gemm_min_float: usize,
    /// One-token GEMVs of quantized weights with f32 activations (exact
    /// to f32 rounding, slower) instead of activations quantized to 8 bits
    /// per 32 values with integer dot products (llama.cpp's and kiln-cpu's
    /// numerics). `$KILN_CUDA_EXACT=1` sets the default.
    pub exact: bool,
    /// Batch-invariant numerics: every token's logits are those of its
    /// sequence alone, whatever else shares its steps (as the CPU backend).
    /// Steps of at most 64 tokens, all products through the per-token GEMV
    /// kernels (no cuBLAS), one attention kernel with a fixed split for every
    /// token, and the separate add_norm for float weights and post-norm
    /// layers ([`CudaOptions::fuse_norm`]'s kernels round those apart from
    /// it). Costs prefill speed (weights read once per 64 tokens) and
    /// batched decode above 8 sequences. `$KILN_CUDA_INVARIANT=1` sets the
    /// default.
    pub invariant: bool,
    /// Steps of one token per sequence run qkv_post's per-head norm and
    /// RoPE inside the decode attention, which also writes the new K/V
    /// (one launch fewer a layer; logits bit-identical).
    /// `$KILN_CUDA_FUSE_QKV=0` turns it off.
    pub fuse_qkv: bool,
    /// Steps of one token take each layer's RMSNorms inside the QKV and
    /// gate|up GEMVs and add the O and down products to the residual
    /// stream in those GEMVs, instead of two `add_norm` launches a layer:
    /// models whose layer matrices are all repacked Q4_0 (the streaming
    /// GEMV, which stages x per block anyway), Q4_K / Q5_K / Q6_K
    /// (`mvqsn*` staging, `mvqa_*` adding; logits bit-identical) or float
    /// (`mvfn_*`, `mvfr_*`; a row's sum scaled by 1 / rms at its end, so the
    /// last bits differ). `$KILN_CUDA_FUSE_NORM=0` turns it off.
    pub fuse_norm: bool,
    /// With `fuse_norm`, gated FFNs whose gate|up product takes the
    /// streaming GEMV also do `act_mul`'s work there (the activation, the
    /// product and the down projection's 8-bit x; float weights with rows of
    /// at least `MVFG_MIN_ROW_BYTES`: its f32 x, `mvfg_*`): one launch a
    /// layer fewer, logits bit-identical. `$KILN_CUDA_FUSE_GLU=0` turns it off.
    pub fuse_glu: bool,
    /// The KV cache's element types: f32 (default) or f16 for both K and V
    /// (half the memory and the bytes attention reads; values rounded to
    /// nearest even when stored, as the CPU backend's f16 cache).
    pub kv: KvTypes,
}

/// Parses a byte count: plain, or with a K/M/G/T suffix (powers of 1024).
pub fn parse_bytes(s: &str) -> Option<usize> {
    let s = s.trim();
    let (num, mult) = match s.char_indices().last()? {
        (i, 'k' | 'K') => (&s[..i], 1usize << 10),
        (i, 'm' | 'M') => (&s[..i], 1 << 20),
        (i, 'g' | 'G') => (&s[..i], 1 << 30),
        (i, 't' | 'T') => (&s[..i], 1 << 40),
        _ => (s, 1),
    };
    let v: f64 = num.trim().parse().ok()?;
    (v.is_finite() && v >= 0.0).then_some((v * mult as f64) as usize)
}

impl Default for CudaOptions {
    fn default() -> Self {
        CudaOptions {
            device: 0,
            graphs: std::env::var("KILN_CUDA_GRAPHS").map_or(true, |v| v != "0"),
            gpu_mem: std::env::var("KILN_GPU_MEM")
                .ok()
                .and_then(|v| parse_bytes(&v)),
            gemm_min: env_parse("KILN_CUDA_GEMM_MIN").unwrap_or(16),
            gemm_min_float: env_parse("KILN_CUDA_GEMM_MIN_FLOAT").unwrap_or(8),
            exact: std::env::var("KILN_CUDA_EXACT").is_ok_and(|v| v == "1"),
            invariant: std::env::var("KILN_CUDA_INVARIANT").is_ok_and(|v| v == "1"),
            fuse_qkv: std::env::var("KILN_CUDA_FUSE_QKV").map_or(true, |v| v != "0"),
            fuse_norm: std::env::var("KILN_CUDA_FUSE_NORM").map_or(true, |v| v != "0"),
            fuse_glu: std::env::var("KILN_CUDA_FUSE_GLU").map_or(true, |v| v != "0"),
            kv: KvTypes::default(),
        }
    }
}

/// The cache types the backend stores: f32 or f16, the same for K and V.
fn check_kv_types(kv: KvTypes) -> Result<()> {
    if kv.k == kv.v {
        return Ok(());
    }
    Err(unsupported(format!(
        "KV cache types K {} / V {} (the CUDA backend stores both as f32 or both as f16)",
        kv.k.as_str(),
        kv.v.as_str()
    )))
}

/// Per-row parameters of sampling on the GPU ([`CudaBackend::forward_sample`]):
/// Gumbel-max over the `top_k` largest logits (all when 0) at `temperature`
/// (≤ 0: greedy), with noise drawn from `seed` alone, so a (seed, logits)
/// pair always gives the same id. Penalties, top-p, min-p and logit bias
/// are not applied here: requests using them sample on the CPU from logits.
pub type GpuSampling = kiln_core::DeviceSampling;

/// The four u32 words the sampling kernel reads.
pub(crate) fn sampling_words(p: &GpuSampling) -> [u32; 4] {
    [
        p.temperature.to_bits(),
        p.top_k,
        p.seed as u32,
        (p.seed >> 32) as u32,
    ]
}

/// A cuBLAS handle bound to the backend's stream, with a fixed workspace
/// (so that GEMMs can be captured in CUDA graphs).
struct Blas {
    handle: cudarc::cublas::sys::cublasHandle_t,
    _ws: DevBuf,
}

const BLAS_WORKSPACE: usize = 32 << 20;

/// Batches of at least this many tokens use the GQA-sharing attention kernel.
const ATT_GQA_MIN_TOKENS: usize = 16;

impl Blas {
    fn new(gpu: &Gpu) -> CuResult<Blas> {
        use cudarc::cublas::{result as br, sys as bs};
        // SAFETY: dlopen only.
        if !unsafe { bs::is_culib_present() } {
            return Err(CudaError("libcublas not found".into()));
        }
        crate::gpu::guarded("cuBLAS", || {
            let err = |what: &str, e: br::CublasError| CudaError(format!("cuBLAS {what}: {e:?}"));
            let handle = br::create_handle().map_err(|e| err("create", e))?;
            let ws = DevBuf::alloc(BLAS_WORKSPACE)?;
            // SAFETY: live handle, stream and workspace (kept with the handle).
            let r = unsafe {
                br::set_stream(handle, gpu.stream as bs::cudaStream_t)
                    .and_then(|_| {
                        bs::cublasSetWorkspace_v2(handle, ws.ptr as *mut _, BLAS_WORKSPACE).result()
                    })
                    .and_then(|_| {
                        bs::cublasSetMathMode(handle, bs::cublasMath_t::CUBLAS_DEFAULT_MATH)
                            .result()
                    })
            };
            if let Err(e) = r {
                // SAFETY: created above.
                let _ = unsafe { br::destroy_handle(handle) };
                return Err(err("setup", e));
            }
            Ok(Blas { handle, _ws: ws })
        })
    }
}

impl Drop for Blas {
    fn drop(&mut self) {
        // SAFETY: created in `new`, destroyed once (context current: see CudaBackend::drop).
        let _ = unsafe { cudarc::cublas::result::destroy_handle(self.handle) };
    }
}

/// A product's operands besides the weights (`CudaBackend::mm`): y[t] =
/// mat . x[t] + bias for `n` tokens, y's rows `ystride` floats apart (bias
/// 0: none); `x_half`: x's producer also wrote it to `s.xh` in the format
/// cuBLAS reads ([`CudaBackend::half_args`]).
#[derive(Clone, Copy)]
struct Operands {
    bias: u64,
    x: u64,
    n: usize,
    y: u64,
    ystride: usize,
    x_half: bool,
    fuse: Fuse,
}

/// Where a product left its rows for the `add_norm` that reads them: at
/// `ptr` itself, or (a split tensor-core product whose `mmq_reduce` was not
/// launched, [`CudaBackend::mm_rows`]) as `parts` partial sums `stride`
/// floats apart, which add_norm adds in mmq_reduce's order.
#[derive(Debug, Clone, Copy)]
struct Rows {
    ptr: u64,
    parts: usize,
    stride: usize,
}

impl Rows {
    fn at(ptr: u64) -> Self {
        Rows {
            ptr,
            parts: 1,
            stride: 0,
        }
    }
}

/// What a one-token GEMV also does for the decode layer around it
/// ([`CudaOptions::fuse_norm`]).
#[derive(Debug, Clone, Copy, PartialEq)]
enum Fuse {
    None,
    /// x is the residual stream: normalize it (RMSNorm with weights `w`,
    /// as `add_norm` would) before the product.
    Norm {
        w: u64,
        eps: f32,
        post: Post,
    },
    /// y is the residual stream: add the product to it.
    Residual,
    /// `Norm` for a gated FFN's gate|up product (rows: gate, then up),
    /// doing `act_mul`'s work as well (activation `act`, `act_kind`): the
    /// down product's 8-bit x goes to `s.xq`, y is not written.
    NormGlu {
        w: u64,
        eps: f32,
        act: i32,
        post: Post,
    },
}

/// A post-norm layer's add_norm inside the next norm-staging product
/// ([`Fuse::Norm`], [`Fuse::NormGlu`]): the residual stream x becomes
/// x + RMSNorm(y; w) first, written to `xo` (not x: the product's other
/// blocks still read it). `y == 0`: none.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
struct Post {
    y: u64,
    w: u64,
    xo: u64,
}

impl Post {
    const NONE: Post = Post { y: 0, w: 0, xo: 0 };

    fn is_some(self) -> bool {
        self.y != 0
    }

    /// The post-norm kernels' last arguments (y, w, xo); none without one.
    fn args(self) -> ArgList {
        if self.is_some() {
            ArgList::of(&[&[Arg::P(self.y), Arg::P(self.w), Arg::P(self.xo)]])
        } else {
            ArgList::of(&[])
        }
    }
}

/// Ranges of 32 gate|up outputs one block of a `mvqsg*` takes at most
/// (GLU_RANGES in gemv.cu).
const MVQS_GLU_RANGES: usize = 8;

/// Blocks of a GLU gate|up product ([`Fuse::NormGlu`]) of `ranges` ranges
/// (32 gate and 32 up rows each) on a grid of at most about `resident`
/// blocks. Block b takes ranges b, b + grid, ...: the fewest blocks that
/// give none more than ceil(ranges / resident) ranges (a grid of `resident`
/// would leave a few blocks one range more than the rest, running alone at
/// the end), and never more than MVQS_GLU_RANGES: the kernel's shared
/// arrays hold that many.
fn glu_grid(ranges: usize, resident: usize) -> usize {
    let per_block = ranges.div_ceil(resident.max(1)).clamp(1, MVQS_GLU_RANGES);
    ranges.div_ceil(per_block)
}

/// A weight matrix in device memory, `[rows, cols]`, rows stored back to back.
struct DMat {
    buf: Arc<DevBuf>,
    /// Byte offset of row 0 in `buf`.
    off: u64,
    ty: GgmlType,
    rows: usize,
    cols: usize,
    /// Bytes from a row to the next: the type's bytes for `cols` values, or
    /// more in a layout that pads rows ([`padded_row_bytes`]).
    row_bytes: usize,
    /// Index into the per-type kernel tables: the ggml id, or REPACKED + id.
    kernel: usize,
}

impl DMat {
    fn ptr(&self) -> u64 {
        self.buf.ptr + self.off
    }

    /// The weight bytes a product reads (a padded row's padding is never read).
    fn bytes(&self) -> usize {
        self.rows * (self.cols / self.ty.block_size() * self.ty.type_size())
    }
}

/// One projection's output written by one or more matrices, each into its
/// own row range of the output (fused when the types agree).
struct Proj {
    parts: Vec<(DMat, usize)>,
    rows: usize,
    bias: Option<DevBuf>,
}

impl Proj {
    /// Weight bytes over all parts.
    fn bytes(&self) -> usize {
        self.parts.iter().map(|(m, _)| m.bytes()).sum()
    }

    /// Whether its one-token GEMV is a float one (`mvf`): the kind that
    /// L2 windows serve.
    fn is_float(&self) -> bool {
        self.parts
            .first()
            .is_some_and(|(m, _)| mvf_type_name(m.ty).is_some())
    }
}

struct DNorm {
    w: DevBuf,
    b: Option<DevBuf>,
}

struct DLayer {
    attn_norm: DNorm,
    qkv: Proj,
    q_norm: Option<DevBuf>,
    k_norm: Option<DevBuf>,
    o: Proj,
    post_attn_norm: Option<DNorm>,
    ffn_norm: DNorm,
    /// gate rows then up rows (gated), or up rows.
    gate_up: Proj,
    down: Proj,
    post_ffn_norm: Option<DNorm>,
}

struct DRope {
    cos: DevBuf,
    sin: DevBuf,
    dim: usize,
    neox: bool,
}

/// Kernel handles, looked up once.
struct Kernels {
    /// Per ggml type id: the GEMV for 1, 2, 4, 8 tokens per block.
    mm: Vec<Option<[cudarc::driver::sys::CUfunction; 4]>>,
    /// Per ggml type id: the one-token GEMV (4 rows per warp).
    mv: Vec<Option<cudarc::driver::sys::CUfunction>>,
    /// Per ggml type id: the one-token GEMV with 16-byte loads (float types).
    mvf: Vec<Option<cudarc::driver::sys::CUfunction>>,
    /// Per ggml type id: the one-token GEMV against 8-bit activations.
    mvq: Vec<Option<cudarc::driver::sys::CUfunction>>,
    /// Per kernel-table index: the streaming one-token GEMV with 4 and 8
    /// blocks per lane in flight ([`mvqs_kernel`]).
    mvqs: Vec<Option<[cudarc::driver::sys::CUfunction; 2]>>,
    /// `mvqs4s_q4_0r`: the plain streaming kernel for rows of four units a
    /// lane ([`plain_streaming`]).
    mvqs4s: cudarc::driver::sys::CUfunction,
    /// `mvqst{NT}_{4, 8, 4s}_q4_0r` for NT = 2, 3, 4 ([`CudaBackend::streaming_nt`]).
    mvqst: [[cudarc::driver::sys::CUfunction; 3]; 3],
    /// Per kernel-table index: `mvq` with two units per lane in flight
    /// ([`mvq_narrow`]).
    mvq2: Vec<Option<cudarc::driver::sys::CUfunction>>,
    /// `mvqs` taking the norm before ([`Fuse::Norm`]: `mvqsn*`) or the
    /// residual add after ([`Fuse::Residual`]: `mvqsr*`), indexed as `mvqs`.
    mvqsn: Vec<Option<[cudarc::driver::sys::CUfunction; 2]>>,
    mvqsr: Vec<Option<[cudarc::driver::sys::CUfunction; 2]>>,
    /// The same for the `mvq_*r` types ([`mvqp_fused_types`]): the norm
    /// staged (`mvqsn{U}_*`), the residual add after `mvqr_impl`
    /// (`mvqa_*`); indexed as `mvq`, [for `mvq`, for `mvq2`].
    mvqpn: Vec<[Option<cudarc::driver::sys::CUfunction>; 2]>,
    mvqa: Vec<[Option<cudarc::driver::sys::CUfunction>; 2]>,
    /// The streaming residual kernel (`mvqsr{U}_*`) for those types.
    mvqpr: Vec<Option<cudarc::driver::sys::CUfunction>>,
    /// Two matrices of different types under one staged norm
    /// ([`mvqsnp_types`]).
    mvqsnp: Vec<NormPair>,
    /// Short-row versions ([`mvqs_rows`]) of `mvqpg`'s staged kernels by
    /// kernel-table index and [`MVQS_SHORT_ROWS`] slot.
    mvqsg_short: Vec<[Option<cudarc::driver::sys::CUfunction>; 2]>,
    /// `mvqsn` doing act_mul's work too ([`Fuse::NormGlu`]: `mvqsg*`),
    /// and `mvqpn`'s the same way.
    mvqsg: Vec<Option<[cudarc::driver::sys::CUfunction; 2]>>,
    mvqpg: Vec<[Option<cudarc::driver::sys::CUfunction>; 2]>,
    /// `mvqsn`, `mvqpn`, `mvqsg` and `mvqpg` behind a post-norm
    /// ([`Post`]: `mvqsnq*`, `mvqsgq*`).
    mvqsnq: Vec<Option<[cudarc::driver::sys::CUfunction; 2]>>,
    mvqpnq: Vec<[Option<cudarc::driver::sys::CUfunction>; 2]>,
    mvqsgq: Vec<Option<[cudarc::driver::sys::CUfunction; 2]>>,
    mvqpgq: Vec<[Option<cudarc::driver::sys::CUfunction>; 2]>,
    /// The same for float weights (`mvfn_*`, `mvfr_*`; `mvfnq_*` behind a
    /// post-norm; `mvfg_*` doing act_mul's work too), indexed as `mvf`.
    mvfn: Vec<Option<cudarc::driver::sys::CUfunction>>,
    mvfnq: Vec<Option<cudarc::driver::sys::CUfunction>>,
    mvfg: Vec<Option<cudarc::driver::sys::CUfunction>>,
    mvfr: Vec<Option<cudarc::driver::sys::CUfunction>>,
    quantize_q8: cudarc::driver::sys::CUfunction,
    softmax_causal: cudarc::driver::sys::CUfunction,
    gather_kv_half: cudarc::driver::sys::CUfunction,
    /// Flash attention for prefill chunks, head dims 64 and 128 (sm_80+).
    flash: [cudarc::driver::sys::CUfunction; 2],
    /// Per ggml type id: the few-token versions of `mvf` / `mvq`.
    mvf_nt: Vec<Option<cudarc::driver::sys::CUfunction>>,
    mvq_nt: Vec<Option<cudarc::driver::sys::CUfunction>>,
    /// Per kernel-table index: the tensor-core product of batched steps
    /// (`mmq_*`, [`MmqCall`]), and the sum of its splits.
    mmq: Vec<Option<([cudarc::driver::sys::CUfunction; 4], usize)>>,
    mmq_reduce: cudarc::driver::sys::CUfunction,
    embed: Vec<Option<cudarc::driver::sys::CUfunction>>,
    add_norm: cudarc::driver::sys::CUfunction,
    add_norm_cl: cudarc::driver::sys::CUfunction,
    gather_norm: cudarc::driver::sys::CUfunction,
    qkv_post: cudarc::driver::sys::CUfunction,
    /// Decode attention for head dims up to 64, 128, 256 (`attention_d2/4/8`).
    attention: [cudarc::driver::sys::CUfunction; 3],
    /// Attention sharing K/V loads among 2, 4, 8 query heads per KV head.
    attention_gqa: [cudarc::driver::sys::CUfunction; 3],
    attention_tile: cudarc::driver::sys::CUfunction,
    /// `attention_d2/d4/d8` doing qkv_post's work themselves
    /// (`attention_f2/f4/f8`).
    attention_fused: [cudarc::driver::sys::CUfunction; 3],
    /// `attention_d4` / `d8` ([_][0]) and `attention_f4` / `f8` ([_][1])
    /// merging their slices inside a thread-block cluster: head dims 65-128
    /// `attention_cd4` / `cf4`, up to 256 `attention_cd8` / `cf8`.
    attention_cl: [[cudarc::driver::sys::CUfunction; 2]; 2],
    /// `attention_f2` / `f4` / `cf4` issuing an L2 window ([`AheadPlan`]):
    /// `attention_fl2` / `fl4` / `cfl4`.
    attention_l2w: [cudarc::driver::sys::CUfunction; 3],
    /// The grouped decode attention (four query heads a block) for head
    /// dims up to 64 and 128: `attention_dg*`, fused `attention_fg*`, with
    /// an L2 window `attention_flg*`.
    attention_grouped: [cudarc::driver::sys::CUfunction; 2],
    attention_grouped_fused: [cudarc::driver::sys::CUfunction; 2],
    attention_grouped_l2w: [cudarc::driver::sys::CUfunction; 2],
    /// The fused grouped kernels at head dim 128 with the tensor-core walk,
    /// f16 cache only, blocks of 4 and of 8 heads (groups of 5-8):
    /// `attention_fgt4_h` / `fgt8_h`, with an L2 window `attention_flgt4_h`
    /// / `flgt8_h`. None where the model cannot take them (head dims other
    /// than 128, a softcap) or `$KILN_CUDA_ATT_TC=0`.
    attention_grouped_tc: Option<[[cudarc::driver::sys::CUfunction; 2]; 2]>,
    /// The wide decode attention ([`AttReach::Wide`]), fused, for head dims
    /// up to 64 and 128: `attention_fw2` / `fw4`, with an L2 window
    /// `attention_flw2` / `flw4`.
    attention_wide: [[cudarc::driver::sys::CUfunction; 2]; 2],
    /// The same for head dims up to 256 (Gemma 3): `attention_fw8` (no
    /// window version: no float O takes one at that head dim).
    attention_wide256: cudarc::driver::sys::CUfunction,
    /// The split decode attention at head dim 256 with 16 warps a block,
    /// for steps of few blocks ([`ATT_DEEP_SM_SHARE`]): `attention_dd8` /
    /// `fd8` ([0][_]), merged inside a cluster `attention_cdd8` / `cfd8`
    /// ([1][_]).
    attention_deep: [[cudarc::driver::sys::CUfunction; 2]; 2],
    act_mul: cudarc::driver::sys::CUfunction,
    softcap: cudarc::driver::sys::CUfunction,
    argmax: cudarc::driver::sys::CUfunction,
    sample: cudarc::driver::sys::CUfunction,
    /// Per ggml type id: rows to 16-bit floats (for the GEMM path).
    deq: Vec<Option<cudarc::driver::sys::CUfunction>>,
    to_half: cudarc::driver::sys::CUfunction,
    repack: Repackers,
    add_bias: cudarc::driver::sys::CUfunction,
}

/// The `mm_{n}_*` GEMVs for 1, 2, 4, 8 tokens per block.
fn mm_funcs(gpu: &mut Gpu, n: &str) -> CuResult<[cudarc::driver::sys::CUfunction; 4]> {
    Ok([
        gpu.func(&format!("mm_{n}_1"))?,
        gpu.func(&format!("mm_{n}_2"))?,
        gpu.func(&format!("mm_{n}_4"))?,
        gpu.func(&format!("mm_{n}_8"))?,
    ])
}

impl Kernels {
    /// `kv`: the cache's element type; the kernels that read or write the
    /// cache are loaded in its version (`_h`: f16).
    fn load(gpu: &mut Gpu, kv: KvType) -> CuResult<Kernels> {
        let sfx = match kv {
            KvType::F32 => "",
            KvType::F16 => "_h",
        };
        let kvf = |gpu: &mut Gpu, name: &str| gpu.func(&format!("{name}{sfx}"));
        let mut mm = vec![None; 64];
        let mut embed = vec![None; 64];
        let mut mv = vec![None; 64];
        let mut deq = vec![None; 64];
        let mut mvf = vec![None; 64];
        let mut mvq = vec![None; 64];
        let mut mvqs = vec![None; 64];
        let mut mvq2 = vec![None; 64];
        let mut mvqsn = vec![None; 64];
        let mut mvqsr = vec![None; 64];
        let mut mvqpn = vec![[None; 2]; 64];
        let mut mvqa = vec![[None; 2]; 64];
        let mut mvqpr = vec![None; 64];
        let mut mvqsg = vec![None; 64];
        let mut mvqpg = vec![[None; 2]; 64];
        let mut mvqsnq = vec![None; 64];
        let mut mvqpnq = vec![[None; 2]; 64];
        let mut mvqsgq = vec![None; 64];
        let mut mvqpgq = vec![[None; 2]; 64];
        let mut mvfn = vec![None; 64];
        let mut mvfnq = vec![None; 64];
        let mut mvfg = vec![None; 64];
        let mut mvfr = vec![None; 64];
        let mut mvf_nt = vec![None; 64];
        let mut mvq_nt = vec![None; 64];
        let mut mmq = vec![None; 64];
        for m in mmq_types() {
            mmq[m.id] = Some((crate::mmq::load(gpu, m.name, m.run_bytes)?, m.max_tokens));
        }
        for ty in GgmlType::ALL {
            let id = ty.id() as usize;
            if let Some(n) = mvf_type_name(ty) {
                mvf[id] = Some(gpu.func(&format!("mvf_{n}"))?);
                mvfn[id] = Some(gpu.func(&format!("mvfn_{n}"))?);
                mvfnq[id] = Some(gpu.func(&format!("mvfnq_{n}"))?);
                mvfg[id] = Some(gpu.func(&format!("mvfg_{n}"))?);
                mvfr[id] = Some(gpu.func(&format!("mvfr_{n}"))?);
                mvf_nt[id] = Some(gpu.func(&format!("mvf_nt_{n}"))?);
            }
            if let Some(n) = mvq_type_name(ty) {
                mvq[id] = Some(gpu.func(&format!("mvq_{n}"))?);
                mvq_nt[id] = Some(gpu.func(&format!("mvq_nt_{n}"))?);
            }
            if let Some(n) = kernel_type_name(ty) {
                let id = ty.id() as usize;
                mm[id] = Some(mm_funcs(gpu, n)?);
                embed[id] = Some(gpu.func(&format!("embed_{n}"))?);
                mv[id] = Some(gpu.func(&format!("mv_{n}"))?);
                deq[id] = Some(gpu.func(&format!("deq_{n}"))?);
            }
            if let Some(n) = repacked_name(ty) {
                let id = REPACKED + ty.id() as usize;
                mm[id] = Some(mm_funcs(gpu, n)?);
                embed[id] = Some(gpu.func(&format!("embed_{n}"))?);
                mv[id] = Some(gpu.func(&format!("mv_{n}"))?);
                deq[id] = Some(gpu.func(&format!("deq_{n}"))?);
                mvq[id] = Some(gpu.func(&format!("mvq_{n}"))?);
                mvq_nt[id] = Some(gpu.func(&format!("mvq_nt_{n}"))?);
            }
        }
        for (id, n) in mvqs_types() {
            for (table, v) in [
                (&mut mvqs, ""),
                (&mut mvqsn, "n"),
                (&mut mvqsr, "r"),
                (&mut mvqsg, "g"),
                (&mut mvqsnq, "nq"),
                (&mut mvqsgq, "gq"),
            ] {
                table[id] = Some([
                    gpu.func(&format!("mvqs{v}4_{n}"))?,
                    gpu.func(&format!("mvqs{v}8_{n}"))?,
                ]);
            }
        }
        for (id, n) in mvq2_types() {
            mvq2[id] = Some(gpu.func(&format!("mvq2_{n}"))?);
            mvqpn[id][1] = Some(gpu.func(&format!("mvqsn2_{n}"))?);
            mvqpg[id][1] = Some(gpu.func(&format!("mvqsg2_{n}"))?);
            mvqpnq[id][1] = Some(gpu.func(&format!("mvqsnq2_{n}"))?);
            mvqpgq[id][1] = Some(gpu.func(&format!("mvqsgq2_{n}"))?);
            mvqa[id][1] = Some(gpu.func(&format!("mvqa2_{n}"))?);
        }
        // A/B switch: `mvqa_*` for their residual adds instead.
        let kres = std::env::var("KILN_CUDA_KRES").map_or(true, |v| v != "0");
        for (id, n, u) in mvqp_fused_types() {
            if kres {
                mvqpr[id] = Some(gpu.func(&format!("mvqsr{u}_{n}"))?);
            }
            mvqpn[id][0] = Some(gpu.func(&format!("mvqsn{u}_{n}"))?);
            mvqpg[id][0] = Some(gpu.func(&format!("mvqsg{u}_{n}"))?);
            mvqa[id][0] = Some(gpu.func(&format!("mvqa_{n}"))?);
        }
        for (id, n, u) in mvqp_norm_types() {
            mvqpn[id][0] = Some(gpu.func(&format!("mvqsn{u}_{n}"))?);
        }
        // Behind a post-norm every staged type, Q8_0 too: a Q8_0 model's
        // add_norm there is the post-norm's as well.
        for (id, n, u) in mvqp_fused_types().into_iter().chain(mvqp_norm_types()) {
            mvqpnq[id][0] = Some(gpu.func(&format!("mvqsnq{u}_{n}"))?);
            mvqpgq[id][0] = Some(gpu.func(&format!("mvqsgq{u}_{n}"))?);
        }
        // A/B switch: `$KILN_CUDA_SHORT_ROWS=0` keeps one row a chunk.
        let short = std::env::var("KILN_CUDA_SHORT_ROWS").map_or(true, |v| v != "0");
        let has_short = |id: usize| short && mvqs_short_types().contains(&id);
        // A type's short-row versions of the kernel named `name(R)`.
        let short_fns = |gpu: &mut Gpu,
                         id: usize,
                         name: &dyn Fn(usize) -> String|
         -> CuResult<[Option<_>; 2]> {
            let mut fs = [None; 2];
            if has_short(id) {
                for (f, r) in fs.iter_mut().zip(MVQS_SHORT_ROWS) {
                    *f = Some(gpu.func(&name(r))?);
                }
            }
            Ok(fs)
        };
        let mut mvqsg_short = vec![[None; 2]; 64];
        for (id, n, u) in mvqp_fused_types() {
            mvqsg_short[id] = short_fns(gpu, id, &|r| format!("mvqsg{u}x{r}_{n}"))?;
        }
        // A/B switch: a kernel for each matrix instead.
        let mvqsnp = if std::env::var("KILN_CUDA_PAIR").is_ok_and(|v| v == "0") {
            Vec::new()
        } else {
            mvqsnp_types()
                .into_iter()
                .map(|(ids, n)| {
                    let short = short_fns(gpu, ids.0, &|r| format!("mvqsnpx{r}_{n}"))?;
                    let f = gpu.func(&format!("mvqsnp_{n}"))?;
                    let post = gpu.func(&format!("mvqsnpq_{n}"))?;
                    Ok(NormPair {
                        ids,
                        f,
                        short,
                        post,
                    })
                })
                .collect::<CuResult<Vec<_>>>()?
        };
        Ok(Kernels {
            mm,
            mv,
            mvf,
            mvq,
            mvqs,
            mvqs4s: gpu.func("mvqs4s_q4_0r")?,
            mvqst: {
                let mut t = [[std::ptr::null_mut(); 3]; 3];
                for (i, row) in t.iter_mut().enumerate() {
                    let nt = i + MVQST_MIN;
                    for (f, (form, cap)) in
                        row.iter_mut()
                            .zip([("4", 4096), ("8", MVQS_COLS), ("4s", 4096)])
                    {
                        *f = gpu.func(&format!("mvqst{nt}_{form}_q4_0r"))?;
                        gpu.set_dyn_smem(*f, mvqst_smem(nt, cap) as u32)?;
                    }
                }
                t
            },
            mvq2,
            mvqsn,
            mvqsr,
            mvqpn,
            mvqa,
            mvqpr,
            mvqsnp,
            mvqsg_short,
            mvqsg,
            mvqpg,
            mvqsnq,
            mvqpnq,
            mvqsgq,
            mvqpgq,
            mvfn,
            mvfnq,
            mvfg,
            mvfr,
            quantize_q8: gpu.func("quantize_q8")?,
            softmax_causal: gpu.func("softmax_causal")?,
            gather_kv_half: kvf(gpu, "gather_kv_half")?,
            flash: [gpu.func("flash_d64")?, gpu.func("flash_d128")?],
            mvf_nt,
            mvq_nt,
            mmq,
            mmq_reduce: gpu.func("mmq_reduce")?,
            embed,
            add_norm: gpu.func("add_norm")?,
            add_norm_cl: gpu.func("add_norm_cl")?,
            gather_norm: gpu.func("gather_norm")?,
            qkv_post: kvf(gpu, "qkv_post")?,
            attention: [
                kvf(gpu, "attention_d2")?,
                kvf(gpu, "attention_d4")?,
                kvf(gpu, "attention_d8")?,
            ],
            attention_gqa: [
                kvf(gpu, "attention_g2")?,
                kvf(gpu, "attention_g4")?,
                kvf(gpu, "attention_g8")?,
            ],
            attention_tile: kvf(gpu, "attention_tile")?,
            attention_fused: [
                kvf(gpu, "attention_f2")?,
                kvf(gpu, "attention_f4")?,
                kvf(gpu, "attention_f8")?,
            ],
            attention_cl: [
                [kvf(gpu, "attention_cd4")?, kvf(gpu, "attention_cf4")?],
                [kvf(gpu, "attention_cd8")?, kvf(gpu, "attention_cf8")?],
            ],
            attention_l2w: [
                kvf(gpu, "attention_fl2")?,
                kvf(gpu, "attention_fl4")?,
                kvf(gpu, "attention_cfl4")?,
            ],
            attention_grouped: [kvf(gpu, "attention_dg2")?, kvf(gpu, "attention_dg4")?],
            attention_grouped_fused: [kvf(gpu, "attention_fg2")?, kvf(gpu, "attention_fg4")?],
            attention_grouped_l2w: [kvf(gpu, "attention_flg2")?, kvf(gpu, "attention_flg4")?],
            attention_grouped_tc: match kv {
                KvType::F16 => Some([
                    [
                        gpu.func("attention_fgt4_h")?,
                        gpu.func("attention_flgt4_h")?,
                    ],
                    [
                        gpu.func("attention_fgt8_h")?,
                        gpu.func("attention_flgt8_h")?,
                    ],
                ]),
                KvType::F32 => None,
            },
            attention_wide: [
                [kvf(gpu, "attention_fw2")?, kvf(gpu, "attention_flw2")?],
                [kvf(gpu, "attention_fw4")?, kvf(gpu, "attention_flw4")?],
            ],
            attention_wide256: kvf(gpu, "attention_fw8")?,
            attention_deep: [
                [kvf(gpu, "attention_dd8")?, kvf(gpu, "attention_fd8")?],
                [kvf(gpu, "attention_cdd8")?, kvf(gpu, "attention_cfd8")?],
            ],
            act_mul: gpu.func("act_mul")?,
            softcap: gpu.func("softcap")?,
            argmax: gpu.func("argmax_rows")?,
            sample: gpu.func("sample_rows")?,
            deq,
            to_half: gpu.func("to_half")?,
            repack: Repackers::load(gpu)?,
            add_bias: gpu.func("add_bias")?,
        })
    }
}

/// Where a step's metadata sits in `s.meta` (u32 words). It depends on the
/// step's token count only, so a graph captured for n tokens finds it where
/// the host writes it, and a step uploads just the words it uses.
#[derive(Debug, Clone, Copy)]
struct MetaLayout {
    /// Nonzero: the step's tokens are the ids the previous step sampled
    /// (`s.ids`), not `tokens`.
    chain: usize,
    tokens: usize,
    positions: usize,
    ends: usize,
    rowidx: usize,
    sel: usize,
    /// First group's block tables; group g at `tables + g * table_len`.
    tables: usize,
    table_len: usize,
    /// Block-table entries per row (sequence).
    tstride: usize,
    /// Rows (sequences) of block tables a group holds.
    rows_max: usize,
    groups: usize,
    total: usize,
}

impl MetaLayout {
    /// The layout of an `n`-token step, with block tables for up to
    /// `rows_max` sequences in each of `groups` KV groups.
    fn new(n: usize, rows_max: usize, tstride: usize, groups: usize) -> MetaLayout {
        // 16-byte aligned regions.
        let span = n.max(1).div_ceil(4) * 4;
        let table_len = rows_max * tstride;
        MetaLayout {
            chain: 0,
            tokens: 4,
            positions: 4 + span,
            ends: 4 + 2 * span,
            rowidx: 4 + 3 * span,
            sel: 4 + 4 * span,
            tables: 4 + 5 * span,
            table_len,
            tstride,
            rows_max,
            groups,
            total: 4 + 5 * span + groups * table_len,
        }
    }

    /// The layout of an `n`-token step with this one's block tables.
    fn for_tokens(&self, n: usize) -> MetaLayout {
        MetaLayout::new(n, self.rows_max, self.tstride, self.groups)
    }

    /// Words a step over `rows` sequences reads: the last group's tables
    /// end at its `rows`-th row.
    fn used(&self, rows: usize) -> usize {
        match self.groups {
            0 => self.tables,
            g => self.tables + (g - 1) * self.table_len + rows * self.tstride,
        }
    }
}

struct Scratch {
    x: DevBuf,
    /// One token's residual stream where a post-norm staging writes it
    /// ([`Post`]: its x and xo alternate between `x` and this).
    x2: DevBuf,
    xn: DevBuf,
    qkv: DevBuf,
    att: DevBuf,
    tmp: DevBuf,
    gu: DevBuf,
    act: DevBuf,
    seln: DevBuf,
    logits: DevBuf,
    ids: DevBuf,
    /// Greedy argmax in slices: each slice's best value (f32), then its
    /// index (u32), ARGMAX_SLICES per row; per-row counters (zero between
    /// launches).
    am_part: DevBuf,
    am_count: DevBuf,
    meta: DevBuf,
    /// Sampling parameters, 4 u32 per logits row.
    samp: DevBuf,
    /// One token's activations as 8-bit blocks for `mvq_*`: values (i8),
    /// then the blocks' scales and scaled sums (f32).
    xq: DevBuf,
    xq_d: DevBuf,
    xq_s: DevBuf,
    /// Prefill attention through cuBLAS: scores (f32), probabilities (f16),
    /// the chunk's Q/K/V as f16; chunks of up to `att_gemm_cap` tokens; the
    /// sequence's K then V for up to `att_gemm_keys` positions, gathered from
    /// the cache as f16.
    att_s: Option<DevBuf>,
    att_p: Option<DevBuf>,
    qkvh: Option<DevBuf>,
    kvh: Option<DevBuf>,
    /// Split decode attention: partial results and per-(head, token) counters.
    att_part: DevBuf,
    att_count: DevBuf,
    /// 16-bit activations for the GEMM path (max_batch x widest input).
    xh: Option<DevBuf>,
    /// Dequantized weight rows for the GEMM path (`deq_elems` 16-bit values).
    wh: Option<DevBuf>,
    deq_elems: usize,
    /// The tensor-core products' split sums (`mmq_part_floats` floats).
    mmq_part: Option<DevBuf>,
    mmq_part_floats: usize,
}

/// Bytes a model needs on the device (weights + KV + scratch), for the
/// up-front memory check.
#[derive(Debug, Clone, Copy, Default)]
pub struct MemoryPlan {
    pub weights: usize,
    pub kv: usize,
    pub scratch: usize,
}

impl MemoryPlan {
    pub fn total(&self) -> usize {
        self.weights + self.kv + self.scratch
    }
}

pub struct CudaBackend {
    desc: ArchDescriptor,
    layout: KvLayout,
    max_batch: usize,
    embd: DMat,
    pos_embd: Option<DevBuf>,
    layers: Vec<DLayer>,
    out_norm: DNorm,
    output: Option<DMat>,
    ropes: Vec<DRope>,
    kv_k: Vec<DevBuf>,
    kv_v: Vec<DevBuf>,
    s: Scratch,
    ml: MetaLayout,
    host_meta: Vec<u32>,
    host_samp: Vec<u32>,
    row_seqs: Vec<u32>,
    /// Ids of steps queued by `enqueue_sampled`, copied back asynchronously.
    pinned: crate::pinned::PinnedIds,
    graphs: Vec<Option<Graph>>,
    use_graphs: bool,
    /// Where a greedy decode step's argmax runs (`$KILN_CUDA_GRAPH_ARGMAX`):
    /// 0 launched after the replay, 1 (default) captured in the graph
    /// unless the step issues L2 windows, 2 captured in the graph.
    graph_argmax: u8,
    /// Decode steps whose wait stamps a timeline build writes out
    /// (`$KILN_CUDA_TIMELINE`, [`Timeline`]).
    timeline: Option<Timeline>,
    k: Kernels,
    plan: MemoryPlan,
    gemm_min: usize,
    /// See [`CudaOptions::gemm_min_float`] (usize::MAX: never).
    gemm_min_float: usize,
    /// See [`CudaOptions::exact`].
    exact: bool,
    /// Most tokens of a step whose quantized products go through the
    /// tensor-core kernels ([`Self::uses_mmq`]; MMQ_TOKENS_MAX, 0: none).
    mmq_max: usize,
    /// Fewest such tokens (MMQ_TOKENS_MIN).
    mmq_min: usize,
    /// Most slices per row of the greedy argmax (`$KILN_CUDA_ARGMAX_SLICES`,
    /// default and at most ARGMAX_SLICES).
    argmax_max: usize,
    /// `add_norm` as a cluster of blocks per token for rows past 4096
    /// values (sm_90+, unless `$KILN_CUDA_CLUSTER` is 0).
    clusters: bool,
    /// That bound (`$KILN_CUDA_CLUSTER_ROWS`, default 4096): 2048 lost on
    /// one-token steps and on batched steps of 2-8 tokens alike (NOTES.md
    /// items 17, 76(b)).
    cluster_rows: usize,
    /// Split tensor-core products' sums added by the `add_norm` that reads
    /// them instead of `mmq_reduce` (`$KILN_CUDA_FOLD_SPLITS`, default on).
    fold_splits: bool,
    /// Most tokens a step may have for the plain streaming kernel's
    /// several-token forms ([`CudaBackend::streaming_nt`]; at most
    /// MVQST_MAX, `$KILN_CUDA_MVQST` sets it, 0 or 1: none). Batch-invariant
    /// runs take them for 2-4 tokens, where each token's y is its one-token
    /// bits: 8B Q4_0 `--batch 2,3,4` 434 / 550 / 626 -> 644 / 765 / 849
    /// generated tok/s against the few-token GEMVs. Default runs keep
    /// `mmq_*`, which was as fast at 2 tokens and 17-28% faster at 3-4
    /// (NOTES.md item 77).
    mvqst_max: usize,
    /// Most slices per (query head, token) of the decode attention (a power
    /// of two; 1: no split). A step uses [`CudaBackend::split_for`].
    att_split: usize,
    /// Steps of up to this many tokens split their decode attention.
    att_split_tokens: usize,
    /// Decode attention blocks a step aims at (usize::MAX with
    /// `$KILN_CUDA_ATT_SPLIT`: always `att_split` slices).
    att_blocks: usize,
    /// Prefill attention through cuBLAS for one sequence's chunks of
    /// `att_gemm_min..=att_gemm_cap` tokens (cap 0: never) that end at most
    /// `att_gemm_keys` positions in.
    att_gemm_min: usize,
    att_gemm_cap: usize,
    att_gemm_keys: usize,
    /// Those chunks through the flash-attention kernel rather than cuBLAS
    /// (sm_80+, head dim 64 or 128, unless `$KILN_CUDA_FLASH` is 0).
    flash: Option<cudarc::driver::sys::CUfunction>,
    /// See [`CudaOptions::fuse_qkv`].
    fuse_qkv: bool,
    /// See [`CudaOptions::fuse_norm`]; false where the model does not
    /// allow it ([`CudaBackend::norm_fusable`]).
    fuse_norm: bool,
    /// [`CudaOptions::fuse_norm`] for post-norm models: their add_norms
    /// inside the next norm-staging product ([`CudaBackend::post_fusable`]).
    fuse_post: bool,
    /// See [`CudaOptions::fuse_glu`] (taken per layer where it applies).
    fuse_glu: bool,
    /// Gate|up rows (bytes) from which float weights take `mvfg_*`
    /// (`MVFG_MIN_ROW_BYTES`; `$KILN_CUDA_MVFG_MIN` for A/B runs).
    mvfg_min: usize,
    /// See [`CudaOptions::kv`].
    kv: KvTypes,
    /// Blocks per SM of the norm-fused GEMVs (`$KILN_CUDA_NORM_BLOCKS`;
    /// default: as many as fit).
    norm_blocks: Option<usize>,
    /// Bytes of the next GEMV's weights the decode attention and act_mul
    /// pull into L2 ([`AheadPlan`]; sm_90+, `$KILN_CUDA_L2PF`, default
    /// L2_AHEAD; 0: none); act_mul's own reach (`$KILN_CUDA_L2PF_ACT`;
    /// default: a quarter of the down projection, see L2_AHEAD_ACT_MAX).
    l2_ahead: usize,
    l2_ahead_act: Option<usize>,
    /// The decode step's weights in reading order, for the windows.
    ahead_plan: AheadPlan,
    /// Some layer's O or down projection is a float GEMV: one-token steps
    /// issue L2 windows (when `l2_ahead` is on).
    float_windows: bool,
    /// Most slices of a split decode attention merged inside a cluster
    /// (`attention_c*`, sm_90, head dims 65-256: what fits resident, up to
    /// ATT_SPLIT_MAX; 1: never, `$KILN_CUDA_ATT_CLUSTER=0`); larger splits
    /// merge through global memory.
    att_cluster_max: usize,
    /// Most blocks a split decode attention step at head dim 256 may have
    /// to take the deep kernels ([`ATT_DEEP_SM_SHARE`]; 0: never), and the
    /// largest cluster of theirs.
    att_deep_blocks: usize,
    att_deep_cluster_max: usize,
    /// Fewest slices a step's split may shrink to so that it takes the
    /// deep kernels ([`ATT_DEEP_MIN_SPLIT`]).
    att_deep_min_split: usize,
    /// Steps whose positions are all below this take the cluster merge at
    /// head dims 65-128 ([`ATT_CLUSTER_CTX`]; `$KILN_CUDA_ATT_CLUSTER=1`:
    /// every step; 0 where none can); 129-256 take it at every depth.
    att_cluster_ctx: usize,
    /// Steps reaching this position take the grouped decode attention
    /// ([`AttReach::Long`]; `usize::MAX`: never).
    att_group_ctx: usize,
    /// Steps of up to `att_wide_tokens` tokens below this position take the
    /// wide decode attention ([`AttReach::Wide`]; 0: never).
    att_wide_ctx: usize,
    /// ATT_WIDE_TOKENS, or `$KILN_CUDA_ATT_WIDE_TOKENS`.
    att_wide_tokens: usize,
    /// Steps reaching this position take the grouped kernels' tensor-core
    /// walk ([`AttReach::Far`], [`Kernels::attention_grouped_tc`]);
    /// `usize::MAX` where the model has none: never.
    att_tc_ctx: usize,
    /// Batches of at least this many tokens use the GQA-sharing attention
    /// (`$KILN_CUDA_ATT_GQA_MIN`, default 16).
    att_gqa_min: usize,
    /// Why there is no cuBLAS (GEMV kernels used for every batch).
    blas_note: Option<String>,
    blas: Option<Blas>,
    // Last: dropped after every buffer above.
    gpu: Gpu,
}

impl Drop for CudaBackend {
    fn drop(&mut self) {
        // Buffers and graphs are freed next: their context must be current.
        let _ = self.gpu.bind();
        let _ = self.gpu.sync();
    }
}

fn unsupported(msg: String) -> EngineError {
    EngineError::Unsupported(msg)
}

fn ggml_type(m: &Model, t: &ModelTensor) -> Result<GgmlType> {
    match t.ty {
        TensorType::Ggml(ty) if is_supported(ty) => Ok(ty),
        other => Err(unsupported(format!(
            "tensor '{}' of type {other} in {} (the CUDA backend reads ggml types)",
            t.name,
            m.path.display()
        ))),
    }
}

fn decode_all(m: &Model, t: &ModelTensor) -> Result<Vec<f32>> {
    let ty = ggml_type(m, t)?;
    dequantize_to_vec(ty, m.data(t)).map_err(|e| unsupported(format!("tensor '{}': {e}", t.name)))
}

fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// Host-side description of one matrix before upload.
struct HostMat {
    ty: GgmlType,
    rows: usize,
    cols: usize,
    /// Borrowed from the mapped file, or decoded (transposed HF Conv1D,
    /// types without a kernel).
    owned: Option<Vec<u8>>,
    tensor: ModelTensor,
}

impl HostMat {
    fn load(m: &Model, name: &str, rows: usize, cols: usize) -> Result<HostMat> {
        let t = m.require(name)?;
        let shape = t.logical_shape();
        let (r, c) = match shape.as_slice() {
            [r, c] => (*r as usize, *c as usize),
            other => {
                return Err(unsupported(format!(
                    "tensor '{name}' has shape {other:?}, a matrix was expected"
                )))
            }
        };
        if r != rows || c != cols {
            return Err(unsupported(format!(
                "tensor '{name}' is [{r}, {c}], expected [{rows}, {cols}]"
            )));
        }
        let ty = ggml_type(m, t)?;
        if t.transposed {
            let data = t.to_logical(decode_all(m, t)?);
            return Ok(HostMat {
                ty: GgmlType::F32,
                rows,
                cols,
                owned: Some(f32_bytes(&data)),
                tensor: t.clone(),
            });
        }
        #[allow(clippy::manual_is_multiple_of)] // rust-version 1.85
        if kernel_type_name(ty).is_none() || cols % ty.block_size() != 0 {
            // No kernel reads this type (i-quants …): decode to f32 once.
            let v = decode_all(m, t)?;
            return Ok(HostMat {
                ty: GgmlType::F32,
                rows,
                cols,
                owned: Some(f32_bytes(&v)),
                tensor: t.clone(),
            });
        }
        Ok(HostMat {
            ty,
            rows,
            cols,
            owned: None,
            tensor: t.clone(),
        })
    }

    fn row_bytes(&self) -> usize {
        self.cols / self.ty.block_size() * self.ty.type_size()
    }

    fn bytes<'a>(&'a self, m: &'a Model) -> &'a [u8] {
        match &self.owned {
            Some(v) => v,
            None => m.data(&self.tensor),
        }
    }

    fn device_bytes(&self) -> usize {
        self.rows * self.row_bytes()
    }
}

/// Uploads matrices as one projection: each run of consecutive matrices of
/// one type as one buffer, so one kernel takes it (a Q4_K_M layer's Q and K
/// together, its Q6_K V apart).
fn upload_proj(m: &Model, mats: Vec<HostMat>, bias: Option<Vec<f32>>) -> Result<Proj> {
    let mut parts = Vec::new();
    let mut r0 = 0;
    for run in mats.chunk_by(|a, b| a.ty == b.ty) {
        let total: usize = run.iter().map(HostMat::device_bytes).sum();
        let buf = Arc::new(DevBuf::alloc(total)?);
        let mut off = 0usize;
        for h in run {
            let data = h.bytes(m);
            let n = h.device_bytes();
            let src = data.get(..n).ok_or_else(|| {
                unsupported(format!(
                    "tensor '{}' is shorter than its shape",
                    h.tensor.name
                ))
            })?;
            // SAFETY: buf holds `total` bytes; off + n <= total.
            unsafe { crate::gpu::upload_landed(buf.ptr + off as u64, src)? };
            off += n;
        }
        let h0 = &run[0];
        let run_rows: usize = run.iter().map(|h| h.rows).sum();
        parts.push((
            DMat {
                buf,
                off: 0,
                ty: h0.ty,
                rows: run_rows,
                cols: h0.cols,
                row_bytes: h0.row_bytes(),
                kernel: h0.ty.id() as usize,
            },
            r0,
        ));
        r0 += run_rows;
    }
    let bias = match bias {
        Some(b) => Some(DevBuf::from_f32(&b)?),
        None => None,
    };
    Ok(Proj {
        parts,
        rows: r0,
        bias,
    })
}

fn vector(m: &Model, name: &str, len: usize, offset: f32) -> Result<Vec<f32>> {
    let t = m.require(name)?;
    let mut v = decode_all(m, t)?;
    if v.len() != len {
        return Err(unsupported(format!(
            "tensor '{name}' has {} values, expected {len}",
            v.len()
        )));
    }
    if offset != 0.0 {
        v.iter_mut().for_each(|x| *x += offset);
    }
    Ok(v)
}

fn opt_vector(m: &Model, name: &str, len: usize, offset: f32) -> Result<Option<Vec<f32>>> {
    if m.tensor(name).is_none() {
        return Ok(None);
    }
    vector(m, name, len, offset).map(Some)
}

fn dev_opt(v: Option<Vec<f32>>) -> Result<Option<DevBuf>> {
    Ok(match v {
        Some(v) => Some(DevBuf::from_f32(&v)?),
        None => None,
    })
}

fn load_norm(m: &Model, d: &ArchDescriptor, stem: &str) -> Result<DNorm> {
    Ok(DNorm {
        w: DevBuf::from_f32(&vector(
            m,
            &format!("{stem}.weight"),
            d.hidden,
            d.norm_weight_offset,
        )?)?,
        b: dev_opt(opt_vector(m, &format!("{stem}.bias"), d.hidden, 0.0)?)?,
    })
}

fn load_norm_opt(m: &Model, d: &ArchDescriptor, stem: &str) -> Result<Option<DNorm>> {
    if m.tensor(&format!("{stem}.weight")).is_none() {
        return Ok(None);
    }
    load_norm(m, d, stem).map(Some)
}

/// Concatenated biases of parts (zeros for parts without one), or None.
fn cat_bias(parts: &[(Option<Vec<f32>>, usize)]) -> Option<Vec<f32>> {
    if parts.iter().all(|(b, _)| b.is_none()) {
        return None;
    }
    let mut out = Vec::new();
    for (b, len) in parts {
        match b {
            Some(b) => out.extend_from_slice(b),
            None => out.extend(std::iter::repeat_n(0.0, *len)),
        }
    }
    Some(out)
}

fn load_layer(m: &Model, d: &ArchDescriptor, i: usize) -> Result<DLayer> {
    let p = |n: &str| format!("blk.{i}.{n}");
    let (hid, qd, kvd, inter) = (d.hidden, d.q_dim(), d.kv_dim(), d.intermediate);
    let bias = |n: &str, len: usize| opt_vector(m, &p(&format!("{n}.bias")), len, 0.0);
    let mat = |n: &str, rows: usize, cols: usize| {
        HostMat::load(m, &p(&format!("{n}.weight")), rows, cols)
    };
    let qkv = if d.fused_qkv {
        upload_proj(
            m,
            vec![mat("attn_qkv", qd + 2 * kvd, hid)?],
            bias("attn_qkv", qd + 2 * kvd)?,
        )?
    } else {
        let b = cat_bias(&[
            (bias("attn_q", qd)?, qd),
            (bias("attn_k", kvd)?, kvd),
            (bias("attn_v", kvd)?, kvd),
        ]);
        upload_proj(
            m,
            vec![
                mat("attn_q", qd, hid)?,
                mat("attn_k", kvd, hid)?,
                mat("attn_v", kvd, hid)?,
            ],
            b,
        )?
    };
    let off = d.norm_weight_offset;
    let (q_norm, k_norm) = if d.qk_norm {
        (
            Some(DevBuf::from_f32(&vector(
                m,
                &p("attn_q_norm.weight"),
                d.head_dim,
                off,
            )?)?),
            Some(DevBuf::from_f32(&vector(
                m,
                &p("attn_k_norm.weight"),
                d.head_dim,
                off,
            )?)?),
        )
    } else {
        (None, None)
    };
    let gate_up = if d.gated_ffn {
        let b = cat_bias(&[
            (bias("ffn_gate", inter)?, inter),
            (bias("ffn_up", inter)?, inter),
        ]);
        upload_proj(
            m,
            vec![mat("ffn_gate", inter, hid)?, mat("ffn_up", inter, hid)?],
            b,
        )?
    } else {
        upload_proj(m, vec![mat("ffn_up", inter, hid)?], bias("ffn_up", inter)?)?
    };
    Ok(DLayer {
        attn_norm: load_norm(m, d, &p("attn_norm"))?,
        qkv,
        q_norm,
        k_norm,
        o: upload_proj(
            m,
            vec![mat("attn_output", hid, qd)?],
            bias("attn_output", hid)?,
        )?,
        post_attn_norm: if d.post_attn_norm {
            load_norm_opt(m, d, &p("post_attention_norm"))?
        } else {
            None
        },
        ffn_norm: load_norm(m, d, &p("ffn_norm"))?,
        gate_up,
        down: upload_proj(
            m,
            vec![mat("ffn_down", hid, inter)?],
            bias("ffn_down", hid)?,
        )?,
        post_ffn_norm: if d.post_ffn_norm {
            load_norm_opt(m, d, &p("post_ffw_norm"))?
        } else {
            None
        },
    })
}

/// cos/sin of a kiln-core RopeTable, read back through its public `apply`.
fn rope_table_arrays(t: &RopeTable, max_ctx: usize) -> (Vec<f32>, Vec<f32>) {
    let half = t.dim / 2;
    let mut cos = Vec::with_capacity(max_ctx * half);
    let mut sin = Vec::with_capacity(max_ctx * half);
    let mut x = vec![0.0f32; t.dim];
    for p in 0..max_ctx {
        // Pair i = (1, 0): rotates to (cos, sin).
        x.iter_mut().for_each(|v| *v = 0.0);
        for i in 0..half {
            match t.style {
                RopeStyle::Interleaved => x[2 * i] = 1.0,
                RopeStyle::Neox => x[i] = 1.0,
            }
        }
        t.apply(&mut x, p);
        for i in 0..half {
            let (c, s) = match t.style {
                RopeStyle::Interleaved => (x[2 * i], x[2 * i + 1]),
                RopeStyle::Neox => (x[i], x[i + half]),
            };
            cos.push(c);
            sin.push(s);
        }
    }
    (cos, sin)
}

fn norm_kind(k: NormKind) -> i32 {
    match k {
        NormKind::Rms => 0,
        NormKind::Layer => 1,
    }
}

fn act_kind(a: Activation) -> i32 {
    match a {
        Activation::Silu => 0,
        Activation::GeluTanh => 1,
        Activation::Gelu => 2,
    }
}

fn opt_ptr(b: &Option<DevBuf>) -> u64 {
    b.as_ref().map_or(0, |b| b.ptr)
}

/// Device bytes the weights of `m` take (as the backend stores them).
fn weight_bytes(m: &Model) -> usize {
    m.tensors()
        .iter()
        .map(|t| match t.ty {
            TensorType::Ggml(ty) if kernel_type_name(ty).is_some() && !t.transposed => {
                // Rows that the repack pads to whole runs take more.
                match t.shape.split_last() {
                    Some((&cols, rest)) if !rest.is_empty() => {
                        let rows = rest.iter().product::<u64>() as usize;
                        padded_row_bytes(ty, cols as usize)
                            .map_or(t.n_bytes as usize, |rb| rows * rb)
                    }
                    _ => t.n_bytes as usize,
                }
            }
            _ => t.n_elements() as usize * 4,
        })
        .sum()
}

impl CudaBackend {
    /// Opens the GPU, checks that everything fits, uploads the weights once
    /// and allocates the KV pool for `layout` and scratch for `max_batch`
    /// tokens.
    pub fn new(
        model: Arc<Model>,
        desc: ArchDescriptor,
        layout: KvLayout,
        max_batch: usize,
        opts: CudaOptions,
    ) -> Result<Self> {
        // Before the device is opened: the same error with or without one.
        check_kv_types(opts.kv)?;
        let gpu = Gpu::new(opts.device)?;
        Self::with_gpu(gpu, model, desc, layout, max_batch, opts)
    }

    pub fn with_gpu(
        mut gpu: Gpu,
        model: Arc<Model>,
        desc: ArchDescriptor,
        layout: KvLayout,
        max_batch: usize,
        opts: CudaOptions,
    ) -> Result<Self> {
        let m = &*model;
        let d = &desc;
        let max_batch = if opts.invariant {
            max_batch.clamp(1, MV_TOKENS_MAX)
        } else {
            max_batch.max(1)
        };
        let (gemm_min_opt, gemm_min_float_opt) = if opts.invariant {
            (0, 0)
        } else {
            (opts.gemm_min, opts.gemm_min_float)
        };
        // Token counts up to which the decode attention is split.
        let att_split_tokens = if opts.invariant {
            max_batch
        } else {
            ATT_SPLIT_MAX_TOKENS
        };
        check_kv_types(opts.kv)?;
        if d.head_dim > 256 {
            return Err(unsupported(format!(
                "head_dim {} (the CUDA attention kernel takes up to 256)",
                d.head_dim
            )));
        }
        #[allow(clippy::manual_is_multiple_of)] // rust-version 1.85
        if d.n_kv_heads == 0 || d.n_heads % d.n_kv_heads != 0 {
            return Err(unsupported(format!(
                "{} query heads over {} KV heads",
                d.n_heads, d.n_kv_heads
            )));
        }
        gpu.bind()?;

        // Sizes first: a model that does not fit is an error here, not later.
        let b = max_batch;
        let (hid, qd, kvd, inter, vocab) = (
            d.hidden,
            d.q_dim(),
            d.kv_dim(),
            d.intermediate,
            d.vocab_size,
        );
        let qkv_dim = qd + 2 * kvd;
        let tstride = layout.max_ctx.div_ceil(layout.block_size);
        let rows_max = b.min(layout.max_seqs).max(1);
        let ml = MetaLayout::new(b, rows_max, tstride, layout.groups.len());
        let scratch_floats = b * (4 * hid + qkv_dim + qd + 2 * inter + inter) + b * vocab;
        // GEMM path: 16-bit activations, and (for quantized weights) one
        // row chunk of dequantized weights as large as the largest layer
        // matrix (the output matrix goes through in chunks of that size).
        let blas_min = [gemm_min_opt, gemm_min_float_opt]
            .into_iter()
            .filter(|&v| v > 0)
            .min()
            .unwrap_or(0);
        let (blas, blas_note) = if blas_min == 0 || b < blas_min {
            (
                None,
                Some(
                    if opts.invariant {
                        "off (batch-invariant mode)"
                    } else {
                        "off (gemm_min)"
                    }
                    .to_string(),
                ),
            )
        } else {
            match Blas::new(&gpu) {
                Ok(bl) => (Some(bl), None),
                Err(e) => (None, Some(e.0)),
            }
        };
        let quantized = m.tensors().iter().any(|t| {
            matches!(t.ty, TensorType::Ggml(ty)
                if !matches!(ty, GgmlType::F32 | GgmlType::F16 | GgmlType::BF16))
                && t.logical_shape().len() == 2
        });
        let widest = hid.max(qd).max(inter);
        let deq_elems = if blas.is_some() && quantized {
            (qkv_dim * hid)
                .max(qd * hid)
                .max(2 * inter * hid)
                .max(hid * inter)
                .max(widest * 64)
        } else {
            0
        };
        let gemm_bytes = if blas.is_some() {
            b * widest * 2 + deq_elems * 2 + BLAS_WORKSPACE
        } else {
            0
        };
        // `$KILN_CUDA_ATT_SPLIT=S` splits every decode attention into up to
        // S slices of one position or more (tests of the merge).
        let forced = env_parse::<usize>("KILN_CUDA_ATT_SPLIT");
        let att_blocks = if forced.is_some() || opts.invariant {
            usize::MAX
        } else {
            ATT_BLOCKS_PER_SM * gpu.info.sms.max(1) as usize
        };
        let att_split = forced
            .unwrap_or_else(|| layout.max_ctx.div_ceil(ATT_SLICE_MIN))
            .clamp(
                1,
                if forced.is_some() {
                    ATT_SPLIT_FORCED_MAX
                } else {
                    ATT_SPLIT_MAX
                },
            )
            .next_power_of_two();
        let split_pairs = b.min(att_split_tokens) * d.n_heads;
        let att_part_floats = if att_split > 1 {
            split_pairs * att_split * (d.head_dim + 2)
        } else {
            1
        };
        let att_gemm_min = env_parse::<usize>("KILN_CUDA_ATT_GEMM_MIN").unwrap_or(ATT_GEMM_MIN);
        // The flash kernel keeps scores on chip: its chunks need only the
        // gathered f16 K/V.
        let flash = (gpu.info.cc.0 >= 8
            && matches!(d.head_dim, 64 | 128)
            && std::env::var("KILN_CUDA_FLASH").map_or(true, |v| v != "0"))
        .then_some(d.head_dim / 128);
        // Chunks of up to `att_gemm_cap` tokens against up to
        // `att_gemm_keys` visible positions: scores (f32 + f16) per head,
        // within ATT_GEMM_MAX_BYTES (fewer keys first, then fewer tokens).
        // Both take 16-bit Q/K/V: only with the 16-bit GEMMs (cuBLAS on),
        // never in exact or batch-invariant runs.
        let mut att_gemm_cap = if blas.is_some() && att_gemm_min > 0 {
            b.min(2048)
        } else {
            0
        };
        let mut att_gemm_keys = layout.max_ctx.max(att_gemm_cap);
        // Flash: the gathered K/V alone, within a quarter of the budget.
        let att_bytes = |cap: usize, keys: usize| match flash {
            Some(_) => keys * kvd * 16,
            None => d.n_heads * cap * keys * 6,
        };
        while att_gemm_cap > 0 && att_bytes(att_gemm_cap, att_gemm_keys) > ATT_GEMM_MAX_BYTES {
            if att_gemm_keys > att_gemm_cap {
                att_gemm_keys = (att_gemm_keys / 2).max(att_gemm_cap);
            } else {
                att_gemm_cap /= 2;
            }
        }
        let att_gemm_bytes = if att_gemm_cap >= att_gemm_min.max(1) {
            let scores = d.n_heads * att_gemm_cap * att_gemm_keys * 6 + att_gemm_cap * qkv_dim * 2;
            flash.map_or(scores, |_| 0) + att_gemm_keys * kvd * 4
        } else {
            att_gemm_cap = 0;
            0
        };
        // Never in batch-invariant runs: a sequence's products would then
        // depend on how many tokens share its step.
        let mmq_max = if opts.invariant || std::env::var("KILN_CUDA_MMQ").is_ok_and(|v| v == "0") {
            0
        } else {
            env_parse("KILN_CUDA_MMQ_MAX").unwrap_or(MMQ_TOKENS_MAX)
        };
        let mmq_min = env_parse("KILN_CUDA_MMQ_MIN")
            .unwrap_or(MMQ_TOKENS_MIN)
            .max(2);
        let mmq_part_floats = if quantized && mmq_min <= b.min(mmq_max) {
            crate::mmq::part_floats(gpu.info.sms.max(1) as usize, b.min(mmq_max))
        } else {
            0
        };
        let xq_cols = widest.div_ceil(32) * 32 * b.min(MV_TOKENS_MAX.max(mmq_max));
        let decode_bytes = xq_cols
            + xq_cols / 32 * 8
            + att_part_floats * 4
            + split_pairs * 4
            + mmq_part_floats * 4;
        let plan = MemoryPlan {
            weights: weight_bytes(m),
            kv: opts.kv.total_bytes(&layout),
            scratch: scratch_floats * 4
                + ml.total * 4
                + b * 4
                + b * 16
                + gemm_bytes
                + decode_bytes
                + att_gemm_bytes,
        };
        let (free, total) = gpu.mem_info()?;
        let margin = 256 << 20;
        let avail = free.saturating_sub(margin);
        let budget = opts.gpu_mem.map_or(avail, |g| g.min(avail));
        if plan.total() > budget {
            let gib = |x: usize| x as f64 / (1u64 << 30) as f64;
            let limit = match opts.gpu_mem {
                Some(g) if g < avail => format!("the GPU memory budget is {:.2} GiB", gib(g)),
                _ => format!(
                    "{} has {:.2} GiB free of {:.2} (less a {:.2} GiB margin)",
                    gpu.info.name,
                    gib(free),
                    gib(total),
                    gib(margin)
                ),
            };
            return Err(unsupported(format!(
                "the model needs {:.2} GiB on the GPU (weights {:.2}, KV cache {:.2}, scratch {:.2}) \
                 but {limit}; lower the context size (-c), the batch size, or use --device cpu",
                gib(plan.total()),
                gib(plan.weights),
                gib(plan.kv),
                gib(plan.scratch),
            )));
        }

        let mut k = Kernels::load(&mut gpu, opts.kv.k)?;
        let flash_f = flash.map(|i| k.flash[i]);
        let att_cluster = std::env::var("KILN_CUDA_ATT_CLUSTER").ok();
        // The cluster kernels of this model's head dim (none up to 64).
        let att_dpl = att_dpl(d.head_dim);
        let cl_kernels: Vec<_> = match att_dpl {
            1 => k.attention_cl[0]
                .iter()
                .chain(&k.attention_l2w[2..])
                .copied()
                .collect(),
            2 => k.attention_cl[1].to_vec(),
            _ => Vec::new(),
        };
        // The largest cluster all of `fs` (blocks of `threads`) can take.
        let cluster_max =
            |fs: &[cudarc::driver::sys::CUfunction], threads| match att_cluster.as_deref() {
                Some("0") => 1,
                _ => fs
                    .iter()
                    .map(|&f| gpu.max_cluster(f, threads, ATT_SPLIT_MAX as u32))
                    .min()
                    .unwrap_or(1) as usize,
            };
        let att_cluster_max = cluster_max(&cl_kernels, att_dec_threads(att_dpl, false));
        // The deep kernels (head dim 256, a block an SM): how many of their
        // blocks a step may have, and the largest cluster of them.
        let (att_deep_blocks, att_deep_cluster_max) = if att_dpl != 2
            || opts.invariant
            || std::env::var("KILN_CUDA_ATT_DEEP").is_ok_and(|v| v == "0")
        {
            (0, 1)
        } else {
            (
                gpu.info.sms as usize / ATT_DEEP_SM_SHARE,
                cluster_max(&k.attention_deep[1], att_dec_threads(2, true)),
            )
        };
        if std::env::var("KILN_CUDA_ATT_TC").is_ok_and(|v| v == "0")
            || d.head_dim != 128
            || d.attn_softcap.is_some()
        {
            k.attention_grouped_tc = None;
        }
        let att_tc_ctx = if k.attention_grouped_tc.is_some() {
            env_parse("KILN_CUDA_ATT_TC_CTX").unwrap_or(ATT_TC_CTX)
        } else {
            usize::MAX
        };
        // 0 where no step can take the cluster: then graphs are not keyed
        // apart by a bound that changes nothing.
        let att_cluster_ctx = match att_cluster.as_deref() {
            _ if att_cluster_max < 2 || !(65..=128).contains(&d.head_dim) => 0,
            Some("1") => usize::MAX,
            _ => env_parse("KILN_CUDA_ATT_CLUSTER_CTX").unwrap_or(ATT_CLUSTER_CTX),
        };
        // A/B switch: the earlier one-token kernels instead of the streaming ones.
        if std::env::var("KILN_CUDA_MVQS").is_ok_and(|v| v == "0") {
            k.mvqs.iter_mut().for_each(|f| *f = None);
        }

        // Weights.
        let embd_h = HostMat::load(m, "token_embd.weight", vocab, hid)?;
        let embd_p = upload_proj(m, vec![embd_h], None)?;
        let mut embd = embd_p
            .parts
            .into_iter()
            .next()
            .map(|(mat, _)| mat)
            .ok_or_else(|| unsupported("token_embd".into()))?;
        let pos_embd = if d.learned_positions {
            let t = m.require("position_embd.weight")?;
            let shape = t.logical_shape();
            let (rows, cols) = match shape.as_slice() {
                [r, c] => (*r as usize, *c as usize),
                _ => (0, 0),
            };
            if cols != hid {
                return Err(unsupported(
                    "position_embd.weight width differs from the hidden size".into(),
                ));
            }
            if layout.max_ctx > rows {
                return Err(EngineError::Input(format!(
                    "context {} exceeds the model's {rows} learned positions",
                    layout.max_ctx
                )));
            }
            let h = HostMat::load(m, "position_embd.weight", rows, cols)?;
            let v = match (&h.owned, h.ty) {
                (Some(bytes), GgmlType::F32) => bytes
                    .chunks_exact(4)
                    .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                    .collect(),
                _ => decode_all(m, t)?,
            };
            Some(DevBuf::from_f32(&v)?)
        } else {
            None
        };
        let mut layers = (0..d.n_layers)
            .map(|i| load_layer(m, d, i))
            .collect::<Result<Vec<_>>>()?;
        let mut output = if d.tied_embeddings {
            None
        } else {
            let h = HostMat::load(m, "output.weight", vocab, hid)?;
            let p = upload_proj(m, vec![h], None)?;
            p.parts.into_iter().next().map(|(mat, _)| mat)
        };
        if std::env::var("KILN_CUDA_REPACK").map_or(true, |v| v != "0") {
            // Every matrix, the output one (or the tied embeddings it reads)
            // too: it is the largest a token reads.
            let layer_mats = layers.iter_mut().flat_map(|l| {
                [&mut l.qkv, &mut l.o, &mut l.gate_up, &mut l.down]
                    .into_iter()
                    .flat_map(|p| p.parts.iter_mut().map(|(mat, _)| mat))
            });
            for mat in layer_mats.chain([&mut embd]).chain(output.as_mut()) {
                if let Some(r) = repack(&gpu, &k.repack, mat.ty, mat.ptr(), mat.rows, mat.cols)? {
                    mat.kernel = r.kernel;
                    if let Some((buf, row_bytes)) = r.moved {
                        let old = std::mem::replace(&mut mat.buf, Arc::new(buf));
                        mat.off = 0;
                        mat.row_bytes = row_bytes;
                        // Freed once the repack has read it: at most one
                        // matrix is held twice.
                        gpu.sync()?;
                        drop(old);
                    }
                }
            }
        }
        let out_norm = load_norm(m, d, "output_norm")?;

        // RoPE tables, built exactly as the CPU backend builds them.
        let mut ropes = Vec::new();
        if let Some(r) = &d.rope {
            let ff = match m.tensor("rope_freqs.weight") {
                Some(_) => Some(vector(m, "rope_freqs.weight", r.dim / 2, 0.0)?),
                None => None,
            };
            let mut tables = Vec::new();
            let (f, s) = inv_freqs(r, r.theta, true, ff.as_deref());
            tables.push(RopeTable::new(r.dim, r.style, &f, s, layout.max_ctx));
            if let Some(tl) = r.theta_local {
                let (f, s) = inv_freqs(r, tl, false, None);
                tables.push(RopeTable::new(r.dim, r.style, &f, s, layout.max_ctx));
            }
            for t in &tables {
                if t.dim > d.head_dim || t.dim % 2 != 0 {
                    return Err(unsupported(format!(
                        "RoPE over {} of {} head dimensions",
                        t.dim, d.head_dim
                    )));
                }
                let (c, s) = rope_table_arrays(t, layout.max_ctx);
                ropes.push(DRope {
                    cos: DevBuf::from_f32(&c)?,
                    sin: DevBuf::from_f32(&s)?,
                    dim: t.dim,
                    neox: t.style == RopeStyle::Neox,
                });
            }
        }

        // KV pool (the CPU layout, f32 or f16 elements) and scratch.
        let mut kv_k = Vec::new();
        let mut kv_v = Vec::new();
        for g in 0..layout.groups.len() {
            let bytes = layout.groups[g].n_blocks * layout.block_elems(g) * opts.kv.k.size();
            kv_k.push(DevBuf::zeroed(bytes)?);
            kv_v.push(DevBuf::zeroed(bytes)?);
        }
        let f = |n: usize| DevBuf::zeroed(n * 4);
        let s = Scratch {
            x: f(b * hid)?,
            x2: f(hid)?,
            xn: f(b * hid)?,
            qkv: f(b * qkv_dim)?,
            att: f(b * qd)?,
            tmp: f(b * hid)?,
            gu: f(b * 2 * inter)?,
            act: f(b * inter)?,
            seln: f(b * hid)?,
            logits: f(b * vocab)?,
            ids: f(b)?,
            am_part: f(2 * b * ARGMAX_SLICES)?,
            am_count: f(b)?,
            meta: f(ml.total)?,
            samp: f(4 * b)?,
            xq: DevBuf::zeroed(xq_cols)?,
            xq_d: f(xq_cols / 32)?,
            xq_s: f(xq_cols / 32)?,
            att_part: f(att_part_floats)?,
            att_s: if att_gemm_cap > 0 && flash.is_none() {
                Some(DevBuf::alloc(d.n_heads * att_gemm_cap * att_gemm_keys * 4)?)
            } else {
                None
            },
            att_p: if att_gemm_cap > 0 && flash.is_none() {
                Some(DevBuf::alloc(d.n_heads * att_gemm_cap * att_gemm_keys * 2)?)
            } else {
                None
            },
            qkvh: if att_gemm_cap > 0 && flash.is_none() {
                Some(DevBuf::alloc(att_gemm_cap * qkv_dim * 2)?)
            } else {
                None
            },
            kvh: if att_gemm_cap > 0 {
                Some(DevBuf::alloc(att_gemm_keys * kvd * 4)?)
            } else {
                None
            },
            att_count: f(split_pairs.max(1))?,
            xh: if blas.is_some() {
                Some(DevBuf::alloc(b * widest * 2)?)
            } else {
                None
            },
            wh: if deq_elems > 0 {
                Some(DevBuf::alloc(deq_elems * 2)?)
            } else {
                None
            },
            deq_elems,
            mmq_part: if mmq_part_floats > 0 {
                Some(DevBuf::alloc(mmq_part_floats * 4)?)
            } else {
                None
            },
            mmq_part_floats,
        };
        let max_graph = b.min(layout.max_seqs).min(64);
        // Whether some layer's O projection reads float weights: the decode
        // attention then issues its L2 window, and its layouts' bounds move.
        let float_o = layers.iter().any(|l| l.o.is_float());
        // The grouped kernels exist for head dims up to 128 that 8 divides
        // (a lane takes whole 16-byte words of 8 dims: attention.cu SplitLanes);
        // by default a group of one (three of a block's four heads copies)
        // does not take them. Groups of two do, from the same bounds, though
        // half a block's heads are copies: Qwen3-0.6B (16 / 8 heads, head
        // dim 128), S_TG after P positions, one-head blocks -> grouped, f32
        // cache: Q4_K_M P = 256 / 512 / 1,024 / 2,048 / 8,192 1,393 / 1,289
        // / 1,146 / 913 / 417 -> 1,462 / 1,425 / 1,329 / 1,163 / 685, bf16
        // P = 512 / 1,024 / 8,192 1,171 / 1,049 / 406 -> 1,205 / 1,137 / 630
        // (NOTES.md item 117). `$KILN_CUDA_ATT_GROUP=0` never,
        // `$KILN_CUDA_ATT_GROUP_CTX` the bound for any group (0: every step;
        // the tiny fixtures' groups of 2 and 1 are checked so). Never with
        // `invariant`: a step's reach is its furthest sequence's, and the
        // grouped kernels round apart from the one-head ones, so a
        // sequence's logits would depend on what shares its steps.
        #[allow(clippy::manual_is_multiple_of)] // rust-version 1.85
        let att_group_ctx = match env_parse::<usize>("KILN_CUDA_ATT_GROUP_CTX") {
            _ if d.head_dim > 128
                || d.head_dim % 8 != 0
                || opts.invariant
                || std::env::var("KILN_CUDA_ATT_GROUP").is_ok_and(|v| v == "0") =>
            {
                usize::MAX
            }
            Some(c) => c,
            None if d.n_heads / d.n_kv_heads.max(1) < 2 => usize::MAX,
            None if float_o => ATT_GROUP_CTX,
            None => ATT_GROUP_CTX_Q8[usize::from(d.head_dim > 64)],
        };
        // Never with `invariant` (a sequence's logits would depend on what
        // shares its steps); only where decode steps fuse qkv_post (head
        // dims 64, 128 and 256, causal): other steps would fall back to the
        // sliced kernels without the cluster merge.
        let att_wide_ctx = if !matches!(d.head_dim, 64 | 128 | 256)
            || !opts.fuse_qkv
            || !d.causal
            || opts.invariant
            || std::env::var("KILN_CUDA_ATT_WIDE").is_ok_and(|v| v == "0")
        {
            0
        } else {
            env_parse("KILN_CUDA_ATT_WIDE_CTX").unwrap_or(ATT_WIDE_CTX[usize::from(float_o)])
        };
        let mut be = CudaBackend {
            host_meta: vec![0; ml.total],
            host_samp: vec![0; 4 * b],
            pinned: crate::pinned::PinnedIds::new(b)?,
            row_seqs: Vec::with_capacity(b),
            graphs: (0..2
                * ATT_REACHES
                * (max_graph + 1)
                * (att_split.trailing_zeros() as usize + 1))
                .map(|_| None)
                .collect(),
            graph_argmax: match std::env::var("KILN_CUDA_GRAPH_ARGMAX").as_deref() {
                Ok("0") => 0,
                Ok("2") => 2,
                _ => 1,
            },
            timeline: Timeline::from_env(),
            use_graphs: opts.graphs,
            desc,
            layout,
            max_batch,
            embd,
            pos_embd,
            layers,
            out_norm,
            output,
            ropes,
            kv_k,
            kv_v,
            s,
            ml,
            k,
            plan,
            gemm_min: gemm_min_opt,
            gemm_min_float: if gemm_min_float_opt == 0 {
                usize::MAX
            } else {
                gemm_min_float_opt
            },
            exact: opts.exact,
            mmq_max,
            mmq_min,
            argmax_max: std::env::var("KILN_CUDA_ARGMAX_SLICES")
                .ok()
                .and_then(|v| v.parse().ok())
                .unwrap_or(ARGMAX_SLICES)
                .clamp(1, ARGMAX_SLICES),
            clusters: gpu.clusters()
                && std::env::var("KILN_CUDA_CLUSTER").map_or(true, |v| v != "0"),
            cluster_rows: env_parse("KILN_CUDA_CLUSTER_ROWS").unwrap_or(512 * 8),
            fold_splits: std::env::var("KILN_CUDA_FOLD_SPLITS").map_or(true, |v| v != "0"),
            mvqst_max: env_parse("KILN_CUDA_MVQST")
                .unwrap_or(if opts.invariant { MVQST_MAX } else { 0 })
                .min(MVQST_MAX),
            att_split,
            att_blocks,
            att_gemm_min,
            att_gemm_cap,
            att_gemm_keys,
            flash: flash_f,
            fuse_qkv: opts.fuse_qkv,
            fuse_norm: false,
            fuse_post: false,
            fuse_glu: opts.fuse_glu,
            mvfg_min: env_parse("KILN_CUDA_MVFG_MIN").unwrap_or(MVFG_MIN_ROW_BYTES),
            kv: opts.kv,
            norm_blocks: env_parse("KILN_CUDA_NORM_BLOCKS"),
            l2_ahead: if gpu.info.cc.0 >= 9 {
                std::env::var("KILN_CUDA_L2PF")
                    .ok()
                    .and_then(|v| parse_bytes(&v))
                    .unwrap_or_else(|| l2_ahead_default(gpu.info.peak_bandwidth))
            } else {
                0
            },
            l2_ahead_act: std::env::var("KILN_CUDA_L2PF_ACT")
                .ok()
                .and_then(|v| parse_bytes(&v)),
            ahead_plan: AheadPlan::default(),
            float_windows: false,
            att_cluster_max,
            att_deep_blocks,
            att_deep_cluster_max,
            att_deep_min_split: env_parse("KILN_CUDA_ATT_DEEP_MIN_SPLIT")
                .unwrap_or(ATT_DEEP_MIN_SPLIT),
            att_cluster_ctx,
            att_group_ctx,
            att_wide_ctx,
            att_wide_tokens: env_parse("KILN_CUDA_ATT_WIDE_TOKENS").unwrap_or(ATT_WIDE_TOKENS),
            att_tc_ctx,
            att_gqa_min: if opts.invariant {
                usize::MAX
            } else {
                env_parse("KILN_CUDA_ATT_GQA_MIN").unwrap_or(ATT_GQA_MIN_TOKENS)
            },
            att_split_tokens,
            blas_note,
            blas,
            gpu,
        };
        // Batch-invariant runs: a sequence alone decodes one token a step (the fused kernels),
        // in a batch several (add_norm apart). The float fused norm scales a row's sum by 1 /
        // rms at its end where add_norm scales x first, and the post-norm staging sums y's
        // squares in its block's order, not add_norm's: both last-bit apart, so those runs keep
        // add_norm there (the quantized pre-norm kernels stage add_norm's bits).
        let float_norm = be
            .layers
            .iter()
            .any(|l| l.qkv.is_float() || l.gate_up.is_float());
        be.fuse_norm = opts.fuse_norm && !(opts.invariant && float_norm) && be.norm_fusable();
        be.fuse_post = opts.fuse_norm && !opts.invariant && be.post_fusable();
        be.ahead_plan = AheadPlan::new(&be.reading_order());
        be.float_windows = be
            .layers
            .iter()
            .any(|l| l.o.is_float() || l.down.is_float());
        Ok(be)
    }

    pub fn device(&self) -> &crate::gpu::DeviceInfo {
        &self.gpu.info
    }

    /// The KV cache's element types.
    pub fn kv_types(&self) -> KvTypes {
        self.kv
    }

    pub fn memory_plan(&self) -> MemoryPlan {
        self.plan
    }

    /// Bytes of weights read per decoded token (all matrices but the
    /// embedding table, plus the output matrix, tied or not).
    pub fn weight_bytes_per_token(&self) -> usize {
        let layers: usize = self
            .layers
            .iter()
            .map(|l| l.qkv.bytes() + l.o.bytes() + l.gate_up.bytes() + l.down.bytes())
            .sum();
        let out = self.output.as_ref().unwrap_or(&self.embd);
        layers + out.bytes()
    }

    pub fn gpu(&self) -> &Gpu {
        &self.gpu
    }

    pub fn set_graphs(&mut self, on: bool) {
        self.use_graphs = on;
    }

    /// Batches of at least `n` tokens use cuBLAS GEMMs (when cuBLAS loaded);
    /// graphs captured so far are dropped.
    pub fn set_gemm_min(&mut self, n: usize) {
        self.gemm_min = n.max(1);
        self.gemm_min_float = n.max(1);
        self.graphs.iter_mut().for_each(|g| *g = None);
    }

    /// Whether one-token steps run the layers' norms and residual adds
    /// inside their GEMVs ([`CudaOptions::fuse_norm`], pre- or post-norm).
    pub fn fused_norms(&self) -> bool {
        self.fuse_norm || self.fuse_post
    }

    /// How batches of many tokens are multiplied: "cuBLAS (≥ N tokens)" or
    /// why GEMV kernels are used throughout.
    pub fn gemm_info(&self) -> String {
        match (&self.blas, &self.blas_note) {
            (Some(_), _) => format!(
                "cuBLAS for batches of ≥ {} tokens (float weights: ≥ {})",
                self.gemm_min,
                self.gemm_min_float.min(self.gemm_min)
            ),
            (None, Some(n)) => format!("GEMV kernels only (cuBLAS: {n})"),
            (None, None) => "GEMV kernels only".into(),
        }
    }

    fn validate(&self, batch: &Batch<'_>, kvt: &KvTables) -> Result<()> {
        batch.check(self.desc.vocab_size, self.max_batch, kvt)
    }

    /// Fills and uploads the per-call inputs; returns the logits row count.
    /// With `chain`, the step's tokens are the ids the step before sampled.
    fn stage(&mut self, batch: &Batch<'_>, kvt: &KvTables, chain: bool) -> Result<usize> {
        let n = batch.len();
        let ml = self.ml.for_tokens(n);
        self.ml = ml;
        let hm = &mut self.host_meta;
        hm[ml.chain] = chain.into();
        self.row_seqs.clear();
        let mut k = 0;
        for i in 0..n {
            let (pos, seq) = (batch.positions[i], batch.seqs[i]);
            hm[ml.tokens + i] = batch.tokens[i];
            hm[ml.positions + i] = pos;
            hm[ml.ends + i] = if self.desc.causal {
                pos + 1
            } else {
                (kvt.len(seq as usize) as u32).max(pos + 1)
            };
            let row = match self.row_seqs.iter().position(|&s| s == seq) {
                Some(r) => r,
                None => {
                    if self.row_seqs.len() >= ml.rows_max {
                        return Err(EngineError::Input(format!(
                            "more than {} sequences in one batch",
                            ml.rows_max
                        )));
                    }
                    self.row_seqs.push(seq);
                    for g in 0..self.layout.groups.len() {
                        let t = kvt.table(seq as usize, g);
                        let r = self.row_seqs.len() - 1;
                        let at = ml.tables + g * ml.table_len + r * ml.tstride;
                        let len = t.len().min(ml.tstride);
                        hm[at..at + len].copy_from_slice(&t[..len]);
                    }
                    self.row_seqs.len() - 1
                }
            };
            hm[ml.rowidx + i] = row as u32;
            if batch.want_logits[i] {
                hm[ml.sel + k] = i as u32;
                k += 1;
            }
        }
        self.gpu.bind()?;
        let used = ml.used(self.row_seqs.len());
        self.gpu
            .upload_async(self.s.meta.ptr, &self.host_meta[..used])?;
        Ok(k)
    }

    fn meta_ptr(&self, off: usize) -> u64 {
        self.s.meta.ptr + off as u64 * 4
    }

    /// The format cuBLAS reads x in when a product with `mat` over `n`
    /// tokens is a GEMM (0 f16, 1 bf16, -1 f32 as it is), or None (a GEMV).
    fn gemm_fmt(&self, mat: &DMat, n: usize) -> Option<i32> {
        if self.uses_mmq(mat, n) {
            return None;
        }
        let float = matches!(mat.ty, GgmlType::F32 | GgmlType::F16 | GgmlType::BF16);
        let gemm = n >= self.gemm_min || (float && n >= self.gemm_min_float);
        (gemm && self.blas.is_some()).then_some(match mat.ty {
            GgmlType::F32 => -1,
            GgmlType::BF16 => 1,
            _ => 0,
        })
    }

    /// Where the producer of `p`'s input over `n` tokens writes it as the
    /// 16-bit floats its GEMMs read (`s.xh`, format), sparing a conversion
    /// pass: when every part reads the same 16-bit format; else nulls.
    fn half_args(&self, p: &Proj, n: usize) -> [Arg; 2] {
        let mut fmts = p.parts.iter().map(|(m, _)| self.gemm_fmt(m, n));
        match (fmts.next().flatten(), &self.s.xh) {
            (Some(f), Some(xh)) if f >= 0 && fmts.all(|g| g == Some(f)) => {
                [Arg::P(xh.ptr), Arg::I(f)]
            }
            _ => [Arg::P(0), Arg::I(0)],
        }
    }

    /// Whether a one-token product with `mat` reads 8-bit activations.
    fn uses_q8(&self, mat: &DMat) -> bool {
        // Quantized rows hold whole blocks (cols % block size == 0, checked at
        // load), so every unit of 32 is complete.
        !self.exact && self.k.mvq[mat.kernel].is_some()
    }

    /// Quantizes one token's activations `x` (`cols` values) into `s.xq`.
    fn quantize_x(&self, x: u64, cols: usize, n: usize) -> CuResult<()> {
        let nb = n * cols / 32;
        self.gpu.launch(
            self.k.quantize_q8,
            (nb.div_ceil(8) as u32, 1, 1),
            256,
            &[
                Arg::P(x),
                Arg::I(nb as i32),
                Arg::P(self.s.xq.ptr),
                Arg::P(self.s.xq_d.ptr),
                Arg::P(self.s.xq_s.ptr),
            ],
        )
    }

    /// The streaming one-token GEMV for `mat` when it takes `n` tokens,
    /// from `table` (`mvqs` or one of its fused versions).
    fn streaming(
        &self,
        table: &[Option<[cudarc::driver::sys::CUfunction; 2]>],
        mat: &DMat,
        n: usize,
    ) -> Option<cudarc::driver::sys::CUfunction> {
        let id = mat.kernel;
        let fs = table[id].filter(|_| n == 1 && self.mv_path(1) && self.uses_q8(mat))?;
        let (u, _) = mvqs_kernel(mat.ty, id >= REPACKED, mat.cols)?;
        // U = 4, 8: kernels 0, 1.
        Some(fs[u.trailing_zeros() as usize - 2])
    }

    /// The one-token GEMV doing `fuse` for `mat` (None: there is none),
    /// and how it launches. The streaming kernel stages x per block anyway
    /// (Q4_0); the `mvq_*r` types get its norm-staging version and a
    /// residual add after their own kernel; the float one stages the
    /// normalized row once per block (NOTES.md item 31; item 29's per-row
    /// bf16 versions lost).
    fn fused_kernel(
        &self,
        mat: &DMat,
        fuse: Fuse,
    ) -> Option<(cudarc::driver::sys::CUfunction, FusedLaunch)> {
        let (streaming, preload, float) = match fuse {
            Fuse::None => (&self.k.mvqs, None, Some(&self.k.mvf)),
            Fuse::Norm { post, .. } if post.is_some() => (
                &self.k.mvqsnq,
                Some((&self.k.mvqpnq, FusedLaunch::Staged)),
                Some(&self.k.mvfnq),
            ),
            Fuse::NormGlu { post, .. } if post.is_some() => (
                &self.k.mvqsgq,
                Some((&self.k.mvqpgq, FusedLaunch::Staged)),
                None,
            ),
            Fuse::Norm { .. } => (
                &self.k.mvqsn,
                Some((&self.k.mvqpn, FusedLaunch::Staged)),
                Some(&self.k.mvfn),
            ),
            Fuse::Residual => (
                &self.k.mvqsr,
                Some((&self.k.mvqa, FusedLaunch::Preload)),
                Some(&self.k.mvfr),
            ),
            Fuse::NormGlu { .. } => (
                &self.k.mvqsg,
                Some((&self.k.mvqpg, FusedLaunch::Staged)),
                Some(&self.k.mvfg),
            ),
        };
        // The GLU kernel's short-row version (pre-norm layers).
        let short = |f| match fuse {
            Fuse::NormGlu { post, .. } if !post.is_some() => short_slot(mat.kernel, mat.cols)
                .and_then(|i| self.k.mvqsg_short[mat.kernel][i])
                .unwrap_or(f),
            _ => f,
        };
        if let Some(f) = self.streaming(streaming, mat, 1) {
            return Some((f, FusedLaunch::Staged));
        }
        if self.mv_path(1) && self.uses_q8(mat) {
            // As `mm` picks `mvq2` over `mvq`.
            let narrow = mvq_narrow(mat.ty, mat.kernel >= REPACKED, mat.cols);
            // The streaming residual kernel where there is one (`mvqpr`).
            if let (Fuse::Residual, Some(f)) = (fuse, self.k.mvqpr[mat.kernel]) {
                if mat.cols <= MVQS_COLS && !narrow {
                    return Some((f, FusedLaunch::Staged));
                }
            }
            let [plain, two] = preload.map_or([None; 2], |(t, _)| t[mat.kernel]);
            let f = two.filter(|_| narrow).or(plain.map(short))?;
            return preload.map(|(_, l)| (f, l));
        }
        #[allow(clippy::manual_is_multiple_of)] // rust-version 1.85
        let aligned16 = mat.row_bytes % 16 == 0 && mat.ptr() % 16 == 0;
        float?[mat.kernel]
            .filter(|_| aligned16 && self.mv_path(1))
            .map(|f| (f, FusedLaunch::Float))
    }

    /// Whether every decode layer can run with [`CudaOptions::fuse_norm`]:
    /// RMSNorms without bias of rows that `add_norm` holds in one block
    /// (so the GEMVs sum squares in its order), no post-norms, and one-token
    /// GEMVs with the fused versions for every matrix.
    fn norm_fusable(&self) -> bool {
        let d = &self.desc;
        let norm = Fuse::Norm {
            w: 0,
            eps: 0.0,
            post: Post::NONE,
        };
        d.norm == NormKind::Rms
            && d.hidden <= 4096
            && self.layers.iter().all(|l| {
                l.attn_norm.b.is_none()
                    && l.ffn_norm.b.is_none()
                    && l.post_attn_norm.is_none()
                    && l.post_ffn_norm.is_none()
                    && self.proj_fused(&l.qkv, norm)
                    && self.proj_fused(&l.gate_up, norm)
                    && l.o.parts.len() == 1
                    && l.down.parts.len() == 1
                    && self.proj_fused(&l.o, Fuse::Residual)
                    && self.proj_fused(&l.down, Fuse::Residual)
            })
    }

    /// Whether every matrix of `p` has a one-token GEMV doing `f`.
    fn proj_fused(&self, p: &Proj, f: Fuse) -> bool {
        p.parts
            .iter()
            .all(|(m, _)| self.fused_kernel(m, f).is_some())
    }

    /// Whether every decode layer of a post-norm model (Gemma 3) can run
    /// its add_norms inside the next norm-staging product ([`Post`]):
    /// RMSNorms without bias of rows that `add_norm` holds in one block,
    /// both post-norms in every layer, and staging kernels behind a
    /// post-norm for every QKV and gate|up matrix (the first layer's QKV:
    /// without one). The O and down products stay plain.
    fn post_fusable(&self) -> bool {
        let d = &self.desc;
        let any = Post { y: 1, w: 1, xo: 1 };
        let staged = |p: &Proj, post: Post| {
            let f = Fuse::Norm {
                w: 0,
                eps: 0.0,
                post,
            };
            self.proj_fused(p, f)
        };
        let plain = |n: &Option<DNorm>| n.as_ref().is_some_and(|n| n.b.is_none());
        d.norm == NormKind::Rms
            && d.hidden <= 4096
            && self
                .layers
                .first()
                .is_some_and(|l| staged(&l.qkv, Post::NONE))
            && self.layers.iter().all(|l| {
                l.attn_norm.b.is_none()
                    && l.ffn_norm.b.is_none()
                    && plain(&l.post_attn_norm)
                    && plain(&l.post_ffn_norm)
                    && staged(&l.qkv, any)
                    && staged(&l.gate_up, any)
            })
    }

    /// [`Fuse::NormGlu`] for layer `l`'s gate|up product in a step whose
    /// norms are fused (`fused`), where it applies: a gated FFN of whole
    /// 32-value blocks, one gate|up matrix with the streaming GLU kernel,
    /// and a down product reading 8-bit x.
    /// `post`: the post-norm add before it ([`Post`]).
    fn glu_fuse(&self, l: &DLayer, fused: bool, post: Post) -> Option<Fuse> {
        let d = &self.desc;
        let [(m, _)] = l.gate_up.parts.as_slice() else {
            return None;
        };
        #[allow(clippy::manual_is_multiple_of)] // rust-version 1.85
        let shape = d.gated_ffn && d.intermediate % 32 == 0 && m.rows == 2 * d.intermediate;
        let glu = Fuse::NormGlu {
            w: l.ffn_norm.w.ptr,
            eps: d.norm_eps,
            act: act_kind(d.activation),
            post,
        };
        // The down product's x: 8-bit (the quantized GLU kernels quantize it) or, float
        // weights both, f32 (`mvfg_*` writes it, rows of at least MVFG_MIN_ROW_BYTES; no
        // post-norm version: fused_kernel below).
        let x_for_down = self.proj_q8(&l.down, 1)
            || (l.gate_up.is_float() && m.row_bytes >= self.mvfg_min && l.down.is_float());
        (fused && self.fuse_glu && shape && x_for_down)
            .then_some(glu)
            .filter(|&g| self.fused_kernel(m, g).is_some())
    }

    /// A two-matrix projection's one-token product under a fused norm as
    /// one launch (`mvqsnp_*`, `mvqsnpq_*` behind a post-norm), where a
    /// kernel takes the pair of types; false: the caller launches a kernel
    /// per matrix.
    fn mm_norm_pair(&self, p: &Proj, x: u64, y: u64, fuse: Fuse) -> CuResult<bool> {
        let Fuse::Norm { w: nw, eps, post } = fuse else {
            return Ok(false);
        };
        let [(a, _), (b, _)] = p.parts.as_slice() else {
            return Ok(false);
        };
        let pair = (a.kernel, b.kernel);
        let Some(&NormPair {
            f, short, post: fq, ..
        }) = self.k.mvqsnp.iter().find(|p| p.ids == pair)
        else {
            return Ok(false);
        };
        // The short-row version by its first matrix's rows a chunk (pre-norm
        // layers: behind a post-norm they lost, NOTES.md item 109).
        let f = if post.is_some() {
            fq
        } else {
            short_slot(a.kernel, a.cols)
                .and_then(|i| short[i])
                .unwrap_or(f)
        };
        // Only where each matrix alone would take its staged kernel.
        let staged = |m: &DMat| {
            self.fused_kernel(m, fuse)
                .is_some_and(|(_, l)| l == FusedLaunch::Staged)
        };
        if !(staged(a) && staged(b) && a.cols <= MVQS_COLS) {
            return Ok(false);
        }
        // A row a warp for both matrices where that is a block an SM at
        // most; otherwise the resident grid split in proportion to their
        // bytes, neither getting more than its rows need. (Split by bytes,
        // Gemma-3-1B's Q|K got 74 of its 80 blocks and those warps' second
        // rows ended the launch ~1 µs late; where the blocks share SMs the
        // split by bytes was faster: NOTES.md item 112.)
        let warps = MVQS_THREADS as usize / 32;
        let (need_a, need_b) = (a.rows.div_ceil(warps), b.rows.div_ceil(warps));
        let (blocks_a, blocks_b) = if need_a + need_b <= self.gpu.info.sms as usize {
            (need_a, need_b)
        } else {
            let total = self
                .resident_grid(f, MVQS_THREADS)
                .min(need_a + need_b)
                .max(2);
            let blocks_a = (total * a.bytes())
                .div_ceil(a.bytes() + b.bytes())
                .clamp(1, total - 1)
                .min(need_a);
            (blocks_a, (total - blocks_a).min(need_b))
        };
        let args = [
            Arg::P(a.ptr()),
            Arg::P(a.row_bytes as u64),
            Arg::I(a.rows as i32),
            Arg::I(a.cols as i32),
            Arg::P(x),
            Arg::P(y),
            Arg::P(p.bias.as_ref().map_or(0, |b| b.ptr)),
            Arg::P(nw),
            Arg::F(eps),
            Arg::P(b.ptr()),
            Arg::P(b.row_bytes as u64),
            Arg::I(b.rows as i32),
            Arg::I(blocks_a as i32),
        ];
        let grid = (blocks_a + blocks_b) as u32;
        let args = ArgList::of(&[&args, post.args().get()]);
        self.gpu.launch(f, (grid, 1, 1), MVQS_THREADS, args.get())?;
        Ok(true)
    }

    /// Blocks of `block` threads of `f` that fit resident on the GPU at
    /// once (`$KILN_CUDA_NORM_BLOCKS` an SM if set): the grid of the
    /// kernels whose warps loop over rows.
    fn resident_grid(&self, f: cudarc::driver::sys::CUfunction, block: u32) -> usize {
        let per_sm = self
            .norm_blocks
            .unwrap_or_else(|| self.gpu.blocks_per_sm(f, block) as usize);
        per_sm.max(1) * self.gpu.info.sms as usize
    }

    /// `mm` for one token with a [`Fuse`] other than None.
    fn mm_fused(&self, mat: &DMat, o: Operands) -> CuResult<()> {
        let (f, launch) = self
            .fused_kernel(mat, o.fuse)
            .ok_or_else(|| CudaError(format!("no fused one-token GEMV for {}", mat.ty)))?;
        let w = [
            Arg::P(mat.ptr()),
            Arg::P(mat.row_bytes as u64),
            Arg::I(mat.rows as i32),
            Arg::I(mat.cols as i32),
        ];
        let out = [Arg::P(o.y), Arg::P(o.bias)];
        // The post-norm kernels' last arguments.
        let post = match o.fuse {
            Fuse::Norm { post, .. } | Fuse::NormGlu { post, .. } => post,
            _ => Post::NONE,
        };
        let post_args = post.args();
        let tail = post_args.get();
        let args = match o.fuse {
            // x: the residual stream in f32.
            Fuse::Norm { w: nw, eps, .. } => {
                ArgList::of(&[&w, &[Arg::P(o.x)], &out, &[Arg::P(nw), Arg::F(eps)], tail])
            }
            // The float GLU kernel writes the down product's f32 x to y.
            Fuse::NormGlu {
                w: nw, eps, act, ..
            } if launch == FusedLaunch::Float => ArgList::of(&[
                &w,
                &[Arg::P(o.x)],
                &out,
                &[Arg::P(nw), Arg::F(eps), Arg::I(act)],
            ]),
            Fuse::NormGlu {
                w: nw, eps, act, ..
            } => {
                let glu = [
                    Arg::P(nw),
                    Arg::F(eps),
                    Arg::I((mat.rows / 2) as i32),
                    Arg::I(act),
                ];
                ArgList::of(&[&w, &[Arg::P(o.x)], &out, &glu, &self.xq_args(true), tail])
            }
            _ if launch == FusedLaunch::Float => ArgList::of(&[&w, &[Arg::P(o.x)], &out]),
            _ => ArgList::of(&[&w, &self.xq_args(true), &out]),
        };
        // MVFN_THREADS (gemv.cu) for the float ones, 8 warps for `mvqa_*`.
        let block = match launch {
            FusedLaunch::Staged => MVQS_THREADS,
            FusedLaunch::Preload | FusedLaunch::Float => 256,
        };
        let mut grid = mat.rows.div_ceil(block as usize / 32);
        // The streaming residual kernel (`mvqsr*`) loops over rows too, so it
        // gets the same resident grid: the 8B's down product as a row a warp
        // was two waves of 256 blocks (tg256 the same either way, NOTES.md
        // item 68).
        let resident = o.fuse == Fuse::Residual && launch == FusedLaunch::Staged;
        if resident || matches!(o.fuse, Fuse::Norm { .. } | Fuse::NormGlu { .. }) {
            // What fits resident, each warp looping over rows: the block's
            // norm is taken once, behind its first weight loads. (A row per
            // warp: every later wave of blocks paid it again, in series:
            // 8B Q4_0 418 -> 278 tok/s.)
            grid = grid.min(self.resident_grid(f, block));
        }
        if matches!(o.fuse, Fuse::NormGlu { .. }) && launch != FusedLaunch::Float {
            grid = glu_grid(mat.rows / 64, grid);
        }
        self.gpu.launch(f, (grid as u32, 1, 1), block, args.get())
    }

    /// y[t][r] = mat[r] . x[t] + bias[r] ([`Operands`]).
    /// One-token products of quantized weights read `s.xq`, which the caller
    /// filled from `x` ([`CudaBackend::quantize_x`]) when [`CudaBackend::uses_q8`].
    fn mm(&self, mat: &DMat, o: Operands) -> CuResult<()> {
        self.mm_rows(mat, o, false).map(|_| ())
    }

    /// [`Self::mm`], leaving a split tensor-core product's sums unreduced
    /// when `fold` (and y has neither bias nor gaps): the caller's
    /// `add_norm` adds them.
    fn mm_rows(&self, mat: &DMat, o: Operands, fold: bool) -> CuResult<Rows> {
        if o.fuse != Fuse::None {
            return self.mm_fused(mat, o).map(|_| Rows::at(o.y));
        }
        if let (Some(f), Some(part)) = (self.mmq_kernels(mat, o.n), &self.s.mmq_part) {
            let call = MmqCall {
                w: mat.ptr(),
                row_bytes: mat.row_bytes,
                rows: mat.rows,
                cols: mat.cols,
                xq: self.xq_args(true),
                n: o.n,
                y: o.y,
                ystride: o.ystride,
                bias: o.bias,
                part: part.ptr,
                part_floats: self.s.mmq_part_floats,
            };
            let fold = fold && o.bias == 0 && o.ystride == mat.rows;
            let parts = call.launch(&self.gpu, f, self.k.mmq_reduce, fold)?;
            return Ok(if parts > 1 {
                Rows {
                    ptr: part.ptr,
                    parts,
                    stride: o.n * mat.rows,
                }
            } else {
                Rows::at(o.y)
            });
        }
        self.mm_float_or_gemv(mat, o).map(|_| Rows::at(o.y))
    }

    /// [`Self::mm`] through cuBLAS or the GEMVs.
    fn mm_float_or_gemv(&self, mat: &DMat, o: Operands) -> CuResult<()> {
        if let Some((f, threads)) = self.streaming_nt(mat, o.n) {
            let grid = mat.rows.div_ceil(threads as usize / 32) as u32;
            let xq = self.xq_args(true);
            return self.gpu.launch(
                f,
                (grid, 1, 1),
                threads,
                &[
                    Arg::P(mat.ptr()),
                    Arg::P(mat.row_bytes as u64),
                    Arg::I(mat.rows as i32),
                    Arg::I(mat.cols as i32),
                    xq[0],
                    xq[1],
                    xq[2],
                    Arg::P(o.y),
                    Arg::I(o.ystride as i32),
                    Arg::P(o.bias),
                ],
            );
        }
        if let (Some(fmt), Some(bl)) = (self.gemm_fmt(mat, o.n), &self.blas) {
            return self.gemm(bl, mat, fmt, o);
        }
        let Operands {
            bias,
            x,
            n,
            y,
            ystride,
            ..
        } = o;
        let id = mat.kernel;
        let w = [
            Arg::P(mat.ptr()),
            Arg::P(mat.row_bytes as u64),
            Arg::I(mat.rows as i32),
            Arg::I(mat.cols as i32),
        ];
        let xq = self.xq_args(true);
        // The kernels' argument lists: weights, then x (f32 or 8-bit), then
        // for several tokens their count, then y (with its row stride) and bias.
        let one = |x: &[Arg]| ArgList::of(&[&w, x, &[Arg::P(y), Arg::P(bias)]]);
        let many = |x: &[Arg]| {
            ArgList::of(&[
                &w,
                x,
                &[
                    Arg::I(n as i32),
                    Arg::P(y),
                    Arg::I(ystride as i32),
                    Arg::P(bias),
                ],
            ])
        };
        const MV_WARPS: usize = 8;
        let block = (MV_WARPS * 32) as u32;
        let rows_per = |r: usize| mat.rows.div_ceil(MV_WARPS * r) as u32;
        #[allow(clippy::manual_is_multiple_of)] // rust-version 1.85
        let aligned16 = mat.row_bytes % 16 == 0 && mat.ptr() % 16 == 0;
        let q8 = self.mat_q8(mat, n);
        if n == 1 && self.mv_path(1) {
            if let Some(f) = self.streaming(&self.k.mvqs, mat, n) {
                let (shifted, threads) = plain_streaming(mat.ty, mat.cols);
                let f = if shifted { self.k.mvqs4s } else { f };
                let grid = mat.rows.div_ceil(threads as usize / 32) as u32;
                return self.gpu.launch(f, (grid, 1, 1), threads, one(&xq).get());
            }
            let narrow = mvq_narrow(mat.ty, id >= REPACKED, mat.cols);
            let plain = self.k.mvq[id];
            if let (true, Some(f)) = (q8, self.k.mvq2[id].filter(|_| narrow).or(plain)) {
                return self
                    .gpu
                    .launch(f, (rows_per(MVQ_ROWS), 1, 1), block, one(&xq).get());
            }
            if let (true, Some(f)) = (aligned16, self.k.mvf[id]) {
                return self
                    .gpu
                    .launch(f, (rows_per(1), 1, 1), block, one(&[Arg::P(x)]).get());
            }
        }
        if n > 1 && self.mv_path(n) {
            let tiles = n.div_ceil(MV_NT) as u32;
            if let (true, Some(f)) = (q8, self.k.mvq_nt[id]) {
                return self
                    .gpu
                    .launch(f, (rows_per(1), tiles, 1), block, many(&xq).get());
            }
            if let (true, Some(f)) = (aligned16, self.k.mvf_nt[id]) {
                let grid = (rows_per(MVF_NT_ROWS), tiles, 1);
                return self.gpu.launch(f, grid, block, many(&[Arg::P(x)]).get());
            }
        }
        if n == 1 {
            if let Some(f) = self.k.mv[id] {
                // 4 warps of 4 rows each.
                let grid = (mat.rows.div_ceil(16) as u32, 1, 1);
                return self.gpu.launch(f, grid, 128, one(&[Arg::P(x)]).get());
            }
        }
        let fs =
            self.k.mm[id].ok_or_else(|| CudaError(format!("no GEMV kernel for {}", mat.ty)))?;
        let (fi, nt) = match n {
            1 => (0, 1),
            2 => (1, 2),
            3 | 4 => (2, 4),
            _ => (3, 8),
        };
        // 4 warps, a row each, nt tokens per block.
        let grid = (mat.rows.div_ceil(4) as u32, n.div_ceil(nt) as u32, 1);
        self.gpu.launch(fs[fi], grid, 128, many(&[Arg::P(x)]).get())
    }

    /// `mm` through cuBLAS: F32 weights as they are (f32 GEMM), F16/BF16
    /// weights as they are with x rounded to the same type, other types
    /// dequantized to f16 in row chunks; f32 accumulation and output.
    fn gemm(&self, bl: &Blas, mat: &DMat, fmt: i32, o: Operands) -> CuResult<()> {
        let Operands {
            bias,
            x,
            n,
            y,
            ystride,
            x_half,
            ..
        } = o;
        use bs::cudaDataType as Dt;
        use cudarc::cublas::sys as bs;
        let (rows, cols) = (mat.rows, mat.cols);
        let grid = |total: usize| (total.div_ceil(256).clamp(1, 65535) as u32, 1, 1);
        let dt = match fmt {
            -1 => Dt::CUDA_R_32F,
            1 => Dt::CUDA_R_16BF,
            _ => Dt::CUDA_R_16F,
        };
        let b_ptr = if fmt < 0 {
            x
        } else {
            let xh = self
                .s
                .xh
                .as_ref()
                .ok_or_else(|| CudaError("no GEMM scratch".into()))?;
            if !x_half {
                // to_half converts 8 values per thread step.
                self.gpu.launch(
                    self.k.to_half,
                    grid((n * cols).div_ceil(8)),
                    256,
                    &[
                        Arg::P(x),
                        Arg::P((n * cols) as u64),
                        Arg::P(xh.ptr),
                        Arg::I(fmt),
                    ],
                )?;
            }
            xh.ptr
        };
        let direct = matches!(mat.ty, GgmlType::F32 | GgmlType::F16 | GgmlType::BF16);
        let (alpha, beta) = (1.0f32, 0.0f32);
        let call = |a: u64, r0: usize, m: usize| -> CuResult<()> {
            // Column-major view: W is cols x rows (lda = cols), x is cols x n,
            // y is ystride x n; y[r0..r0+m] = W^T x.
            // SAFETY: the pointers are device buffers of the sizes above; the
            // handle's stream is the backend's stream.
            unsafe {
                bs::cublasGemmEx(
                    bl.handle,
                    bs::cublasOperation_t::CUBLAS_OP_T,
                    bs::cublasOperation_t::CUBLAS_OP_N,
                    m as i32,
                    n as i32,
                    cols as i32,
                    (&alpha) as *const f32 as *const _,
                    a as *const _,
                    dt,
                    cols as i32,
                    b_ptr as *const _,
                    dt,
                    cols as i32,
                    (&beta) as *const f32 as *const _,
                    (y + r0 as u64 * 4) as *mut _,
                    Dt::CUDA_R_32F,
                    ystride as i32,
                    bs::cublasComputeType_t::CUBLAS_COMPUTE_32F,
                    bs::cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
                )
                .result()
                .map_err(|e| CudaError(format!("cuBLAS GEMM {m}x{n}x{cols}: {e:?}")))
            }
        };
        if direct {
            call(mat.ptr(), 0, rows)?;
        } else {
            let wh = self
                .s
                .wh
                .as_ref()
                .ok_or_else(|| CudaError("no GEMM scratch".into()))?;
            let f = self.k.deq[mat.kernel]
                .ok_or_else(|| CudaError(format!("no dequantization kernel for {}", mat.ty)))?;
            let chunk = (self.s.deq_elems / cols).max(1).min(rows);
            let units = cols.div_ceil(32);
            let mut r0 = 0;
            while r0 < rows {
                let m = chunk.min(rows - r0);
                self.gpu.launch(
                    f,
                    ((m * units).div_ceil(256) as u32, 1, 1),
                    256,
                    &[
                        Arg::P(mat.ptr() + (r0 * mat.row_bytes) as u64),
                        Arg::P(mat.row_bytes as u64),
                        Arg::I(m as i32),
                        Arg::I(cols as i32),
                        Arg::P(wh.ptr),
                        Arg::I(0),
                    ],
                )?;
                call(wh.ptr, r0, m)?;
                r0 += m;
            }
        }
        if bias != 0 {
            self.gpu.launch(
                self.k.add_bias,
                grid(n * rows),
                256,
                &[
                    Arg::P(y),
                    Arg::I(ystride as i32),
                    Arg::I(rows as i32),
                    Arg::I(n as i32),
                    Arg::P(bias),
                ],
            )?;
        }
        Ok(())
    }

    /// Attention of a one-sequence chunk against every position up to its
    /// end, K/V gathered from the cache as f16: the flash kernel when there
    /// is one, else S = scale·Q Kᵀ and O = P V as f16 cuBLAS GEMMs with f32
    /// accumulation (batched over KV heads, once per query head of a group),
    /// P = `softmax_causal(S)`. Q is read from `s.qkv` (RoPE applied).
    /// `p0`: the chunk's first position; `grp`: the layer's KV group;
    /// `cache`: the layer's paged-cache arguments (block tables, their
    /// stride, block size, layers in the group, the layer's slot).
    fn attention_gemm(
        &self,
        n: usize,
        p0: usize,
        window: i32,
        grp: usize,
        cache: &[Arg],
    ) -> CuResult<()> {
        use bs::cudaDataType as Dt;
        use cudarc::cublas::sys as bs;
        let Some(kvh) = &self.s.kvh else {
            return Err(CudaError("no attention K/V scratch".into()));
        };
        let d = &self.desc;
        let (qd, kvd, hd) = (d.q_dim(), d.kv_dim(), d.head_dim);
        let qkv_dim = qd + 2 * kvd;
        let g = d.n_heads / d.n_kv_heads;
        // Keys: the positions the chunk's queries see, this chunk's included
        // (qkv_post has written them to the cache), as f16: K then V. Under a
        // sliding window they start at the first query's window, counted from
        // there on (p0 and the keys relative to `first`): the blocks before it
        // are released (NO_BLOCK in the table), and the masks only need the
        // positions' differences.
        let first = if window > 0 {
            (p0 + 1).saturating_sub(window as usize)
        } else {
            0
        };
        let (p0, keys) = (p0 - first, p0 + n - first);
        let (kh, vh) = (kvh.ptr, kvh.ptr + (keys * kvd * 2) as u64);
        let gather = ArgList::of(&[
            &[
                Arg::P(self.kv_k[grp].ptr),
                Arg::P(self.kv_v[grp].ptr),
                Arg::P(self.meta_ptr(self.ml.rowidx)),
            ],
            cache,
            &[
                Arg::I(first as i32),
                Arg::I(keys as i32),
                Arg::I(kvd as i32),
                Arg::P(kh),
                Arg::P(vh),
            ],
        ]);
        self.gpu.launch(
            self.k.gather_kv_half,
            ((keys * kvd).div_ceil(256).clamp(1, 65535) as u32, 1, 1),
            256,
            gather.get(),
        )?;
        if let Some(f) = self.flash {
            let call = FlashCall {
                q: self.s.qkv.ptr,
                qstride: qkv_dim,
                k: kh,
                v: vh,
                kvd,
                heads: d.n_heads,
                n,
                keys,
                p0,
                group: g,
                scale: d.attn_scale,
                softcap: d.attn_softcap.unwrap_or(0.0),
                window,
                out: self.s.att.ptr,
                ostride: qd,
            };
            return call.launch(&self.gpu, f);
        }
        let (Some(bl), Some(sb), Some(pb), Some(qh)) =
            (&self.blas, &self.s.att_s, &self.s.att_p, &self.s.qkvh)
        else {
            return Err(CudaError("no attention GEMM scratch".into()));
        };
        let total = n * qkv_dim;
        self.gpu.launch(
            self.k.to_half,
            (total.div_ceil(8 * 256).clamp(1, 65535) as u32, 1, 1),
            256,
            &[
                Arg::P(self.s.qkv.ptr),
                Arg::P(total as u64),
                Arg::P(qh.ptr),
                Arg::I(0),
            ],
        )?;
        let nn = (n * keys) as i64;
        let gemm = |ta,
                    m: usize,
                    nc: usize,
                    kk: usize,
                    alpha: f32,
                    a: u64,
                    lda: usize,
                    sa: i64,
                    b: u64,
                    ldb: usize,
                    sbt: i64,
                    c: u64,
                    ct,
                    ldc: usize,
                    sc: i64|
         -> CuResult<()> {
            let beta = 0.0f32;
            // SAFETY: device buffers sized for n <= att_gemm_cap; the handle
            // runs on the backend's stream.
            unsafe {
                bs::cublasGemmStridedBatchedEx(
                    bl.handle,
                    ta,
                    bs::cublasOperation_t::CUBLAS_OP_N,
                    m as i32,
                    nc as i32,
                    kk as i32,
                    (&alpha) as *const f32 as *const _,
                    a as *const _,
                    Dt::CUDA_R_16F,
                    lda as i32,
                    sa,
                    b as *const _,
                    Dt::CUDA_R_16F,
                    ldb as i32,
                    sbt,
                    (&beta) as *const f32 as *const _,
                    c as *mut _,
                    ct,
                    ldc as i32,
                    sc,
                    d.n_kv_heads as i32,
                    bs::cublasComputeType_t::CUBLAS_COMPUTE_32F,
                    bs::cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
                )
                .result()
                .map_err(|e| CudaError(format!("cuBLAS attention GEMM {m}x{nc}x{kk}: {e:?}")))
            }
        };
        for j in 0..g {
            // Column-major: S_hᵀ (keys x n) = K_g (as hd x keys, transposed) · Q_h (hd x n).
            gemm(
                bs::cublasOperation_t::CUBLAS_OP_T,
                keys,
                n,
                hd,
                d.attn_scale,
                kh,
                kvd,
                hd as i64,
                qh.ptr + (j * hd * 2) as u64,
                qkv_dim,
                (g * hd) as i64,
                sb.ptr + (j as u64) * (nn as u64) * 4,
                Dt::CUDA_R_32F,
                keys,
                g as i64 * nn,
            )?;
        }
        self.gpu.launch(
            self.k.softmax_causal,
            (n as u32, d.n_heads as u32, 1),
            256,
            &[
                Arg::P(sb.ptr),
                Arg::P(pb.ptr),
                Arg::I(n as i32),
                Arg::I(keys as i32),
                Arg::I(p0 as i32),
                Arg::F(d.attn_softcap.unwrap_or(0.0)),
                Arg::I(window),
            ],
        )?;
        for j in 0..g {
            // Column-major: O_hᵀ (hd x n) = V_g (hd x keys) · P_hᵀ (keys x n).
            gemm(
                bs::cublasOperation_t::CUBLAS_OP_N,
                hd,
                n,
                keys,
                1.0,
                vh,
                kvd,
                hd as i64,
                pb.ptr + (j as u64) * (nn as u64) * 2,
                keys,
                g as i64 * nn,
                self.s.att.ptr + (j * hd * 4) as u64,
                Dt::CUDA_R_32F,
                qd,
                (g * hd) as i64,
            )?;
        }
        Ok(())
    }

    /// Whether a `p` over `n` tokens reads `s.xq` (8-bit activations).
    fn proj_q8(&self, p: &Proj, n: usize) -> bool {
        p.parts.iter().any(|(m, _)| self.mat_q8(m, n))
    }

    /// Whether the product of `mat` over `n` tokens reads 8-bit activations.
    fn mat_q8(&self, mat: &DMat, n: usize) -> bool {
        (self.mv_path(n) && self.uses_q8(mat)) || self.uses_mmq(mat, n)
    }

    /// Whether the product of `mat` over `n` tokens is a tensor-core one
    /// ([`MmqCall`]): steps of `mmq_min` tokens or more whose 8-bit
    /// activations fit the decode scratch (`mmq_max` tokens), up to the
    /// type's own bound (`MmqType::max_tokens`). Other matrices of such a
    /// step keep the few-token GEMVs or cuBLAS.
    fn uses_mmq(&self, mat: &DMat, n: usize) -> bool {
        self.mmq_kernels(mat, n).is_some()
    }

    /// The `mmq_*` kernels (one a token tile) of `mat` when
    /// [`Self::uses_mmq`].
    fn mmq_kernels(&self, mat: &DMat, n: usize) -> Option<&[cudarc::driver::sys::CUfunction; 4]> {
        let step = !self.exact
            && n >= self.mmq_min
            && n <= self.mmq_max.min(self.max_batch)
            && self.s.mmq_part.is_some();
        // The MMQ kernels read whole runs of 8 units: rows of cols % 256 == 0.
        #[allow(clippy::manual_is_multiple_of)] // rust-version 1.85
        let step = step && mat.cols % 256 == 0;
        let (f, max) = self.k.mmq[mat.kernel].as_ref().filter(|_| step)?;
        (n <= *max && self.streaming_nt(mat, n).is_none()).then_some(f)
    }

    /// The plain streaming kernel for a step of `n` tokens (2 to
    /// `mvqst_max`) of a repacked Q4_0 matrix, and its threads a block:
    /// each token's y the one-token kernel's bits.
    fn streaming_nt(&self, mat: &DMat, n: usize) -> Option<(cudarc::driver::sys::CUfunction, u32)> {
        if self.exact
            || n < MVQST_MIN
            || n > self.mvqst_max
            || !self.mv_path(n)
            || !self.uses_q8(mat)
        {
            return None;
        }
        let (u, _) = mvqs_kernel(mat.ty, mat.kernel >= REPACKED, mat.cols)?;
        let (shifted, threads) = plain_streaming(mat.ty, mat.cols);
        let form = match (u, shifted) {
            (_, true) => 2,
            (4, false) => 0,
            _ => 1,
        };
        Some((self.k.mvqst[n - MVQST_MIN][form], threads))
    }

    /// Whether products over `n` tokens use the decode GEMVs.
    fn mv_path(&self, n: usize) -> bool {
        n >= 1
            && n <= MV_TOKENS_MAX.min(self.max_batch)
            && (n < self.gemm_min || self.blas.is_none())
    }

    /// The 8-bit activation buffers for a producer kernel to fill when the
    /// consumer `p` reads them (else null pointers).
    fn q8_args(&self, p: &Proj, n: usize) -> [Arg; 3] {
        self.xq_args(self.proj_q8(p, n))
    }

    /// The 8-bit activation buffers (`s.xq`: values, scales, sums), or null
    /// pointers when `on` is false.
    fn xq_args(&self, on: bool) -> [Arg; 3] {
        if on {
            [
                Arg::P(self.s.xq.ptr),
                Arg::P(self.s.xq_d.ptr),
                Arg::P(self.s.xq_s.ptr),
            ]
        } else {
            [Arg::P(0), Arg::P(0), Arg::P(0)]
        }
    }

    /// y[t][..] = proj(x[t]) for n tokens, each part into its row range.
    /// `staged`: the producer of `x` also wrote what `p` reads instead of it
    /// over `n` tokens: `s.xq` ([`Self::q8_args`]) or `s.xh`
    /// ([`Self::half_args`]). `fuse`: see [`Fuse`] (one token). `fold` (for
    /// an `add_norm` to read y, with [`Self::fold_splits`]): a one-part
    /// projection's split tensor-core sums are left for it to add
    /// ([`Self::mm_rows`]); the returned [`Rows`] say where y is.
    #[allow(clippy::too_many_arguments)]
    fn proj(
        &self,
        p: &Proj,
        x: u64,
        n: usize,
        y: u64,
        ystride: usize,
        staged: bool,
        fuse: Fuse,
        fold: bool,
    ) -> CuResult<Rows> {
        let x_half = staged && !matches!(self.half_args(p, n)[0], Arg::P(0));
        // A norm-fused GEMV quantizes the normalized x itself.
        let own_q8 = matches!(fuse, Fuse::Norm { .. } | Fuse::NormGlu { .. });
        if !staged && !own_q8 && self.proj_q8(p, n) {
            if let Some((m, _)) = p.parts.first() {
                self.quantize_x(x, m.cols, n)?;
            }
        }
        if n == 1 && self.mm_norm_pair(p, x, y, fuse)? {
            return Ok(Rows::at(y));
        }
        let fold = fold && self.fold_splits && p.parts.len() == 1;
        let mut rows = Rows::at(y);
        for (mat, r0) in &p.parts {
            let bias = p.bias.as_ref().map_or(0, |b| b.ptr + *r0 as u64 * 4);
            let o = Operands {
                bias,
                x,
                n,
                y: y + *r0 as u64 * 4,
                ystride,
                x_half,
                fuse,
            };
            let r = self.mm_rows(mat, o, fold)?;
            if fold {
                rows = r;
            }
        }
        Ok(rows)
    }

    /// `x`: the residual stream (`s.x`, or where a post-norm staging left
    /// it). `next`: the projection that reads `out` (its 8-bit activations
    /// are filled here when it takes them).
    #[allow(clippy::too_many_arguments)]
    fn add_norm(
        &self,
        x: u64,
        n: usize,
        y: Rows,
        post: Option<&DNorm>,
        norm: Option<&DNorm>,
        out: u64,
        next: Option<&Proj>,
    ) -> CuResult<()> {
        let d = &self.desc;
        let (q, h) = match next {
            Some(p) if norm.is_some() => (self.q8_args(p, n), self.half_args(p, n)),
            _ => ([Arg::P(0), Arg::P(0), Arg::P(0)], [Arg::P(0), Arg::I(0)]),
        };
        // A cluster of blocks per token when the row splits into slices of
        // whole 32-value units that the blocks hold in registers (AN_V = 8
        // values per thread of at most 256), else one block per token.
        let hid = d.hidden;
        #[allow(clippy::manual_is_multiple_of)] // rust-version 1.85
        // Decode-sized steps only (below the GEMM threshold, as the GEMVs):
        // with hundreds of tokens one block each is parallel enough and the
        // clusters measured slower (pp512 -15 to -22%). And only rows that
        // one block cannot hold in registers (AN_THREADS * AN_V): a single
        // block leaves the next GEMV's early weight loads more SMs (decode
        // 1B Q8_0 1,191 -> 1,237 tok/s, 1B bf16 838 -> 851, 8B Q4_0 393 ->
        // 397 without the cluster at 2048 / 4096 values a row).
        let cluster = if self.clusters && n < self.gemm_min && hid > self.cluster_rows {
            [8usize, 4, 2]
                .into_iter()
                .find(|&c| hid % (32 * c) == 0 && hid / c <= 8 * 256)
        } else {
            None
        };
        let (f, grid, block, cl) = match cluster {
            Some(c) => (
                self.k.add_norm_cl,
                (c as u32, n as u32, 1),
                (hid / c).min(256) as u32,
                c as u32,
            ),
            // 512: AN_THREADS in common.cu.
            None => (self.k.add_norm, (n as u32, 1, 1), 512, 1),
        };
        self.gpu.launch_cluster(
            f,
            grid,
            block,
            cl,
            &[
                Arg::P(x),
                Arg::P(y.ptr),
                Arg::P(post.map_or(0, |p| p.w.ptr)),
                Arg::P(post.map_or(0, |p| opt_ptr(&p.b))),
                Arg::P(norm.map_or(0, |p| p.w.ptr)),
                Arg::P(norm.map_or(0, |p| opt_ptr(&p.b))),
                Arg::P(out),
                Arg::I(d.hidden as i32),
                Arg::F(d.norm_eps),
                Arg::I(norm_kind(d.norm)),
                q[0],
                q[1],
                q[2],
                h[0],
                h[1],
                Arg::I(y.parts as i32),
                Arg::P(y.stride as u64),
            ],
        )
    }

    /// Query heads a block of the split decode attention serves: 1 (not
    /// `grouped`), 4, or 8 where the tensor-core walk (`tc`: it applies to
    /// the step, so its kernels are loaded: [`AttReach::Far`] needs them)
    /// takes a group of 5-8 in one block (two blocks of 4 would each walk
    /// the group's K / V).
    fn att_heads_per_block(&self, grouped: bool, tc: bool) -> usize {
        let group = self.desc.n_heads / self.desc.n_kv_heads.max(1);
        match (grouped, tc) {
            (false, _) => 1,
            (true, true) if group > 4 => 8,
            _ => 4,
        }
    }

    /// Slices for the decode attention of `batch`: enough (head block,
    /// token, slice) blocks to fill the GPU `att_blocks` / SMs times over, a
    /// power of two up to `att_split`. It depends on the batch size only,
    /// not on the context length, so one captured graph serves a whole
    /// generation (the length-based count left 1-4 slices of 256 positions
    /// at contexts below 1024, each warp walking 64 positions in a row:
    /// 666 tok/s against 961 with 16 slices, 1B Q4_0 shape).
    fn split_for(&self, batch: &Batch<'_>, reach: AttReach) -> usize {
        let d = &self.desc;
        let grouped = matches!(reach, AttReach::Long | AttReach::Far);
        let per = self.att_heads_per_block(grouped, reach == AttReach::Far);
        let pairs = att_head_blocks(d.n_heads, d.n_kv_heads, per) * batch.len().max(1);
        let split = self
            .att_blocks
            .div_ceil(pairs)
            .min(self.att_split)
            .next_power_of_two();
        // Head dim 256: fewer slices where that lets the step take the deep
        // kernels (a block of 16 warps walks what 4 of 4 warps would); not
        // where the split is forced (att_blocks unbounded).
        if pairs * split > self.att_deep_blocks
            && batch.len() <= self.att_split_tokens
            && self.att_blocks != usize::MAX
        {
            let fit = (self.att_deep_blocks / pairs.max(1))
                .checked_ilog2()
                .map_or(0, |l| 1 << l);
            if fit >= self.att_deep_min_split && fit < split {
                return fit;
            }
        }
        split
    }

    /// The step's GEMV matrices as (pointer, bytes), one slot per GEMV in
    /// the order a decode step runs them: per layer QKV, O, gate|up, down;
    /// then the output projection ([`AheadPlan`]).
    fn reading_order(&self) -> Vec<Vec<(u64, u64)>> {
        let mats = |p: &Proj| -> Vec<(u64, u64)> {
            p.parts
                .iter()
                .map(|(m, _)| (m.ptr(), m.bytes() as u64))
                .collect()
        };
        let out = self.output.as_ref().unwrap_or(&self.embd);
        self.layers
            .iter()
            .flat_map(|l| [mats(&l.qkv), mats(&l.o), mats(&l.gate_up), mats(&l.down)])
            .chain([vec![(out.ptr(), out.bytes() as u64)]])
            .collect()
    }

    /// Enqueues the whole forward pass for `n` staged tokens, `k` of which
    /// want logits; with `greedy`, also the argmax of each logits row.
    /// `chunk`: the batch is one sequence's consecutive tokens from this
    /// position.
    /// `reach`: how the split decode attention is laid out.
    fn enqueue(
        &self,
        n: usize,
        k: usize,
        greedy: bool,
        split: usize,
        reach: AttReach,
        chunk: Option<usize>,
    ) -> CuResult<()> {
        let d = &self.desc;
        let s = &self.s;
        let ml = self.ml;
        let (hid, qd, kvd, inter) = (d.hidden, d.q_dim(), d.kv_dim(), d.intermediate);
        let qkv_dim = qd + 2 * kvd;

        let ef = self.k.embed[self.embd.kernel]
            .ok_or_else(|| CudaError(format!("no embedding kernel for {}", self.embd.ty)))?;
        self.gpu.launch(
            ef,
            (n as u32, 1, 1),
            128,
            &[
                Arg::P(self.embd.ptr()),
                Arg::P(self.embd.row_bytes as u64),
                Arg::I(hid as i32),
                Arg::P(self.meta_ptr(ml.tokens)),
                Arg::P(self.meta_ptr(ml.chain)),
                Arg::P(s.ids.ptr),
                Arg::P(self.meta_ptr(ml.positions)),
                Arg::F(d.embedding_scale),
                Arg::P(opt_ptr(&self.pos_embd)),
                Arg::P(s.x.ptr),
            ],
        )?;

        // The layers' norms and residual adds inside their GEMVs (one token):
        // x stays the residual stream, written by the O and down GEMVs.
        let fuse = n == 1 && self.fuse_norm && self.mv_path(1);
        // Post-norm layers (one token): each add_norm inside the next
        // norm-staging product, which writes the residual stream to the
        // other of s.x / s.x2 (`cur` is where it is); O and down plain.
        let pfuse = n == 1 && self.fuse_post && self.mv_path(1);
        let mut cur = s.x.ptr;
        let other = |p: u64| if p == s.x.ptr { s.x2.ptr } else { s.x.ptr };
        let norm_of = |nm: &DNorm, post: Post| {
            if fuse || pfuse {
                Fuse::Norm {
                    w: nm.w.ptr,
                    eps: d.norm_eps,
                    post,
                }
            } else {
                Fuse::None
            }
        };
        let (res, res_y, norm_x) = if fuse {
            (Fuse::Residual, s.x.ptr, s.x.ptr)
        } else {
            (Fuse::None, s.tmp.ptr, s.xn.ptr)
        };
        // A staging product's x, and the add_norm before it behind post-norm
        // `pn` of the product that wrote s.tmp where it applies (not before
        // the first layer): its Post, and the stream moves.
        let mut post_of = |pn: Option<&DNorm>| match pn {
            Some(pn) if pfuse => {
                let p = Post {
                    y: s.tmp.ptr,
                    w: pn.w.ptr,
                    xo: other(cur),
                };
                (p, std::mem::replace(&mut cur, p.xo))
            }
            _ => (Post::NONE, if pfuse { cur } else { norm_x }),
        };
        // L2 windows of one-token GEMV steps: GEMV slot 4 li + {0: QKV, 1:
        // O, 2: gate|up, 3: down}, taken only before a float GEMV.
        let cap = if self.mv_path(n) { self.l2_ahead } else { 0 };
        let mut plan = self.ahead_plan.windows(cap as u64);
        for (li, l) in self.layers.iter().enumerate() {
            let ld = d.layers[li];
            if li == 0 && !fuse && !pfuse {
                self.add_norm(
                    s.x.ptr,
                    n,
                    Rows::at(0),
                    None,
                    Some(&l.attn_norm),
                    s.xn.ptr,
                    Some(&l.qkv),
                )?;
            }
            let prev_post = li
                .checked_sub(1)
                .and_then(|p| self.layers[p].post_ffn_norm.as_ref());
            let (qkv_post, qkv_x) = post_of(prev_post);
            let qkv_norm = norm_of(&l.attn_norm, qkv_post);
            self.proj(&l.qkv, qkv_x, n, s.qkv.ptr, qkv_dim, true, qkv_norm, false)?;
            let (g, lig) = self.layout.layer_slot[li];
            let nlg = self.layout.groups[g].layers.len();
            let rope = self.ropes.get(ld.rope_table);
            // Where this layer's K/V rows sit in the paged cache (the same
            // arguments for every kernel that reads or writes it).
            let cache = [
                Arg::P(self.meta_ptr(ml.tables + g * ml.table_len)),
                Arg::I(ml.tstride as i32),
                Arg::I(self.layout.block_size as i32),
                Arg::I(nlg as i32),
                Arg::I(lig as i32),
            ];
            let qkv_args = ArgList::of(&[
                &[
                    Arg::P(s.qkv.ptr),
                    Arg::I(qkv_dim as i32),
                    Arg::I(d.n_heads as i32),
                    Arg::I(d.n_kv_heads as i32),
                    Arg::I(d.head_dim as i32),
                    Arg::P(opt_ptr(&l.q_norm)),
                    Arg::P(opt_ptr(&l.k_norm)),
                    Arg::F(d.norm_eps),
                    Arg::P(rope.map_or(0, |r| r.cos.ptr)),
                    Arg::P(rope.map_or(0, |r| r.sin.ptr)),
                    Arg::I(rope.map_or(0, |r| r.dim as i32)),
                    Arg::I(rope.map_or(0, |r| i32::from(r.neox))),
                    Arg::P(self.meta_ptr(ml.positions)),
                    Arg::P(self.meta_ptr(ml.rowidx)),
                ],
                &cache,
                &[Arg::P(self.kv_k[g].ptr), Arg::P(self.kv_v[g].ptr)],
            ]);
            let gemm_chunk = chunk.filter(|&p0| {
                n >= self.att_gemm_min && n <= self.att_gemm_cap && p0 + n <= self.att_gemm_keys
            });
            // qkv_post's work inside the decode attention (`attention_f*`):
            // one token per sequence (no token reads another's new K/V), RoPE
            // over whole heads of 64, 128 or 256 dims.
            let fused = self.fuse_qkv
                && d.causal
                && n < self.att_gqa_min
                && gemm_chunk.is_none()
                && self.row_seqs.len() == n
                && matches!(d.head_dim, 64 | 128 | 256)
                && rope.is_none_or(|r| r.dim == d.head_dim);
            if !fused {
                // A warp per (head, token), QP_WARPS = 4 a block.
                self.gpu.launch(
                    self.k.qkv_post,
                    (
                        (d.n_heads + 2 * d.n_kv_heads).div_ceil(4) as u32,
                        n as u32,
                        1,
                    ),
                    128,
                    qkv_args.get(),
                )?;
            }
            // Many tokens: one block per KV head and token (K/V read once per
            // GQA group); few (decode): one per query head, for parallelism.
            let gqa = match d.n_heads / d.n_kv_heads {
                2 => Some(0),
                4 => Some(1),
                8 => Some(2),
                _ => None,
            }
            .filter(|_| n >= self.att_gqa_min);
            let group = d.n_heads / d.n_kv_heads;
            let window = ld.window.map_or(0, |w| w.min(i32::MAX as usize) as i32);
            // The attention kernels' arguments around their shape arguments.
            let att_head = [
                Arg::P(s.qkv.ptr),
                Arg::I(qkv_dim as i32),
                Arg::P(self.kv_k[g].ptr),
                Arg::P(self.kv_v[g].ptr),
            ];
            let att_tail = ArgList::of(&[
                &[
                    Arg::P(self.meta_ptr(ml.positions)),
                    Arg::P(self.meta_ptr(ml.ends)),
                    Arg::P(self.meta_ptr(ml.rowidx)),
                ],
                &cache,
                &[
                    Arg::I(window),
                    Arg::F(d.attn_scale),
                    Arg::F(d.attn_softcap.unwrap_or(0.0)),
                    Arg::P(s.att.ptr),
                    Arg::I(qd as i32),
                ],
            ]);
            // Whether the attention also wrote what the O projection reads.
            let mut o_staged = false;
            if let Some(p0) = gemm_chunk {
                self.attention_gemm(n, p0, window, g, &cache)?;
            } else if n >= self.att_gqa_min
                && self.row_seqs.len() == 1
                && d.head_dim <= 128
                && d.head_dim & 3 == 0
                && group <= 32
                && 32 % group == 0
            {
                let tq = 32 / group;
                let shape = [
                    Arg::I(n as i32),
                    Arg::I(d.n_kv_heads as i32),
                    Arg::I(d.head_dim as i32),
                    Arg::I(group as i32),
                ];
                let args = ArgList::of(&[&att_head, &shape, att_tail.get()]);
                self.gpu.launch(
                    self.k.attention_tile,
                    (d.n_kv_heads as u32, n.div_ceil(tq) as u32, 1),
                    128,
                    args.get(),
                )?;
            } else {
                // Registers sized for the head: dims up to 64, 128, 256.
                let dpl = att_dpl(d.head_dim);
                // `att_group_ctx` is usize::MAX for head dims past 128.
                let grouped =
                    matches!(reach, AttReach::Long | AttReach::Far) && gqa.is_none() && dpl < 2;
                // The tensor-core walk (f16 cache, head dim 128) from
                // ATT_TC_CTX: 8B bf16 S_TG after 2,048 / 8,192 positions 244 /
                // 210 -> 247 / 228 tok/s (NOTES.md item 117).
                let tc_on = grouped && fused && reach == AttReach::Far;
                let per = self.att_heads_per_block(grouped, tc_on);
                let head_blocks = att_head_blocks(d.n_heads, d.n_kv_heads, per);
                // Steps past att_split_tokens take one slice.
                let split = if n <= self.att_split_tokens { split } else { 1 };
                // Head dim 256 in steps of few blocks: 16 warps a block.
                let deep = dpl == 2
                    && gqa.is_none()
                    && head_blocks * n * split.max(1) <= self.att_deep_blocks;
                let tc = self
                    .k
                    .attention_grouped_tc
                    .filter(|_| tc_on)
                    .map(|f| f[usize::from(per == 8)]);
                let att_dec = match (grouped, fused, tc) {
                    _ if deep => self.k.attention_deep[0][usize::from(fused)],
                    (_, _, Some(f)) => f[0],
                    (true, true, None) => self.k.attention_grouped_fused[dpl],
                    (true, false, None) => self.k.attention_grouped[dpl],
                    (false, true, None) => self.k.attention_fused[dpl],
                    (false, false, None) => self.k.attention[dpl],
                };
                let (att_f, att_heads, split) = match gqa {
                    Some(i) => (self.k.attention_gqa[i], d.n_kv_heads, 0),
                    None => (att_dec, head_blocks, split),
                };
                let shape = [
                    Arg::I(d.n_heads as i32),
                    Arg::I(d.n_kv_heads as i32),
                    Arg::I(d.head_dim as i32),
                ];
                // `attention` takes the split scratch (and what follows)
                // too; `attention_g*` stop before it (a launch reads only
                // its kernel's own).
                let scratch = [Arg::P(s.att_part.ptr), Arg::P(s.att_count.ptr)];
                // `attention_f*` also take qkv_post's norm and RoPE arguments.
                let post_args = [
                    Arg::P(opt_ptr(&l.q_norm)),
                    Arg::P(opt_ptr(&l.k_norm)),
                    Arg::F(d.norm_eps),
                    Arg::P(rope.map_or(0, |r| r.cos.ptr)),
                    Arg::P(rope.map_or(0, |r| r.sin.ptr)),
                    Arg::I(rope.map_or(0, |r| i32::from(r.neox))),
                ];
                let post: &[Arg] = if fused { &post_args } else { &[] };
                // `attention_d*` / `attention_f*` also write the O
                // projection's 8-bit input when it takes one (whole 32-dim
                // blocks: head dims a multiple of 32), sparing quantize_q8.
                #[allow(clippy::manual_is_multiple_of)] // rust-version 1.85
                let o_q8 = if gqa.is_none() && d.head_dim % 32 == 0 {
                    self.q8_args(&l.o, n)
                } else {
                    [Arg::P(0), Arg::P(0), Arg::P(0)]
                };
                o_staged = !matches!(o_q8[0], Arg::P(0));
                // The fused kernels' window versions take the window (head
                // dims up to 128: `attention_l2w` has no 256 form).
                let ahead = if fused && l.o.is_float() && dpl < 2 {
                    plan.before(4 * li + 1)
                } else {
                    Ahead::default()
                };
                let l2w = ahead != Ahead::default();
                let ahead = ahead.args();
                let window: &[Arg] = if l2w { &ahead } else { &[] };
                let args = ArgList::of(&[
                    &att_head,
                    &shape,
                    att_tail.get(),
                    &scratch,
                    &o_q8,
                    post,
                    window,
                ]);
                // Split attention of head dims 65-128 below
                // `att_cluster_ctx`, and of 129-256 at every depth: the
                // slices merged inside a cluster when they fit one. At 64 the
                // global merge is faster (1B shape, tg256, 16 slices: Q4_0
                // 1,772 / 1,780 -> 1,804 / 1,804 tok/s, bf16 881 / 890 -> 893
                // / 896; 8B, head dim 128: Q4_0 467 -> 462-465 without the
                // cluster). At 256 (Gemma 3: 4 heads, 16 slices, no grouped
                // kernel) the global merge took 8-10 us a layer (NOTES.md
                // items 110, 113).
                let cluster_merge = dpl == 2 || (dpl == 1 && reach == AttReach::Short);
                if reach == AttReach::Wide && fused && gqa.is_none() && n <= self.att_split_tokens {
                    // 32 warps for head dims up to 64, 16 up to 128 and up to
                    // 256 (attention.cu ATTENTION_WIDE).
                    let f = if dpl < 2 {
                        self.k.attention_wide[dpl][usize::from(l2w)]
                    } else {
                        self.k.attention_wide256
                    };
                    let warps = if dpl == 0 { 32 } else { 16 };
                    self.gpu
                        .launch(f, (d.n_heads as u32, n as u32, 1), 32 * warps, args.get())?;
                } else if cluster_merge
                    && gqa.is_none()
                    && split >= 2
                    && split
                        <= if deep {
                            self.att_deep_cluster_max
                        } else {
                            self.att_cluster_max
                        }
                {
                    let f = match () {
                        _ if l2w => self.k.attention_l2w[2],
                        _ if deep => self.k.attention_deep[1][usize::from(fused)],
                        _ => self.k.attention_cl[dpl - 1][usize::from(fused)],
                    };
                    self.gpu.launch_cluster(
                        f,
                        (split as u32, att_heads as u32, n as u32),
                        att_dec_threads(dpl, deep),
                        split as u32,
                        args.get(),
                    )?;
                } else {
                    // `attention_g*` keep ATT_WARPS (4) warps.
                    let block = if gqa.is_some() {
                        128
                    } else {
                        att_dec_threads(dpl, grouped || deep)
                    };
                    let f = match (l2w, grouped) {
                        (true, true) => tc.map_or(self.k.attention_grouped_l2w[dpl], |f| f[1]),
                        (true, false) => self.k.attention_l2w[dpl],
                        _ => att_f,
                    };
                    self.gpu.launch(
                        f,
                        (att_heads as u32, n as u32, split.max(1) as u32),
                        block,
                        args.get(),
                    )?;
                }
            }
            let o_rows = self.proj(&l.o, s.att.ptr, n, res_y, hid, o_staged, res, !fuse)?;
            if !fuse && !pfuse {
                self.add_norm(
                    s.x.ptr,
                    n,
                    o_rows,
                    l.post_attn_norm.as_ref(),
                    Some(&l.ffn_norm),
                    s.xn.ptr,
                    Some(&l.gate_up),
                )?;
            }
            let gu_stride = l.gate_up.rows;
            let (gu_post, gu_x) = post_of(l.post_attn_norm.as_ref());
            if let Some(glu) = self.glu_fuse(l, fuse || pfuse, gu_post) {
                // act_mul's work inside the gate|up GEMV (s.xq for down; float: s.act).
                let y = if l.gate_up.is_float() {
                    s.act.ptr
                } else {
                    s.gu.ptr
                };
                self.proj(&l.gate_up, gu_x, n, y, gu_stride, true, glu, false)?;
                self.proj(&l.down, s.act.ptr, n, res_y, hid, true, res, false)?;
                continue;
            }
            let gu_norm = norm_of(&l.ffn_norm, gu_post);
            self.proj(
                &l.gate_up, gu_x, n, s.gu.ptr, gu_stride, true, gu_norm, false,
            )?;
            #[allow(clippy::manual_is_multiple_of)] // rust-version 1.85
            let q = if inter % 32 == 0 {
                self.q8_args(&l.down, n)
            } else {
                [Arg::P(0), Arg::P(0), Arg::P(0)]
            };
            let h = self.half_args(&l.down, n);
            let down_staged = !matches!(q[0], Arg::P(0)) || !matches!(h[0], Arg::P(0));
            let ahead = if l.down.is_float() {
                let reach = self
                    .l2_ahead_act
                    .unwrap_or((l.down.bytes() / 4).min(L2_AHEAD_ACT_MAX));
                plan.before_cap(4 * li + 3, reach as u64)
            } else {
                Ahead::default()
            };
            let act_args = ArgList::of(&[
                &[
                    Arg::P(s.gu.ptr),
                    Arg::I(gu_stride as i32),
                    Arg::I(inter as i32),
                    Arg::I(n as i32),
                    Arg::I(i32::from(d.gated_ffn)),
                    Arg::I(act_kind(d.activation)),
                    Arg::P(s.act.ptr),
                    q[0],
                    q[1],
                    q[2],
                    h[0],
                    h[1],
                ],
                &ahead.args(),
            ]);
            self.gpu.launch(
                self.k.act_mul,
                (
                    inter.div_ceil(256).clamp(1, 8192) as u32,
                    n.min(65535) as u32,
                    1,
                ),
                256,
                act_args.get(),
            )?;
            let down_rows =
                self.proj(&l.down, s.act.ptr, n, res_y, hid, down_staged, res, !fuse)?;
            if fuse || pfuse {
                continue;
            }
            let next = self.layers.get(li + 1);
            self.add_norm(
                s.x.ptr,
                n,
                down_rows,
                l.post_ffn_norm.as_ref(),
                next.map(|nl| &nl.attn_norm),
                s.xn.ptr,
                next.map(|nl| &nl.qkv),
            )?;
        }
        if pfuse {
            // The last layer's post-norm add, on the stream where it is.
            let last = self.layers.last().and_then(|l| l.post_ffn_norm.as_ref());
            self.add_norm(cur, n, Rows::at(s.tmp.ptr), last, None, 0, None)?;
        }
        if k == 0 {
            return Ok(());
        }
        let out = self.output.as_ref().unwrap_or(&self.embd);
        // The output GEMV's 8-bit input, written by gather_norm.
        let q = self.xq_args(self.mat_q8(out, k));
        self.gpu.launch(
            self.k.gather_norm,
            (k as u32, 1, 1),
            256,
            &[
                Arg::P(cur),
                Arg::P(self.meta_ptr(ml.sel)),
                Arg::P(self.out_norm.w.ptr),
                Arg::P(opt_ptr(&self.out_norm.b)),
                Arg::P(s.seln.ptr),
                Arg::I(hid as i32),
                Arg::F(d.norm_eps),
                Arg::I(norm_kind(d.norm)),
                q[0],
                q[1],
                q[2],
            ],
        )?;
        self.mm(
            out,
            Operands {
                bias: 0,
                x: s.seln.ptr,
                n: k,
                y: s.logits.ptr,
                ystride: d.vocab_size,
                x_half: false,
                fuse: Fuse::None,
            },
        )?;
        if let Some(c) = d.final_softcap {
            let total = k * d.vocab_size;
            self.gpu.launch(
                self.k.softcap,
                (total.div_ceil(256).clamp(1, 8192) as u32, 1, 1),
                256,
                &[Arg::P(s.logits.ptr), Arg::P(total as u64), Arg::F(c)],
            )?;
        }
        if greedy {
            self.argmax(k)?;
        }
        Ok(())
    }

    /// `s.ids[r]` = the argmax of logits row r < k, each row in slices of
    /// ~4096 entries over up to ARGMAX_SLICES blocks.
    fn argmax(&self, k: usize) -> CuResult<()> {
        let cols = self.desc.vocab_size;
        let slices = argmax_slices(cols).min(self.argmax_max);
        let s = &self.s;
        self.gpu.launch(
            self.k.argmax,
            (slices as u32, k as u32, 1),
            256,
            &[
                Arg::P(s.logits.ptr),
                Arg::P(cols as u64),
                Arg::P(s.ids.ptr),
                Arg::P(s.am_part.ptr),
                Arg::P(s.am_part.ptr + (s.am_part.bytes / 2) as u64),
                Arg::P(s.am_count.ptr),
            ],
        )
    }

    /// The decode attention's layout for `batch`, by its furthest position.
    fn reach_of(&self, batch: &Batch<'_>) -> AttReach {
        let far = batch
            .positions
            .iter()
            .map(|&p| p as usize)
            .max()
            .unwrap_or(0);
        if batch.len() <= self.att_wide_tokens && far < self.att_wide_ctx {
            AttReach::Wide
        } else if far >= self.att_group_ctx.max(self.att_tc_ctx) {
            AttReach::Far
        } else if far >= self.att_group_ctx {
            AttReach::Long
        } else if far < self.att_cluster_ctx {
            AttReach::Short
        } else {
            AttReach::Mid
        }
    }

    /// Runs the staged step: replayed from a graph when it is a decode step
    /// (one token per sequence, all wanting logits) and graphs are on.
    fn run(&mut self, batch: &Batch<'_>, k: usize, greedy: bool) -> Result<()> {
        let n = batch.len();
        let reach = self.reach_of(batch);
        let split = self.split_for(batch, reach);
        let levels = self.att_split.trailing_zeros() as usize + 1;
        // Graphs are keyed by (n, split, reach, greedy): a greedy step's argmax is
        // the graph's last kernel, except where the step issues L2 windows:
        // replayed right behind the previous replay with no kernel launched
        // between them, the windows stop paying (~19 µs a step; NOTES.md
        // item 56, not understood), and the argmax launched after the
        // replay is that kernel.
        let windowed = self.float_windows && self.l2_ahead > 0 && self.mv_path(n);
        let greedy_in_graph = greedy
            && match self.graph_argmax {
                0 => false,
                1 => !windowed,
                _ => true,
            };
        let gi = 2
            * (ATT_REACHES * (n * levels + split.trailing_zeros() as usize) + reach as usize)
            + greedy_in_graph as usize;
        let decode_like =
            k == n && gi < self.graphs.len() && self.use_graphs && !repeats_seq(batch);
        if !decode_like {
            let p0 = batch.positions.first().map_or(0, |&p| p as usize);
            let chunk = self.row_seqs.len() == 1
                && batch
                    .positions
                    .iter()
                    .enumerate()
                    .all(|(i, &p)| p as usize == p0 + i);
            self.enqueue(n, k, greedy, split, reach, chunk.then_some(p0))?;
            return Ok(());
        }
        if self.graphs[gi].is_none() {
            self.gpu.begin_capture()?;
            let r = self.enqueue(n, k, greedy_in_graph, split, reach, None);
            let g = self.gpu.end_capture();
            r?;
            self.graphs[gi] = Some(g?);
        }
        let (reset, read) = self.timeline.as_mut().map_or((false, false), |t| t.step());
        if reset {
            self.gpu.timeline_reset()?;
        }
        if let Some(g) = &self.graphs[gi] {
            self.gpu.replay(g)?;
        }
        if greedy && !greedy_in_graph {
            self.argmax(k)?;
        }
        if read {
            let rows = self.gpu.timeline_read()?;
            if let Some(t) = &self.timeline {
                t.write(&rows)?;
            }
        }
        Ok(())
    }

    /// Like [`Backend::forward`], but only the greedy token id of each row
    /// that wants logits comes back (argmax on the GPU; lowest id on ties,
    /// as `kiln_core::sampler::argmax`).
    pub fn forward_greedy(
        &mut self,
        batch: &Batch<'_>,
        kv: &KvTables,
        ids: &mut [u32],
    ) -> Result<()> {
        self.forward_ids(batch, kv, None, ids)
    }
}

impl CudaBackend {
    /// Like [`CudaBackend::forward_greedy`], but each row that wants logits
    /// is sampled on the GPU with its own [`GpuSampling`] (Gumbel-max over
    /// the top k); only the ids come back.
    pub fn forward_sample(
        &mut self,
        batch: &Batch<'_>,
        kv: &KvTables,
        params: &[GpuSampling],
        ids: &mut [u32],
    ) -> Result<()> {
        self.forward_ids(batch, kv, Some(params), ids)
    }

    /// Runs `batch`, samples each logits row (`None`: greedy) and returns
    /// the ids.
    fn forward_ids(
        &mut self,
        batch: &Batch<'_>,
        kv: &KvTables,
        params: Option<&[GpuSampling]>,
        ids: &mut [u32],
    ) -> Result<()> {
        if batch.is_empty() {
            return Ok(());
        }
        if ids.len() < batch.n_logits() {
            return Err(EngineError::Input("ids buffer too small".into()));
        }
        let k = self.queue_sampled(batch, kv, params, false)?;
        if k > 0 {
            self.gpu.download_async(&mut ids[..k], self.s.ids.ptr)?;
        }
        self.gpu.sync()?;
        Ok(())
    }

    /// Queues `batch` and the sampling of each logits row into `s.ids`
    /// (by the argmax alone with no parameters or all rows greedy); with
    /// `chain`, the batch's tokens are first replaced on the device by the
    /// ids the previous queued step left in `s.ids`. Returns the rows.
    fn queue_sampled(
        &mut self,
        batch: &Batch<'_>,
        kv: &KvTables,
        params: Option<&[GpuSampling]>,
        chain: bool,
    ) -> Result<usize> {
        self.validate(batch, kv)?;
        let n = batch.len();
        let k = batch.n_logits();
        if params.is_some_and(|p| p.len() < k) {
            return Err(EngineError::Input(
                "sampling parameters shorter than the logits rows".into(),
            ));
        }
        if chain && k != n {
            return Err(EngineError::Input(
                "a chained step has one token per sequence, each wanting logits".into(),
            ));
        }
        self.stage(batch, kv, chain)?;
        let params = match params {
            Some(p) if p[..k].iter().any(|p| p.temperature > 0.0) => p,
            _ => {
                self.run(batch, k, true)?;
                return Ok(k);
            }
        };
        for (i, p) in params[..k].iter().enumerate() {
            self.host_samp[4 * i..4 * i + 4].copy_from_slice(&sampling_words(p));
        }
        self.gpu
            .upload_async(self.s.samp.ptr, &self.host_samp[..4 * k])?;
        self.run(batch, k, false)?;
        if k > 0 {
            self.gpu.launch(
                self.k.sample,
                (k as u32, 1, 1),
                1024,
                &[
                    Arg::P(self.s.logits.ptr),
                    Arg::P(self.desc.vocab_size as u64),
                    Arg::P(self.s.samp.ptr),
                    Arg::P(self.s.ids.ptr),
                ],
            )?;
        }
        Ok(k)
    }
}

/// Decode steps have one token per sequence; prefill chunks are never graphed.
fn repeats_seq(batch: &Batch<'_>) -> bool {
    let s = batch.seqs;
    (1..s.len()).any(|i| s[..i].contains(&s[i]))
}

impl Backend for CudaBackend {
    fn desc(&self) -> &ArchDescriptor {
        &self.desc
    }

    fn max_batch_tokens(&self) -> usize {
        self.max_batch
    }

    fn forward(&mut self, batch: &Batch<'_>, kv: &KvTables, logits: &mut [f32]) -> Result<()> {
        let n = batch.len();
        if n == 0 {
            return Ok(());
        }
        self.validate(batch, kv)?;
        let k = batch.n_logits();
        let vocab = self.desc.vocab_size;
        if logits.len() < k * vocab {
            return Err(EngineError::Input("logits buffer too small".into()));
        }
        self.stage(batch, kv, false)?;
        self.run(batch, k, false)?;
        // A step that returns nothing (a prefill chunk before the last) is
        // left running: the next step queues behind it on the stream.
        if k > 0 {
            self.gpu
                .download_async(&mut logits[..k * vocab], self.s.logits.ptr)?;
            self.gpu.sync()?;
        }
        Ok(())
    }

    fn samples_on_device(&self) -> bool {
        true
    }

    fn copy_bandwidth(&mut self) -> Option<f64> {
        // 256 MiB each way, several times any L2; None if that much is not
        // free beside the model.
        self.gpu.copy_bandwidth(256 << 20, 10).ok()
    }

    fn pipelines_sampling(&self) -> bool {
        true
    }

    fn enqueue_sampled(
        &mut self,
        batch: &Batch<'_>,
        kv: &KvTables,
        params: &[GpuSampling],
        chain: bool,
    ) -> Result<()> {
        if self.pinned.is_full() {
            return Err(EngineError::Input(format!(
                "{} sampled steps are already queued",
                crate::pinned::SLOTS
            )));
        }
        let k = self.queue_sampled(batch, kv, Some(params), chain)?;
        self.pinned.push(&self.gpu, self.s.ids.ptr, k)?;
        Ok(())
    }

    fn wait_sampled(&mut self, ids: &mut [u32]) -> Result<()> {
        self.pinned.pop(ids)?;
        Ok(())
    }

    fn forward_sampled(
        &mut self,
        batch: &Batch<'_>,
        kv: &KvTables,
        params: &[GpuSampling],
        ids: &mut [u32],
    ) -> Result<()> {
        self.forward_ids(batch, kv, Some(params), ids)
    }
}

/// `$KILN_CUDA_TIMELINE=FIRST[:COUNT]` with a timeline build ([`crate::gpu::timeline_on`]):
/// the wait stamps of decode steps FIRST..FIRST+COUNT (graph replays,
/// counted from 0) go to `$KILN_CUDA_TIMELINE_OUT` (default
/// `kiln-timeline.tsv`) for bench/cuda/timeline.py.
struct Timeline {
    first: usize,
    count: usize,
    seen: usize,
    out: std::path::PathBuf,
}

impl Timeline {
    fn from_env() -> Option<Timeline> {
        let v = std::env::var("KILN_CUDA_TIMELINE").ok()?;
        let mut it = v.split(':');
        let first = it.next()?.trim().parse().ok()?;
        let count = it
            .next()
            .and_then(|c| c.trim().parse().ok())
            .unwrap_or(1usize)
            .max(1);
        let out = std::env::var_os("KILN_CUDA_TIMELINE_OUT")
            .map_or_else(|| "kiln-timeline.tsv".into(), std::path::PathBuf::from);
        Some(Timeline {
            first,
            count,
            seen: 0,
            out,
        })
    }

    /// Counts a decode step: (empty the stamps before it, read them after it).
    fn step(&mut self) -> (bool, bool) {
        let i = self.seen;
        self.seen += 1;
        (i == self.first, i + 1 == self.first + self.count)
    }

    fn write(&self, rows: &[[u64; 10]]) -> Result<()> {
        let mut s = String::from("grid\tblock\tbefore\tafter\tm1\tm2\tm3\tm4\tm5\tshape\n");
        for r in rows {
            let cells: Vec<String> = r.iter().map(u64::to_string).collect();
            s.push_str(&cells.join("\t"));
            s.push('\n');
        }
        std::fs::write(&self.out, s)
            .map_err(|e| EngineError::Input(format!("timeline '{}': {e}", self.out.display())))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_rows_cover_a_row_with_their_units() {
        // Four units a lane (Q5_0): SmolLM2-135M's 576 and SmolLM2-360M's
        // 960 columns four rows a chunk, Gemma's 1,152 and 2,048 two, wider
        // rows one; two a lane (the pairs' Q8_0): 576 two.
        for (u, cols, r) in [
            (4, 576, 4),
            (4, 960, 4),
            (4, 1024, 4),
            (4, 1152, 2),
            (4, 2048, 2),
            (4, 2080, 1),
            (4, 4096, 1),
            (2, 576, 2),
            (2, 1152, 1),
            (1, 64, 1),
        ] {
            assert_eq!(mvqs_rows(u, cols), r, "{u} units a lane, {cols} columns");
            // A lane's U / R units of each row cover it.
            assert!(cols / 32 <= 32 * (u / r));
        }
    }

    #[test]
    fn glu_grid_fits_the_kernels_ranges() {
        // 1B (256 ranges) and 8B (448) on 264 resident blocks, as on the H100.
        assert_eq!(glu_grid(256, 264), 256);
        assert_eq!(glu_grid(448, 264), 224);
        for ranges in 1..4000 {
            for resident in [1, 2, 7, 132, 264, 528] {
                let grid = glu_grid(ranges, resident);
                // The most ranges a block gets (block 0's).
                let most = ranges.div_ceil(grid);
                assert!(
                    most <= MVQS_GLU_RANGES,
                    "{ranges} ranges, {resident} resident"
                );
                assert!(grid <= ranges);
                if ranges <= resident * MVQS_GLU_RANGES {
                    assert!(grid <= resident, "{ranges} ranges, {resident} resident");
                    assert_eq!(most, ranges.div_ceil(resident));
                }
            }
        }
    }

    /// The several-token streaming kernels exist for every token count
    /// the host may pick, and their shared memory holds what mvqst_impl
    /// lays out: per token the 8-bit x (cols bytes), then the scales and
    /// sums (a float each per 32 values), and fits one SM beside a second
    /// block at the widest rows.
    #[test]
    fn several_token_streaming_kernels_match_the_host() {
        let src = include_str!("../kernels/gemv.cu");
        for nt in MVQST_MIN..=MVQST_MAX {
            assert!(src.contains(&format!("\nMVQST({nt})\n")), "MVQST({nt})");
            for cols in [2048, 4096, 14_336, MVQS_COLS] {
                assert_eq!(mvqst_smem(nt, cols), nt * cols + 2 * nt * (cols / 32) * 4);
            }
        }
        assert!(2 * mvqst_smem(MVQST_MAX, MVQS_COLS) <= 227 * 1024);
    }

    /// Every kernel the host loads for a repacked type, a fused family or a
    /// pair is instantiated in the sources (a missing one fails only at
    /// load, on a GPU).
    #[test]
    fn repacked_kernels_are_instantiated() {
        let gemv = include_str!("../kernels/gemv.cu");
        let matmul = include_str!("../kernels/matmul.cu");
        let mm = include_str!("../kernels/mm.cu");
        // A line `MACRO(name, T_..., u)` (u: None for two-argument macros).
        let has = |src: &str, mac: &str, n: &str, u: Option<usize>| {
            src.lines().any(|l| {
                l.starts_with(&format!("{mac}({n}, "))
                    && u.is_none_or(|u| l.ends_with(&format!(", {u})")))
            })
        };
        for ty in GgmlType::ALL {
            let Some(n) = repacked_name(ty) else {
                continue;
            };
            assert!(has(gemv, "MVQR", n, None), "MVQR({n})");
            assert!(has(gemv, "MVQ_NT", n, None), "MVQ_NT({n})");
            assert!(has(mm, "MM_ALL", n, None), "MM_ALL({n})");
            for mac in ["MV", "EMBED", "DEQ"] {
                assert!(has(matmul, mac, n, None), "{mac}({n})");
            }
        }
        for (_, n, u) in mvqp_fused_types() {
            for mac in ["MVQSN", "MVQSR"] {
                assert!(has(gemv, mac, n, Some(u)), "{mac}({n}, {u})");
            }
            assert!(has(gemv, "MVQA", n, None), "MVQA({n})");
        }
        for (_, n, u) in mvqp_norm_types() {
            assert!(has(gemv, "MVQSN", n, Some(u)), "MVQSN({n}, {u})");
        }
        for (_, n) in mvqs_types() {
            for u in [4, 8] {
                assert!(has(gemv, "MVQS", n, Some(u)), "MVQS({n}, {u})");
            }
        }
        for (_, n) in mvq2_types() {
            assert!(has(gemv, "MVQSN", n, Some(2)), "MVQSN({n}, 2)");
        }
        for ((a, b), n) in mvqsnp_types() {
            let name = |id: usize| {
                GgmlType::ALL
                    .into_iter()
                    .find(|t| REPACKED + t.id() as usize == id)
                    .and_then(repacked_name)
                    .expect("a repacked type")
            };
            let (na, nb) = (name(a), name(b));
            assert_eq!(n, format!("{na}_{nb}"));
            assert!(
                gemv.lines()
                    .any(|l| l.starts_with(&format!("MVQSNP({na}, "))
                        && l.contains(&format!(", {nb}, "))),
                "MVQSNP({n})"
            );
        }
    }

    /// A number `#define`d in quant.cu.
    fn quant_cu_define(name: &str) -> usize {
        include_str!("../kernels/quant.cu")
            .lines()
            .find_map(|l| l.strip_prefix(&format!("#define {name} ")))
            .and_then(|r| r.split_whitespace().next())
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("{name} in quant.cu"))
    }

    /// The host's limit on repacked Q6_K rows is where `repack_q6k`'s
    /// shared-memory row buffer ends, Q4_0's where `repack_q4f`'s does.
    #[test]
    fn repack_limits_match_the_kernels() {
        let max_sb = quant_cu_define("Q6KR_MAX_SB");
        assert_eq!(Q6KR_MAX_SB, max_sb);
        assert!(max_sb * 210 <= 48 * 1024);
        let max_units = quant_cu_define("Q4F_MAX_UNITS");
        assert_eq!(Q4F_MAX_UNITS, max_units);
        assert!(max_units * 18 <= 48 * 1024);
        use GgmlType::*;
        // Q6_K: runs of 4 super-blocks (840 bytes with their d's), in place
        // where a row is whole runs of 8 (the file's bytes, 16-byte rows).
        assert_eq!(quant_cu_define("Q6KR_RUN") + 8, 840);
        assert_eq!(repack_layout(Q6K, 6 * 256), Some(Repack::Q6KTo(6)));
        assert_eq!(repack_layout(Q6K, 256), Some(Repack::Q6KTo(1)));
        assert_eq!(repack_layout(Q6K, 0), None);
        assert_eq!(padded_row_bytes(Q6K, 6 * 256), Some(1680));
        assert_eq!(padded_row_bytes(Q6K, 256), Some(848));
        assert_eq!(padded_row_bytes(Q6K, 27 * 256), Some(5888));
        assert_eq!(padded_row_bytes(Q6K, 8 * 256), None);
        assert_eq!(repack_layout(Q6K, 8 * 256), Some(Repack::Q6K(8)));
        assert_eq!(repack_layout(Q6K, 4096), Some(Repack::Q6K(16)));
        assert_eq!(repack_layout(Q6K, 14336), Some(Repack::Q6K(56)));
        assert_eq!(repack_layout(Q6K, 7 * 256), Some(Repack::Q6KTo(7)));
        assert_eq!(
            repack_layout(Q6K, max_sb * 256),
            Some(Repack::Q6KTo(max_sb))
        );
        assert_eq!(repack_layout(Q6K, (max_sb + 1) * 256), None);
        // Q4_0: flat, in place where a row's bytes are a multiple of 16.
        assert_eq!(repack_layout(Q4_0, 4096), Some(Repack::Q4F(128)));
        assert_eq!(repack_layout(Q4_0, 4096 + 32), Some(Repack::Q4FTo(129)));
        assert_eq!(repack_layout(Q4_0, 1152), Some(Repack::Q4FTo(36)));
        assert_eq!(padded_row_bytes(Q4_0, 1152), Some(656));
        assert_eq!(padded_row_bytes(Q4_0, 896), Some(512));
        assert_eq!(
            repack_layout(Q4_0, max_units * 32),
            Some(Repack::Q4FTo(max_units))
        );
        assert_eq!(repack_layout(Q4_0, (max_units + 1) * 32), None);
        assert_eq!(repack_layout(Q8_0, 2048), Some(Repack::Runs8(32)));
        // Rows of whole blocks but not whole runs, and Q5_0 always: out of place.
        assert_eq!(
            repack_layout(Q8_0, 896),
            Some(Repack::Runs8To { qb: 32, hb: 0 })
        );
        let q5 = Some(Repack::Runs8To { qb: 16, hb: 4 });
        assert_eq!(repack_layout(Q5_0, 4096), q5);
        assert_eq!(repack_layout(Q5_0, 576), q5);
        assert_eq!(
            repack_layout(Q4_1, 576),
            Some(Repack::Runs8To { qb: 16, hb: 2 })
        );
        assert_eq!(repack_layout(Q4_0, 48), None);
        // Padded rows: whole runs of 8 blocks of quants, second fields, scales.
        assert_eq!(padded_row_bytes(Q4_1, 576), Some(3 * 8 * 20));
        assert_eq!(
            repack_layout(Q5_1, 4096),
            Some(Repack::Runs8To { qb: 16, hb: 6 })
        );
        assert_eq!(padded_row_bytes(Q5_1, 576), Some(3 * 8 * 24));
        assert_eq!(padded_row_bytes(Q5_0, 1152), Some(5 * 8 * 22));
        assert_eq!(padded_row_bytes(Q8_0, 960), Some(4 * 8 * 34));
        assert_eq!(padded_row_bytes(Q5_0, 4096), Some(4096 / 32 * 22));
        assert_eq!(padded_row_bytes(Q4_0, 4096), None);
        assert_eq!(repack_layout(Q4K, 4096), Some(Repack::Q4K));
        assert_eq!(repack_layout(Q4K, 256), Some(Repack::Q4K));
        assert_eq!(repack_layout(Q5K, 4096), Some(Repack::Q5K));
        // Q3_K: into rows of 112-byte super-blocks; rows of partial ones stay.
        assert_eq!(repack_layout(Q3K, 4096), Some(Repack::Q3K(16)));
        assert_eq!(padded_row_bytes(Q3K, 2048), Some(8 * 112));
        assert_eq!(repack_layout(Q3K, 2000), None);
        // Q2_K: rows of whole runs of 4 super-blocks (336 bytes).
        assert_eq!(repack_layout(Q2K, 4096), Some(Repack::Q2K(16)));
        assert_eq!(padded_row_bytes(Q2K, 4096), Some(4096 / 256 * 84));
        assert_eq!(padded_row_bytes(Q2K, 1536), Some(2 * 336));
        assert_eq!(repack_layout(Q2K, 100), None);
    }

    #[test]
    fn meta_layout_regions_fit_and_uploads_cover_what_steps_read() {
        for (n, rows_max, tstride, groups) in [(1, 1, 145, 1), (7, 4, 16, 2), (2048, 64, 256, 1)] {
            let ml = MetaLayout::new(n, rows_max, tstride, groups);
            let regions = [
                ml.chain,
                ml.tokens,
                ml.positions,
                ml.ends,
                ml.rowidx,
                ml.sel,
                ml.tables,
            ];
            // 16-byte aligned, in order, each holding n words (the chain word 1).
            for w in regions.windows(2) {
                assert_eq!(w[1] % 4, 0);
                assert!(w[1] >= w[0] + if w[0] == ml.chain { 1 } else { n });
            }
            assert_eq!(ml.total, ml.tables + groups * rows_max * tstride);
            // A step over r sequences uploads through its last group's r-th row.
            for r in 1..=rows_max {
                let last = ml.tables + (groups - 1) * ml.table_len + r * tstride;
                assert_eq!(ml.used(r), last);
                assert!(ml.used(r) <= ml.total);
            }
            // A smaller step's layout fits inside the largest one's buffer.
            assert!(MetaLayout::new(1, rows_max, tstride, groups).total <= ml.total);
        }
    }

    #[test]
    fn byte_counts() {
        assert_eq!(parse_bytes("1234"), Some(1234));
        assert_eq!(parse_bytes("8G"), Some(8 << 30));
        assert_eq!(parse_bytes("1.5g"), Some(3 << 29));
        assert_eq!(parse_bytes("512M"), Some(512 << 20));
        assert_eq!(parse_bytes(" 64k "), Some(64 << 10));
        assert_eq!(parse_bytes("x"), None);
        assert_eq!(parse_bytes("-1G"), None);
        assert_eq!(parse_bytes(""), None);
    }

    #[test]
    fn sampling_words_layout() {
        let p = GpuSampling {
            temperature: 0.5,
            top_k: 40,
            seed: 0x1234_5678_9abc_def0,
        };
        assert_eq!(
            sampling_words(&p),
            [0.5f32.to_bits(), 40, 0x9abc_def0, 0x1234_5678]
        );
    }
}
