//! Activations quantized on the fly for the integer kernels.
//!
//! One format serves every weight type: blocks of 32 values with an f32
//! scale `d` (`x ≈ d * q`, `q` in -127..=127, round-half-even), plus the
//! block's `d * Σq` (for Q4_1/Q5_1 mins and the Q4_0/Q5_0 offsets) and the
//! integer sums of every 16 values (for the k-quants' 16-value sub-blocks
//! and offsets). Per-32 scales are finer than llama.cpp's per-256 Q8_K, so
//! the k-quant paths are at least as accurate as llama.cpp's.

use crate::pool::ThreadPool;

/// Quantized activations of up to `cap_tokens` rows of up to `cap_cols`.
pub(crate) struct QAct {
    pub qs: Vec<i8>,
    pub d: Vec<f32>,
    pub sx: Vec<f32>,
    pub s16: Vec<i16>,
    /// `d * Σq` of every 16 values (the GEMM kernels' 16-value offsets).
    pub sx16: Vec<f32>,
    /// `d` and `sx` again for each full group of 4 tokens, transposed:
    /// `[group][block][token in group]` (the 4-token kernels load a block's
    /// four scales as one vector).
    pub d4: Vec<f32>,
    pub sx4: Vec<f32>,
    /// Columns of the rows currently held (a multiple of 32).
    pub cols: usize,
    pub n: usize,
}

/// One token's row, as raw pointers for the kernels.
#[derive(Clone, Copy)]
pub(crate) struct XRef {
    pub qs: *const i8,
    pub d: *const f32,
    pub sx: *const f32,
    pub s16: *const i16,
}

impl QAct {
    pub fn new(cap_tokens: usize, cap_cols: usize) -> QAct {
        let c = cap_cols.div_ceil(32) * 32;
        let t = cap_tokens.max(1);
        QAct {
            qs: vec![0; t * c],
            d: vec![0.0; t * c / 32],
            sx: vec![0.0; t * c / 32],
            s16: vec![0; t * c / 16],
            sx16: vec![0.0; t * c / 16],
            d4: vec![0.0; t * c / 32],
            sx4: vec![0.0; t * c / 32],
            cols: 0,
            n: 0,
        }
    }

    /// Whether `n` rows of `cols` fit.
    pub fn fits(&self, n: usize, cols: usize) -> bool {
        cols & 31 == 0 && n * cols <= self.qs.len()
    }

    /// Quantizes `n` rows of `cols` values from `x` (`cols` a multiple of
    /// 32, checked by [`QAct::fits`]).
    #[cfg(test)]
    pub fn quantize(&mut self, x: &[f32], n: usize, cols: usize) {
        self.quantize_on(None, x, n, cols)
    }

    /// [`QAct::quantize`], split by tokens over `pool`'s threads when the
    /// batch is large enough to pay for a dispatch (the result is the
    /// same: every block is quantized alone).
    pub fn quantize_on(&mut self, pool: Option<&ThreadPool>, x: &[f32], n: usize, cols: usize) {
        assert!(self.fits(n, cols) && x.len() >= n * cols);
        self.cols = cols;
        self.n = n;
        let bpr = cols / 32;
        let raw = RawQ {
            qs: self.qs.as_mut_ptr(),
            d: self.d.as_mut_ptr(),
            sx: self.sx.as_mut_ptr(),
            s16: self.s16.as_mut_ptr(),
            sx16: self.sx16.as_mut_ptr(),
            d4: self.d4.as_mut_ptr(),
            sx4: self.sx4.as_mut_ptr(),
        };
        match pool {
            Some(pool) if pool.n_threads() > 1 && n >= PAR_MIN_TOKENS => {
                let (groups, nt) = (n.div_ceil(4), pool.n_threads());
                let raw = &raw;
                pool.run(&|tid| {
                    let (g0, g1) = (groups * tid / nt, groups * (tid + 1) / nt);
                    let (t0, t1) = (4 * g0, (4 * g1).min(n));
                    if t0 < t1 {
                        // SAFETY: the buffers hold n rows of cols (fits);
                        // token ranges of the threads are disjoint.
                        unsafe { raw.tokens(x, bpr, t0, t1, n) };
                    }
                });
            }
            // SAFETY: as above, one thread.
            _ => unsafe { raw.tokens(x, bpr, 0, n, n) },
        }
    }

    /// The transposed scales of the 4-token group starting at token `t`.
    #[inline(always)]
    pub fn group4(&self, t: usize) -> (*const f32, *const f32) {
        let at = t * self.cols / 32;
        (self.d4[at..].as_ptr(), self.sx4[at..].as_ptr())
    }

    #[inline(always)]
    pub fn row(&self, t: usize) -> XRef {
        let c = self.cols;
        // SAFETY (for users): offsets stay inside the buffers for t < n.
        XRef {
            qs: self.qs[t * c..].as_ptr(),
            d: self.d[t * c / 32..].as_ptr(),
            sx: self.sx[t * c / 32..].as_ptr(),
            s16: self.s16[t * c / 16..].as_ptr(),
        }
    }

    /// The dequantized value of element `i` of token `t` (tests).
    #[cfg(test)]
    pub fn value(&self, t: usize, i: usize) -> f32 {
        let c = self.cols;
        self.d[(t * c + i) / 32] * f32::from(self.qs[t * c + i])
    }
}

/// Batches at least this large quantize on all threads.
const PAR_MIN_TOKENS: usize = 8;

/// The buffers of a [`QAct`], for threads writing disjoint token ranges.
struct RawQ {
    qs: *mut i8,
    d: *mut f32,
    sx: *mut f32,
    s16: *mut i16,
    sx16: *mut f32,
    d4: *mut f32,
    sx4: *mut f32,
}

// SAFETY: users write disjoint ranges only.
unsafe impl Sync for RawQ {}

/// One range of blocks of every buffer.
struct Blocks<'a> {
    qs: &'a mut [i8],
    d: &'a mut [f32],
    sx: &'a mut [f32],
    s16: &'a mut [i16],
    sx16: &'a mut [f32],
}

impl RawQ {
    /// Quantizes tokens `t0..t1` (`t0` a multiple of 4) of `n`, and
    /// transposes the scales of the whole 4-token groups among them.
    ///
    /// # Safety
    /// The buffers hold `n` rows of `32 * bpr` values; no other thread
    /// touches tokens `t0..t1`.
    unsafe fn tokens(&self, x: &[f32], bpr: usize, t0: usize, t1: usize, n: usize) {
        let (b0, nb) = (t0 * bpr, (t1 - t0) * bpr);
        let out = Blocks {
            qs: std::slice::from_raw_parts_mut(self.qs.add(32 * b0), 32 * nb),
            d: std::slice::from_raw_parts_mut(self.d.add(b0), nb),
            sx: std::slice::from_raw_parts_mut(self.sx.add(b0), nb),
            s16: std::slice::from_raw_parts_mut(self.s16.add(2 * b0), 2 * nb),
            sx16: std::slice::from_raw_parts_mut(self.sx16.add(2 * b0), 2 * nb),
        };
        let x = &x[32 * b0..32 * (b0 + nb)];
        #[cfg(target_arch = "x86_64")]
        if crate::simd::has_avx2() {
            // SAFETY: the CPU has AVX2+FMA+F16C (checked at run time).
            quantize_avx2(out, x, nb);
        } else {
            quantize_blocks(out, x, nb);
        }
        #[cfg(not(target_arch = "x86_64"))]
        quantize_blocks(out, x, nb);
        let mut g = t0 / 4;
        while 4 * g + 4 <= t1.min(n) {
            for b in 0..bpr {
                for k in 0..4 {
                    let src = (4 * g + k) * bpr + b;
                    let dst = (g * bpr + b) * 4 + k;
                    *self.d4.add(dst) = *self.d.add(src);
                    *self.sx4.add(dst) = *self.sx.add(src);
                }
            }
            g += 1;
        }
    }
}

#[inline(always)]
fn quantize_blocks(a: Blocks<'_>, x: &[f32], nb: usize) {
    for b in 0..nb {
        let xs = &x[b * 32..b * 32 + 32];
        let mut amax = 0.0f32;
        for &v in xs {
            amax = amax.max(v.abs());
        }
        let d = amax / 127.0;
        let id = if d > 0.0 { 1.0 / d } else { 0.0 };
        let qs = &mut a.qs[b * 32..b * 32 + 32];
        for (q, &v) in qs.iter_mut().zip(xs) {
            *q = (v * id).round_ties_even() as i8;
        }
        let mut s = [0i32; 2];
        for (h, s) in s.iter_mut().enumerate() {
            *s = qs[h * 16..h * 16 + 16].iter().map(|&q| i32::from(q)).sum();
        }
        a.s16[2 * b] = s[0] as i16;
        a.s16[2 * b + 1] = s[1] as i16;
        a.d[b] = d;
        a.sx[b] = d * (s[0] + s[1]) as f32;
        a.sx16[2 * b] = d * s[0] as f32;
        a.sx16[2 * b + 1] = d * s[1] as f32;
    }
}

/// [`quantize_blocks`] with AVX2 intrinsics: the same results bit for bit
/// (`cvtps2dq` rounds half to even, as `round_ties_even`).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn quantize_avx2(a: Blocks<'_>, x: &[f32], nb: usize) {
    use std::arch::x86_64::*;
    assert!(x.len() >= 32 * nb && a.qs.len() >= 32 * nb && a.d.len() >= nb);
    assert!(a.sx.len() >= nb && a.s16.len() >= 2 * nb && a.sx16.len() >= 2 * nb);
    let sign = _mm256_set1_ps(-0.0);
    let perm = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    for b in 0..nb {
        let p = x.as_ptr().add(32 * b);
        let v = [
            _mm256_loadu_ps(p),
            _mm256_loadu_ps(p.add(8)),
            _mm256_loadu_ps(p.add(16)),
            _mm256_loadu_ps(p.add(24)),
        ];
        let m = _mm256_max_ps(
            _mm256_max_ps(_mm256_andnot_ps(sign, v[0]), _mm256_andnot_ps(sign, v[1])),
            _mm256_max_ps(_mm256_andnot_ps(sign, v[2]), _mm256_andnot_ps(sign, v[3])),
        );
        let m4 = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
        let m2 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
        let amax = _mm_cvtss_f32(_mm_max_ss(m2, _mm_movehdup_ps(m2)));
        let d = amax / 127.0;
        let id = _mm256_set1_ps(if d > 0.0 { 1.0 / d } else { 0.0 });
        let q: [__m256i; 4] = std::array::from_fn(|k| _mm256_cvtps_epi32(_mm256_mul_ps(v[k], id)));
        // Σ of each half (values 0..16, 16..32).
        let hs = |a: __m256i, b: __m256i| {
            let s = _mm256_add_epi32(a, b);
            let s = _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
            let s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4e));
            _mm_cvtsi128_si32(_mm_add_epi32(s, _mm_shuffle_epi32(s, 0xb1)))
        };
        let (s0, s1) = (hs(q[0], q[1]), hs(q[2], q[3]));
        let w01 = _mm256_packs_epi32(q[0], q[1]);
        let w23 = _mm256_packs_epi32(q[2], q[3]);
        let bytes = _mm256_permutevar8x32_epi32(_mm256_packs_epi16(w01, w23), perm);
        _mm256_storeu_si256(a.qs.as_mut_ptr().add(32 * b) as *mut __m256i, bytes);
        a.s16[2 * b] = s0 as i16;
        a.s16[2 * b + 1] = s1 as i16;
        a.d[b] = d;
        a.sx[b] = d * (s0 + s1) as f32;
        a.sx16[2 * b] = d * s0 as f32;
        a.sx16[2 * b + 1] = d * s1 as f32;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantize_roundtrip() {
        let cols = 96;
        let mut x: Vec<f32> = (0..2 * cols)
            .map(|i| ((i * 37) as f32 * 0.21).sin())
            .collect();
        // A block of exact halves (ties round to even), a zero block.
        for (i, v) in x[32..64].iter_mut().enumerate() {
            *v = if i == 0 {
                127.0
            } else {
                (i as f32 - 16.5) * if i % 3 == 0 { -1.0 } else { 1.0 }
            };
        }
        x[64..96].fill(0.0);
        let mut a = QAct::new(2, cols);
        a.quantize(&x, 2, cols);
        let mut b = QAct::new(2, cols);
        let bb = Blocks {
            qs: &mut b.qs,
            d: &mut b.d,
            sx: &mut b.sx,
            s16: &mut b.s16,
            sx16: &mut b.sx16,
        };
        quantize_blocks(bb, &x, 2 * cols / 32);
        assert_eq!(a.qs, b.qs);
        assert_eq!(a.d, b.d);
        assert_eq!((&a.sx, &a.s16, &a.sx16), (&b.sx, &b.s16, &b.sx16));
        for t in 0..2 {
            for i in 0..cols {
                let v = x[t * cols + i];
                assert!((a.value(t, i) - v).abs() <= a.d[(t * cols + i) / 32] * 0.5 + 1e-7);
            }
        }
        let s: i32 = a.qs[16..32].iter().map(|&q| i32::from(q)).sum();
        assert_eq!(i32::from(a.s16[1]), s);
    }

    /// Quantizing on several threads gives the same buffers.
    #[test]
    fn quantize_parallel_same() {
        let (n, cols) = (13, 64);
        let x: Vec<f32> = (0..n * cols)
            .map(|i| ((i * 13) as f32 * 0.37).cos())
            .collect();
        let mut a = QAct::new(n, cols);
        a.quantize(&x, n, cols);
        for threads in [2, 3] {
            let mut b = QAct::new(n, cols);
            b.quantize_on(Some(&ThreadPool::new(threads)), &x, n, cols);
            assert_eq!((&a.qs, &a.d, &a.sx, &a.s16), (&b.qs, &b.d, &b.sx, &b.s16));
            assert_eq!((&a.sx16, &a.d4, &a.sx4), (&b.sx16, &b.d4, &b.sx4));
        }
    }
}
