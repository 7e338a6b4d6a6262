//! Reference dequantization of ggml tensor types to `f32`.
//!
//! Scalar, block-at-a-time decoders that follow ggml's block layouts
//! (`ggml-common.h`) and its `dequantize_row_*` formulas (`ggml-quants.c`).
//! The float operations are done in the same order as gguf-py's
//! `gguf.quants` (f16 scales widened to f32 first, then e.g.
//! `(d * sc) * q - (dmin * m)`), so the output is bit-identical to gguf-py's;
//! `tests/dequant_gguf_py.rs` checks that against stored vectors.
//!
//! Nothing here panics on any input: bytes of any value decode (NaN/inf
//! scales propagate), and sizes that are not whole blocks are a
//! [`DequantError::Length`].
//!
//! Not supported: `Q8_1`. ggml has no dequantizer for it (it only exists as
//! the activation side of dot products), and its geometry is disputed: ggml's
//! `block_q8_1` is 36 bytes (`f16 d, f16 s, i8 qs[32]`), while gguf-py's size
//! table, and so [`GgmlType::type_size`], still say 40 (the old `f32 d, f32 s`
//! layout).

mod floats;
mod grids;
mod iquants;
mod kquants;
mod legacy;

use std::fmt;

use crate::ggml_type::GgmlType;

/// Why a buffer could not be dequantized.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DequantError {
    /// `dequantize` has no decoder for this type.
    Unsupported(GgmlType),
    /// data/out length do not fit the type's block geometry
    Length {
        ty: GgmlType,
        bytes: usize,
        elements: usize,
    },
}

impl fmt::Display for DequantError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DequantError::Unsupported(ty) => {
                write!(
                    f,
                    "dequantization of {ty} (type id {}) is not supported",
                    ty.id()
                )
            }
            DequantError::Length {
                ty,
                bytes,
                elements,
            } => write!(
                f,
                "{ty}: {bytes} bytes and {elements} elements do not fit its blocks \
                 ({} elements in {} bytes per block)",
                ty.block_size(),
                ty.type_size()
            ),
        }
    }
}

impl std::error::Error for DequantError {}

/// Decodes one block: `block.len() == ty.type_size()`,
/// `out.len() == ty.block_size()`.
type BlockFn = fn(&[u8], &mut [f32]);

/// The block decoder for `ty`, or `None` if unsupported.
fn block_fn(ty: GgmlType) -> Option<BlockFn> {
    use GgmlType::*;
    let f: BlockFn = match ty {
        F32 => floats::f32_block,
        F16 => floats::f16_block,
        BF16 => floats::bf16_block,
        F64 => floats::f64_block,
        I8 => floats::i8_block,
        I16 => floats::i16_block,
        I32 => floats::i32_block,
        I64 => floats::i64_block,
        Q4_0 => legacy::q4_0,
        Q4_1 => legacy::q4_1,
        Q5_0 => legacy::q5_0,
        Q5_1 => legacy::q5_1,
        Q8_0 => legacy::q8_0,
        Q2K => kquants::q2_k,
        Q3K => kquants::q3_k,
        Q4K => kquants::q4_k,
        Q5K => kquants::q5_k,
        Q6K => kquants::q6_k,
        Q8K => kquants::q8_k,
        IQ4NL => iquants::iq4_nl,
        IQ4XS => iquants::iq4_xs,
        TQ1_0 => iquants::tq1_0,
        TQ2_0 => iquants::tq2_0,
        MXFP4 => iquants::mxfp4,
        IQ2XXS => iquants::iq2_xxs,
        IQ2XS => iquants::iq2_xs,
        IQ2S => iquants::iq2_s,
        IQ3XXS => iquants::iq3_xxs,
        IQ3S => iquants::iq3_s,
        IQ1S => iquants::iq1_s,
        IQ1M => iquants::iq1_m,
        Q8_1 => return None,
    };
    Some(f)
}

/// Which types `dequantize` handles.
pub fn is_supported(ty: GgmlType) -> bool {
    block_fn(ty).is_some()
}

/// Elements held by `bytes` bytes of `ty`, or `None` if that is not a whole
/// number of blocks.
fn elements_in(ty: GgmlType, bytes: usize) -> Option<usize> {
    let (blocks, rest) = (bytes / ty.type_size(), bytes % ty.type_size());
    if rest != 0 {
        return None;
    }
    blocks.checked_mul(ty.block_size())
}

/// Decode `data` (whole blocks of `ty`) into `out`; out.len() must equal the number of elements in data.
pub fn dequantize(ty: GgmlType, data: &[u8], out: &mut [f32]) -> Result<(), DequantError> {
    let decode = block_fn(ty).ok_or(DequantError::Unsupported(ty))?;
    if elements_in(ty, data.len()) != Some(out.len()) {
        return Err(DequantError::Length {
            ty,
            bytes: data.len(),
            elements: out.len(),
        });
    }
    let (bs, ts) = (ty.block_size(), ty.type_size());
    for (block, dst) in data.chunks_exact(ts).zip(out.chunks_exact_mut(bs)) {
        decode(block, dst);
    }
    Ok(())
}

/// Like [`dequantize`], allocating the output. A `data` length that is not
/// whole blocks is a [`DequantError::Length`] whose `elements` is what the
/// whole blocks in it would give.
pub fn dequantize_to_vec(ty: GgmlType, data: &[u8]) -> Result<Vec<f32>, DequantError> {
    if !is_supported(ty) {
        return Err(DequantError::Unsupported(ty));
    }
    let elements = elements_in(ty, data.len()).ok_or(DequantError::Length {
        ty,
        bytes: data.len(),
        elements: (data.len() / ty.type_size()).saturating_mul(ty.block_size()),
    })?;
    let mut out = vec![0.0f32; elements];
    dequantize(ty, data, &mut out)?;
    Ok(out)
}

/// Dequantize one row of a 2-D weight; a helper later kernels are checked against.
///
/// `data` holds rows of `n_per_row` elements each (`n_per_row` a multiple of
/// the block size), stored back to back; row `row` is decoded into `out`,
/// which must hold `n_per_row` values. A row past the end of `data` or a row
/// length that is not whole blocks is a [`DequantError::Length`].
pub fn dequantize_row(
    ty: GgmlType,
    data: &[u8],
    n_per_row: usize,
    row: usize,
    out: &mut [f32],
) -> Result<(), DequantError> {
    if !is_supported(ty) {
        return Err(DequantError::Unsupported(ty));
    }
    let length_err = DequantError::Length {
        ty,
        bytes: data.len(),
        elements: n_per_row,
    };
    let (bs, ts) = (ty.block_size(), ty.type_size());
    let (row_blocks, rest) = (n_per_row / bs, n_per_row % bs);
    if rest != 0 || out.len() != n_per_row {
        return Err(length_err);
    }
    let bytes = row_blocks
        .checked_mul(ts)
        .and_then(|row_bytes| {
            let start = row.checked_mul(row_bytes)?;
            data.get(start..start.checked_add(row_bytes)?)
        })
        .ok_or(length_err)?;
    dequantize(ty, bytes, out)
}

/// Read-only helpers shared by the block decoders. Callers index within the
/// block size fixed by the type table, so the slicing cannot fail.
pub(crate) mod bytes {
    /// ggml's f16 → f32, exact and bit-preserving (like numpy's
    /// `npy_halfbits_to_floatbits`): NaN payloads, signalling NaNs included,
    /// are kept rather than quieted, so the result never depends on whether
    /// the CPU has a hardware conversion.
    pub(crate) fn f16_to_f32(h: u16) -> f32 {
        let sign = u32::from(h & 0x8000) << 16;
        let exp = u32::from((h >> 10) & 0x1f);
        let man = u32::from(h & 0x03ff);
        let bits = match exp {
            0 => {
                // Zero or subnormal: man * 2^-24, exact in f32.
                let mag = man as f32 * f32::from_bits(0x3380_0000);
                mag.to_bits()
            }
            0x1f => 0x7f80_0000 | (man << 13),
            _ => ((exp + 112) << 23) | (man << 13),
        };
        f32::from_bits(sign | bits)
    }

    #[inline]
    pub(crate) fn u16_le(b: &[u8], at: usize) -> u16 {
        u16::from_le_bytes([b[at], b[at + 1]])
    }

    #[inline]
    pub(crate) fn u32_le(b: &[u8], at: usize) -> u32 {
        u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
    }

    /// The little-endian f16 at byte `at`, widened to f32.
    #[inline]
    pub(crate) fn f16_le(b: &[u8], at: usize) -> f32 {
        f16_to_f32(u16_le(b, at))
    }
}

#[cfg(test)]
mod tests;
