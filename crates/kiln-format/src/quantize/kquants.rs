//! K-quant super-blocks (256 values), transcribed from ggml-quants.c's
//! reference quantizers `quantize_row_q{2,3,4,5,6}_K_ref` — what
//! `ggml_quantize_chunk` (and so llama-quantize) runs when no importance
//! matrix is given.
//!
//! Bit-exactness with ggml rests on doing the same `f32` operations in the
//! same order: C's `w*l*l` is `(w*l)*l`, `a*b - c*d` is two roundings (the
//! reference library is built without FMA contraction), every sum is a
//! sequential left-to-right accumulation, and fp16 conversion is ggml's
//! round-to-nearest-even ([`fp16`]). `tests/quantize_gguf_py.rs` checks the
//! bytes against ggml's own output (`tests/data/quant/*.kquant.bin`).

const QK_K: usize = 256;
const GROUP_MAX_EPS: f32 = 1e-15;

/// ggml's `nearest_int`: round half to even via the 1.5 * 2^23 trick (the
/// same garbage as ggml's outside +/- 2^22).
#[inline(always)]
fn nearest_int(v: f32) -> i32 {
    let bits = (v + 12582912.0).to_bits() as i32;
    (bits & 0x007f_ffff) - 0x0040_0000
}

/// ggml's `ggml_compute_fp32_to_fp16` (the portable one, as built into
/// libggml-base): round to nearest even, overflow to infinity, NaN to
/// `0x7e00` with the sign.
pub(super) fn fp16(f: f32) -> u16 {
    let scale_to_inf = f32::from_bits(0x7780_0000); // 2^112
    let scale_to_zero = f32::from_bits(0x0880_0000); // 2^-110
    let mut base = (f.abs() * scale_to_inf) * scale_to_zero;
    let w = f.to_bits();
    let shl1_w = w.wrapping_add(w);
    let sign = w & 0x8000_0000;
    let bias = (shl1_w & 0xff00_0000).max(0x7100_0000);
    base += f32::from_bits((bias >> 1) + 0x0780_0000);
    let bits = base.to_bits();
    let nonsign = ((bits >> 13) & 0x7c00) + (bits & 0x0fff);
    ((sign >> 16)
        | if shl1_w > 0xff00_0000 {
            0x7e00
        } else {
            nonsign
        }) as u16
}

/// fp16 bits to f32 (exact).
#[inline]
fn f16f(h: u16) -> f32 {
    half::f16::from_bits(h).to_f32()
}

/// `make_qx_quants(n, nmax, x, L, rmse_type = 1, qw = NULL)`.
fn make_qx_quants(nmax: i32, x: &[f32], l_out: &mut [i8]) -> f32 {
    let mut max = 0.0f32;
    let mut amax = 0.0f32;
    for &v in x {
        let ax = v.abs();
        if ax > amax {
            amax = ax;
            max = v;
        }
    }
    if amax < GROUP_MAX_EPS {
        l_out.iter_mut().for_each(|l| *l = 0);
        return 0.0;
    }
    let nmf = nmax as f32;
    let q = |iscale: f32, v: f32| nearest_int(iscale * v).clamp(-nmax, nmax - 1);
    let mut iscale = -nmf / max;
    let mut sumlx = 0.0f32;
    let mut suml2 = 0.0f32;
    for (l_o, &v) in l_out.iter_mut().zip(x) {
        let l = q(iscale, v);
        *l_o = (l + nmax) as i8;
        let w = v * v;
        let lf = l as f32;
        sumlx += w * v * lf;
        suml2 += w * lf * lf;
    }
    let mut scale = if suml2 != 0.0 { sumlx / suml2 } else { 0.0 };
    let mut best = scale * sumlx;
    for is in -9..=9 {
        if is == 0 {
            continue;
        }
        iscale = -(nmf + 0.1f32 * is as f32) / max;
        sumlx = 0.0;
        suml2 = 0.0;
        for &v in x {
            let lf = q(iscale, v) as f32;
            let w = v * v;
            sumlx += w * v * lf;
            suml2 += w * lf * lf;
        }
        if suml2 > 0.0 && sumlx * sumlx > best * suml2 {
            for (l_o, &v) in l_out.iter_mut().zip(x) {
                *l_o = (nmax + q(iscale, v)) as i8;
            }
            scale = sumlx / suml2;
            best = scale * sumlx;
        }
    }
    scale
}

/// `make_q3_quants(n, nmax, x, L, do_rmse = true)`.
fn make_q3_quants(nmax: i32, x: &[f32], l_out: &mut [i8]) -> f32 {
    let mut max = 0.0f32;
    let mut amax = 0.0f32;
    for &v in x {
        let ax = v.abs();
        if ax > amax {
            amax = ax;
            max = v;
        }
    }
    if amax < GROUP_MAX_EPS {
        l_out.iter_mut().for_each(|l| *l = 0);
        return 0.0;
    }
    let iscale = -(nmax as f32) / max;
    let mut sumlx = 0.0f32;
    let mut suml2 = 0.0f32;
    for (l_o, &v) in l_out.iter_mut().zip(x) {
        let l = nearest_int(iscale * v).clamp(-nmax, nmax - 1);
        *l_o = l as i8;
        let w = v * v;
        let lf = l as f32;
        sumlx += w * v * lf;
        suml2 += w * lf * lf;
    }
    for _ in 0..5 {
        let mut n_changed = 0;
        for (l_o, &v) in l_out.iter_mut().zip(x) {
            let w = v * v;
            let li = *l_o as f32;
            let mut slx = sumlx - w * v * li;
            if slx > 0.0 {
                let mut sl2 = suml2 - w * li * li;
                let new_l = nearest_int(v * sl2 / slx).clamp(-nmax, nmax - 1);
                if new_l != *l_o as i32 {
                    let nl = new_l as f32;
                    slx += w * v * nl;
                    sl2 += w * nl * nl;
                    if sl2 > 0.0 && slx * slx * suml2 > sumlx * sumlx * sl2 {
                        *l_o = new_l as i8;
                        sumlx = slx;
                        suml2 = sl2;
                        n_changed += 1;
                    }
                }
            }
        }
        if n_changed == 0 {
            break;
        }
    }
    for l in l_out.iter_mut() {
        *l += nmax as i8;
    }
    if suml2 > 0.0 {
        sumlx / suml2
    } else {
        0.0
    }
}

/// `make_qkx2_quants(n, nmax, x, weights, L, &the_min, Laux, rmin, rdelta,
/// nstep, use_mad)`; returns `(scale, the_min)`.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
fn make_qkx2_quants<const N: usize>(
    nmax: i32,
    x: &[f32; N],
    weights: &[f32; N],
    l_out: &mut [u8; N],
    rmin: f32,
    rdelta: f32,
    nstep: i32,
    use_mad: bool,
) -> (f32, f32) {
    let mut min = x[0];
    let mut max = x[0];
    let mut sum_w = weights[0];
    let mut sum_x = sum_w * x[0];
    for i in 1..N {
        if x[i] < min {
            min = x[i];
        }
        if x[i] > max {
            max = x[i];
        }
        let w = weights[i];
        sum_w += w;
        sum_x += w * x[i];
    }
    if min > 0.0 {
        min = 0.0;
    }
    if max == min {
        *l_out = [0; N];
        return (0.0, -min);
    }
    let nmf = nmax as f32;
    let err = |d: f32| if use_mad { d.abs() } else { d * d };
    let mut iscale = nmf / (max - min);
    let mut scale = 1.0 / iscale;
    let mut best_error = 0.0f32;
    for i in 0..N {
        let l = nearest_int(iscale * (x[i] - min)).clamp(0, nmax);
        l_out[i] = l as u8;
        let diff = err(scale * l as f32 + min - x[i]);
        best_error += weights[i] * diff;
    }
    if nstep < 1 {
        return (scale, -min);
    }
    let mut laux = [0u8; N];
    for is in 0..=nstep {
        iscale = (rmin + rdelta * is as f32 + nmf) / (max - min);
        let mut sum_l = 0.0f32;
        let mut sum_l2 = 0.0f32;
        let mut sum_xl = 0.0f32;
        for i in 0..N {
            let l = nearest_int(iscale * (x[i] - min)).clamp(0, nmax);
            laux[i] = l as u8;
            let w = weights[i];
            let lf = l as f32;
            sum_l += w * lf;
            sum_l2 += w * lf * lf;
            sum_xl += w * lf * x[i];
        }
        let d = sum_w * sum_l2 - sum_l * sum_l;
        if d > 0.0 {
            let mut this_scale = (sum_w * sum_xl - sum_x * sum_l) / d;
            let mut this_min = (sum_l2 * sum_x - sum_l * sum_xl) / d;
            if this_min > 0.0 {
                this_min = 0.0;
                this_scale = sum_xl / sum_l2;
            }
            let mut cur_error = 0.0f32;
            for i in 0..N {
                let diff = err(this_scale * laux[i] as f32 + this_min - x[i]);
                cur_error += weights[i] * diff;
            }
            if cur_error < best_error {
                *l_out = laux;
                best_error = cur_error;
                scale = this_scale;
                min = this_min;
            }
        }
    }
    (scale, -min)
}

/// ggml's `get_scale_min_k4`: sub-block `j`'s 6-bit scale and min.
fn get_scale_min_k4(j: usize, q: &[u8]) -> (u8, u8) {
    if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        (
            (q[j + 4] & 0xf) | ((q[j - 4] >> 6) << 4),
            (q[j + 4] >> 4) | ((q[j] >> 6) << 4),
        )
    }
}

/// The 12 scale bytes of Q4_K/Q5_K from eight 6-bit scales and mins.
fn pack_scale_min_k4(ls: &[u8; 8], lm: &[u8; 8]) -> [u8; 12] {
    let mut s = [0u8; 12];
    for j in 0..8 {
        if j < 4 {
            s[j] = ls[j];
            s[j + 4] = lm[j];
        } else {
            s[j + 4] = (ls[j] & 0xf) | ((lm[j] & 0xf) << 4);
            s[j - 4] |= (ls[j] >> 4) << 6;
            s[j] |= (lm[j] >> 4) << 6;
        }
    }
    s
}

/// The shared part of `quantize_row_q4_K_ref` / `quantize_row_q5_K_ref`:
/// per-32 scales and mins, the 12 scale bytes, `d`, `dmin` and the final
/// levels `l` (0..=nmax).
fn q45_k(
    x: &[f32],
    nmax: i32,
    rmin: f32,
    rdelta: f32,
    nstep: i32,
) -> ([u8; 12], u16, u16, [u8; QK_K]) {
    let mut l = [0u8; QK_K];
    let mut scales = [0.0f32; 8];
    let mut mins = [0.0f32; 8];
    let mut max_scale = 0.0f32;
    let mut max_min = 0.0f32;
    for j in 0..8 {
        let xs: &[f32; 32] = x[32 * j..32 * j + 32].try_into().expect("32 values");
        let mut sum_x2 = 0.0f32;
        for &v in xs {
            sum_x2 += v * v;
        }
        let av_x = (sum_x2 / 32.0).sqrt();
        let weights: [f32; 32] = std::array::from_fn(|i| av_x + xs[i].abs());
        let ls: &mut [u8; 32] = (&mut l[32 * j..32 * j + 32]).try_into().expect("32 levels");
        let (s, m) = make_qkx2_quants(nmax, xs, &weights, ls, rmin, rdelta, nstep, false);
        scales[j] = s;
        mins[j] = m;
        if s > max_scale {
            max_scale = s;
        }
        if m > max_min {
            max_min = m;
        }
    }
    let inv_scale = if max_scale > 0.0 {
        63.0 / max_scale
    } else {
        0.0
    };
    let inv_min = if max_min > 0.0 { 63.0 / max_min } else { 0.0 };
    let ls: [u8; 8] = std::array::from_fn(|j| (nearest_int(inv_scale * scales[j]) as u8).min(63));
    let lm: [u8; 8] = std::array::from_fn(|j| (nearest_int(inv_min * mins[j]) as u8).min(63));
    let sc = pack_scale_min_k4(&ls, &lm);
    let d = fp16(max_scale / 63.0);
    let dmin = fp16(max_min / 63.0);
    let (df, dminf) = (f16f(d), f16f(dmin));
    for j in 0..8 {
        let (s, m) = get_scale_min_k4(j, &sc);
        let dj = df * s as f32;
        if dj == 0.0 {
            continue;
        }
        let dm = dminf * m as f32;
        for ii in 0..32 {
            let q = nearest_int((x[32 * j + ii] + dm) / dj).clamp(0, nmax);
            l[32 * j + ii] = q as u8;
        }
    }
    (sc, d, dmin, l)
}

/// One Q4_K block: `d dmin scales[12] qs[128]`.
pub(super) fn q4_k(x: &[f32], o: &mut [u8]) {
    debug_assert_eq!((x.len(), o.len()), (QK_K, 144));
    let (sc, d, dmin, l) = q45_k(x, 15, -1.0, 0.1, 20);
    o[0..2].copy_from_slice(&d.to_le_bytes());
    o[2..4].copy_from_slice(&dmin.to_le_bytes());
    o[4..16].copy_from_slice(&sc);
    let qs = &mut o[16..144];
    for (c, j) in (0..QK_K).step_by(64).enumerate() {
        for i in 0..32 {
            qs[32 * c + i] = l[j + i] | (l[j + i + 32] << 4);
        }
    }
}

/// One Q5_K block: `d dmin scales[12] qh[32] qs[128]`.
pub(super) fn q5_k(x: &[f32], o: &mut [u8]) {
    debug_assert_eq!((x.len(), o.len()), (QK_K, 176));
    let (sc, d, dmin, l) = q45_k(x, 31, -0.5, 0.1, 15);
    o[0..2].copy_from_slice(&d.to_le_bytes());
    o[2..4].copy_from_slice(&dmin.to_le_bytes());
    o[4..16].copy_from_slice(&sc);
    let (qh, ql) = o[16..176].split_at_mut(32);
    qh.fill(0);
    let (mut m1, mut m2) = (1u8, 2u8);
    for (c, n) in (0..QK_K).step_by(64).enumerate() {
        for j in 0..32 {
            let mut l1 = l[n + j];
            if l1 > 15 {
                l1 -= 16;
                qh[j] |= m1;
            }
            let mut l2 = l[n + j + 32];
            if l2 > 15 {
                l2 -= 16;
                qh[j] |= m2;
            }
            ql[32 * c + j] = l1 | (l2 << 4);
        }
        m1 <<= 2;
        m2 <<= 2;
    }
}

/// One Q2_K block: `scales[16] qs[64] d dmin`.
pub(super) fn q2_k(x: &[f32], o: &mut [u8]) {
    debug_assert_eq!((x.len(), o.len()), (QK_K, 84));
    let mut l = [0u8; QK_K];
    let mut scales = [0.0f32; 16];
    let mut mins = [0.0f32; 16];
    let mut max_scale = 0.0f32;
    let mut max_min = 0.0f32;
    for j in 0..16 {
        let xs: &[f32; 16] = x[16 * j..16 * j + 16].try_into().expect("16 values");
        let weights: [f32; 16] = std::array::from_fn(|i| xs[i].abs());
        let ls: &mut [u8; 16] = (&mut l[16 * j..16 * j + 16]).try_into().expect("16 levels");
        let (s, m) = make_qkx2_quants(3, xs, &weights, ls, -0.5, 0.1, 15, true);
        scales[j] = s;
        mins[j] = m;
        if s > max_scale {
            max_scale = s;
        }
        if m > max_min {
            max_min = m;
        }
    }
    let q4scale = 15.0f32;
    let mut sc = [0u8; 16];
    let d = if max_scale > 0.0 {
        let iscale = q4scale / max_scale;
        for j in 0..16 {
            sc[j] = nearest_int(iscale * scales[j]) as u8;
        }
        fp16(max_scale / q4scale)
    } else {
        fp16(0.0)
    };
    let dmin = if max_min > 0.0 {
        let iscale = q4scale / max_min;
        for j in 0..16 {
            sc[j] |= nearest_int(iscale * mins[j]).wrapping_shl(4) as u8;
        }
        fp16(max_min / q4scale)
    } else {
        fp16(0.0)
    };
    let (df, dminf) = (f16f(d), f16f(dmin));
    for j in 0..16 {
        let dj = df * (sc[j] & 0xf) as f32;
        if dj == 0.0 {
            continue;
        }
        let dm = dminf * (sc[j] >> 4) as f32;
        for ii in 0..16 {
            let q = nearest_int((x[16 * j + ii] + dm) / dj).clamp(0, 3);
            l[16 * j + ii] = q as u8;
        }
    }
    o[0..16].copy_from_slice(&sc);
    pack_2bit(&l, &mut o[16..80]);
    o[80..82].copy_from_slice(&d.to_le_bytes());
    o[82..84].copy_from_slice(&dmin.to_le_bytes());
}

/// 2-bit levels, four per byte: `qs[j/4 + l]` holds `L[j+l+32k]` in bits
/// `2k`, for each half `j` of 128.
fn pack_2bit(l: &[u8; QK_K], qs: &mut [u8]) {
    for j in (0..QK_K).step_by(128) {
        for i in 0..32 {
            qs[j / 4 + i] =
                l[j + i] | (l[j + i + 32] << 2) | (l[j + i + 64] << 4) | (l[j + i + 96] << 6);
        }
    }
}

/// One Q3_K block: `hmask[32] qs[64] scales[12] d`.
pub(super) fn q3_k(x: &[f32], o: &mut [u8]) {
    debug_assert_eq!((x.len(), o.len()), (QK_K, 110));
    let mut l = [0i8; QK_K];
    let mut scales = [0.0f32; 16];
    let mut max_scale = 0.0f32;
    let mut amax = 0.0f32;
    for j in 0..16 {
        let s = make_q3_quants(4, &x[16 * j..16 * j + 16], &mut l[16 * j..16 * j + 16]);
        scales[j] = s;
        if s.abs() > amax {
            amax = s.abs();
            max_scale = s;
        }
    }
    let mut sc = [0u8; 12];
    let d = if max_scale != 0.0 {
        let iscale = -32.0f32 / max_scale;
        for j in 0..16 {
            let v = nearest_int(iscale * scales[j]) as i8;
            let v = (v.clamp(-32, 31) + 32) as u8;
            if j < 8 {
                sc[j] = v & 0xf;
            } else {
                sc[j - 8] |= (v & 0xf) << 4;
            }
            sc[j % 4 + 8] |= (v >> 4) << (2 * (j / 4));
        }
        fp16(1.0 / iscale)
    } else {
        fp16(0.0)
    };
    let df = f16f(d);
    for j in 0..16 {
        let low = if j < 8 { sc[j] & 0xf } else { sc[j - 8] >> 4 };
        let s = (low | (((sc[8 + j % 4] >> (2 * (j / 4))) & 3) << 4)) as i8 - 32;
        let dj = df * s as f32;
        if dj == 0.0 {
            continue;
        }
        for ii in 0..16 {
            let q = nearest_int(x[16 * j + ii] / dj).clamp(-4, 3);
            l[16 * j + ii] = (q + 4) as i8;
        }
    }
    let (hmask, rest) = o.split_at_mut(32);
    hmask.fill(0);
    let mut lu = [0u8; QK_K];
    for j in 0..QK_K {
        let mut v = l[j] as u8;
        if v > 3 {
            hmask[j % 32] |= 1 << (j / 32);
            v -= 4;
        }
        lu[j] = v;
    }
    pack_2bit(&lu, &mut rest[0..64]);
    rest[64..76].copy_from_slice(&sc);
    rest[76..78].copy_from_slice(&d.to_le_bytes());
}

/// One Q6_K block: `ql[128] qh[64] scales[16] d`.
pub(super) fn q6_k(x: &[f32], o: &mut [u8]) {
    debug_assert_eq!((x.len(), o.len()), (QK_K, 210));
    let mut l = [0i8; QK_K];
    let mut scales = [0.0f32; QK_K / 16];
    let mut max_scale = 0.0f32;
    let mut max_abs_scale = 0.0f32;
    for ib in 0..QK_K / 16 {
        let s = make_qx_quants(32, &x[16 * ib..16 * ib + 16], &mut l[16 * ib..16 * ib + 16]);
        scales[ib] = s;
        if s.abs() > max_abs_scale {
            max_abs_scale = s.abs();
            max_scale = s;
        }
    }
    o.fill(0);
    if max_abs_scale < GROUP_MAX_EPS {
        return;
    }
    let iscale = -128.0f32 / max_scale;
    let d16 = fp16(1.0 / iscale);
    o[208..210].copy_from_slice(&d16.to_le_bytes());
    let d = f16f(d16);
    let mut sc = [0i8; QK_K / 16];
    for ib in 0..QK_K / 16 {
        sc[ib] = nearest_int(iscale * scales[ib]).min(127) as i8;
        o[192 + ib] = sc[ib] as u8;
    }
    for j in 0..QK_K / 16 {
        let dj = d * sc[j] as f32;
        if dj == 0.0 {
            continue;
        }
        for ii in 0..16 {
            let q = nearest_int(x[16 * j + ii] / dj).clamp(-32, 31);
            l[16 * j + ii] = (q + 32) as i8;
        }
    }
    let (ql, rest) = o.split_at_mut(128);
    let qh = &mut rest[..64];
    for half in 0..2 {
        let j = half * 128;
        let ql = &mut ql[half * 64..half * 64 + 64];
        let qh = &mut qh[half * 32..half * 32 + 32];
        for i in 0..32 {
            let q = |k: usize| l[j + i + k] as u8;
            ql[i] = (q(0) & 0xf) | ((q(64) & 0xf) << 4);
            ql[i + 32] = (q(32) & 0xf) | ((q(96) & 0xf) << 4);
            qh[i] = (q(0) >> 4) | ((q(32) >> 4) << 2) | ((q(64) >> 4) << 4) | ((q(96) >> 4) << 6);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fp16_matches_half_on_finite_values() {
        let mut s = 0x1234_5678u32;
        for _ in 0..200_000 {
            s = s.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
            let x = f32::from_bits(s);
            if x.is_nan() {
                assert_eq!(fp16(x) & 0x7fff, 0x7e00);
            } else {
                assert_eq!(fp16(x), half::f16::from_f32(x).to_bits(), "{x:e}");
            }
        }
    }
}
