//! K-quant blocks (256 values), transcribed from ggml-quants.c's reference
//! quantizers (`quantize_row_q6_K_ref` with `make_qx_quants`, no importance
//! matrix). gguf-py has no K-quant quantizer; these are checked against
//! llama.cpp-made files and by round-trip error bounds.

use super::f32_to_f16_bits;

const QK_K: usize = 256;
const GROUP_MAX_EPS: f32 = 1e-15;

/// ggml's `nearest_int`: round half to even via the 1.5 * 2^23 trick.
fn nearest_int(v: f32) -> i32 {
    let bits = (v + 12582912.0).to_bits() as i32;
    (bits & 0x007f_ffff) - 0x0040_0000
}

/// `make_qx_quants(n, nmax, x, L, rmse_type = 1, NULL)`.
fn make_qx_quants(nmax: i32, x: &[f32], l_out: &mut [i8]) -> f32 {
    let mut max = 0.0f32;
    let mut amax = 0.0f32;
    for &v in x {
        if v.abs() > amax {
            amax = v.abs();
            max = v;
        }
    }
    if amax < GROUP_MAX_EPS {
        l_out.iter_mut().for_each(|l| *l = 0);
        return 0.0;
    }
    let nmf = nmax as f32;
    let mut iscale = -nmf / max;
    let mut sumlx = 0.0f32;
    let mut suml2 = 0.0f32;
    for (i, &v) in x.iter().enumerate() {
        let l = nearest_int(iscale * v).clamp(-nmax, nmax - 1);
        l_out[i] = (l + nmax) as i8;
        let w = v * v;
        sumlx += w * v * l as f32;
        suml2 += w * (l * l) as f32;
    }
    let mut scale = if suml2 != 0.0 { sumlx / suml2 } else { 0.0 };
    let mut best = scale * sumlx;
    for is in -9..=9 {
        if is == 0 {
            continue;
        }
        iscale = -(nmf + 0.1 * is as f32) / max;
        sumlx = 0.0;
        suml2 = 0.0;
        for &v in x {
            let l = nearest_int(iscale * v).clamp(-nmax, nmax - 1);
            let w = v * v;
            sumlx += w * v * l as f32;
            suml2 += w * (l * l) as f32;
        }
        if suml2 > 0.0 && sumlx * sumlx > best * suml2 {
            for (i, &v) in x.iter().enumerate() {
                let l = nearest_int(iscale * v).clamp(-nmax, nmax - 1);
                l_out[i] = (nmax + l) as i8;
            }
            scale = sumlx / suml2;
            best = scale * sumlx;
        }
    }
    scale
}

/// One Q6_K block: `ql[128] qh[64] scales[16] d`.
pub(super) fn q6_k(x: &[f32], o: &mut [u8]) {
    debug_assert_eq!(x.len(), QK_K);
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
    o.iter_mut().for_each(|b| *b = 0);
    if max_abs_scale < GROUP_MAX_EPS {
        return;
    }
    let iscale = -128.0f32 / max_scale;
    let d16 = f32_to_f16_bits(1.0 / iscale);
    o[208..210].copy_from_slice(&d16.to_le_bytes());
    let d = half::f16::from_bits(d16).to_f32();
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
