//! Attention over the paged KV cache for (token, head) items.

use kiln_core::kv::KvTables;
use kiln_core::Batch;

use crate::kernels;
use crate::pool::SyncPtr;

/// Everything one layer's attention reads; `run` handles a range of
/// `token * n_heads + head` items.
pub(crate) struct Attn<'a> {
    pub kc: &'a [f32],
    pub vc: &'a [f32],
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
        #[cfg(target_arch = "x86_64")]
        if fast && crate::simd::has_avx2() {
            // SAFETY: the CPU has AVX2, FMA and F16C (checked at run time).
            unsafe { run_avx2(self, lo, hi, scores) };
            return;
        }
        let _ = fast;
        for item in lo..hi {
            self.item::<false>(item, scores);
        }
    }

    #[inline(always)]
    fn item<const FAST: bool>(&self, item: usize, scores: &mut [f32]) {
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
        for (j, sc) in scores.iter_mut().enumerate() {
            let a = at(start + j);
            let mut v = kernels::dot(qv, &self.kc[a..a + hd]) * self.scale;
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
        for (j, &sc) in scores.iter().enumerate() {
            let a = at(start + j);
            kernels::axpy(out, sc * inv, &self.vc[a..a + hd]);
        }
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn run_avx2(a: &Attn<'_>, lo: usize, hi: usize, scores: &mut [f32]) {
    for item in lo..hi {
        a.item::<true>(item, scores);
    }
}
