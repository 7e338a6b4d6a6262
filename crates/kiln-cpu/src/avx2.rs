//! AVX2 (+FMA, F16C) kernels: rows of quantized weights, as stored, against
//! activations quantized to 8 bits ([`QAct`](crate::quant::QAct)).
//!
//! Every quantized kernel has the same shape: unpack a block's weights to
//! unsigned bytes once, then for each of `T` tokens multiply-add them with
//! the token's signed bytes (`maddubs`, `madd`), convert to f32 and scale by
//! `d_w * d_x`. Offsets (`q - 8`, `q - 32`…) and mins are applied through the
//! activation sums, never in the inner product. Each token's arithmetic is
//! the same whatever `T` is, so results do not depend on how tokens are
//! grouped or how rows are split between threads.
//!
//! Only called after [`has_avx2`](crate::simd::has_avx2) said yes.

use std::arch::x86_64::*;

use crate::quant::{QAct, XRef};

/// Rows `r0..r1` of one matmul over quantized activations.
pub(crate) struct QJob<'a> {
    /// Row 0 of the matrix.
    pub w: *const u8,
    pub row_bytes: usize,
    /// Blocks per row.
    pub nb: usize,
    pub x: &'a QAct,
    pub n: usize,
    /// `y[t * ystride + r]`.
    pub y: *mut f32,
    pub ystride: usize,
    pub r0: usize,
    pub r1: usize,
    pub bias: Option<&'a [f32]>,
}

/// Rows `r0..r1` of one matmul over f32 activations (float weights).
pub(crate) struct FJob<'a> {
    pub w: *const u8,
    pub row_bytes: usize,
    pub cols: usize,
    pub x: &'a [f32],
    pub n: usize,
    pub y: *mut f32,
    pub ystride: usize,
    pub r0: usize,
    pub r1: usize,
    pub bias: Option<&'a [f32]>,
}

#[inline(always)]
unsafe fn rd_u16(p: *const u8) -> u16 {
    u16::from_le_bytes([*p, *p.add(1)])
}

#[inline(always)]
unsafe fn rd_u32(p: *const u8) -> u32 {
    u32::from_le_bytes([*p, *p.add(1), *p.add(2), *p.add(3)])
}

#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn f16(p: *const u8) -> f32 {
    _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(i32::from(rd_u16(p)))))
}

#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(crate) unsafe fn hsum(v: __m256) -> f32 {
    let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    let s = _mm_add_ss(s, _mm_movehdup_ps(s));
    _mm_cvtss_f32(s)
}

/// Unsigned bytes × signed bytes, summed in adjacent fours, as f32.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn mul_sum(q: __m256i, x: __m256i) -> __m256 {
    _mm256_cvtepi32_ps(_mm256_madd_epi16(
        _mm256_maddubs_epi16(q, x),
        _mm256_set1_epi16(1),
    ))
}

/// Like [`mul_sum`] with the pair sums weighted by 16-bit `scales`.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn mul_sum_scaled(q: __m256i, x: __m256i, scales: __m256i) -> __m256 {
    _mm256_cvtepi32_ps(_mm256_madd_epi16(_mm256_maddubs_epi16(q, x), scales))
}

#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn ld(p: *const i8) -> __m256i {
    _mm256_loadu_si256(p as *const __m256i)
}

#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn ldu(p: *const u8) -> __m256i {
    _mm256_loadu_si256(p as *const __m256i)
}

/// 16 bytes of nibbles to 32 bytes: low nibbles then high nibbles.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn nibbles32(p: *const u8) -> __m256i {
    let raw = _mm_loadu_si128(p as *const __m128i);
    _mm256_and_si256(
        _mm256_set_m128i(_mm_srli_epi16(raw, 4), raw),
        _mm256_set1_epi8(0x0f),
    )
}

/// Bit `j` of `bits` to byte `j` (0x10 where set, else 0).
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn bits_to_0x10(bits: u32) -> __m256i {
    let shuf = _mm256_set_epi64x(
        0x0303_0303_0303_0303,
        0x0202_0202_0202_0202,
        0x0101_0101_0101_0101,
        0,
    );
    let bytes = _mm256_shuffle_epi8(_mm256_set1_epi32(bits as i32), shuf);
    let mask = _mm256_set1_epi64x(0x7fbf_dfef_f7fb_fdfe_u64 as i64);
    let set = _mm256_cmpeq_epi8(_mm256_or_si256(bytes, mask), _mm256_set1_epi64x(-1));
    _mm256_and_si256(set, _mm256_set1_epi8(0x10))
}

/// How far ahead of the current block weights are prefetched (bytes).
const PREFETCH: usize = 4096;

/// Prefetches the cache lines `PREFETCH` bytes past a super-block.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn prefetch_block(blk: *const u8, bytes: usize) {
    let mut off = 0;
    while off < bytes {
        _mm_prefetch::<_MM_HINT_T0>(blk.wrapping_add(PREFETCH + off) as *const i8);
        off += 64;
    }
}

// ---- 32-element block types --------------------------------------------

/// The shared loop of the 32-element types: `unpack(block) -> (q, d, m)`;
/// the result is `Σ d·dx·(q·x) + offset_or_min_term`, where `min_mul` picks
/// the term: `m · sx` for types with a min, `-off · d · sx` otherwise.
macro_rules! legacy_dot {
    ($name:ident, $bytes:expr, |$blk:ident| $unpack:block, $has_min:expr, $off:expr) => {
        #[target_feature(enable = "avx2,fma,f16c")]
        #[inline]
        unsafe fn $name<const T: usize>(w: *const u8, nb: usize, x: &[XRef; T]) -> [f32; T] {
            // Two sets of accumulators (even and odd blocks) to break the
            // FMA and add latency chains; the same for every T.
            let mut acc0 = [_mm256_setzero_ps(); T];
            let mut acc1 = [_mm256_setzero_ps(); T];
            let mut corr0 = [0.0f32; T];
            let mut corr1 = [0.0f32; T];
            #[inline(always)]
            unsafe fn step<const T: usize>(
                w: *const u8,
                b: usize,
                x: &[XRef; T],
                acc: &mut [__m256; T],
                corr: &mut [f32; T],
            ) {
                let $blk = w.add(b * $bytes);
                _mm_prefetch::<_MM_HINT_T0>($blk.wrapping_add(PREFETCH) as *const i8);
                let (q, d, m): (__m256i, f32, f32) = $unpack;
                let cm = if $has_min { m } else { d };
                for t in 0..T {
                    let xv = ld(x[t].qs.add(32 * b));
                    let s = _mm256_set1_ps(d * *x[t].d.add(b));
                    acc[t] = _mm256_fmadd_ps(mul_sum(q, xv), s, acc[t]);
                    corr[t] += cm * *x[t].sx.add(b);
                }
            }
            let mut b = 0;
            while b + 2 <= nb {
                step(w, b, x, &mut acc0, &mut corr0);
                step(w, b + 1, x, &mut acc1, &mut corr1);
                b += 2;
            }
            if b < nb {
                step(w, b, x, &mut acc0, &mut corr0);
            }
            let mut out = [0.0f32; T];
            for t in 0..T {
                let a = hsum(_mm256_add_ps(acc0[t], acc1[t]));
                let c = corr0[t] + corr1[t];
                out[t] = if $has_min { a + c } else { a - $off * c };
            }
            out
        }
    };
}

/// The 4-token form of a `legacy_dot` kernel: the four tokens' scales and
/// sums of a block are one vector (`QAct::group4`). The arithmetic per
/// token is the same as the T-generic kernel's, so results are identical.
macro_rules! legacy_dot4 {
    ($name:ident, $bytes:expr, |$blk:ident| $unpack:block, $has_min:expr, $off:expr) => {
        #[target_feature(enable = "avx2,fma,f16c")]
        #[inline]
        unsafe fn $name(
            w: *const u8,
            nb: usize,
            x: &[XRef; 4],
            (d4, sx4): (*const f32, *const f32),
        ) -> [f32; 4] {
            let mut acc0 = [_mm256_setzero_ps(); 4];
            let mut acc1 = [_mm256_setzero_ps(); 4];
            let mut corr0 = _mm_setzero_ps();
            let mut corr1 = _mm_setzero_ps();
            #[inline(always)]
            unsafe fn step(
                w: *const u8,
                b: usize,
                x: &[XRef; 4],
                d4: *const f32,
                sx4: *const f32,
                acc: &mut [__m256; 4],
                corr: &mut __m128,
            ) {
                let $blk = w.add(b * $bytes);
                _mm_prefetch::<_MM_HINT_T0>($blk.wrapping_add(PREFETCH) as *const i8);
                let (q, d, m): (__m256i, f32, f32) = $unpack;
                let cm = if $has_min { m } else { d };
                let s4 = _mm_mul_ps(_mm_set1_ps(d), _mm_loadu_ps(d4.add(4 * b)));
                let s = [
                    _mm256_broadcastss_ps(s4),
                    _mm256_broadcastss_ps(_mm_movehdup_ps(s4)),
                    _mm256_broadcastss_ps(_mm_movehl_ps(s4, s4)),
                    _mm256_broadcastss_ps(_mm_shuffle_ps::<0xff>(s4, s4)),
                ];
                *corr = _mm_add_ps(
                    *corr,
                    _mm_mul_ps(_mm_set1_ps(cm), _mm_loadu_ps(sx4.add(4 * b))),
                );
                for t in 0..4 {
                    let xv = ld(x[t].qs.add(32 * b));
                    acc[t] = _mm256_fmadd_ps(mul_sum(q, xv), s[t], acc[t]);
                }
            }
            let mut b = 0;
            while b + 2 <= nb {
                step(w, b, x, d4, sx4, &mut acc0, &mut corr0);
                step(w, b + 1, x, d4, sx4, &mut acc1, &mut corr1);
                b += 2;
            }
            if b < nb {
                step(w, b, x, d4, sx4, &mut acc0, &mut corr0);
            }
            let mut c = [0.0f32; 4];
            _mm_storeu_ps(c.as_mut_ptr(), _mm_add_ps(corr0, corr1));
            let mut out = [0.0f32; 4];
            for t in 0..4 {
                let a = hsum(_mm256_add_ps(acc0[t], acc1[t]));
                out[t] = if $has_min { a + c[t] } else { a - $off * c[t] };
            }
            out
        }
    };
}

legacy_dot!(
    dot_q4_0,
    18,
    |blk| { (nibbles32(blk.add(2)), f16(blk), 0.0) },
    false,
    8.0
);
legacy_dot4!(
    dot_q4_0_4,
    18,
    |blk| { (nibbles32(blk.add(2)), f16(blk), 0.0) },
    false,
    8.0
);
legacy_dot!(
    dot_q4_1,
    20,
    |blk| { (nibbles32(blk.add(4)), f16(blk), f16(blk.add(2))) },
    true,
    0.0
);
legacy_dot4!(
    dot_q4_1_4,
    20,
    |blk| { (nibbles32(blk.add(4)), f16(blk), f16(blk.add(2))) },
    true,
    0.0
);
legacy_dot!(
    dot_q5_0,
    22,
    |blk| {
        (
            _mm256_or_si256(nibbles32(blk.add(6)), bits_to_0x10(rd_u32(blk.add(2)))),
            f16(blk),
            0.0,
        )
    },
    false,
    16.0
);
legacy_dot4!(
    dot_q5_0_4,
    22,
    |blk| {
        (
            _mm256_or_si256(nibbles32(blk.add(6)), bits_to_0x10(rd_u32(blk.add(2)))),
            f16(blk),
            0.0,
        )
    },
    false,
    16.0
);
legacy_dot!(
    dot_q5_1,
    24,
    |blk| {
        (
            _mm256_or_si256(nibbles32(blk.add(8)), bits_to_0x10(rd_u32(blk.add(4)))),
            f16(blk),
            f16(blk.add(2)),
        )
    },
    true,
    0.0
);
legacy_dot4!(
    dot_q5_1_4,
    24,
    |blk| {
        (
            _mm256_or_si256(nibbles32(blk.add(8)), bits_to_0x10(rd_u32(blk.add(4)))),
            f16(blk),
            f16(blk.add(2)),
        )
    },
    true,
    0.0
);

/// Q8_0: signed × signed via the sign trick (`|w| · sign(x, w)`).
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn dot_q8_0<const T: usize>(w: *const u8, nb: usize, x: &[XRef; T]) -> [f32; T] {
    #[inline(always)]
    unsafe fn step<const T: usize>(w: *const u8, b: usize, x: &[XRef; T], acc: &mut [__m256; T]) {
        let blk = w.add(b * 34);
        _mm_prefetch::<_MM_HINT_T0>(blk.wrapping_add(PREFETCH) as *const i8);
        let d = f16(blk);
        let wv = ldu(blk.add(2));
        let aw = _mm256_sign_epi8(wv, wv);
        for t in 0..T {
            let xv = _mm256_sign_epi8(ld(x[t].qs.add(32 * b)), wv);
            let s = _mm256_set1_ps(d * *x[t].d.add(b));
            acc[t] = _mm256_fmadd_ps(mul_sum(aw, xv), s, acc[t]);
        }
    }
    let mut acc0 = [_mm256_setzero_ps(); T];
    let mut acc1 = [_mm256_setzero_ps(); T];
    let mut b = 0;
    while b + 2 <= nb {
        step(w, b, x, &mut acc0);
        step(w, b + 1, x, &mut acc1);
        b += 2;
    }
    if b < nb {
        step(w, b, x, &mut acc0);
    }
    let mut out = [0.0f32; T];
    for t in 0..T {
        out[t] = hsum(_mm256_add_ps(acc0[t], acc1[t]));
    }
    out
}

// ---- k-quants (256-element super-blocks) -------------------------------

/// Q4_K/Q5_K's 12 bytes of 6-bit scales and mins to (scales, mins) as f32×8.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn k4_scales(s: *const u8, d: f32, dmin: f32) -> (__m256, __m256) {
    const K1: u32 = 0x3f3f_3f3f;
    const K2: u32 = 0x0f0f_0f0f;
    const K3: u32 = 0x0303_0303;
    let (u0, u1, u2) = (rd_u32(s), rd_u32(s.add(4)), rd_u32(s.add(8)));
    let m_hi = ((u2 >> 4) & K2) | (((u1 >> 6) & K3) << 4);
    let m_lo = u1 & K1;
    let sc_hi = (u2 & K2) | (((u0 >> 6) & K3) << 4);
    let sc_lo = u0 & K1;
    let sc = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_set_epi32(
        0,
        0,
        sc_hi as i32,
        sc_lo as i32,
    )));
    let m = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_set_epi32(
        0,
        0,
        m_hi as i32,
        m_lo as i32,
    )));
    (
        _mm256_mul_ps(sc, _mm256_set1_ps(d)),
        _mm256_mul_ps(m, _mm256_set1_ps(dmin)),
    )
}

/// Q4_K (`HIGH = false`) and Q5_K (`HIGH = true`).
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn dot_q45_k<const T: usize, const HIGH: bool>(
    w: *const u8,
    nb: usize,
    x: &[XRef; T],
) -> [f32; T] {
    let (bytes, qs_at) = if HIGH { (176, 48) } else { (144, 16) };
    let m4 = _mm256_set1_epi8(0x0f);
    let one = _mm256_set1_epi8(1);
    let mut acc = [[_mm256_setzero_ps(); T]; 2];
    let mut mins = [_mm256_setzero_ps(); T];
    let mut sv = [[0.0f32; 8]; T];
    for b in 0..nb {
        let blk = w.add(b * bytes);
        prefetch_block(blk, bytes);
        let (dsc, dm) = k4_scales(blk.add(4), f16(blk), f16(blk.add(2)));
        for t in 0..T {
            let dx = _mm256_loadu_ps(x[t].d.add(8 * b));
            _mm256_storeu_ps(sv[t].as_mut_ptr(), _mm256_mul_ps(dsc, dx));
            mins[t] = _mm256_fmadd_ps(dm, _mm256_loadu_ps(x[t].sx.add(8 * b)), mins[t]);
        }
        let mut hq = if HIGH {
            ldu(blk.add(16))
        } else {
            _mm256_setzero_si256()
        };
        for c in 0..4 {
            let raw = ldu(blk.add(qs_at + 32 * c));
            let mut lo = _mm256_and_si256(raw, m4);
            let mut hi = _mm256_and_si256(_mm256_srli_epi16(raw, 4), m4);
            if HIGH {
                lo = _mm256_or_si256(lo, _mm256_slli_epi16(_mm256_and_si256(hq, one), 4));
                hq = _mm256_srli_epi16(hq, 1);
                hi = _mm256_or_si256(hi, _mm256_slli_epi16(_mm256_and_si256(hq, one), 4));
                hq = _mm256_srli_epi16(hq, 1);
            }
            for t in 0..T {
                let xp = x[t].qs.add(256 * b + 64 * c);
                let p0 = mul_sum(lo, ld(xp));
                acc[0][t] = _mm256_fmadd_ps(p0, _mm256_set1_ps(sv[t][2 * c]), acc[0][t]);
                let p1 = mul_sum(hi, ld(xp.add(32)));
                acc[1][t] = _mm256_fmadd_ps(p1, _mm256_set1_ps(sv[t][2 * c + 1]), acc[1][t]);
            }
        }
    }
    let mut out = [0.0f32; T];
    for t in 0..T {
        out[t] = hsum(_mm256_add_ps(acc[0][t], acc[1][t])) - hsum(mins[t]);
    }
    out
}

/// For 16-value sub-blocks: 16 i16 scales to the per-chunk madd vector
/// `[s(2k) x8 | s(2k+1) x8]` for chunk `k` of 32 values.
struct Scales16 {
    lo: __m256i,
    hi: __m256i,
    masks: [__m256i; 4],
}

impl Scales16 {
    #[target_feature(enable = "avx2,fma,f16c")]
    #[inline]
    unsafe fn new(s: __m256i, masks: [__m256i; 4]) -> Self {
        Scales16 {
            lo: _mm256_permute2x128_si256(s, s, 0x00),
            hi: _mm256_permute2x128_si256(s, s, 0x11),
            masks,
        }
    }
    #[target_feature(enable = "avx2,fma,f16c")]
    #[inline]
    unsafe fn chunk(&self, k: usize) -> __m256i {
        let src = if k < 4 { self.lo } else { self.hi };
        _mm256_shuffle_epi8(src, self.masks[k % 4])
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn scale_masks() -> [__m256i; 4] {
    let pair = |i: i16| ((2 * i + 1) << 8) | (2 * i);
    let mk = |a: i16| _mm256_set_m128i(_mm_set1_epi16(pair(a + 1)), _mm_set1_epi16(pair(a)));
    [mk(0), mk(2), mk(4), mk(6)]
}

/// The shared loop of Q2_K, Q3_K and Q6_K: 8 chunks of 32 unsigned values
/// from `chunk(blk, k)`, 16 i16 scales, and a correction `Σ_k corr_k ·
/// s16_k · dx` scaled by `dcorr` and subtracted.
macro_rules! k16_dot {
    ($name:ident, $bytes:expr,
     |$blk:ident| $prep:block,
     |$st:ident, $k:ident| $chunk:block) => {
        #[target_feature(enable = "avx2,fma,f16c")]
        #[inline]
        unsafe fn $name<const T: usize>(w: *const u8, nb: usize, x: &[XRef; T]) -> [f32; T] {
            let masks = scale_masks();
            let mut acc0 = [_mm256_setzero_ps(); T];
            let mut acc1 = [_mm256_setzero_ps(); T];
            let mut corr = [_mm256_setzero_ps(); T];
            let mut sv = [[0.0f32; 8]; T];
            for b in 0..nb {
                let $blk = w.add(b * $bytes);
                prefetch_block($blk, $bytes);
                // (d, dcorr, scales i16x16, corr coefficients i16x16, state)
                let (d, dcorr, scales, cco, mut $st) = $prep;
                let sc = Scales16::new(scales, masks);
                for t in 0..T {
                    let dx = _mm256_loadu_ps(x[t].d.add(8 * b));
                    _mm256_storeu_ps(sv[t].as_mut_ptr(), _mm256_mul_ps(_mm256_set1_ps(d), dx));
                    let s16 = _mm256_loadu_si256(x[t].s16.add(16 * b) as *const __m256i);
                    let c = _mm256_cvtepi32_ps(_mm256_madd_epi16(cco, s16));
                    corr[t] = _mm256_fmadd_ps(c, _mm256_mul_ps(_mm256_set1_ps(dcorr), dx), corr[t]);
                }
                for kk in 0..4 {
                    for (half, acc) in [(0, &mut acc0), (1, &mut acc1)] {
                        let $k = 2 * kk + half;
                        let q = $chunk;
                        let scv = sc.chunk($k);
                        for t in 0..T {
                            let p = mul_sum_scaled(q, ld(x[t].qs.add(256 * b + 32 * $k)), scv);
                            acc[t] = _mm256_fmadd_ps(p, _mm256_set1_ps(sv[t][$k]), acc[t]);
                        }
                    }
                }
            }
            let mut out = [0.0f32; T];
            for t in 0..T {
                out[t] = hsum(_mm256_add_ps(acc0[t], acc1[t])) - hsum(corr[t]);
            }
            out
        }
    };
}

/// Q6_K chunk state: the two halves' ql/qh vectors.
struct Q6 {
    ql0: __m256i,
    ql1: __m256i,
    qh: __m256i,
}

k16_dot!(
    dot_q6_k,
    210,
    |blk| {
        let s = _mm256_cvtepi8_epi16(_mm_loadu_si128(blk.add(192) as *const __m128i));
        let st = Q6 {
            ql0: _mm256_setzero_si256(),
            ql1: _mm256_setzero_si256(),
            qh: _mm256_setzero_si256(),
        };
        let d = f16(blk.add(208));
        (d, d, s, _mm256_slli_epi16(s, 5), st)
    },
    |st, k| {
        let (h, i) = (k / 4, k % 4);
        if i == 0 {
            st.ql0 = ldu(blk.add(64 * h));
            st.ql1 = ldu(blk.add(64 * h + 32));
            st.qh = ldu(blk.add(128 + 32 * h));
        }
        let m4 = _mm256_set1_epi8(0x0f);
        let m3 = _mm256_set1_epi8(3);
        let ql = if i % 2 == 0 { st.ql0 } else { st.ql1 };
        let lo = if i < 2 {
            _mm256_and_si256(ql, m4)
        } else {
            _mm256_and_si256(_mm256_srli_epi16(ql, 4), m4)
        };
        let hb = _mm256_and_si256(st.qh, m3);
        st.qh = _mm256_srli_epi16(st.qh, 2);
        _mm256_or_si256(lo, _mm256_slli_epi16(hb, 4))
    }
);

k16_dot!(
    dot_q2_k,
    84,
    |blk| {
        let raw = _mm_loadu_si128(blk as *const __m128i);
        let m4 = _mm_set1_epi8(0x0f);
        let s = _mm256_cvtepu8_epi16(_mm_and_si128(raw, m4));
        let mn = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(raw, 4), m4));
        (
            f16(blk.add(80)),
            f16(blk.add(82)),
            s,
            mn,
            _mm256_setzero_si256(),
        )
    },
    |st, k| {
        if k % 4 == 0 {
            st = ldu(blk.add(16 + 32 * (k / 4)));
        }
        let q = _mm256_and_si256(st, _mm256_set1_epi8(3));
        st = _mm256_srli_epi16(st, 2);
        q
    }
);

/// Q3_K chunk state: the current half's 2-bit values and the high-bit mask.
struct Q3 {
    q: __m256i,
    hm: __m256i,
}

k16_dot!(
    dot_q3_k,
    110,
    |blk| {
        let mut sc = [0i8; 16];
        let s = std::slice::from_raw_parts(blk.add(96), 12);
        for (k, o) in sc.iter_mut().enumerate() {
            let low = if k < 8 { s[k] & 0x0f } else { s[k - 8] >> 4 };
            let high = (s[8 + k % 4] >> (2 * (k / 4))) & 3;
            *o = (low | (high << 4)) as i8 - 32;
        }
        let sv = _mm256_cvtepi8_epi16(_mm_loadu_si128(sc.as_ptr() as *const __m128i));
        let d = f16(blk.add(108));
        let st = Q3 {
            q: _mm256_setzero_si256(),
            hm: ldu(blk),
        };
        (d, d, sv, _mm256_slli_epi16(sv, 2), st)
    },
    |st, k| {
        if k % 4 == 0 {
            st.q = ldu(blk.add(32 + 32 * (k / 4)));
        }
        let one = _mm256_set1_epi8(1);
        let low = _mm256_and_si256(st.q, _mm256_set1_epi8(3));
        st.q = _mm256_srli_epi16(st.q, 2);
        let hb = _mm256_and_si256(st.hm, one);
        st.hm = _mm256_srli_epi16(st.hm, 1);
        _mm256_or_si256(low, _mm256_slli_epi16(hb, 2))
    }
);

#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn dot_q4_k<const T: usize>(w: *const u8, nb: usize, x: &[XRef; T]) -> [f32; T] {
    dot_q45_k::<T, false>(w, nb, x)
}

#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn dot_q5_k<const T: usize>(w: *const u8, nb: usize, x: &[XRef; T]) -> [f32; T] {
    dot_q45_k::<T, true>(w, nb, x)
}

// ---- drivers ------------------------------------------------------------

macro_rules! q_driver {
    ($name:ident, $dot:ident) => {
        q_driver!($name, $dot, |w, nb, x, t| $dot::<4>(
            w,
            nb,
            &[x.row(t), x.row(t + 1), x.row(t + 2), x.row(t + 3)]
        ));
    };
    ($name:ident, $dot:ident, $dot4:ident) => {
        q_driver!($name, $dot, |w, nb, x, t| $dot4(
            w,
            nb,
            &[x.row(t), x.row(t + 1), x.row(t + 2), x.row(t + 3)],
            x.group4(t)
        ));
    };
    ($name:ident, $dot:ident, |$w:ident, $nb:ident, $x:ident, $t:ident| $four:expr) => {
        #[target_feature(enable = "avx2,fma,f16c")]
        pub(crate) unsafe fn $name(j: &QJob<'_>) {
            let x = j.x;
            for r in j.r0..j.r1 {
                let w = j.w.add(r * j.row_bytes);
                let b = j.bias.map_or(0.0, |b| b[r]);
                let y = j.y.add(r);
                let mut t = 0;
                while t + 4 <= j.n {
                    let o = {
                        let ($w, $nb, $x, $t) = (w, j.nb, x, t);
                        $four
                    };
                    for (k, v) in o.iter().enumerate() {
                        *y.add((t + k) * j.ystride) = v + b;
                    }
                    t += 4;
                }
                match j.n - t {
                    3 => {
                        let o = $dot::<3>(w, j.nb, &[x.row(t), x.row(t + 1), x.row(t + 2)]);
                        for (k, v) in o.iter().enumerate() {
                            *y.add((t + k) * j.ystride) = v + b;
                        }
                    }
                    2 => {
                        let o = $dot::<2>(w, j.nb, &[x.row(t), x.row(t + 1)]);
                        for (k, v) in o.iter().enumerate() {
                            *y.add((t + k) * j.ystride) = v + b;
                        }
                    }
                    1 => {
                        let o = $dot::<1>(w, j.nb, &[x.row(t)]);
                        *y.add(t * j.ystride) = o[0] + b;
                    }
                    _ => {}
                }
            }
        }
    };
}

q_driver!(rows_q4_0, dot_q4_0, dot_q4_0_4);
q_driver!(rows_q4_1, dot_q4_1, dot_q4_1_4);
q_driver!(rows_q5_0, dot_q5_0, dot_q5_0_4);
q_driver!(rows_q5_1, dot_q5_1, dot_q5_1_4);
q_driver!(rows_q8_0, dot_q8_0);
q_driver!(rows_q2_k, dot_q2_k);
q_driver!(rows_q3_k, dot_q3_k);
q_driver!(rows_q4_k, dot_q4_k);
q_driver!(rows_q5_k, dot_q5_k);
q_driver!(rows_q6_k, dot_q6_k);

// ---- float weights ------------------------------------------------------

/// Eight weights at element `i` as f32.
pub(crate) trait Load8 {
    unsafe fn load8(w: *const u8, i: usize) -> __m256;
    fn scalar(w: *const u8, i: usize) -> f32;
}

pub(crate) struct F32w;
pub(crate) struct F16w;
struct Bf16w;

impl Load8 for F32w {
    #[inline(always)]
    unsafe fn load8(w: *const u8, i: usize) -> __m256 {
        _mm256_loadu_ps(w.add(4 * i) as *const f32)
    }
    #[inline(always)]
    fn scalar(w: *const u8, i: usize) -> f32 {
        // SAFETY: i < cols, inside the row.
        unsafe { f32::from_bits(rd_u32(w.add(4 * i))) }
    }
}

impl Load8 for F16w {
    #[inline(always)]
    unsafe fn load8(w: *const u8, i: usize) -> __m256 {
        _mm256_cvtph_ps(_mm_loadu_si128(w.add(2 * i) as *const __m128i))
    }
    #[inline(always)]
    fn scalar(w: *const u8, i: usize) -> f32 {
        // SAFETY: i < cols, inside the row.
        unsafe {
            _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(i32::from(rd_u16(
                w.add(2 * i),
            )))))
        }
    }
}

impl Load8 for Bf16w {
    #[inline(always)]
    unsafe fn load8(w: *const u8, i: usize) -> __m256 {
        let h = _mm256_cvtepu16_epi32(_mm_loadu_si128(w.add(2 * i) as *const __m128i));
        _mm256_castsi256_ps(_mm256_slli_epi32(h, 16))
    }
    #[inline(always)]
    fn scalar(w: *const u8, i: usize) -> f32 {
        // SAFETY: i < cols, inside the row.
        unsafe { f32::from_bits(u32::from(rd_u16(w.add(2 * i))) << 16) }
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn dot_f<L: Load8, const T: usize>(
    w: *const u8,
    cols: usize,
    x: [*const f32; T],
) -> [f32; T] {
    let mut a0 = [_mm256_setzero_ps(); T];
    let mut a1 = [_mm256_setzero_ps(); T];
    let mut i = 0;
    while i + 16 <= cols {
        let w0 = L::load8(w, i);
        let w1 = L::load8(w, i + 8);
        for t in 0..T {
            a0[t] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(x[t].add(i)), a0[t]);
            a1[t] = _mm256_fmadd_ps(w1, _mm256_loadu_ps(x[t].add(i + 8)), a1[t]);
        }
        i += 16;
    }
    if i + 8 <= cols {
        let w0 = L::load8(w, i);
        for t in 0..T {
            a0[t] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(x[t].add(i)), a0[t]);
        }
        i += 8;
    }
    let mut out = [0.0f32; T];
    for t in 0..T {
        let mut s = hsum(_mm256_add_ps(a0[t], a1[t]));
        for k in i..cols {
            s += L::scalar(w, k) * *x[t].add(k);
        }
        out[t] = s;
    }
    out
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn rows_f<L: Load8>(j: &FJob<'_>) {
    let xp = |t: usize| j.x.as_ptr().add(t * j.cols);
    for r in j.r0..j.r1 {
        let w = j.w.add(r * j.row_bytes);
        let b = j.bias.map_or(0.0, |b| b[r]);
        let y = j.y.add(r);
        let mut t = 0;
        while t + 4 <= j.n {
            let o = dot_f::<L, 4>(w, j.cols, [xp(t), xp(t + 1), xp(t + 2), xp(t + 3)]);
            for (k, v) in o.iter().enumerate() {
                *y.add((t + k) * j.ystride) = v + b;
            }
            t += 4;
        }
        while t < j.n {
            let o = dot_f::<L, 1>(w, j.cols, [xp(t)]);
            *y.add(t * j.ystride) = o[0] + b;
            t += 1;
        }
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn rows_f32(j: &FJob<'_>) {
    rows_f::<F32w>(j)
}

#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn rows_f16(j: &FJob<'_>) {
    rows_f::<F16w>(j)
}

#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn rows_bf16(j: &FJob<'_>) {
    rows_f::<Bf16w>(j)
}

// ---- attention ----------------------------------------------------------

/// `[k0·q, k1·q, k2·q, k3·q]` over `q.len()` values of four K rows stored
/// as `L` (two accumulators per row: eight independent FMA chains).
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn dot4_kv<L: Load8>(k: [*const u8; 4], q: &[f32]) -> [f32; 4] {
    let len = q.len();
    let qp = q.as_ptr();
    let mut a = [_mm256_setzero_ps(); 4];
    let mut b = [_mm256_setzero_ps(); 4];
    let mut i = 0;
    while i + 16 <= len {
        let q0 = _mm256_loadu_ps(qp.add(i));
        let q1 = _mm256_loadu_ps(qp.add(i + 8));
        for r in 0..4 {
            a[r] = _mm256_fmadd_ps(L::load8(k[r], i), q0, a[r]);
            b[r] = _mm256_fmadd_ps(L::load8(k[r], i + 8), q1, b[r]);
        }
        i += 16;
    }
    if i + 8 <= len {
        let q0 = _mm256_loadu_ps(qp.add(i));
        for r in 0..4 {
            a[r] = _mm256_fmadd_ps(L::load8(k[r], i), q0, a[r]);
        }
        i += 8;
    }
    let mut out = [0.0f32; 4];
    for r in 0..4 {
        let mut s = hsum(_mm256_add_ps(a[r], b[r]));
        for j in i..len {
            s += L::scalar(k[r], j) * *qp.add(j);
        }
        out[r] = s;
    }
    out
}

/// `y += p[0]·v[0] + p[1]·v[1] + p[2]·v[2] + p[3]·v[3]` over `y.len()`
/// values of four V rows stored as `L`.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn axpy4_kv<L: Load8>(y: &mut [f32], p: [f32; 4], v: [*const u8; 4]) {
    let len = y.len();
    let yp = y.as_mut_ptr();
    let pv = p.map(|x| _mm256_set1_ps(x));
    let mut i = 0;
    while i + 8 <= len {
        let mut acc = _mm256_loadu_ps(yp.add(i));
        for r in 0..4 {
            acc = _mm256_fmadd_ps(pv[r], L::load8(v[r], i), acc);
        }
        _mm256_storeu_ps(yp.add(i), acc);
        i += 8;
    }
    for j in i..len {
        *yp.add(j) += p[0] * L::scalar(v[0], j)
            + p[1] * L::scalar(v[1], j)
            + p[2] * L::scalar(v[2], j)
            + p[3] * L::scalar(v[3], j);
    }
}

/// A KV cache element type and how eight of them load as f32.
pub(crate) trait KvLoad {
    type L: Load8;
}
impl KvLoad for f32 {
    type L = F32w;
}
impl KvLoad for u16 {
    type L = F16w;
}

/// [`dot4_kv`] of rows of `E` (f32, or f16 bits for the f16 KV cache).
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(crate) unsafe fn dot4<E: KvLoad>(k: [&[E]; 4], q: &[f32]) -> [f32; 4] {
    debug_assert!(k.iter().all(|r| r.len() >= q.len()));
    dot4_kv::<E::L>(k.map(|r| r.as_ptr() as *const u8), q)
}

/// [`axpy4_kv`] of rows of `E`.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(crate) unsafe fn axpy4<E: KvLoad>(y: &mut [f32], p: [f32; 4], v: [&[E]; 4]) {
    debug_assert!(v.iter().all(|r| r.len() >= y.len()));
    axpy4_kv::<E::L>(y, p, v.map(|r| r.as_ptr() as *const u8))
}
