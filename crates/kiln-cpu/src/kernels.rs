//! Scalar reference kernels, written so the compiler vectorizes them
//! (independent accumulators over fixed-size chunks).

use kiln_format::{Activation, NormKind};

/// Σ a[i]·b[i] over the shorter length, 16 independent accumulators.
#[inline]
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    let n = a.len().min(b.len());
    let (a, b) = (&a[..n], &b[..n]);
    let mut acc = [0.0f32; 16];
    let ca = a.chunks_exact(16);
    let cb = b.chunks_exact(16);
    let (ra, rb) = (ca.remainder(), cb.remainder());
    for (x, y) in ca.zip(cb) {
        for j in 0..16 {
            acc[j] += x[j] * y[j];
        }
    }
    let mut tail = 0.0f32;
    for (x, y) in ra.iter().zip(rb) {
        tail += x * y;
    }
    reduce16(acc) + tail
}

#[inline(always)]
fn reduce16(mut acc: [f32; 16]) -> f32 {
    for j in 0..8 {
        acc[j] += acc[j + 8];
    }
    for j in 0..4 {
        acc[j] += acc[j + 4];
    }
    (acc[0] + acc[2]) + (acc[1] + acc[3])
}

/// Four rows against one vector: `[w0·x, w1·x, w2·x, w3·x]` (`x` is loaded
/// once for the four rows). All slices have the same length.
#[inline]
pub fn dot4(w: [&[f32]; 4], x: &[f32]) -> [f32; 4] {
    let n = x.len();
    let mut acc = [[0.0f32; 8]; 4];
    let full = n / 8 * 8;
    let (w0, w1, w2, w3) = (&w[0][..n], &w[1][..n], &w[2][..n], &w[3][..n]);
    let mut i = 0;
    while i < full {
        let xs = &x[i..i + 8];
        let (a0, a1, a2, a3) = (&w0[i..i + 8], &w1[i..i + 8], &w2[i..i + 8], &w3[i..i + 8]);
        for j in 0..8 {
            acc[0][j] += a0[j] * xs[j];
            acc[1][j] += a1[j] * xs[j];
            acc[2][j] += a2[j] * xs[j];
            acc[3][j] += a3[j] * xs[j];
        }
        i += 8;
    }
    let mut out = [0.0f32; 4];
    for r in 0..4 {
        let a = acc[r];
        let mut s = ((a[0] + a[4]) + (a[2] + a[6])) + ((a[1] + a[5]) + (a[3] + a[7]));
        for k in full..n {
            s += w[r][k] * x[k];
        }
        out[r] = s;
    }
    out
}

/// Σ x, eight independent accumulators (vectorizes).
#[inline]
pub fn sum(x: &[f32]) -> f32 {
    let mut acc = [0.0f32; 8];
    let c = x.chunks_exact(8);
    let rest: f32 = c.remainder().iter().sum();
    for v in c {
        for j in 0..8 {
            acc[j] += v[j];
        }
    }
    ((acc[0] + acc[4]) + (acc[2] + acc[6])) + ((acc[1] + acc[5]) + (acc[3] + acc[7])) + rest
}

/// e^x without a libm call (vectorizes): Cephes' `expf` range reduction
/// and polynomial, within 2 ulp of `f32::exp` for x in [-87, 88]; 0 below,
/// +inf above.
#[inline(always)]
pub fn exp_fast(x: f32) -> f32 {
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    let xc = x.clamp(-87.0, 88.5);
    let n = (xc * LOG2E + 0.5).floor();
    let r = xc - n * 0.693_359_4 - n * -2.121_944_4e-4;
    let r2 = r * r;
    let p = ((((1.987_569_1e-4 * r + 1.398_199_9e-3) * r + 8.333_452e-3) * r + 4.166_579_6e-2) * r
        + 1.666_666_5e-1)
        * r
        + 0.5;
    let e = p * r2 + r + 1.0;
    let scaled = e * f32::from_bits(((n as i32 + 127) as u32) << 23);
    if x < -87.0 {
        0.0
    } else if x > 88.5 {
        f32::INFINITY
    } else {
        scaled
    }
}

/// `y += a * x`
#[inline]
pub fn axpy(y: &mut [f32], a: f32, x: &[f32]) {
    for (y, &x) in y.iter_mut().zip(x) {
        *y += a * x;
    }
}

/// `y += a[0] * x[0] + a[1] * x[1] + a[2] * x[2] + a[3] * x[3]` (one pass
/// over `y` for four rows).
#[inline]
#[cfg_attr(target_arch = "x86_64", allow(dead_code))]
pub fn axpy4(y: &mut [f32], a: [f32; 4], x: [&[f32]; 4]) {
    let n = y.len();
    let (x0, x1, x2, x3) = (&x[0][..n], &x[1][..n], &x[2][..n], &x[3][..n]);
    for i in 0..n {
        y[i] += (a[0] * x0[i] + a[1] * x1[i]) + (a[2] * x2[i] + a[3] * x3[i]);
    }
}

/// Normalizes `x` into `out` (same length): RMSNorm `x / rms(x) * w`, or
/// LayerNorm `(x - mean) / std * w + b`. Sums in f64.
pub fn norm(kind: NormKind, x: &[f32], out: &mut [f32], w: &[f32], b: Option<&[f32]>, eps: f32) {
    let n = x.len().max(1) as f64;
    match kind {
        NormKind::Rms => {
            let ss: f64 = x.iter().map(|&v| f64::from(v) * f64::from(v)).sum();
            let inv = (1.0 / (ss / n + f64::from(eps)).sqrt()) as f32;
            for ((o, &v), &w) in out.iter_mut().zip(x).zip(w) {
                *o = v * inv * w;
            }
        }
        NormKind::Layer => {
            let mean = x.iter().map(|&v| f64::from(v)).sum::<f64>() / n;
            let var = x
                .iter()
                .map(|&v| (f64::from(v) - mean).powi(2))
                .sum::<f64>()
                / n;
            let inv = 1.0 / (var + f64::from(eps)).sqrt();
            for (i, (o, &v)) in out.iter_mut().zip(x).enumerate() {
                let nv = ((f64::from(v) - mean) * inv) as f32;
                *o = nv * w.get(i).copied().unwrap_or(1.0)
                    + b.and_then(|b| b.get(i)).copied().unwrap_or(0.0);
            }
        }
    }
}

/// In-place RMSNorm of each `dim`-sized head of `x`.
pub fn rms_heads(x: &mut [f32], dim: usize, w: &[f32], eps: f32) {
    for h in x.chunks_exact_mut(dim) {
        let ss: f64 = h.iter().map(|&v| f64::from(v) * f64::from(v)).sum();
        let inv = (1.0 / (ss / dim as f64 + f64::from(eps)).sqrt()) as f32;
        for (v, &w) in h.iter_mut().zip(w) {
            *v = *v * inv * w;
        }
    }
}

#[inline]
pub fn activate(kind: Activation, x: f32) -> f32 {
    match kind {
        Activation::Silu => x / (1.0 + (-x).exp()),
        Activation::GeluTanh => {
            let x64 = f64::from(x);
            let c = (2.0 / std::f64::consts::PI).sqrt();
            (0.5 * x64 * (1.0 + (c * (x64 + 0.044715 * x64 * x64 * x64)).tanh())) as f32
        }
        Activation::Gelu => {
            let x64 = f64::from(x);
            (0.5 * x64 * (1.0 + erf(x64 / std::f64::consts::SQRT_2))) as f32
        }
    }
}

/// [`activate`] without libm calls (vectorizes): SiLU and tanh-GELU
/// through [`exp_fast`] in f32; erf-GELU as [`activate`].
#[inline(always)]
pub fn activate_fast(kind: Activation, x: f32) -> f32 {
    match kind {
        Activation::Silu => x / (1.0 + exp_fast(-x)),
        Activation::GeluTanh => {
            const C: f32 = 0.797_884_6; // sqrt(2/pi)
            let u = C * (x + 0.044715 * x * x * x);
            // tanh(u) = 1 - 2 / (e^(2u) + 1), exact at both ends.
            let t = 1.0 - 2.0 / (exp_fast(2.0 * u) + 1.0);
            0.5 * x * (1.0 + t)
        }
        Activation::Gelu => activate(kind, x),
    }
}

/// The FFN's activation in place: `gate = act(gate) * up` when gated, else
/// `gate = act(up)`. `fast` uses [`activate_fast`] in an AVX2 build.
pub fn ffn_act(fast: bool, kind: Activation, gated: bool, gate: &mut [f32], up: &[f32]) {
    #[cfg(target_arch = "x86_64")]
    if fast && crate::simd::has_avx2() {
        // SAFETY: the CPU has AVX2, FMA and F16C (checked at run time).
        unsafe { ffn_act_avx2(kind, gated, gate, up) };
        return;
    }
    if fast {
        ffn_act_with(activate_fast, kind, gated, gate, up)
    } else {
        ffn_act_with(activate, kind, gated, gate, up)
    }
}

#[inline(always)]
fn ffn_act_with(
    f: fn(Activation, f32) -> f32,
    kind: Activation,
    gated: bool,
    gate: &mut [f32],
    up: &[f32],
) {
    if gated {
        for (g, &u) in gate.iter_mut().zip(up) {
            *g = f(kind, *g) * u;
        }
    } else {
        for (g, &u) in gate.iter_mut().zip(up) {
            *g = f(kind, u);
        }
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn ffn_act_avx2(kind: Activation, gated: bool, gate: &mut [f32], up: &[f32]) {
    // One loop per kind so each vectorizes.
    match (kind, gated) {
        (Activation::Silu, true) => ffn_act_with(
            |_, x| activate_fast(Activation::Silu, x),
            kind,
            true,
            gate,
            up,
        ),
        (Activation::Silu, false) => ffn_act_with(
            |_, x| activate_fast(Activation::Silu, x),
            kind,
            false,
            gate,
            up,
        ),
        (Activation::GeluTanh, true) => ffn_act_with(
            |_, x| activate_fast(Activation::GeluTanh, x),
            kind,
            true,
            gate,
            up,
        ),
        (Activation::GeluTanh, false) => ffn_act_with(
            |_, x| activate_fast(Activation::GeluTanh, x),
            kind,
            false,
            gate,
            up,
        ),
        _ => ffn_act_with(activate, kind, gated, gate, up),
    }
}

/// erf via the complementary error function's Chebyshev fit (Numerical
/// Recipes `erfcc`), relative error < 1.2e-7.
pub fn erf(x: f64) -> f64 {
    let z = x.abs();
    let t = 1.0 / (1.0 + 0.5 * z);
    let r = t
        * (-z * z - 1.265_512_23
            + t * (1.000_023_68
                + t * (0.374_091_96
                    + t * (0.096_784_18
                        + t * (-0.186_288_06
                            + t * (0.278_868_07
                                + t * (-1.135_203_98
                                    + t * (1.488_515_87
                                        + t * (-0.822_152_23 + t * 0.170_872_77)))))))))
            .exp();
    if x >= 0.0 {
        1.0 - r
    } else {
        r - 1.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dot_matches_naive() {
        for n in [0, 1, 15, 16, 17, 33, 100] {
            let a: Vec<f32> = (0..n).map(|i| (i as f32 * 0.7).sin()).collect();
            let b: Vec<f32> = (0..n).map(|i| (i as f32 * 0.3).cos()).collect();
            let want: f64 = a.iter().zip(&b).map(|(x, y)| f64::from(x * y)).sum();
            assert!((f64::from(dot(&a, &b)) - want).abs() < 1e-5);
        }
    }

    #[test]
    fn dot4_matches_dot() {
        for n in [1, 7, 8, 9, 64, 100] {
            let rows: Vec<Vec<f32>> = (0..4)
                .map(|r| (0..n).map(|i| ((i * 7 + r) as f32 * 0.11).sin()).collect())
                .collect();
            let x: Vec<f32> = (0..n).map(|i| (i as f32 * 0.3).cos()).collect();
            let got = dot4([&rows[0], &rows[1], &rows[2], &rows[3]], &x);
            for r in 0..4 {
                assert!((got[r] - dot(&rows[r], &x)).abs() < 1e-5);
            }
        }
    }

    #[test]
    fn exp_fast_close_to_exp() {
        let mut worst = 0.0f32;
        let mut x = -87.0f32;
        while x < 88.0 {
            let (a, b) = (exp_fast(x), x.exp());
            worst = worst.max(((a - b) / b).abs());
            x += 0.0137;
        }
        assert!(worst < 3e-7, "relative error {worst}");
        assert_eq!(exp_fast(-100.0), 0.0);
        assert_eq!(exp_fast(0.0), 1.0);
        assert!(exp_fast(f32::NEG_INFINITY) == 0.0);
    }

    #[test]
    fn activate_fast_close() {
        for kind in [Activation::Silu, Activation::GeluTanh, Activation::Gelu] {
            let mut x = -30.0f32;
            while x < 30.0 {
                let (a, b) = (activate_fast(kind, x), activate(kind, x));
                assert!(
                    (a - b).abs() <= 1e-6 * b.abs().max(1.0),
                    "{kind:?} {x}: {a} vs {b}"
                );
                x += 0.01;
            }
        }
        let mut g = vec![0.5f32; 19];
        let u = vec![2.0f32; 19];
        ffn_act(true, Activation::Silu, true, &mut g, &u);
        assert!((g[18] - 2.0 * activate(Activation::Silu, 0.5)).abs() < 1e-6);
    }

    #[test]
    fn sum_matches() {
        let x: Vec<f32> = (0..37).map(|i| i as f32 * 0.5).collect();
        assert_eq!(sum(&x), x.iter().sum::<f32>());
    }

    #[test]
    fn erf_values() {
        assert!((erf(0.5) - 0.520_499_877_813_046_5).abs() < 2e-7);
        assert!((erf(-1.5) + 0.966_105_146_475_310_7).abs() < 2e-7);
    }
}
