//! Quantization of `f32` rows to ggml tensor types: the inverse of
//! [`crate::dequant`].
//!
//! The legacy block types (`Q4_0`, `Q4_1`, `Q5_0`, `Q5_1`, `Q8_0`) and the
//! float types (`F32`, `F16`, `BF16`) follow gguf-py's `gguf.quants.quantize`
//! operation for operation in `f32` (which itself follows ggml-quants.c's
//! `quantize_row_*_ref`), so the blocks are bit-identical to gguf-py's;
//! `tests/quantize_gguf_py.rs` checks that against stored vectors.
//!
//! The K-quants (`Q2_K`, `Q3_K`, `Q4_K`, `Q5_K`, `Q6_K`) follow ggml-quants.c's
//! `quantize_row_q*_K_ref`, which is what `ggml_quantize_chunk` (and so
//! llama-quantize) runs without an importance matrix. gguf-py has no K-quant
//! quantizer; the same test checks them byte for byte against ggml's own
//! output (vectors made through ctypes from llama-cpp-python's
//! libggml-base, built without FMA contraction).
//!
//! Speed: the K-quants' scale searches (`make_qkx2_quants` for Q2_K/Q4_K/Q5_K,
//! `make_qx_quants` for Q6_K) run 8 sub-blocks side by side, in AVX2 where the
//! CPU has it, doing per lane exactly the reference's operations; about
//! 30-45 M values/s per core for Q2_K/Q4_K/Q5_K/Q6_K (Q3_K ~17 M, scalar).
//! [`quantize_par`] splits a tensor over threads in whole blocks.
//!
//! Everything works on whole blocks: the input length must be a multiple of
//! the type's block size ([`QuantError::Length`] otherwise). No input panics:
//! NaN and infinite values give whatever the reference formulas give.

mod kquants;
mod legacy;
mod stream;

pub use stream::{GgufStreamWriter, PlannedTensor};

use std::fmt;

use crate::ggml_type::GgmlType;

/// Why a buffer could not be quantized.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum QuantError {
    /// No quantizer for this type.
    Unsupported(GgmlType),
    /// The number of values is not a whole number of blocks.
    Length { ty: GgmlType, elements: usize },
}

impl fmt::Display for QuantError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            QuantError::Unsupported(ty) => write!(f, "quantization to {ty} is not supported"),
            QuantError::Length { ty, elements } => write!(
                f,
                "{ty}: {elements} values are not a whole number of {}-element blocks",
                ty.block_size()
            ),
        }
    }
}

impl std::error::Error for QuantError {}

/// The types [`quantize`] can produce.
pub const SUPPORTED: &[GgmlType] = &[
    GgmlType::F32,
    GgmlType::F16,
    GgmlType::BF16,
    GgmlType::Q8_0,
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q5_0,
    GgmlType::Q5_1,
    GgmlType::Q2K,
    GgmlType::Q3K,
    GgmlType::Q4K,
    GgmlType::Q5K,
    GgmlType::Q6K,
];

pub fn is_supported(ty: GgmlType) -> bool {
    SUPPORTED.contains(&ty)
}

/// Bytes `n` values of `ty` take (whole blocks only).
fn out_len(ty: GgmlType, n: usize) -> Result<usize, QuantError> {
    if !is_supported(ty) {
        return Err(QuantError::Unsupported(ty));
    }
    if !n.is_multiple_of(ty.block_size()) {
        return Err(QuantError::Length { ty, elements: n });
    }
    Ok(n / ty.block_size() * ty.type_size())
}

/// Quantizes `src` into `dst`, which must be exactly the size the blocks take
/// (`ty.bytes_for(src.len())`).
pub fn quantize(ty: GgmlType, src: &[f32], dst: &mut [u8]) -> Result<(), QuantError> {
    let want = out_len(ty, src.len())?;
    assert_eq!(
        dst.len(),
        want,
        "quantize: output buffer has the wrong size"
    );
    let bs = ty.block_size();
    let ts = ty.type_size();
    match ty {
        GgmlType::F32 => {
            for (x, o) in src.iter().zip(dst.chunks_exact_mut(4)) {
                o.copy_from_slice(&x.to_le_bytes());
            }
        }
        GgmlType::F16 => {
            for (x, o) in src.iter().zip(dst.chunks_exact_mut(2)) {
                o.copy_from_slice(&f32_to_f16_bits(*x).to_le_bytes());
            }
        }
        GgmlType::BF16 => {
            for (x, o) in src.iter().zip(dst.chunks_exact_mut(2)) {
                o.copy_from_slice(&f32_to_bf16_bits(*x).to_le_bytes());
            }
        }
        _ => {
            let f: fn(&[f32], &mut [u8]) = match ty {
                GgmlType::Q8_0 => legacy::q8_0,
                GgmlType::Q4_0 => legacy::q4_0,
                GgmlType::Q4_1 => legacy::q4_1,
                GgmlType::Q5_0 => legacy::q5_0,
                GgmlType::Q5_1 => legacy::q5_1,
                GgmlType::Q2K => kquants::q2_k,
                GgmlType::Q3K => kquants::q3_k,
                GgmlType::Q4K => kquants::q4_k,
                GgmlType::Q5K => kquants::q5_k,
                GgmlType::Q6K => kquants::q6_k,
                _ => unreachable!("checked by out_len"),
            };
            for (x, o) in src.chunks_exact(bs).zip(dst.chunks_exact_mut(ts)) {
                f(x, o);
            }
        }
    }
    Ok(())
}

/// [`quantize`] into a new buffer.
pub fn quantize_to_vec(ty: GgmlType, src: &[f32]) -> Result<Vec<u8>, QuantError> {
    let mut out = vec![0u8; out_len(ty, src.len())?];
    quantize(ty, src, &mut out)?;
    Ok(out)
}

/// [`quantize_to_vec`] spread over `threads` threads (whole blocks per
/// thread; the result is the same as the single-threaded one).
pub fn quantize_par(ty: GgmlType, src: &[f32], threads: usize) -> Result<Vec<u8>, QuantError> {
    let mut out = vec![0u8; out_len(ty, src.len())?];
    let n_blocks = src.len() / ty.block_size();
    let threads = threads.clamp(1, n_blocks.max(1));
    if threads <= 1 || n_blocks < 1024 {
        quantize(ty, src, &mut out)?;
        return Ok(out);
    }
    let per = n_blocks.div_ceil(threads);
    let len_err = QuantError::Length {
        ty,
        elements: src.len(),
    };
    std::thread::scope(|s| {
        let hs: Vec<_> = src
            .chunks(per * ty.block_size())
            .zip(out.chunks_mut(per * ty.type_size()))
            .map(|(x, o)| s.spawn(move || quantize(ty, x, o)))
            .collect();
        hs.into_iter()
            .try_for_each(|h| h.join().unwrap_or(Err(len_err.clone())))
    })?;
    Ok(out)
}

/// f32 -> f16 bits as numpy's `astype(np.float16)`: round to nearest even,
/// overflow to infinity; NaN keeps its sign and top mantissa bits (and stays
/// NaN), as numpy's `npy_floatbits_to_halfbits` does.
pub fn f32_to_f16_bits(x: f32) -> u16 {
    let bits = x.to_bits();
    if (bits & 0x7fff_ffff) > 0x7f80_0000 {
        let sign = ((bits >> 16) & 0x8000) as u16;
        let mut ret = 0x7c00u16 + ((bits & 0x007f_ffff) >> 13) as u16;
        if ret == 0x7c00 {
            ret += 1;
        }
        return sign + ret;
    }
    half::f16::from_f32(x).to_bits()
}

/// f32 -> bf16 bits as ggml's `ggml_compute_fp32_to_bf16` (and gguf-py's
/// `BF16.quantize_blocks`): NaN made quiet, otherwise round to nearest even.
pub fn f32_to_bf16_bits(x: f32) -> u16 {
    let n = x.to_bits();
    let n = if (n & 0x7fff_ffff) > 0x7f80_0000 {
        (n & 0xffff_0000) | (64 << 16)
    } else {
        n
    };
    ((n as u64 + (0x7fff + ((n as u64 >> 16) & 1))) >> 16) as u16
}

#[cfg(test)]
mod tests;
