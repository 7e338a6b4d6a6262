//! The non-linear and ternary types: IQ4_NL, IQ4_XS, TQ1_0, TQ2_0, MXFP4
//! and the grid-based IQ1/IQ2/IQ3 types.
//!
//! Signs are applied by multiplying with ±1.0 (not by negating), and scale
//! products are grouped as in gguf-py (`(d * (0.5 + s)) * 0.25`, then
//! `(db * grid) * sign`), so results match bit for bit.

use super::bytes::{f16_le, f16_to_f32, u16_le, u32_le};
use super::grids::{
    IQ1S_GRID, IQ2S_GRID, IQ2XS_GRID, IQ2XXS_GRID, IQ3S_GRID, IQ3XXS_GRID, KSIGNS_IQ2XS,
};

/// `kvalues_iq4nl`: the 16 non-linear levels of IQ4_NL / IQ4_XS.
const KVALUES_IQ4NL: [i8; 16] = [
    -127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113,
];

/// `kvalues_mxfp4`: e2m1 values, doubled (the scale is halved to match).
const KVALUES_MXFP4: [i8; 16] = [0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12];

/// `IQ1S_DELTA`.
const IQ1S_DELTA: f32 = 0.125;

/// Byte `j` of a grid row.
#[inline]
fn grid_byte(row: u64, j: usize) -> u8 {
    (row >> (8 * j)) as u8
}

/// `+1.0` when bit `j` of `signs` is clear, `-1.0` when set.
#[inline]
fn sign(signs: u8, j: usize) -> f32 {
    if (signs >> j) & 1 == 0 {
        1.0
    } else {
        -1.0
    }
}

/// Nibble `k` of `bytes`, low nibble first.
#[inline]
fn nibble(bytes: &[u8], k: usize) -> u8 {
    (bytes[k / 2] >> (4 * (k % 2))) & 0x0f
}

/// `{ f16 d; u8 qs[16] }`: `x = d * kvalues[q]`.
pub(crate) fn iq4_nl(b: &[u8], out: &mut [f32]) {
    let d = f16_le(b, 0);
    for (j, &q) in b[2..18].iter().enumerate() {
        out[j] = d * f32::from(KVALUES_IQ4NL[usize::from(q & 0x0f)]);
        out[j + 16] = d * f32::from(KVALUES_IQ4NL[usize::from(q >> 4)]);
    }
}

/// `{ f16 d; u16 scales_h; u8 scales_l[4]; u8 qs[128] }`, 8 sub-blocks of 32
/// with 6-bit scales: `x = (d * (ls - 32)) * kvalues[q]`.
pub(crate) fn iq4_xs(b: &[u8], out: &mut [f32]) {
    let d = f16_le(b, 0);
    let scales_h = u16_le(b, 2);
    let scales_l = &b[4..8];
    let qs = &b[8..136];
    for (k, sub) in out.chunks_exact_mut(32).enumerate() {
        let high = ((scales_h >> (2 * k)) & 3) as u8;
        let ls = (nibble(scales_l, k) | (high << 4)) as i8 - 32;
        let dl = d * f32::from(ls);
        for (j, &q) in qs[16 * k..16 * k + 16].iter().enumerate() {
            sub[j] = dl * f32::from(KVALUES_IQ4NL[usize::from(q & 0x0f)]);
            sub[j + 16] = dl * f32::from(KVALUES_IQ4NL[usize::from(q >> 4)]);
        }
    }
}

/// `{ u8 qs[48]; u8 qh[4]; f16 d }`: base-3 packed ternary digits,
/// `x = d * (t - 1)` with `t` in 0..=2.
pub(crate) fn tq1_0(b: &[u8], out: &mut [f32]) {
    const POW3: [u8; 5] = [1, 3, 9, 27, 81];
    let qs = &b[0..48];
    let qh = &b[48..52];
    let d = f16_le(b, 52);
    for (e, o) in out.iter_mut().enumerate() {
        // Digit p of byte l is the top "trit" of byte * 3^p (mod 256).
        let (byte, p) = match e {
            0..=159 => (qs[e % 32], e / 32),
            160..=239 => (qs[32 + (e - 160) % 16], (e - 160) / 16),
            _ => (qh[(e - 240) % 4], (e - 240) / 4),
        };
        let x = byte.wrapping_mul(POW3[p]);
        let t = ((u16::from(x) * 3) >> 8) as i8;
        *o = d * f32::from(t - 1);
    }
}

/// `{ u8 qs[64]; f16 d }`: 2-bit ternary, `x = d * (q - 1)`.
pub(crate) fn tq2_0(b: &[u8], out: &mut [f32]) {
    let qs = &b[0..64];
    let d = f16_le(b, 64);
    for (e, o) in out.iter_mut().enumerate() {
        let (half, shift, l) = (e / 128, (e % 128) / 32, e % 32);
        let q = ((qs[half * 32 + l] >> (2 * shift)) & 3) as i8;
        *o = d * f32::from(q - 1);
    }
}

/// ggml's `ggml_e8m0_to_fp32_half`: `2^(e - 128)` as an f32 (subnormal for
/// e < 2; e = 255 gives 2^127, never inf/NaN).
fn e8m0_to_f32_half(e: u8) -> f32 {
    let bits = if e < 2 {
        0x0020_0000u32 << e
    } else {
        u32::from(e - 1) << 23
    };
    f32::from_bits(bits)
}

/// `{ u8 e; u8 qs[16] }`: `x = 2^(e-128) * kvalues_mxfp4[q]`.
pub(crate) fn mxfp4(b: &[u8], out: &mut [f32]) {
    let d = e8m0_to_f32_half(b[0]);
    for (j, &q) in b[1..17].iter().enumerate() {
        out[j] = d * f32::from(KVALUES_MXFP4[usize::from(q & 0x0f)]);
        out[j + 16] = d * f32::from(KVALUES_MXFP4[usize::from(q >> 4)]);
    }
}

/// `{ f16 d; u16 qs[32] }`: per 32 elements two u32, the first holding four
/// grid indices, the second four 7-bit sign indices and a 4-bit scale.
pub(crate) fn iq2_xxs(b: &[u8], out: &mut [f32]) {
    let d = f16_le(b, 0);
    for (ib, sub) in out.chunks_exact_mut(32).enumerate() {
        let grid_idx = u32_le(b, 2 + 8 * ib);
        let aux = u32_le(b, 2 + 8 * ib + 4);
        let db = d * (0.5 + (aux >> 28) as f32) * 0.25;
        for (l, group) in sub.chunks_exact_mut(8).enumerate() {
            let row = IQ2XXS_GRID[((grid_idx >> (8 * l)) & 0xff) as usize];
            let signs = KSIGNS_IQ2XS[((aux >> (7 * l)) & 0x7f) as usize];
            for (j, o) in group.iter_mut().enumerate() {
                *o = db * f32::from(grid_byte(row, j)) * sign(signs, j);
            }
        }
    }
}

/// `{ f16 d; u16 qs[32]; u8 scales[8] }`: each u16 is a 9-bit grid index and
/// a 7-bit sign index; a 4-bit scale per 16 elements.
pub(crate) fn iq2_xs(b: &[u8], out: &mut [f32]) {
    let d = f16_le(b, 0);
    let scales = &b[66..74];
    for (k, group) in out.chunks_exact_mut(8).enumerate() {
        let q = u16_le(b, 2 + 2 * k);
        let db = d * (0.5 + f32::from(nibble(scales, k / 2))) * 0.25;
        let row = IQ2XS_GRID[usize::from(q & 511)];
        let signs = KSIGNS_IQ2XS[usize::from(q >> 9)];
        for (j, o) in group.iter_mut().enumerate() {
            *o = db * f32::from(grid_byte(row, j)) * sign(signs, j);
        }
    }
}

/// `{ f16 d; u8 qs[32]; u8 signs[32]; u8 qh[8]; u8 scales[8] }`: 10-bit grid
/// indices, one explicit sign bit per element, a 4-bit scale per 16 elements.
pub(crate) fn iq2_s(b: &[u8], out: &mut [f32]) {
    let d = f16_le(b, 0);
    let qs = &b[2..34];
    let signs = &b[34..66];
    let qh = &b[66..74];
    let scales = &b[74..82];
    for (k, group) in out.chunks_exact_mut(8).enumerate() {
        let high = (qh[k / 4] >> (2 * (k % 4))) & 3;
        let idx = usize::from(qs[k]) | (usize::from(high) << 8);
        let db = d * (0.5 + f32::from(nibble(scales, k / 2))) * 0.25;
        let row = IQ2S_GRID[idx];
        for (j, o) in group.iter_mut().enumerate() {
            *o = db * f32::from(grid_byte(row, j)) * sign(signs[k], j);
        }
    }
}

/// `{ f16 d; u8 qs[64]; u32 scales_and_signs[8] }`: 8-bit indices into a
/// grid of 4-element rows; per 32 elements four 7-bit sign indices and a
/// 4-bit scale.
pub(crate) fn iq3_xxs(b: &[u8], out: &mut [f32]) {
    let d = f16_le(b, 0);
    let qs = &b[2..66];
    for (ib, sub) in out.chunks_exact_mut(32).enumerate() {
        let aux = u32_le(b, 66 + 4 * ib);
        let db = d * (0.5 + (aux >> 28) as f32) * 0.5;
        for (l, group) in sub.chunks_exact_mut(8).enumerate() {
            let signs = KSIGNS_IQ2XS[((aux >> (7 * l)) & 0x7f) as usize];
            for (j, o) in group.iter_mut().enumerate() {
                let row = IQ3XXS_GRID[usize::from(qs[8 * ib + 2 * l + j / 4])];
                let g = (row >> (8 * (j % 4))) as u8;
                *o = db * f32::from(g) * sign(signs, j);
            }
        }
    }
}

/// `{ f16 d; u8 qs[64]; u8 qh[8]; u8 signs[32]; u8 scales[4] }`: 9-bit
/// indices into a grid of 4-element rows, one sign bit per element, an odd
/// scale `1 + 2s` per 32 elements.
pub(crate) fn iq3_s(b: &[u8], out: &mut [f32]) {
    let d = f16_le(b, 0);
    let qs = &b[2..66];
    let qh = &b[66..74];
    let signs = &b[74..106];
    let scales = &b[106..110];
    for (k, group) in out.chunks_exact_mut(4).enumerate() {
        let high = (qh[k / 8] >> (k % 8)) & 1;
        let idx = usize::from(qs[k]) | (usize::from(high) << 8);
        let row = IQ3S_GRID[idx];
        let db = d * f32::from(1 + 2 * nibble(scales, k / 8));
        for (j, o) in group.iter_mut().enumerate() {
            let e = 4 * k + j;
            let g = (row >> (8 * j)) as u8;
            *o = db * f32::from(g) * sign(signs[e / 8], e % 8);
        }
    }
}

/// `{ f16 d; u8 qs[32]; u16 qh[8] }`: 11-bit indices into a grid of
/// {-1, 0, 1} rows; per 32 elements an odd 3-bit scale and a ±1/8 shift:
/// `x = (d * (2s + 1)) * (g + delta)`.
pub(crate) fn iq1_s(b: &[u8], out: &mut [f32]) {
    let d = f16_le(b, 0);
    let qs = &b[2..34];
    for (ib, sub) in out.chunks_exact_mut(32).enumerate() {
        let qh = u16_le(b, 34 + 2 * ib);
        let dl = d * f32::from(2 * ((qh >> 12) & 7) + 1);
        let delta = if qh & 0x8000 == 0 {
            IQ1S_DELTA
        } else {
            -IQ1S_DELTA
        };
        for (l, group) in sub.chunks_exact_mut(8).enumerate() {
            let idx = usize::from(qs[4 * ib + l]) | (usize::from((qh >> (3 * l)) & 7) << 8);
            let row = IQ1S_GRID[idx];
            for (j, o) in group.iter_mut().enumerate() {
                let g = grid_byte(row, j) as i8;
                *o = dl * (f32::from(g) + delta);
            }
        }
    }
}

/// `{ u8 qs[32]; u8 qh[16]; u8 scales[8] }`: like IQ1_S with a 3-bit scale
/// per 16 elements and a shift per 8; the f16 `d` is spread over the top
/// nibbles of the four u16 scale words.
pub(crate) fn iq1_m(b: &[u8], out: &mut [f32]) {
    let qs = &b[0..32];
    let qh = &b[32..48];
    let sc = [u16_le(b, 48), u16_le(b, 50), u16_le(b, 52), u16_le(b, 54)];
    let d_bits =
        (sc[0] >> 12) | ((sc[1] >> 8) & 0x00f0) | ((sc[2] >> 4) & 0x0f00) | (sc[3] & 0xf000);
    let d = f16_to_f32(d_bits);
    for (k, group) in out.chunks_exact_mut(8).enumerate() {
        // Scale s covers grid rows 2s and 2s + 1.
        let s = k / 2;
        let scale = (sc[s / 4] >> (3 * (s % 4))) & 7;
        let dl = d * f32::from(2 * scale + 1);
        let h = (qh[k / 2] >> (4 * (k % 2))) & 0x0f;
        let idx = usize::from(qs[k]) | (usize::from(h & 7) << 8);
        let delta = if h & 0x08 == 0 {
            IQ1S_DELTA
        } else {
            -IQ1S_DELTA
        };
        let row = IQ1S_GRID[idx];
        for (j, o) in group.iter_mut().enumerate() {
            let g = grid_byte(row, j) as i8;
            *o = dl * (f32::from(g) + delta);
        }
    }
}
