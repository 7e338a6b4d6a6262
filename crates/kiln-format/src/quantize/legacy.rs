//! The 32-element legacy blocks, transcribed from gguf-py's
//! `Q*_*.quantize_blocks` (all arithmetic in `f32`, like numpy on `float32`
//! arrays and like ggml-quants.c's `quantize_row_*_ref`).

use super::f32_to_f16_bits;

const QK: usize = 32;

/// `np.where(d == 0, 0, 1 / d)`.
fn inv(d: f32) -> f32 {
    if d == 0.0 {
        0.0
    } else {
        1.0 / d
    }
}

/// gguf-py's `np_roundf`: round half away from zero.
fn roundf(n: f32) -> f32 {
    let a = n.abs();
    let fl = a.floor();
    let b = fl + (2.0 * (a - fl)).floor();
    // np.sign: NaN stays NaN, 0 gives 0.
    let s = if n > 0.0 {
        1.0
    } else if n < 0.0 {
        -1.0
    } else if n.is_nan() {
        f32::NAN
    } else {
        0.0
    };
    s * b
}

/// numpy's (x86) float -> integer cast: `cvttss2si` to i32, where NaN and
/// values outside i32 give `i32::MIN`, then the low byte. (So `inf` -> 0,
/// `300.0` -> 44, as numpy does; these only happen when a block's scale
/// underflows so that `1 / d` is infinite.)
fn cast_low_byte(v: f32) -> u8 {
    let i = if !(-2147483648.0..2147483648.0).contains(&v) {
        i32::MIN
    } else {
        v as i32
    };
    i as u8
}

/// `astype(np.uint8)` of a value already truncated, then `.clip(0, hi)`.
fn to_u8_clip(v: f32, hi: u8) -> u8 {
    cast_low_byte(v).min(hi)
}

/// The element with the largest magnitude, first one on ties (numpy
/// `argmax` of `abs`).
fn signed_absmax(x: &[f32]) -> f32 {
    let mut best = x[0];
    let mut amax = x[0].abs();
    for &v in &x[1..] {
        // argmax treats NaN as the maximum (first NaN wins).
        if amax.is_nan() {
            break;
        }
        if v.abs() > amax || v.is_nan() {
            amax = v.abs();
            best = v;
        }
    }
    best
}

fn min_max(x: &[f32]) -> (f32, f32) {
    // np.min/np.max propagate NaN.
    let mut lo = x[0];
    let mut hi = x[0];
    for &v in &x[1..] {
        if v.is_nan() || lo.is_nan() {
            lo = f32::NAN;
            hi = f32::NAN;
            continue;
        }
        lo = lo.min(v);
        hi = hi.max(v);
    }
    (lo, hi)
}

fn put_f16(o: &mut [u8], v: f32) {
    o.copy_from_slice(&f32_to_f16_bits(v).to_le_bytes());
}

/// Low nibbles from the first half, high nibbles from the second half.
fn pack_nibbles(q: &[u8; QK], o: &mut [u8]) {
    for j in 0..QK / 2 {
        o[j] = (q[j] & 0x0f) | (q[j + QK / 2] << 4);
    }
}

fn pack_high_bits(q: &[u8; QK], o: &mut [u8]) {
    let mut qh = 0u32;
    for (j, &v) in q.iter().enumerate() {
        qh |= u32::from((v >> 4) != 0) << j;
    }
    o.copy_from_slice(&qh.to_le_bytes());
}

pub(super) fn q8_0(x: &[f32], o: &mut [u8]) {
    let amax = x.iter().fold(0.0f32, |m, v| {
        let a = v.abs();
        if a > m || a.is_nan() {
            a
        } else {
            m
        }
    });
    let d = amax / 127.0;
    let id = inv(d);
    put_f16(&mut o[0..2], d);
    for (j, &v) in x.iter().enumerate() {
        o[2 + j] = cast_low_byte(roundf(v * id));
    }
}

pub(super) fn q4_0(x: &[f32], o: &mut [u8]) {
    let max = signed_absmax(x);
    let d = max / -8.0;
    let id = inv(d);
    let mut q = [0u8; QK];
    for (qj, &v) in q.iter_mut().zip(x) {
        *qj = to_u8_clip((v * id + 8.5).trunc(), 15);
    }
    put_f16(&mut o[0..2], d);
    pack_nibbles(&q, &mut o[2..18]);
}

pub(super) fn q4_1(x: &[f32], o: &mut [u8]) {
    let (min, max) = min_max(x);
    let d = (max - min) / 15.0;
    let id = inv(d);
    let mut q = [0u8; QK];
    for (qj, &v) in q.iter_mut().zip(x) {
        *qj = to_u8_clip(((v - min) * id + 0.5).trunc(), 15);
    }
    put_f16(&mut o[0..2], d);
    put_f16(&mut o[2..4], min);
    pack_nibbles(&q, &mut o[4..20]);
}

pub(super) fn q5_0(x: &[f32], o: &mut [u8]) {
    let max = signed_absmax(x);
    let d = max / -16.0;
    let id = inv(d);
    let mut q = [0u8; QK];
    for (qj, &v) in q.iter_mut().zip(x) {
        *qj = to_u8_clip((v * id + 16.5).trunc(), 31);
    }
    put_f16(&mut o[0..2], d);
    pack_high_bits(&q, &mut o[2..6]);
    pack_nibbles(&q, &mut o[6..22]);
}

pub(super) fn q5_1(x: &[f32], o: &mut [u8]) {
    let (min, max) = min_max(x);
    let d = (max - min) / 31.0;
    let id = inv(d);
    let mut q = [0u8; QK];
    for (qj, &v) in q.iter_mut().zip(x) {
        *qj = to_u8_clip(((v - min) * id + 0.5).trunc(), 31);
    }
    put_f16(&mut o[0..2], d);
    put_f16(&mut o[2..4], min);
    pack_high_bits(&q, &mut o[4..8]);
    pack_nibbles(&q, &mut o[8..24]);
}
