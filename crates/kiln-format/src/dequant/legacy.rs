//! The original 32-element block types: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0.
//!
//! In every 4/5-bit type element `j < 16` takes the low nibble of byte `j`,
//! element `j + 16` its high nibble. Q5 types keep the fifth bit of element
//! `j` in bit `j` of a little-endian u32 `qh`.

use super::bytes::{f16_le, u32_le};

/// `{ f16 d; u8 qs[16] }`: `x = d * (q - 8)`.
pub(crate) fn q4_0(b: &[u8], out: &mut [f32]) {
    let d = f16_le(b, 0);
    let qs = &b[2..18];
    for (j, &q) in qs.iter().enumerate() {
        out[j] = d * f32::from((q & 0x0f) as i8 - 8);
        out[j + 16] = d * f32::from((q >> 4) as i8 - 8);
    }
}

/// `{ f16 d; f16 m; u8 qs[16] }`: `x = (d * q) + m`.
pub(crate) fn q4_1(b: &[u8], out: &mut [f32]) {
    let d = f16_le(b, 0);
    let m = f16_le(b, 2);
    let qs = &b[4..20];
    for (j, &q) in qs.iter().enumerate() {
        out[j] = d * f32::from(q & 0x0f) + m;
        out[j + 16] = d * f32::from(q >> 4) + m;
    }
}

/// `{ f16 d; u32 qh; u8 qs[16] }`: `x = d * (q - 16)`.
pub(crate) fn q5_0(b: &[u8], out: &mut [f32]) {
    let d = f16_le(b, 0);
    let qh = u32_le(b, 2);
    let qs = &b[6..22];
    for (j, &q) in qs.iter().enumerate() {
        let lo = (q & 0x0f) | ((((qh >> j) & 1) as u8) << 4);
        let hi = (q >> 4) | ((((qh >> (j + 16)) & 1) as u8) << 4);
        out[j] = d * f32::from(lo as i8 - 16);
        out[j + 16] = d * f32::from(hi as i8 - 16);
    }
}

/// `{ f16 d; f16 m; u32 qh; u8 qs[16] }`: `x = (d * q) + m`.
pub(crate) fn q5_1(b: &[u8], out: &mut [f32]) {
    let d = f16_le(b, 0);
    let m = f16_le(b, 2);
    let qh = u32_le(b, 4);
    let qs = &b[8..24];
    for (j, &q) in qs.iter().enumerate() {
        let lo = (q & 0x0f) | ((((qh >> j) & 1) as u8) << 4);
        let hi = (q >> 4) | ((((qh >> (j + 16)) & 1) as u8) << 4);
        out[j] = d * f32::from(lo) + m;
        out[j + 16] = d * f32::from(hi) + m;
    }
}

/// `{ f16 d; i8 qs[32] }`: `x = q * d`.
pub(crate) fn q8_0(b: &[u8], out: &mut [f32]) {
    let d = f16_le(b, 0);
    for (o, &q) in out.iter_mut().zip(&b[2..34]) {
        *o = f32::from(q as i8) * d;
    }
}
