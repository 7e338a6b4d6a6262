//! Attention over the paged KV cache for (token, head) items.

use kiln_core::kv::KvTables;
use kiln_core::Batch;

use crate::kernels;
use crate::kvf16::KvEl;
use crate::pool::SyncPtr;

/// One KV group's K or V storage, f32 or f16 bits.
#[derive(Clone, Copy)]
pub(crate) enum KvRef<'a> {
    F32(&'a [f32]),
    F16(&'a [u16]),
}

/// Everything one layer's attention reads; `run` handles a range of
/// `token * n_heads + head` items.
pub(crate) struct Attn<'a> {
    pub kc: KvRef<'a>,
    pub vc: KvRef<'a>,
    pub q: &'a [f32],
    pub att: SyncPtr,
    pub batch: &'a Batch<'a>,
    pub kvt: &'a KvTables,
    /// KV group, layers in the group, this layer's index in it.
    pub g: usize,
    pub nlg: usize,
    pub lig: usize,
    pub bs: usize,
    pub kvd: usize,
    pub qd: usize,
    pub hd: usize,
    pub n_heads: usize,
    /// Query heads per KV head.
    pub group: usize,
    pub scale: f32,
    pub softcap: Option<f32>,
    pub causal: bool,
    pub window: Option<usize>,
}

impl Attn<'_> {
    /// Items `lo..hi`; `fast` uses the AVX2 build with a polynomial exp.
    pub fn run(&self, fast: bool, lo: usize, hi: usize, scores: &mut [f32]) {
        use KvRef::*;
        match (self.kc, self.vc) {
            (F32(k), F32(v)) => self.run_with(fast, k, v, lo, hi, scores),
            (F32(k), F16(v)) => self.run_with(fast, k, v, lo, hi, scores),
            (F16(k), F32(v)) => self.run_with(fast, k, v, lo, hi, scores),
            (F16(k), F16(v)) => self.run_with(fast, k, v, lo, hi, scores),
        }
    }

    fn run_with<K: KvEl, V: KvEl>(
        &self,
        fast: bool,
        kc: &[K],
        vc: &[V],
        lo: usize,
        hi: usize,
        scores: &mut [f32],
    ) {
        #[cfg(target_arch = "x86_64")]
        if fast && crate::simd::has_avx2() {
            // SAFETY: the CPU has AVX2, FMA and F16C (checked at run time).
            unsafe { run_avx2(self, kc, vc, lo, hi, scores) };
            return;
        }
        let _ = fast;
        for item in lo..hi {
            self.item::<false, K, V>(kc, vc, item, scores);
        }
    }

    #[inline(always)]
    fn item<const FAST: bool, K: KvEl, V: KvEl>(
        &self,
        kc: &[K],
        vc: &[V],
        item: usize,
        scores: &mut [f32],
    ) {
        let (i, h) = (item / self.n_heads, item % self.n_heads);
        let (qd, hd, kvd, bs) = (self.qd, self.hd, self.kvd, self.bs);
        let kh = h / self.group;
        let (pos, seq) = (
            self.batch.positions[i] as usize,
            self.batch.seqs[i] as usize,
        );
        let table = self.kvt.table(seq, self.g);
        let end = if self.causal {
            pos + 1
        } else {
            self.kvt.len(seq).max(pos + 1)
        };
        let start = self.window.map_or(0, |win| (pos + 1).saturating_sub(win));
        let qv = &self.q[i * qd + h * hd..i * qd + (h + 1) * hd];
        let scores = &mut scores[..end - start];
        let at = |p: usize| {
            let blk = table[p / bs] as usize;
            ((blk * self.nlg + self.lig) * bs + p % bs) * kvd + kh * hd
        };
        let mut mx = f32::NEG_INFINITY;
        let mut j0 = 0;
        if FAST {
            // Four keys at a time: four independent accumulator chains.
            let k = |j: usize| {
                let a = at(start + j);
                &kc[a..a + hd]
            };
            while j0 + 4 <= scores.len() {
                // SAFETY: FAST items run only under `run_avx2`.
                let d = unsafe { K::dot4([k(j0), k(j0 + 1), k(j0 + 2), k(j0 + 3)], qv) };
                for (sc, d) in scores[j0..j0 + 4].iter_mut().zip(d) {
                    let mut v = d * self.scale;
                    if let Some(c) = self.softcap {
                        v = (v / c).tanh() * c;
                    }
                    *sc = v;
                    mx = mx.max(v);
                }
                j0 += 4;
            }
        }
        for (j, sc) in scores.iter_mut().enumerate().skip(j0) {
            let a = at(start + j);
            let mut v = K::dot(qv, &kc[a..a + hd]) * self.scale;
            if let Some(c) = self.softcap {
                v = (v / c).tanh() * c;
            }
            *sc = v;
            mx = mx.max(v);
        }
        let sum = if FAST {
            for sc in scores.iter_mut() {
                *sc = kernels::exp_fast(*sc - mx);
            }
            kernels::sum(scores)
        } else {
            let mut sum = 0.0f32;
            for sc in scores.iter_mut() {
                *sc = (*sc - mx).exp();
                sum += *sc;
            }
            sum
        };
        let inv = 1.0 / sum;
        // SAFETY: head h of token i is written by this thread only.
        let out =
            unsafe { std::slice::from_raw_parts_mut(self.att.ptr().add(i * qd + h * hd), hd) };
        out.fill(0.0);
        let mut j0 = 0;
        if FAST {
            let v = |j: usize| {
                let a = at(start + j);
                &vc[a..a + hd]
            };
            while j0 + 4 <= scores.len() {
                let p = [
                    scores[j0] * inv,
                    scores[j0 + 1] * inv,
                    scores[j0 + 2] * inv,
                    scores[j0 + 3] * inv,
                ];
                // SAFETY: as above.
                unsafe { V::axpy4(out, p, [v(j0), v(j0 + 1), v(j0 + 2), v(j0 + 3)]) };
                j0 += 4;
            }
        }
        for (j, &sc) in scores.iter().enumerate().skip(j0) {
            let a = at(start + j);
            V::axpy(out, sc * inv, &vc[a..a + hd]);
        }
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn run_avx2<K: KvEl, V: KvEl>(
    a: &Attn<'_>,
    kc: &[K],
    vc: &[V],
    lo: usize,
    hi: usize,
    scores: &mut [f32],
) {
    for item in lo..hi {
        a.item::<true, K, V>(kc, vc, item, scores);
    }
}
