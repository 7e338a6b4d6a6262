//! The k-quants: 256-element super-blocks with 6- or 8-bit sub-block scales.
//!
//! Each decoder walks the output index `e` and derives which bytes and bit
//! fields feed it; the layouts are ggml's (`block_q*_K` in ggml-common.h).
//! Scales are combined exactly as gguf-py does: sub-block scale first
//! (`dl = d * sc`, `ml = dmin * m`), then `dl * q - ml`.

use super::bytes::{f16_le, u32_le};

/// `{ u8 scales[16]; u8 qs[64]; f16 d; f16 dmin }`, 16 sub-blocks of 16:
/// `x = (d * (sc & 15)) * q - (dmin * (sc >> 4))`, q 2-bit.
pub(crate) fn q2_k(b: &[u8], out: &mut [f32]) {
    let scales = &b[0..16];
    let qs = &b[16..80];
    let d = f16_le(b, 80);
    let dmin = f16_le(b, 82);
    for (e, o) in out.iter_mut().enumerate() {
        let (half, shift, l) = (e / 128, (e % 128) / 32, e % 32);
        let q = (qs[half * 32 + l] >> (2 * shift)) & 3;
        let sc = scales[e / 16];
        let dl = d * f32::from(sc & 0x0f);
        let ml = dmin * f32::from(sc >> 4);
        *o = dl * f32::from(q) - ml;
    }
}

/// `{ u8 hmask[32]; u8 qs[64]; u8 scales[12]; f16 d }`, 16 sub-blocks of 16:
/// `x = (d * (sc - 32)) * (q - (hbit ? 0 : 4))`, q 2-bit, sc 6-bit.
pub(crate) fn q3_k(b: &[u8], out: &mut [f32]) {
    let hmask = &b[0..32];
    let qs = &b[32..96];
    let sc = &b[96..108];
    let d = f16_le(b, 108);
    let mut dl = [0.0f32; 16];
    for (k, dl) in dl.iter_mut().enumerate() {
        // Low nibbles: bytes 0..8, low halves first. High 2 bits: bytes 8..12,
        // one 2-bit field per group of four scales.
        let low = if k < 8 { sc[k] & 0x0f } else { sc[k - 8] >> 4 };
        let high = (sc[8 + k % 4] >> (2 * (k / 4))) & 3;
        let s = (low | (high << 4)) as i8 - 32;
        *dl = d * f32::from(s);
    }
    for (e, o) in out.iter_mut().enumerate() {
        let (half, shift, l) = (e / 128, (e % 128) / 32, e % 32);
        let low = ((qs[half * 32 + l] >> (2 * shift)) & 3) as i8;
        let hbit = (hmask[l] >> (e / 32)) & 1;
        let q = low - (((hbit ^ 1) << 2) as i8);
        *o = dl[e / 16] * f32::from(q);
    }
}

/// ggml's `get_scale_min_k4`: eight 6-bit scales and mins packed in 12 bytes.
fn scale_min_k4(s: &[u8]) -> ([u8; 8], [u8; 8]) {
    let mut sc = [0u8; 8];
    let mut m = [0u8; 8];
    for j in 0..4 {
        sc[j] = s[j] & 0x3f;
        m[j] = s[j + 4] & 0x3f;
        sc[j + 4] = (s[j + 8] & 0x0f) | ((s[j] >> 2) & 0x30);
        m[j + 4] = (s[j + 8] >> 4) | ((s[j + 4] >> 2) & 0x30);
    }
    (sc, m)
}

/// The per-sub-block `(d * sc, dmin * m)` of Q4_K / Q5_K.
fn k4_scales(b: &[u8]) -> ([f32; 8], [f32; 8]) {
    let d = f16_le(b, 0);
    let dmin = f16_le(b, 2);
    let (sc, m) = scale_min_k4(&b[4..16]);
    let mut dl = [0.0f32; 8];
    let mut ml = [0.0f32; 8];
    for j in 0..8 {
        dl[j] = d * f32::from(sc[j]);
        ml[j] = dmin * f32::from(m[j]);
    }
    (dl, ml)
}

/// `{ f16 d; f16 dmin; u8 scales[12]; u8 qs[128] }`, 8 sub-blocks of 32:
/// `x = (d * sc) * q - (dmin * m)`, q 4-bit.
pub(crate) fn q4_k(b: &[u8], out: &mut [f32]) {
    let (dl, ml) = k4_scales(b);
    let qs = &b[16..144];
    for (e, o) in out.iter_mut().enumerate() {
        let (chunk, nib, l) = (e / 64, (e % 64) / 32, e % 32);
        let q = (qs[chunk * 32 + l] >> (4 * nib)) & 0x0f;
        *o = dl[e / 32] * f32::from(q) - ml[e / 32];
    }
}

/// `{ f16 d; f16 dmin; u8 scales[12]; u8 qh[32]; u8 qs[128] }`, 8 sub-blocks
/// of 32: `x = (d * sc) * q - (dmin * m)`, q 5-bit (bit 4 of element `e` is
/// bit `e / 32` of `qh[e % 32]`).
pub(crate) fn q5_k(b: &[u8], out: &mut [f32]) {
    let (dl, ml) = k4_scales(b);
    let qh = &b[16..48];
    let qs = &b[48..176];
    for (e, o) in out.iter_mut().enumerate() {
        let (chunk, nib, l) = (e / 64, (e % 64) / 32, e % 32);
        let low = (qs[chunk * 32 + l] >> (4 * nib)) & 0x0f;
        let high = (qh[l] >> (e / 32)) & 1;
        let q = low | (high << 4);
        *o = dl[e / 32] * f32::from(q) - ml[e / 32];
    }
}

/// `{ u8 ql[128]; u8 qh[64]; i8 scales[16]; f16 d }`, 16 sub-blocks of 16:
/// `x = (d * sc) * (q - 32)`, q 6-bit.
pub(crate) fn q6_k(b: &[u8], out: &mut [f32]) {
    let ql = &b[0..128];
    let qh = &b[128..192];
    let scales = &b[192..208];
    let d = f16_le(b, 208);
    for (e, o) in out.iter_mut().enumerate() {
        let (half, r) = (e / 128, e % 128);
        let low = (ql[half * 64 + r % 64] >> (4 * (r / 64))) & 0x0f;
        let high = (qh[half * 32 + r % 32] >> (2 * (r / 32))) & 3;
        let q = (low | (high << 4)) as i8 - 32;
        let dl = d * f32::from(scales[e / 16] as i8);
        *o = dl * f32::from(q);
    }
}

/// `{ f32 d; i8 qs[256]; i16 bsums[16] }`: `x = d * q` (bsums unused).
pub(crate) fn q8_k(b: &[u8], out: &mut [f32]) {
    let d = f32::from_bits(u32_le(b, 0));
    for (o, &q) in out.iter_mut().zip(&b[4..260]) {
        *o = d * f32::from(q as i8);
    }
}
