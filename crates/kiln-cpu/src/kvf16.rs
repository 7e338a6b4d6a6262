//! The f16 KV cache's conversions (`KvType::F16`: values rounded to nearest
//! even when stored, as F16C's `vcvtps2ph` and numpy's `astype(float16)`
//! do) and dot products over f16 rows.

/// f16 bits to f32 (exact).
#[inline]
pub(crate) fn f16_to_f32(h: u16) -> f32 {
    let sign = u32::from(h & 0x8000) << 16;
    let e = u32::from((h >> 10) & 0x1f);
    let m = u32::from(h & 0x3ff);
    let bits = match e {
        0 if m == 0 => sign,
        0 => {
            // Subnormal: m · 2^-24, exact in f32.
            let v = m as f32 * (1.0 / 16_777_216.0);
            return if sign != 0 { -v } else { v };
        }
        31 => sign | 0x7f80_0000 | (m << 13),
        _ => sign | ((e + 112) << 23) | (m << 13),
    };
    f32::from_bits(bits)
}

/// f32 to f16 bits, rounded to nearest even; overflow to infinity, NaN
/// stays NaN (as `vcvtps2ph` with round-to-nearest).
#[inline]
pub(crate) fn f32_to_f16(x: f32) -> u16 {
    let b = x.to_bits();
    let sign = ((b >> 16) & 0x8000) as u16;
    let abs = b & 0x7fff_ffff;
    if abs > 0x7f80_0000 {
        return sign | 0x7e00 | ((abs >> 13) & 0x3ff) as u16;
    }
    if abs >= 0x4780_0000 {
        // ≥ 65536 (or infinity): rounds to infinity.
        return sign | 0x7c00;
    }
    if abs < 0x3880_0000 {
        // Below the smallest normal f16 (2^-14): subnormal or zero.
        // Value = abs_f32; quantum 2^-24.
        let v = f32::from_bits(abs) * 16_777_216.0; // exact (power of two)
        let r = v.round_ties_even() as u16;
        return sign | r;
    }
    // Normal: drop 13 mantissa bits with round to nearest even (a carry
    // into the exponent is the correct result, up to infinity).
    let e = (abs >> 23) - 112;
    let m = abs & 0x7f_ffff;
    let mut h = (e << 10) | (m >> 13);
    let rest = m & 0x1fff;
    if rest > 0x1000 || (rest == 0x1000 && (h & 1) == 1) {
        h += 1;
    }
    sign | h as u16
}

/// `dst[i] = f16(src[i])`; `fast` uses F16C where the CPU has it (the same
/// bits as the scalar conversion).
pub(crate) fn store_f16(fast: bool, src: &[f32], dst: &mut [u16]) {
    #[cfg(target_arch = "x86_64")]
    if fast && crate::simd::has_avx2() {
        // SAFETY: the CPU has F16C (checked).
        unsafe { store_f16_f16c(src, dst) };
        return;
    }
    let _ = fast;
    for (d, &s) in dst.iter_mut().zip(src) {
        *d = f32_to_f16(s);
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn store_f16_f16c(src: &[f32], dst: &mut [u16]) {
    use std::arch::x86_64::*;
    let n = src.len().min(dst.len());
    let mut i = 0;
    while i + 8 <= n {
        let v = _mm256_loadu_ps(src.as_ptr().add(i));
        let h = _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(v);
        _mm_storeu_si128(dst.as_mut_ptr().add(i) as *mut __m128i, h);
        i += 8;
    }
    for j in i..n {
        dst[j] = f32_to_f16(src[j]);
    }
}

/// An element of the KV cache.
pub(crate) trait KvEl: Copy + Send + Sync {
    /// `q · k` (reference order: one chain, as `kernels::dot` for f32).
    fn dot(q: &[f32], k: &[Self]) -> f32;
    /// `y += a · v`.
    fn axpy(y: &mut [f32], a: f32, v: &[Self]);
    /// Four keys against one query (AVX2; only called under `run_avx2`).
    ///
    /// # Safety
    /// The CPU has AVX2, FMA and F16C.
    unsafe fn dot4(k: [&[Self]; 4], q: &[f32]) -> [f32; 4];
    /// `y += Σ p[r]·v[r]` (AVX2).
    ///
    /// # Safety
    /// As `dot4`.
    unsafe fn axpy4(y: &mut [f32], p: [f32; 4], v: [&[Self]; 4]);
}

impl KvEl for f32 {
    #[inline(always)]
    fn dot(q: &[f32], k: &[f32]) -> f32 {
        crate::kernels::dot(q, k)
    }
    #[inline(always)]
    fn axpy(y: &mut [f32], a: f32, v: &[f32]) {
        crate::kernels::axpy(y, a, v)
    }
    #[inline(always)]
    unsafe fn dot4(k: [&[f32]; 4], q: &[f32]) -> [f32; 4] {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: the caller's contract.
        return unsafe { crate::avx2::dot4(k, q) };
        #[cfg(not(target_arch = "x86_64"))]
        crate::kernels::dot4(k, q)
    }
    #[inline(always)]
    unsafe fn axpy4(y: &mut [f32], p: [f32; 4], v: [&[f32]; 4]) {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: the caller's contract.
        return unsafe { crate::avx2::axpy4(y, p, v) };
        #[cfg(not(target_arch = "x86_64"))]
        crate::kernels::axpy4(y, p, v)
    }
}

impl KvEl for u16 {
    #[inline(always)]
    fn dot(q: &[f32], k: &[u16]) -> f32 {
        let mut acc = [0.0f32; 8];
        let (qc, kc) = (q.chunks_exact(8), k.chunks_exact(8));
        let (qr, kr) = (qc.remainder(), kc.remainder());
        for (a, b) in qc.zip(kc) {
            for j in 0..8 {
                acc[j] += a[j] * f16_to_f32(b[j]);
            }
        }
        let mut s =
            ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
        for (a, &b) in qr.iter().zip(kr) {
            s += a * f16_to_f32(b);
        }
        s
    }
    #[inline(always)]
    fn axpy(y: &mut [f32], a: f32, v: &[u16]) {
        for (y, &v) in y.iter_mut().zip(v) {
            *y += a * f16_to_f32(v);
        }
    }
    #[inline(always)]
    unsafe fn dot4(k: [&[u16]; 4], q: &[f32]) -> [f32; 4] {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: the caller's contract.
        return unsafe { crate::avx2::dot4(k, q) };
        #[cfg(not(target_arch = "x86_64"))]
        [
            Self::dot(q, k[0]),
            Self::dot(q, k[1]),
            Self::dot(q, k[2]),
            Self::dot(q, k[3]),
        ]
    }
    #[inline(always)]
    unsafe fn axpy4(y: &mut [f32], p: [f32; 4], v: [&[u16]; 4]) {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: the caller's contract.
        return unsafe { crate::avx2::axpy4(y, p, v) };
        #[cfg(not(target_arch = "x86_64"))]
        for r in 0..4 {
            Self::axpy(y, p[r], v[r]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn f16_round_trip_and_rounding_match_f16c() {
        // Every f16 value converts exactly and back.
        for h in 0..=u16::MAX {
            let f = f16_to_f32(h);
            if f.is_nan() {
                assert!(f16_to_f32(f32_to_f16(f)).is_nan());
                continue;
            }
            assert_eq!(f32_to_f16(f), h, "{h:#06x} {f}");
        }
        // Scalar and F16C agree on values around every rounding boundary.
        let mut xs = Vec::new();
        let mut s = 0x1234_5678u64;
        for _ in 0..200_000 {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            xs.push(f32::from_bits(s as u32));
        }
        for h in (0..0x7c00u16).step_by(7) {
            let b = f16_to_f32(h).to_bits();
            for d in [0x0fffu32, 0x1000, 0x1001] {
                xs.push(f32::from_bits(b + d));
                xs.push(-f32::from_bits(b + d));
            }
        }
        xs.extend([
            65504.0,
            65519.0,
            65520.0,
            1e9,
            f32::INFINITY,
            0.0,
            -0.0,
            5.9e-8,
            2.9e-8,
        ]);
        let mut fast = vec![0u16; xs.len()];
        let mut slow = vec![0u16; xs.len()];
        store_f16(true, &xs, &mut fast);
        store_f16(false, &xs, &mut slow);
        for ((x, f), s) in xs.iter().zip(&fast).zip(&slow) {
            if x.is_nan() {
                assert!(f16_to_f32(*f).is_nan() && f16_to_f32(*s).is_nan());
            } else {
                assert_eq!(f, s, "{x:e} ({:#010x})", x.to_bits());
            }
        }
    }
}

#[cfg(all(test, target_arch = "x86_64"))]
mod kernel_tests {
    use super::*;

    fn rng(s: &mut u64) -> f32 {
        *s ^= *s << 13;
        *s ^= *s >> 7;
        *s ^= *s << 17;
        (*s >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0
    }

    /// The AVX2 f16 `dot4`/`axpy4` against f64 sums over the same f16
    /// values, and the scalar `dot`/`axpy`, on awkward head sizes.
    #[test]
    fn f16_attention_kernels_match_f64() {
        if !crate::simd::has_avx2() {
            return;
        }
        let mut s = 7u64;
        for len in [
            1, 3, 7, 8, 9, 15, 16, 17, 31, 33, 64, 67, 80, 96, 128, 200, 256,
        ] {
            let q: Vec<f32> = (0..len).map(|_| rng(&mut s) * 3.0).collect();
            let rows: Vec<Vec<u16>> = (0..4)
                .map(|_| (0..len).map(|_| f32_to_f16(rng(&mut s) * 5.0)).collect())
                .collect();
            let k = [&rows[0][..], &rows[1][..], &rows[2][..], &rows[3][..]];
            // SAFETY: AVX2/FMA/F16C checked above.
            let got = unsafe { <u16 as KvEl>::dot4(k, &q) };
            for r in 0..4 {
                let (want, mag) = k[r]
                    .iter()
                    .zip(&q)
                    .fold((0.0f64, 0.0f64), |(a, m), (&h, &x)| {
                        let p = f64::from(f16_to_f32(h)) * f64::from(x);
                        (a + p, m + p.abs())
                    });
                let tol = 1e-6 * mag.max(1.0);
                assert!(
                    (f64::from(got[r]) - want).abs() <= tol,
                    "dot4 len {len} row {r}"
                );
                let scalar = <u16 as KvEl>::dot(&q, k[r]);
                assert!(
                    (f64::from(scalar) - want).abs() <= tol,
                    "dot len {len} row {r}"
                );
            }
            let p = [0.3f32, -1.25, 0.07, 2.0];
            let y0: Vec<f32> = (0..len).map(|_| rng(&mut s)).collect();
            let mut y = y0.clone();
            // SAFETY: as above.
            unsafe { <u16 as KvEl>::axpy4(&mut y, p, k) };
            let mut y2 = y0.clone();
            for r in 0..4 {
                <u16 as KvEl>::axpy(&mut y2, p[r], k[r]);
            }
            for i in 0..len {
                let want = f64::from(y0[i])
                    + (0..4)
                        .map(|r| f64::from(p[r]) * f64::from(f16_to_f32(k[r][i])))
                        .sum::<f64>();
                assert!(
                    (f64::from(y[i]) - want).abs() <= 1e-5,
                    "axpy4 len {len} at {i}"
                );
                assert!(
                    (f64::from(y2[i]) - want).abs() <= 1e-5,
                    "axpy len {len} at {i}"
                );
            }
        }
    }
}
