//! The CPU sampler chain.
//!
//! Order (llama.cpp's default order, so the same flags mean the same thing):
//!
//! 1. **logit bias**: `logits[id] += bias` for each configured pair;
//! 2. **penalties** over the last `repeat_last_n` tokens of the sequence:
//!    repetition (a seen token's logit is divided by `repeat_penalty` when
//!    positive, multiplied when negative), then presence
//!    (`- presence_penalty` once) and frequency (`- frequency_penalty × count`);
//! 3. **greedy** when `temperature <= 0`: the highest logit, ties to the lowest id;
//! 4. **top-k** (`0` = off): keep the k highest logits;
//! 5. **top-p** (`1.0` = off): keep the smallest prefix of the sorted
//!    candidates whose probability (softmax at temperature 1) reaches `top_p`;
//! 6. **min-p** (`0.0` = off): keep candidates with probability at least
//!    `min_p ×` the top probability;
//! 7. **temperature**: divide the remaining logits by it;
//! 8. **sample** from their softmax with the seeded RNG (xoshiro256**).
//!
//! The same seed and the same logits give the same tokens. Nothing here
//! allocates after [`Sampler::new`].

/// Sampling settings. `Default` is llama.cpp's defaults.
#[derive(Debug, Clone, PartialEq)]
pub struct SamplerParams {
    pub temperature: f32,
    pub top_k: usize,
    pub top_p: f32,
    pub min_p: f32,
    pub repeat_penalty: f32,
    pub repeat_last_n: usize,
    pub presence_penalty: f32,
    pub frequency_penalty: f32,
    pub logit_bias: Vec<(u32, f32)>,
    pub seed: u64,
}

impl Default for SamplerParams {
    fn default() -> Self {
        SamplerParams {
            temperature: 0.8,
            top_k: 40,
            top_p: 0.95,
            min_p: 0.05,
            repeat_penalty: 1.0,
            repeat_last_n: 64,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            logit_bias: Vec::new(),
            seed: 0,
        }
    }
}

impl SamplerParams {
    pub fn greedy() -> Self {
        SamplerParams {
            temperature: 0.0,
            ..Default::default()
        }
    }
}

/// Sampling a backend can do on its device so that only token ids come
/// back ([`crate::Backend::forward_sampled`]): greedy when `temperature <= 0`,
/// else a draw from the softmax of the `top_k` largest logits (all when 0)
/// at `temperature`, with the randomness taken from `seed` alone.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DeviceSampling {
    pub temperature: f32,
    pub top_k: u32,
    pub seed: u64,
}

/// xoshiro256** seeded through splitmix64.
#[derive(Debug, Clone)]
pub struct Rng {
    s: [u64; 4],
}

impl Rng {
    pub fn new(seed: u64) -> Self {
        let mut x = seed;
        let mut next = || {
            x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = x;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            z ^ (z >> 31)
        };
        Rng {
            s: [next(), next(), next(), next()],
        }
    }

    pub fn next_u64(&mut self) -> u64 {
        let result = self.s[1].wrapping_mul(5).rotate_left(7).wrapping_mul(9);
        let t = self.s[1] << 17;
        self.s[2] ^= self.s[0];
        self.s[3] ^= self.s[1];
        self.s[1] ^= self.s[2];
        self.s[0] ^= self.s[3];
        self.s[2] ^= t;
        self.s[3] = self.s[3].rotate_left(45);
        result
    }

    /// Uniform in [0, 1).
    pub fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }
}

pub struct Sampler {
    pub params: SamplerParams,
    rng: Rng,
    /// (logit, id) candidates; capacity = vocab.
    cand: Vec<(f32, u32)>,
    /// Per-id counts for penalties (reset after use).
    counts: Vec<u32>,
}

/// Index of the highest value, ties to the lowest index.
pub fn argmax(logits: &[f32]) -> u32 {
    let mut best = 0usize;
    let mut bv = f32::NEG_INFINITY;
    for (i, &v) in logits.iter().enumerate() {
        if v > bv {
            bv = v;
            best = i;
        }
    }
    best as u32
}

impl Sampler {
    pub fn new(params: SamplerParams, vocab_size: usize) -> Self {
        Sampler {
            rng: Rng::new(params.seed),
            params,
            cand: Vec::with_capacity(vocab_size),
            counts: vec![0; vocab_size],
        }
    }

    /// This step's sampling as a [`DeviceSampling`] when the chain reduces
    /// to one — no logit bias or penalties, and top-p / min-p off unless
    /// greedy — else `None` (sample on the host from logits). Takes the
    /// step's seed from this sampler's RNG, so a seed repeats its run.
    pub fn device_step(&mut self) -> Option<DeviceSampling> {
        if !self.device_capable() {
            return None;
        }
        let p = &self.params;
        if p.temperature <= 0.0 {
            return Some(DeviceSampling {
                temperature: 0.0,
                top_k: 0,
                seed: 0,
            });
        }
        Some(DeviceSampling {
            temperature: p.temperature,
            top_k: u32::try_from(p.top_k).unwrap_or(u32::MAX),
            seed: self.rng.next_u64(),
        })
    }

    /// Whether [`Sampler::device_step`] gives a step (without drawing from
    /// the RNG).
    pub fn device_capable(&self) -> bool {
        let p = &self.params;
        let penalize = p.repeat_last_n > 0
            && (p.repeat_penalty != 1.0 || p.presence_penalty != 0.0 || p.frequency_penalty != 0.0);
        p.logit_bias.is_empty()
            && !penalize
            && (p.temperature <= 0.0 || (p.top_p >= 1.0 && p.min_p <= 0.0))
    }

    /// Restarts the RNG from the configured seed.
    pub fn reseed(&mut self) {
        self.rng = Rng::new(self.params.seed);
    }

    /// Picks the next token. `logits` are modified in place (bias and
    /// penalties); `history` is the sequence so far (prompt included).
    pub fn sample(&mut self, logits: &mut [f32], history: &[u32]) -> u32 {
        let p = &self.params;
        let vocab = logits.len();
        if vocab == 0 {
            return 0;
        }
        for &(id, b) in &p.logit_bias {
            if let Some(l) = logits.get_mut(id as usize) {
                *l += b;
            }
        }
        let penalize =
            p.repeat_penalty != 1.0 || p.presence_penalty != 0.0 || p.frequency_penalty != 0.0;
        if penalize && p.repeat_last_n > 0 {
            let start = history.len().saturating_sub(p.repeat_last_n);
            let window = &history[start..];
            if self.counts.len() < vocab {
                self.counts.resize(vocab, 0);
            }
            for &t in window {
                if let Some(c) = self.counts.get_mut(t as usize) {
                    *c += 1;
                }
            }
            for &t in window {
                let t = t as usize;
                let (Some(c), Some(l)) = (self.counts.get(t).copied(), logits.get_mut(t)) else {
                    continue;
                };
                if c == 0 {
                    continue; // already applied
                }
                if *l > 0.0 {
                    *l /= p.repeat_penalty;
                } else {
                    *l *= p.repeat_penalty;
                }
                *l -= p.presence_penalty + p.frequency_penalty * c as f32;
                self.counts[t] = 0;
            }
        }
        if p.temperature <= 0.0 {
            return argmax(logits);
        }

        self.cand.clear();
        self.cand
            .extend(logits.iter().enumerate().map(|(i, &l)| (l, i as u32)));
        let desc = |a: &(f32, u32), b: &(f32, u32)| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1));
        // top-k, leaving the kept candidates sorted.
        let k = if p.top_k == 0 {
            vocab
        } else {
            p.top_k.min(vocab)
        };
        if k < self.cand.len() {
            self.cand.select_nth_unstable_by(k - 1, desc);
            self.cand.truncate(k);
        }
        self.cand.sort_unstable_by(desc);
        let max = self.cand[0].0;
        // top-p on temperature-1 probabilities.
        if p.top_p < 1.0 {
            let total: f64 = self.cand.iter().map(|c| f64::from(c.0 - max).exp()).sum();
            let mut acc = 0.0;
            let mut keep = self.cand.len();
            for (i, c) in self.cand.iter().enumerate() {
                acc += f64::from(c.0 - max).exp() / total;
                if acc >= f64::from(p.top_p) {
                    keep = i + 1;
                    break;
                }
            }
            self.cand.truncate(keep.max(1));
        }
        // min-p: p_i >= min_p * p_max  ⇔  l_i >= l_max + ln(min_p).
        if p.min_p > 0.0 {
            let floor = max + p.min_p.ln();
            let keep = self.cand.iter().take_while(|c| c.0 >= floor).count();
            self.cand.truncate(keep.max(1));
        }
        let t = p.temperature;
        let total: f64 = self
            .cand
            .iter()
            .map(|c| f64::from((c.0 - max) / t).exp())
            .sum();
        let mut r = self.rng.next_f64() * total;
        for c in &self.cand {
            r -= f64::from((c.0 - max) / t).exp();
            if r < 0.0 {
                return c.1;
            }
        }
        self.cand.last().map_or(0, |c| c.1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn device_step_only_for_plain_chains() {
        // llama.cpp's defaults use top-p and min-p: host sampling.
        assert_eq!(
            Sampler::new(SamplerParams::default(), 8).device_step(),
            None
        );
        let greedy = Sampler::new(SamplerParams::greedy(), 8).device_step();
        assert_eq!(greedy.map(|d| d.temperature), Some(0.0));
        let plain = SamplerParams {
            temperature: 0.7,
            top_k: 40,
            top_p: 1.0,
            min_p: 0.0,
            seed: 42,
            ..SamplerParams::default()
        };
        let mut a = Sampler::new(plain.clone(), 8);
        let s1 = a.device_step().map(|d| d.seed);
        let s2 = a.device_step().map(|d| d.seed);
        assert!(s1.is_some() && s1 != s2, "each step gets its own seed");
        a.reseed();
        assert_eq!(
            a.device_step().map(|d| d.seed),
            s1,
            "a seed repeats its run"
        );
        assert_eq!(
            a.device_step().map(|d| (d.temperature, d.top_k)),
            Some((0.7, 40))
        );
        for p in [
            SamplerParams {
                logit_bias: vec![(1, 2.0)],
                ..plain.clone()
            },
            SamplerParams {
                presence_penalty: 0.5,
                ..plain.clone()
            },
            SamplerParams {
                top_p: 0.9,
                ..plain.clone()
            },
            SamplerParams {
                min_p: 0.1,
                ..plain.clone()
            },
        ] {
            assert_eq!(Sampler::new(p, 8).device_step(), None);
        }
    }

    fn freqs(params: SamplerParams, logits: &[f32], n: usize) -> Vec<f64> {
        let mut s = Sampler::new(params, logits.len());
        let mut counts = vec![0usize; logits.len()];
        for _ in 0..n {
            let mut l = logits.to_vec();
            counts[s.sample(&mut l, &[]) as usize] += 1;
        }
        counts.iter().map(|&c| c as f64 / n as f64).collect()
    }

    fn softmax(l: &[f32]) -> Vec<f64> {
        let m = l.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
        let e: Vec<f64> = l.iter().map(|&x| f64::from(x - m).exp()).collect();
        let s: f64 = e.iter().sum();
        e.iter().map(|x| x / s).collect()
    }

    const LOGITS: [f32; 6] = [2.0, 1.5, 1.0, 0.0, -1.0, 0.5];

    fn plain() -> SamplerParams {
        SamplerParams {
            temperature: 1.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            seed: 7,
            ..Default::default()
        }
    }

    #[test]
    fn greedy_ties_to_lowest() {
        let mut s = Sampler::new(SamplerParams::greedy(), 4);
        assert_eq!(s.sample(&mut [1.0, 3.0, 3.0, 0.0], &[]), 1);
    }

    #[test]
    fn seeded_runs_reproduce() {
        let a = freqs(plain(), &LOGITS, 500);
        let b = freqs(plain(), &LOGITS, 500);
        assert_eq!(a, b);
        let mut s1 = Sampler::new(plain(), 6);
        let mut s2 = Sampler::new(SamplerParams { seed: 8, ..plain() }, 6);
        let x: Vec<u32> = (0..64)
            .map(|_| s1.sample(&mut LOGITS.to_vec(), &[]))
            .collect();
        let y: Vec<u32> = (0..64)
            .map(|_| s2.sample(&mut LOGITS.to_vec(), &[]))
            .collect();
        assert_ne!(x, y);
    }

    #[test]
    fn full_distribution_matches_softmax() {
        let n = 200_000;
        let f = freqs(plain(), &LOGITS, n);
        for (a, b) in f.iter().zip(softmax(&LOGITS)) {
            assert!((a - b).abs() < 0.005, "{a} vs {b}");
        }
        // temperature 0.5 = logits doubled
        let f = freqs(
            SamplerParams {
                temperature: 0.5,
                ..plain()
            },
            &LOGITS,
            n,
        );
        let doubled: Vec<f32> = LOGITS.iter().map(|x| x * 2.0).collect();
        for (a, b) in f.iter().zip(softmax(&doubled)) {
            assert!((a - b).abs() < 0.005, "{a} vs {b}");
        }
    }

    #[test]
    fn top_k_renormalizes_the_k_best() {
        let f = freqs(
            SamplerParams {
                top_k: 2,
                ..plain()
            },
            &LOGITS,
            100_000,
        );
        let p = softmax(&LOGITS[..2]);
        assert!((f[0] - p[0]).abs() < 0.006 && (f[1] - p[1]).abs() < 0.006);
        assert_eq!(f[2..].iter().sum::<f64>(), 0.0);
    }

    #[test]
    fn top_p_keeps_the_smallest_prefix() {
        let p = softmax(&LOGITS); // sorted ids: 0, 1, 2, 5, 3, 4
        let top_p = (p[0] + p[1] + 0.5 * p[2]) as f32; // needs ids 0, 1, 2
        let f = freqs(SamplerParams { top_p, ..plain() }, &LOGITS, 100_000);
        let q = softmax(&LOGITS[..3]);
        for i in 0..3 {
            assert!((f[i] - q[i]).abs() < 0.006, "{i}: {} vs {}", f[i], q[i]);
        }
        assert_eq!(f[3] + f[4] + f[5], 0.0);
    }

    #[test]
    fn min_p_drops_unlikely_tokens() {
        // p_i / p_max = exp(l_i - 2): id2 0.37, id5 0.22, id3 0.14
        let f = freqs(
            SamplerParams {
                min_p: 0.2,
                ..plain()
            },
            &LOGITS,
            100_000,
        );
        let kept = [LOGITS[0], LOGITS[1], LOGITS[2], LOGITS[5]];
        let q = softmax(&kept);
        for (j, &i) in [0usize, 1, 2, 5].iter().enumerate() {
            assert!((f[i] - q[j]).abs() < 0.006);
        }
        assert_eq!(f[3] + f[4], 0.0);
    }

    #[test]
    fn penalties_and_bias() {
        let mut s = Sampler::new(
            SamplerParams {
                repeat_penalty: 2.0,
                presence_penalty: 0.5,
                frequency_penalty: 0.25,
                logit_bias: vec![(3, 10.0)],
                ..SamplerParams::greedy()
            },
            6,
        );
        let mut l = LOGITS.to_vec();
        assert_eq!(s.sample(&mut l, &[0, 0, 4]), 3);
        assert_eq!(l[0], 2.0 / 2.0 - 0.5 - 0.5);
        assert_eq!(l[4], -2.0 - 0.5 - 0.25);
        assert_eq!(l[3], 10.0);
        assert_eq!(l[1], 1.5);
    }
}
