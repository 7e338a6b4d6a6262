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
    let max = max_by_magnitude(x);
    let amax = max.abs();
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
    let max = max_by_magnitude(x);
    let amax = max.abs();
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

/// ggml's `make_qkx2_quants(n, nmax, x, weights, L, &the_min, Laux, rmin,
/// rdelta, nstep, use_mad)` for `K` independent groups of `N` values at once
/// (`xt[i][k]` is value `i` of group `k`); returns `(scale, the_min)` per
/// group. Every group goes through exactly the C function's operations in
/// the same order
/// (branches become per-lane selects), so the results are bit-identical;
/// running the groups side by side only breaks the scalar version's
/// dependency chains (and lets the compiler use SIMD across groups).
#[allow(clippy::too_many_arguments, clippy::needless_range_loop)]
#[inline(always)]
fn make_qkx2_quants_lanes<const N: usize, const K: usize>(
    nmax: i32,
    xt: &[[f32; K]; N],
    wt: &[[f32; K]; N],
    l_out: &mut [[f32; K]; N],
    rmin: f32,
    rdelta: f32,
    nstep: i32,
    use_mad: bool,
) -> ([f32; K], [f32; K]) {
    let mut min = xt[0];
    let mut max = xt[0];
    let mut sum_w = wt[0];
    let mut sum_x = [0.0f32; K];
    for k in 0..K {
        sum_x[k] = sum_w[k] * xt[0][k];
    }
    for i in 1..N {
        for k in 0..K {
            let x = xt[i][k];
            min[k] = if x < min[k] { x } else { min[k] };
            max[k] = if x > max[k] { x } else { max[k] };
            sum_w[k] += wt[i][k];
            sum_x[k] += wt[i][k] * x;
        }
    }
    for m in min.iter_mut() {
        if *m > 0.0 {
            *m = 0.0;
        }
    }
    // Groups with max == min return early in C (levels 0, scale 0, the
    // min as it is now); here they run along and are overwritten at the end.
    let flat: [bool; K] = std::array::from_fn(|k| max[k] == min[k]);
    let min0 = min;
    let nmf = nmax as f32;
    let err = |d: f32| if use_mad { d.abs() } else { d * d };
    let mut scale = [0.0f32; K];
    let mut iscale = [0.0f32; K];
    for k in 0..K {
        iscale[k] = nmf / (max[k] - min[k]);
        scale[k] = 1.0 / iscale[k];
    }
    let mut best_error = [0.0f32; K];
    for i in 0..N {
        for k in 0..K {
            let l = nearest_int(iscale[k] * (xt[i][k] - min[k])).clamp(0, nmax);
            l_out[i][k] = l as f32;
            let diff = err(scale[k] * l_out[i][k] + min[k] - xt[i][k]);
            best_error[k] += wt[i][k] * diff;
        }
    }
    if nstep >= 1 {
        let mut laux = [[0.0f32; K]; N];
        for is in 0..=nstep {
            let num = rmin + rdelta * is as f32 + nmf;
            for k in 0..K {
                iscale[k] = num / (max[k] - min[k]);
            }
            let mut sum_l = [0.0f32; K];
            let mut sum_l2 = [0.0f32; K];
            let mut sum_xl = [0.0f32; K];
            for i in 0..N {
                for k in 0..K {
                    let l = nearest_int(iscale[k] * (xt[i][k] - min[k])).clamp(0, nmax);
                    let lf = l as f32;
                    laux[i][k] = lf;
                    let w = wt[i][k];
                    sum_l[k] += w * lf;
                    sum_l2[k] += w * lf * lf;
                    sum_xl[k] += w * lf * xt[i][k];
                }
            }
            let mut ok = [false; K];
            let mut this_scale = [0.0f32; K];
            let mut this_min = [0.0f32; K];
            for k in 0..K {
                let d = sum_w[k] * sum_l2[k] - sum_l[k] * sum_l[k];
                ok[k] = d > 0.0;
                let ts = (sum_w[k] * sum_xl[k] - sum_x[k] * sum_l[k]) / d;
                let tm = (sum_l2[k] * sum_x[k] - sum_l[k] * sum_xl[k]) / d;
                let pos = tm > 0.0;
                this_min[k] = if pos { 0.0 } else { tm };
                this_scale[k] = if pos { sum_xl[k] / sum_l2[k] } else { ts };
            }
            if !ok.iter().any(|&b| b) {
                continue;
            }
            let mut cur_error = [0.0f32; K];
            for i in 0..N {
                for k in 0..K {
                    let diff = err(this_scale[k] * laux[i][k] + this_min[k] - xt[i][k]);
                    cur_error[k] += wt[i][k] * diff;
                }
            }
            let better: [bool; K] = std::array::from_fn(|k| ok[k] && cur_error[k] < best_error[k]);
            if !better.iter().any(|&b| b) {
                continue;
            }
            for i in 0..N {
                for k in 0..K {
                    l_out[i][k] = if better[k] { laux[i][k] } else { l_out[i][k] };
                }
            }
            for k in 0..K {
                if better[k] {
                    best_error[k] = cur_error[k];
                    scale[k] = this_scale[k];
                    min[k] = this_min[k];
                }
            }
        }
    }
    for k in 0..K {
        if flat[k] {
            scale[k] = 0.0;
            min[k] = min0[k];
            for row in l_out.iter_mut() {
                row[k] = 0.0;
            }
        }
    }
    (scale, min.map(|m| -m))
}

/// [`make_qkx2_quants_lanes`] for 8 groups: explicit AVX2 where the CPU has
/// it (the same lane-wise IEEE operations, so the same bits), the portable
/// version otherwise.
#[allow(clippy::too_many_arguments)]
fn qkx2_8<const N: usize>(
    nmax: i32,
    xt: &[[f32; 8]; N],
    wt: &[[f32; 8]; N],
    l_out: &mut [[f32; 8]; N],
    rmin: f32,
    rdelta: f32,
    nstep: i32,
    use_mad: bool,
) -> ([f32; 8], [f32; 8]) {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU has AVX2.
        return unsafe { avx2::qkx2_8(nmax, xt, wt, l_out, rmin, rdelta, nstep, use_mad) };
    }
    make_qkx2_quants_lanes(nmax, xt, wt, l_out, rmin, rdelta, nstep, use_mad)
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    //! `make_qkx2_quants` on 8 groups in AVX2 registers, operation for
    //! operation as [`super::make_qkx2_quants_lanes`] (no FMA: every
    //! product is rounded before it is added, as in the C reference).

    use std::arch::x86_64::*;

    #[inline(always)]
    unsafe fn ld(a: &[f32; 8]) -> __m256 {
        _mm256_loadu_ps(a.as_ptr())
    }

    #[inline(always)]
    unsafe fn st(a: &mut [f32; 8], v: __m256) {
        _mm256_storeu_ps(a.as_mut_ptr(), v)
    }

    /// `clamp(nearest_int(v), 0, nmax)` as f32, per lane.
    #[inline(always)]
    unsafe fn level(v: __m256, nmax: __m256i) -> __m256 {
        let b = _mm256_castps_si256(_mm256_add_ps(v, _mm256_set1_ps(12582912.0)));
        let i = _mm256_sub_epi32(
            _mm256_and_si256(b, _mm256_set1_epi32(0x007f_ffff)),
            _mm256_set1_epi32(0x0040_0000),
        );
        let i = _mm256_min_epi32(_mm256_max_epi32(i, _mm256_setzero_si256()), nmax);
        _mm256_cvtepi32_ps(i)
    }

    #[inline(always)]
    unsafe fn err(d: __m256, use_mad: bool) -> __m256 {
        if use_mad {
            _mm256_andnot_ps(_mm256_set1_ps(-0.0), d)
        } else {
            _mm256_mul_ps(d, d)
        }
    }

    #[allow(clippy::too_many_arguments, clippy::needless_range_loop)]
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn qkx2_8<const N: usize>(
        nmax: i32,
        xt: &[[f32; 8]; N],
        wt: &[[f32; 8]; N],
        l_out: &mut [[f32; 8]; N],
        rmin: f32,
        rdelta: f32,
        nstep: i32,
        use_mad: bool,
    ) -> ([f32; 8], [f32; 8]) {
        let zero = _mm256_setzero_ps();
        let nmax_i = _mm256_set1_epi32(nmax);
        let nmf = nmax as f32;
        let mut min = ld(&xt[0]);
        let mut max = min;
        let mut sum_w = ld(&wt[0]);
        let mut sum_x = _mm256_mul_ps(sum_w, min);
        for i in 1..N {
            let x = ld(&xt[i]);
            let w = ld(&wt[i]);
            // minps(a, b) = a < b ? a : b: exactly `if x < min { min = x }`.
            min = _mm256_min_ps(x, min);
            max = _mm256_max_ps(x, max);
            sum_w = _mm256_add_ps(sum_w, w);
            sum_x = _mm256_add_ps(sum_x, _mm256_mul_ps(w, x));
        }
        min = _mm256_blendv_ps(min, zero, _mm256_cmp_ps::<_CMP_GT_OQ>(min, zero));
        let flat = _mm256_cmp_ps::<_CMP_EQ_OQ>(max, min);
        let min0 = min;
        let mut iscale = _mm256_div_ps(_mm256_set1_ps(nmf), _mm256_sub_ps(max, min));
        let mut scale = _mm256_div_ps(_mm256_set1_ps(1.0), iscale);
        let mut best = zero;
        for i in 0..N {
            let x = ld(&xt[i]);
            let l = level(_mm256_mul_ps(iscale, _mm256_sub_ps(x, min)), nmax_i);
            st(&mut l_out[i], l);
            let d = _mm256_sub_ps(_mm256_add_ps(_mm256_mul_ps(scale, l), min), x);
            best = _mm256_add_ps(best, _mm256_mul_ps(ld(&wt[i]), err(d, use_mad)));
        }
        if nstep >= 1 {
            let mut laux = [zero; N];
            for is in 0..=nstep {
                let num = rmin + rdelta * is as f32 + nmf;
                iscale = _mm256_div_ps(_mm256_set1_ps(num), _mm256_sub_ps(max, min));
                let (mut sum_l, mut sum_l2, mut sum_xl) = (zero, zero, zero);
                for i in 0..N {
                    let x = ld(&xt[i]);
                    let w = ld(&wt[i]);
                    let l = level(_mm256_mul_ps(iscale, _mm256_sub_ps(x, min)), nmax_i);
                    laux[i] = l;
                    let wl = _mm256_mul_ps(w, l);
                    sum_l = _mm256_add_ps(sum_l, wl);
                    sum_l2 = _mm256_add_ps(sum_l2, _mm256_mul_ps(wl, l));
                    sum_xl = _mm256_add_ps(sum_xl, _mm256_mul_ps(wl, x));
                }
                let d = _mm256_sub_ps(_mm256_mul_ps(sum_w, sum_l2), _mm256_mul_ps(sum_l, sum_l));
                let ok = _mm256_cmp_ps::<_CMP_GT_OQ>(d, zero);
                if _mm256_movemask_ps(ok) == 0 {
                    continue;
                }
                let ts = _mm256_div_ps(
                    _mm256_sub_ps(_mm256_mul_ps(sum_w, sum_xl), _mm256_mul_ps(sum_x, sum_l)),
                    d,
                );
                let tm = _mm256_div_ps(
                    _mm256_sub_ps(_mm256_mul_ps(sum_l2, sum_x), _mm256_mul_ps(sum_l, sum_xl)),
                    d,
                );
                let pos = _mm256_cmp_ps::<_CMP_GT_OQ>(tm, zero);
                let this_min = _mm256_blendv_ps(tm, zero, pos);
                let this_scale = _mm256_blendv_ps(ts, _mm256_div_ps(sum_xl, sum_l2), pos);
                let mut cur = zero;
                for i in 0..N {
                    let x = ld(&xt[i]);
                    let e = _mm256_sub_ps(
                        _mm256_add_ps(_mm256_mul_ps(this_scale, laux[i]), this_min),
                        x,
                    );
                    cur = _mm256_add_ps(cur, _mm256_mul_ps(ld(&wt[i]), err(e, use_mad)));
                }
                let better = _mm256_and_ps(ok, _mm256_cmp_ps::<_CMP_LT_OQ>(cur, best));
                if _mm256_movemask_ps(better) == 0 {
                    continue;
                }
                for i in 0..N {
                    let v = _mm256_blendv_ps(ld(&l_out[i]), laux[i], better);
                    st(&mut l_out[i], v);
                }
                best = _mm256_blendv_ps(best, cur, better);
                scale = _mm256_blendv_ps(scale, this_scale, better);
                min = _mm256_blendv_ps(min, this_min, better);
            }
        }
        for row in l_out.iter_mut() {
            let v = _mm256_blendv_ps(ld(row), zero, flat);
            st(row, v);
        }
        scale = _mm256_blendv_ps(scale, zero, flat);
        min = _mm256_blendv_ps(min, min0, flat);
        let mut sc = [0.0f32; 8];
        let mut mn = [0.0f32; 8];
        st(&mut sc, scale);
        st(&mut mn, _mm256_xor_ps(min, _mm256_set1_ps(-0.0)));
        (sc, mn)
    }

    /// `make_qx_quants(16, nmax, x, L, rmse_type = 1, NULL)` on 8 groups
    /// (`xt[i][k]` is value `i` of group `k`): returns the scales and the
    /// levels `L` (`0..2*nmax`, 0 for an all-zero group).
    #[allow(clippy::needless_range_loop)]
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn qx_8(nmax: i32, xt: &[[f32; 8]; 16]) -> ([f32; 8], [[i8; 8]; 16]) {
        let zero = _mm256_setzero_ps();
        let sign = _mm256_set1_ps(-0.0);
        let lo = _mm256_set1_epi32(-nmax);
        let hi = _mm256_set1_epi32(nmax - 1);
        let nmf = nmax as f32;
        let mut max = zero;
        let mut amax = zero;
        for row in xt {
            let v = ld(row);
            let ax = _mm256_andnot_ps(sign, v);
            let m = _mm256_cmp_ps::<_CMP_GT_OQ>(ax, amax);
            amax = _mm256_blendv_ps(amax, ax, m);
            max = _mm256_blendv_ps(max, v, m);
        }
        let tiny = _mm256_cmp_ps::<_CMP_LT_OQ>(amax, _mm256_set1_ps(super::GROUP_MAX_EPS));
        let levels = |iscale: __m256, l: &mut [__m256; 16]| -> (__m256, __m256) {
            let (mut sumlx, mut suml2) = (zero, zero);
            for i in 0..16 {
                let v = ld(&xt[i]);
                let b = _mm256_castps_si256(_mm256_add_ps(
                    _mm256_mul_ps(iscale, v),
                    _mm256_set1_ps(12582912.0),
                ));
                let q = _mm256_sub_epi32(
                    _mm256_and_si256(b, _mm256_set1_epi32(0x007f_ffff)),
                    _mm256_set1_epi32(0x0040_0000),
                );
                let lf = _mm256_cvtepi32_ps(_mm256_min_epi32(_mm256_max_epi32(q, lo), hi));
                l[i] = lf;
                let w = _mm256_mul_ps(v, v);
                sumlx = _mm256_add_ps(sumlx, _mm256_mul_ps(_mm256_mul_ps(w, v), lf));
                suml2 = _mm256_add_ps(suml2, _mm256_mul_ps(_mm256_mul_ps(w, lf), lf));
            }
            (sumlx, suml2)
        };
        let mut l = [zero; 16];
        let mut laux = [zero; 16];
        let (sumlx, suml2) = levels(_mm256_div_ps(_mm256_set1_ps(-nmf), max), &mut l);
        let nz = _mm256_cmp_ps::<_CMP_NEQ_UQ>(suml2, zero);
        let mut scale = _mm256_and_ps(nz, _mm256_div_ps(sumlx, suml2));
        let mut best = _mm256_mul_ps(scale, sumlx);
        for is in -9..=9 {
            if is == 0 {
                continue;
            }
            let iscale = _mm256_div_ps(_mm256_set1_ps(-(nmf + 0.1f32 * is as f32)), max);
            let (sumlx, suml2) = levels(iscale, &mut laux);
            let better = _mm256_and_ps(
                _mm256_cmp_ps::<_CMP_GT_OQ>(suml2, zero),
                _mm256_cmp_ps::<_CMP_GT_OQ>(
                    _mm256_mul_ps(sumlx, sumlx),
                    _mm256_mul_ps(best, suml2),
                ),
            );
            if _mm256_movemask_ps(better) == 0 {
                continue;
            }
            for i in 0..16 {
                l[i] = _mm256_blendv_ps(l[i], laux[i], better);
            }
            let sc = _mm256_div_ps(sumlx, suml2);
            scale = _mm256_blendv_ps(scale, sc, better);
            best = _mm256_blendv_ps(best, _mm256_mul_ps(sc, sumlx), better);
        }
        scale = _mm256_blendv_ps(scale, zero, tiny);
        let mut out = [[0i8; 8]; 16];
        let off = _mm256_set1_ps(nmf);
        for i in 0..16 {
            let mut v = [0.0f32; 8];
            st(
                &mut v,
                _mm256_blendv_ps(_mm256_add_ps(l[i], off), zero, tiny),
            );
            out[i] = v.map(|f| f as i8);
        }
        let mut sc = [0.0f32; 8];
        st(&mut sc, scale);
        (sc, out)
    }
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

/// `x` as `N` sub-blocks of `M` values, transposed: `xt[i][j]` is value `i`
/// of sub-block `j` (the layout `qkx2_8` takes).
fn transposed<const M: usize, const N: usize>(x: &[f32]) -> [[f32; N]; M] {
    let mut xt = [[0.0f32; N]; M];
    for (j, sub) in x.chunks_exact(M).enumerate() {
        for (i, &v) in sub.iter().enumerate() {
            xt[i][j] = v;
        }
    }
    xt
}

/// The levels `lt[i][j]` of `transposed` back in block order:
/// `l[M * j + i]`.
fn untransposed<const M: usize, const N: usize>(lt: &[[f32; N]; M]) -> [u8; QK_K] {
    let mut l = [0u8; QK_K];
    for (i, row) in lt.iter().enumerate() {
        for (j, &v) in row.iter().enumerate() {
            l[M * j + i] = v as u8;
        }
    }
    l
}

/// The largest of `v`, 0 when none is above it (ggml's `>` loop).
fn max_above_zero(v: &[f32]) -> f32 {
    v.iter().fold(0.0f32, |m, &s| if s > m { s } else { m })
}

/// The value of `v` with the largest magnitude, the first on ties; 0 when
/// none is above 0 in magnitude (ggml's `fabsf(s) > amax` loop).
fn max_by_magnitude(v: &[f32]) -> f32 {
    let mut amax = 0.0f32;
    let mut best = 0.0f32;
    for &s in v {
        if s.abs() > amax {
            amax = s.abs();
            best = s;
        }
    }
    best
}

/// The shared part of `quantize_row_q4_K_ref` / `quantize_row_q5_K_ref`:
/// per-32 scales and mins, the 12 scale bytes, `d`, `dmin` and the final
/// levels `l` (0..=nmax).
type Q45 = ([u8; 12], u16, u16, [u8; QK_K]);

fn q45_k(x: &[f32], nmax: i32, rmin: f32, rdelta: f32, nstep: i32) -> Q45 {
    let xt = transposed::<32, 8>(x);
    let mut sum_x2 = [0.0f32; 8];
    for row in &xt {
        for k in 0..8 {
            sum_x2[k] += row[k] * row[k];
        }
    }
    let av_x = sum_x2.map(|s| (s / 32.0).sqrt());
    let wt: [[f32; 8]; 32] =
        std::array::from_fn(|i| std::array::from_fn(|k| av_x[k] + xt[i][k].abs()));
    let mut lt = [[0.0f32; 8]; 32];
    let (scales, mins) = qkx2_8(nmax, &xt, &wt, &mut lt, rmin, rdelta, nstep, false);
    let mut l = untransposed(&lt);
    let (max_scale, max_min) = (max_above_zero(&scales), max_above_zero(&mins));
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
    let xt = transposed::<16, 16>(x);
    let mut lt = [[0.0f32; 16]; 16];
    let mut scales = [0.0f32; 16];
    let mut mins = [0.0f32; 16];
    for h in 0..2 {
        let xh: [[f32; 8]; 16] = std::array::from_fn(|i| std::array::from_fn(|k| xt[i][8 * h + k]));
        let wh: [[f32; 8]; 16] = std::array::from_fn(|i| xh[i].map(f32::abs));
        let mut lh = [[0.0f32; 8]; 16];
        let (sc, mn) = qkx2_8(3, &xh, &wh, &mut lh, -0.5, 0.1, 15, true);
        scales[8 * h..8 * h + 8].copy_from_slice(&sc);
        mins[8 * h..8 * h + 8].copy_from_slice(&mn);
        for i in 0..16 {
            lt[i][8 * h..8 * h + 8].copy_from_slice(&lh[i]);
        }
    }
    let mut l = untransposed(&lt);
    let (max_scale, max_min) = (max_above_zero(&scales), max_above_zero(&mins));
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
    for j in 0..16 {
        scales[j] = make_q3_quants(4, &x[16 * j..16 * j + 16], &mut l[16 * j..16 * j + 16]);
    }
    let max_scale = max_by_magnitude(&scales);
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

/// [`make_qx_quants`] (rmse_type 1) on the 16 groups of 16 values of a
/// super-block: AVX2 (8 groups at a time, same bits) where present.
fn qx_16x16(nmax: i32, x: &[f32], scales: &mut [f32; 16], l: &mut [i8; QK_K]) {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        for h in 0..2 {
            let xt: [[f32; 8]; 16] =
                std::array::from_fn(|i| std::array::from_fn(|k| x[16 * (8 * h + k) + i]));
            // SAFETY: the CPU has AVX2.
            let (sc, lv) = unsafe { avx2::qx_8(nmax, &xt) };
            scales[8 * h..8 * h + 8].copy_from_slice(&sc);
            for (i, row) in lv.iter().enumerate() {
                for k in 0..8 {
                    l[16 * (8 * h + k) + i] = row[k];
                }
            }
        }
        return;
    }
    for ib in 0..16 {
        scales[ib] = make_qx_quants(
            nmax,
            &x[16 * ib..16 * ib + 16],
            &mut l[16 * ib..16 * ib + 16],
        );
    }
}

/// One Q6_K block: `ql[128] qh[64] scales[16] d`.
pub(super) fn q6_k(x: &[f32], o: &mut [u8]) {
    debug_assert_eq!((x.len(), o.len()), (QK_K, 210));
    let mut l = [0i8; QK_K];
    let mut scales = [0.0f32; QK_K / 16];
    qx_16x16(32, x, &mut scales, &mut l);
    let max_scale = max_by_magnitude(&scales);
    let max_abs_scale = max_scale.abs();
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

    /// The portable lane version (used without AVX2) equals the dispatched
    /// one (AVX2 here), including flat, zero, negative and huge groups.
    #[test]
    fn portable_lanes_equal_dispatched() {
        let mut s = 0x2545_f491_4f6c_dd1du64;
        let mut r = || {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s >> 40) as f32 / (1u64 << 24) as f32 - 0.5
        };
        for case in 0..400 {
            let mut xt = [[0.0f32; 8]; 32];
            for (i, row) in xt.iter_mut().enumerate() {
                for (k, v) in row.iter_mut().enumerate() {
                    *v = match (case + k) % 6 {
                        0 => r() * 0.02,
                        1 => -1.5,
                        2 => 0.0,
                        3 => r() * 1e30,
                        4 => r().abs() + 1.0,
                        _ => r() * (i as f32 + 1.0),
                    };
                }
            }
            for (nmax, use_mad, rmin, rdelta, nstep) in [
                (15, false, -1.0, 0.1, 20),
                (31, false, -0.5, 0.1, 15),
                (3, true, -0.5, 0.1, 15),
            ] {
                let wt: [[f32; 8]; 32] = std::array::from_fn(|i| xt[i].map(|v| v.abs() + 0.1));
                let (mut la, mut lb) = ([[0.0f32; 8]; 32], [[0.0f32; 8]; 32]);
                let a =
                    make_qkx2_quants_lanes(nmax, &xt, &wt, &mut la, rmin, rdelta, nstep, use_mad);
                let b = qkx2_8(nmax, &xt, &wt, &mut lb, rmin, rdelta, nstep, use_mad);
                let bits = |v: ([f32; 8], [f32; 8])| (v.0.map(f32::to_bits), v.1.map(f32::to_bits));
                assert_eq!(bits(a), bits(b), "case {case} nmax {nmax}");
                assert_eq!(la, lb, "case {case} nmax {nmax}");
            }
        }
    }

    /// Q6_K's groups: the scalar `make_qx_quants` equals the dispatched one.
    #[test]
    fn qx_scalar_equals_dispatched() {
        let mut s = 0x9e37_79b9u64;
        let mut r = || {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (s >> 40) as f32 / (1u64 << 24) as f32 - 0.5
        };
        for case in 0..300 {
            let x: Vec<f32> = (0..QK_K)
                .map(|i| match (case + i / 16) % 5 {
                    0 => r() * 0.02,
                    1 => 0.0,
                    2 => 0.75,
                    3 => r() * 1e-20,
                    _ => r() * (1 + i % 7) as f32,
                })
                .collect();
            let (mut sa, mut la) = ([0.0f32; 16], [0i8; QK_K]);
            qx_16x16(32, &x, &mut sa, &mut la);
            let mut lb = [0i8; QK_K];
            for ib in 0..16 {
                let sb = make_qx_quants(
                    32,
                    &x[16 * ib..16 * ib + 16],
                    &mut lb[16 * ib..16 * ib + 16],
                );
                assert_eq!(sa[ib].to_bits(), sb.to_bits(), "case {case} group {ib}");
            }
            assert_eq!(la, lb, "case {case}");
        }
    }

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
