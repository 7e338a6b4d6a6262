//! Rotary position embeddings, precomputed at load.
//!
//! A [`RopeTable`] holds `cos`/`sin` for every position up to the context
//! size and every rotated pair, with the scaling (linear, Llama 3, per-frequency
//! factors, YaRN) already folded into the frequencies. Applying it is a
//! table lookup and a rotation, the same code for every model.

use kiln_format::{RopeConfig, RopeScaling, RopeStyle};

#[derive(Debug, Clone)]
pub struct RopeTable {
    /// Rotated dimensions per head (even).
    pub dim: usize,
    pub style: RopeStyle,
    pub max_positions: usize,
    cos: Vec<f32>,
    sin: Vec<f32>,
}

/// The inverse frequencies (radians per position) of the `dim / 2` pairs,
/// and the factor cos/sin are multiplied by (YaRN's attention factor, else 1).
///
/// `scaled = false` gives the plain frequencies of `theta` (Gemma's sliding
/// layers are never scaled). `freq_factors` are llama.cpp's per-frequency
/// divisors (`rope_freqs.weight`), used for [`RopeScaling::FreqFactors`].
pub fn inv_freqs(
    cfg: &RopeConfig,
    theta: f64,
    scaled: bool,
    freq_factors: Option<&[f32]>,
) -> (Vec<f64>, f64) {
    let d = cfg.dim;
    let half = d / 2;
    let base: Vec<f64> = (0..half)
        .map(|i| 1.0 / theta.powf((2 * i) as f64 / d as f64))
        .collect();
    if !scaled {
        return (base, 1.0);
    }
    match &cfg.scaling {
        RopeScaling::None => (base, 1.0),
        RopeScaling::Linear { factor } => (base.iter().map(|f| f / factor).collect(), 1.0),
        RopeScaling::FreqFactors => match freq_factors {
            Some(ff) if ff.len() >= half => (
                base.iter()
                    .zip(ff)
                    .map(|(f, &k)| f / f64::from(k))
                    .collect(),
                1.0,
            ),
            _ => (base, 1.0),
        },
        RopeScaling::Llama3 {
            factor,
            low_freq_factor,
            high_freq_factor,
            original_context,
        } => {
            // transformers `_compute_llama3_parameters`.
            let old = *original_context as f64;
            let low_wavelen = old / low_freq_factor;
            let high_wavelen = old / high_freq_factor;
            let out = base
                .iter()
                .map(|&f| {
                    let wavelen = 2.0 * std::f64::consts::PI / f;
                    if wavelen < high_wavelen {
                        f
                    } else if wavelen > low_wavelen {
                        f / factor
                    } else {
                        let smooth = (old / wavelen - low_freq_factor)
                            / (high_freq_factor - low_freq_factor);
                        (1.0 - smooth) * f / factor + smooth * f
                    }
                })
                .collect();
            (out, 1.0)
        }
        RopeScaling::Yarn {
            factor,
            original_context,
            beta_fast,
            beta_slow,
        } => {
            // transformers `_compute_yarn_parameters` (truncate = true).
            let dd = d as f64;
            let corr = |rot: f64| {
                dd * ((*original_context as f64) / (rot * 2.0 * std::f64::consts::PI)).ln()
                    / (2.0 * theta.ln())
            };
            let low = corr(*beta_fast).floor().max(0.0);
            let mut high = corr(*beta_slow).ceil().min(dd - 1.0);
            if low == high {
                high += 0.001;
            }
            let out = base
                .iter()
                .enumerate()
                .map(|(i, &f)| {
                    let ramp = ((i as f64 - low) / (high - low)).clamp(0.0, 1.0);
                    let extrapolation = 1.0 - ramp;
                    (f / factor) * (1.0 - extrapolation) + f * extrapolation
                })
                .collect();
            let mscale = if *factor > 1.0 {
                0.1 * factor.ln() + 1.0
            } else {
                1.0
            };
            (out, mscale)
        }
    }
}

impl RopeTable {
    pub fn new(
        dim: usize,
        style: RopeStyle,
        inv_freq: &[f64],
        scale: f64,
        max_positions: usize,
    ) -> Self {
        let half = dim / 2;
        let mut cos = Vec::with_capacity(max_positions * half);
        let mut sin = Vec::with_capacity(max_positions * half);
        for p in 0..max_positions {
            for &f in &inv_freq[..half.min(inv_freq.len())] {
                let a = p as f64 * f;
                cos.push((a.cos() * scale) as f32);
                sin.push((a.sin() * scale) as f32);
            }
        }
        RopeTable {
            dim,
            style,
            max_positions,
            cos,
            sin,
        }
    }

    /// Rotates one head vector (`x.len() >= dim`) for position `pos`
    /// (`pos < max_positions`; positions past the table leave `x` unchanged,
    /// callers check the context size first).
    #[inline]
    pub fn apply(&self, x: &mut [f32], pos: usize) {
        let half = self.dim / 2;
        let (Some(cos), Some(sin)) = (
            self.cos.get(pos * half..(pos + 1) * half),
            self.sin.get(pos * half..(pos + 1) * half),
        ) else {
            return;
        };
        if x.len() < self.dim {
            return;
        }
        match self.style {
            RopeStyle::Interleaved => {
                for ((pair, &c), &s) in x[..self.dim].chunks_exact_mut(2).zip(cos).zip(sin) {
                    let (a, b) = (pair[0], pair[1]);
                    pair[0] = a * c - b * s;
                    pair[1] = a * s + b * c;
                }
            }
            RopeStyle::Neox => {
                let (lo, hi) = x[..self.dim].split_at_mut(half);
                for (((a, b), &c), &s) in lo.iter_mut().zip(hi.iter_mut()).zip(cos).zip(sin) {
                    let (x0, x1) = (*a, *b);
                    *a = x0 * c - x1 * s;
                    *b = x0 * s + x1 * c;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(scaling: RopeScaling) -> RopeConfig {
        RopeConfig {
            theta: 10000.0,
            theta_local: None,
            dim: 8,
            style: RopeStyle::Neox,
            scaling,
        }
    }

    #[test]
    fn interleaved_equals_neox_on_permuted_pairs() {
        let (f, s) = inv_freqs(&cfg(RopeScaling::None), 10000.0, true, None);
        let a = RopeTable::new(8, RopeStyle::Interleaved, &f, s, 16);
        let b = RopeTable::new(8, RopeStyle::Neox, &f, s, 16);
        let x: Vec<f32> = (0..8).map(|i| i as f32 * 0.37 - 1.0).collect();
        // interleaved pair i = (x[2i], x[2i+1]) ↔ neox pair (y[i], y[i+4])
        let mut xi = x.clone();
        let mut y = vec![0.0; 8];
        for i in 0..4 {
            y[i] = x[2 * i];
            y[i + 4] = x[2 * i + 1];
        }
        a.apply(&mut xi, 5);
        b.apply(&mut y, 5);
        for i in 0..4 {
            assert!((xi[2 * i] - y[i]).abs() < 1e-6);
            assert!((xi[2 * i + 1] - y[i + 4]).abs() < 1e-6);
        }
    }

    #[test]
    fn linear_divides_frequencies() {
        let (f1, _) = inv_freqs(&cfg(RopeScaling::None), 10000.0, true, None);
        let (f2, _) = inv_freqs(
            &cfg(RopeScaling::Linear { factor: 4.0 }),
            10000.0,
            true,
            None,
        );
        for (a, b) in f1.iter().zip(&f2) {
            assert!((a / 4.0 - b).abs() < 1e-15);
        }
        let (f3, _) = inv_freqs(
            &cfg(RopeScaling::Linear { factor: 4.0 }),
            10000.0,
            false,
            None,
        );
        assert_eq!(f1, f3);
    }
}
