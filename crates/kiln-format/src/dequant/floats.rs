//! Plain (one element per "block") float and integer types.
//!
//! F32, F16 and BF16 are exact and keep every bit pattern, NaN payloads
//! included (like gguf-py's `view`/`astype`). The integers and F64 are
//! converted with Rust's `as`, which rounds to nearest, ties to even, as the
//! C casts in ggml and numpy's `astype(np.float32)` do.

use super::bytes::{f16_le, u16_le, u32_le};

pub(crate) fn f32_block(b: &[u8], out: &mut [f32]) {
    out[0] = f32::from_bits(u32_le(b, 0));
}

pub(crate) fn f16_block(b: &[u8], out: &mut [f32]) {
    out[0] = f16_le(b, 0);
}

pub(crate) fn bf16_block(b: &[u8], out: &mut [f32]) {
    out[0] = f32::from_bits(u32::from(u16_le(b, 0)) << 16);
}

pub(crate) fn f64_block(b: &[u8], out: &mut [f32]) {
    let mut le = [0u8; 8];
    le.copy_from_slice(&b[..8]);
    out[0] = f64::from_le_bytes(le) as f32;
}

pub(crate) fn i8_block(b: &[u8], out: &mut [f32]) {
    out[0] = f32::from(b[0] as i8);
}

pub(crate) fn i16_block(b: &[u8], out: &mut [f32]) {
    out[0] = f32::from(u16_le(b, 0) as i16);
}

pub(crate) fn i32_block(b: &[u8], out: &mut [f32]) {
    out[0] = u32_le(b, 0) as i32 as f32;
}

pub(crate) fn i64_block(b: &[u8], out: &mut [f32]) {
    let mut le = [0u8; 8];
    le.copy_from_slice(&b[..8]);
    out[0] = i64::from_le_bytes(le) as f32;
}
