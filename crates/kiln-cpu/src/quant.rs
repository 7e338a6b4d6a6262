//! Activations quantized on the fly for the integer kernels.
//!
//! One format serves every weight type: blocks of 32 values with an f32
//! scale `d` (`x ≈ d * q`, `q` in -127..=127, round-half-even), plus the
//! block's `d * Σq` (for Q4_1/Q5_1 mins and the Q4_0/Q5_0 offsets) and the
//! integer sums of every 16 values (for the k-quants' 16-value sub-blocks
//! and offsets). Per-32 scales are finer than llama.cpp's per-256 Q8_K, so
//! the k-quant paths are at least as accurate as llama.cpp's.

/// Quantized activations of up to `cap_tokens` rows of up to `cap_cols`.
pub(crate) struct QAct {
    pub qs: Vec<i8>,
    pub d: Vec<f32>,
    pub sx: Vec<f32>,
    pub s16: Vec<i16>,
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
    pub fn quantize(&mut self, x: &[f32], n: usize, cols: usize) {
        debug_assert!(self.fits(n, cols) && x.len() >= n * cols);
        self.cols = cols;
        self.n = n;
        let nb = n * cols / 32;
        #[cfg(target_arch = "x86_64")]
        if crate::simd::has_avx2() {
            // SAFETY: the CPU has AVX2+FMA+F16C (checked at run time).
            unsafe { quantize_avx2(self, &x[..nb * 32], nb) };
        } else {
            quantize_blocks(self, &x[..nb * 32], nb);
        }
        #[cfg(not(target_arch = "x86_64"))]
        quantize_blocks(self, &x[..nb * 32], nb);
        let bpr = cols / 32;
        for g in 0..n / 4 {
            for b in 0..bpr {
                for k in 0..4 {
                    let src = (4 * g + k) * bpr + b;
                    let dst = (g * bpr + b) * 4 + k;
                    self.d4[dst] = self.d[src];
                    self.sx4[dst] = self.sx[src];
                }
            }
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

#[inline(always)]
fn quantize_blocks(a: &mut QAct, x: &[f32], nb: usize) {
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
    }
}

/// The same code compiled for AVX2 (the loops vectorize).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn quantize_avx2(a: &mut QAct, x: &[f32], nb: usize) {
    quantize_blocks(a, x, nb)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantize_roundtrip() {
        let cols = 96;
        let x: Vec<f32> = (0..2 * cols)
            .map(|i| ((i * 37) as f32 * 0.21).sin())
            .collect();
        let mut a = QAct::new(2, cols);
        a.quantize(&x, 2, cols);
        let mut b = QAct::new(2, cols);
        quantize_blocks(&mut b, &x, 2 * cols / 32);
        assert_eq!(a.qs, b.qs);
        assert_eq!(a.d, b.d);
        for t in 0..2 {
            for i in 0..cols {
                let v = x[t * cols + i];
                assert!((a.value(t, i) - v).abs() <= a.d[(t * cols + i) / 32] * 0.5 + 1e-7);
            }
        }
        let s: i32 = a.qs[16..32].iter().map(|&q| i32::from(q)).sum();
        assert_eq!(i32::from(a.s16[1]), s);
    }
}
