//! AVX2 GEMM over repacked weights ([`PackedMat`]): a tile of eight rows ×
//! up to four tokens per pass over a group's records.
//!
//! Per 32-column chunk the eight weight vectors are unpacked once for the
//! tile; for each token, vector `j` is multiplied (`maddubs`) with the
//! token's bytes `4j..4j+4` broadcast, the products are added in 16-bit
//! lanes as far as the weights' range allows (4-bit: all eight; 5-bit: four;
//! 6-bit: two; 8-bit: one), `madd` turns them into the eight rows' 32-bit
//! sums, and one convert and one FMA scale them by the rows' scales times
//! the token's block scale. Offsets and mins go through the activation sums
//! (`sx`, `sx16`) as in `avx2.rs`.
//!
//! Each token's arithmetic is the same whatever tile it is in, and each row
//! the same whatever group range a thread runs, so results do not depend on
//! batching or the thread count.

use std::arch::x86_64::*;

use kiln_format::GgmlType;

use crate::packed::{PackedMat, ROWS};
use crate::quant::QAct;

/// Groups `g0..g1` of one matmul over packed weights.
pub(crate) struct PJob<'a> {
    pub w: &'a PackedMat,
    pub x: &'a QAct,
    pub n: usize,
    /// `y[t * ystride + r]`.
    pub y: *mut f32,
    pub ystride: usize,
    pub g0: usize,
    pub g1: usize,
    pub bias: Option<&'a [f32]>,
}

/// How far ahead weights are prefetched (bytes), as in `avx2.rs`.
const PREFETCH: usize = 4096;

/// One chunk's weights and per-row factors.
struct Ck {
    w: [__m256i; 8],
    /// Rows' float scale (times the token's `d`).
    fs: __m256,
    /// Rows' offset/min coefficient (times the token's `sx`), or of the
    /// first 16 columns (times `sx16`) for 16-value sub-blocks.
    off: __m256,
    /// Second-half coefficient (16-value sub-blocks only).
    off2: __m256,
    /// 16-bit `madd` factors of weight vectors 0–3 and 4–7.
    sc: [__m256i; 2],
}

/// How many `maddubs` results may be added in 16 bits before a `madd`.
#[derive(PartialEq, Eq)]
enum Sum {
    /// 4-bit weights: all eight.
    G8,
    /// 5-bit: four (vectors 0–3 and 4–7).
    G4,
    /// 6-bit: pairs, each `madd` with its sub-block's scales.
    G2,
    /// Signed 8-bit: sign trick, one `madd` each.
    S8,
}

trait Pk {
    const REC: usize;
    const CHUNKS: usize;
    const SUM: Sum;
    /// Offsets per 16 values (`sx16`) instead of per 32 (`sx`).
    const OFF16: bool = false;
    type S: Copy;
    unsafe fn rec(p: *const u8) -> Self::S;
    unsafe fn chunk(p: *const u8, s: &Self::S, c: usize) -> Ck;
}

#[inline(always)]
unsafe fn ld(p: *const u8) -> __m256i {
    _mm256_loadu_si256(p as *const __m256i)
}

#[inline(always)]
unsafe fn f16x8(p: *const u8) -> __m256 {
    _mm256_cvtph_ps(_mm_loadu_si128(p as *const __m128i))
}

#[inline(always)]
unsafe fn u8x8(p: *const u8) -> __m256 {
    _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64(p as *const __m128i)))
}

#[inline(always)]
unsafe fn i8x8(p: *const u8) -> __m256 {
    _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(p as *const __m128i)))
}

/// Eight i8 scales to the `madd` vector `[s0 s0 s1 s1 … s7 s7]` (i16).
#[inline(always)]
unsafe fn i8_pairs(p: *const u8) -> __m256i {
    let v = _mm_cvtepi8_epi16(_mm_loadl_epi64(p as *const __m128i));
    _mm256_set_m128i(_mm_unpackhi_epi16(v, v), _mm_unpacklo_epi16(v, v))
}

/// The nibble plane at `p`: weight vectors 0–7 (low nibbles are 0–3).
#[inline(always)]
unsafe fn nibbles(p: *const u8) -> [__m256i; 8] {
    let m4 = _mm256_set1_epi8(0x0f);
    let mut w = [_mm256_setzero_si256(); 8];
    for k in 0..4 {
        let raw = ld(p.add(32 * k));
        w[k] = _mm256_and_si256(raw, m4);
        w[k + 4] = _mm256_and_si256(_mm256_srli_epi16::<4>(raw), m4);
    }
    w
}

/// ORs bit `k` of each byte of `h` into bit 4 of `w[k]`.
#[inline(always)]
unsafe fn add_bit4(w: &mut [__m256i; 8], h: __m256i) {
    let b = |k: i32| _mm256_and_si256(h, _mm256_set1_epi8(1 << k));
    w[0] = _mm256_or_si256(w[0], _mm256_slli_epi16::<4>(b(0)));
    w[1] = _mm256_or_si256(w[1], _mm256_slli_epi16::<3>(b(1)));
    w[2] = _mm256_or_si256(w[2], _mm256_slli_epi16::<2>(b(2)));
    w[3] = _mm256_or_si256(w[3], _mm256_slli_epi16::<1>(b(3)));
    w[4] = _mm256_or_si256(w[4], b(4));
    w[5] = _mm256_or_si256(w[5], _mm256_srli_epi16::<1>(b(5)));
    w[6] = _mm256_or_si256(w[6], _mm256_srli_epi16::<2>(b(6)));
    w[7] = _mm256_or_si256(w[7], _mm256_srli_epi16::<3>(b(7)));
}

/// ORs bits `2k..2k+2` of `h` into bits 4–5 of `w[k]` (k < 4).
#[inline(always)]
unsafe fn add_bits45(w: &mut [__m256i], h: __m256i) {
    let b = |k: i32| _mm256_and_si256(h, _mm256_set1_epi8(3 << (2 * k)));
    w[0] = _mm256_or_si256(w[0], _mm256_slli_epi16::<4>(b(0)));
    w[1] = _mm256_or_si256(w[1], _mm256_slli_epi16::<2>(b(1)));
    w[2] = _mm256_or_si256(w[2], b(2));
    w[3] = _mm256_or_si256(w[3], _mm256_srli_epi16::<2>(b(3)));
}

#[inline(always)]
fn ones() -> __m256i {
    // SAFETY: AVX is available wherever this module runs.
    unsafe { _mm256_set1_epi16(1) }
}

/// Legacy 32-value blocks: `(d offset, m offset or none, 5-bit plane, nibbles)`.
macro_rules! legacy {
    ($name:ident, $rec:expr, $sum:expr, $m:expr, $h:expr, $nib:expr, $off:expr) => {
        struct $name;
        impl Pk for $name {
            const REC: usize = $rec;
            const CHUNKS: usize = 1;
            const SUM: Sum = $sum;
            type S = ();
            #[inline(always)]
            unsafe fn rec(_: *const u8) {}
            #[inline(always)]
            unsafe fn chunk(p: *const u8, _: &(), _: usize) -> Ck {
                let d = f16x8(p);
                let m: Option<usize> = $m;
                let off = match m {
                    Some(at) => f16x8(p.add(at)),
                    None => _mm256_mul_ps(d, _mm256_set1_ps(-$off)),
                };
                let mut w = nibbles(p.add($nib));
                let h: Option<usize> = $h;
                if let Some(at) = h {
                    add_bit4(&mut w, ld(p.add(at)));
                }
                Ck {
                    w,
                    fs: d,
                    off,
                    off2: off,
                    sc: [ones(), ones()],
                }
            }
        }
    };
}

legacy!(Q40, 144, Sum::G8, None, None, 16, 8.0);
legacy!(Q41, 160, Sum::G8, Some(16), None, 32, 0.0);
legacy!(Q50, 176, Sum::G4, None, Some(16), 48, 16.0);
legacy!(Q51, 192, Sum::G4, Some(16), Some(32), 64, 0.0);

struct Q80;
impl Pk for Q80 {
    const REC: usize = 272;
    const CHUNKS: usize = 1;
    const SUM: Sum = Sum::S8;
    type S = ();
    #[inline(always)]
    unsafe fn rec(_: *const u8) {}
    #[inline(always)]
    unsafe fn chunk(p: *const u8, _: &(), _: usize) -> Ck {
        let mut w = [_mm256_setzero_si256(); 8];
        for (k, v) in w.iter_mut().enumerate() {
            *v = ld(p.add(16 + 32 * k));
        }
        let z = _mm256_setzero_ps();
        Ck {
            w,
            fs: f16x8(p),
            off: z,
            off2: z,
            sc: [ones(), ones()],
        }
    }
}

/// Q4_K (`FIVE = false`) and Q5_K.
struct Q45K<const FIVE: bool>;
impl<const FIVE: bool> Pk for Q45K<FIVE> {
    const REC: usize = if FIVE { 1440 } else { 1184 };
    const CHUNKS: usize = 8;
    const SUM: Sum = if FIVE { Sum::G4 } else { Sum::G8 };
    type S = (__m256, __m256);
    #[inline(always)]
    unsafe fn rec(p: *const u8) -> (__m256, __m256) {
        (f16x8(p), f16x8(p.add(16)))
    }
    #[inline(always)]
    unsafe fn chunk(p: *const u8, &(d, dmin): &(__m256, __m256), c: usize) -> Ck {
        let fs = _mm256_mul_ps(d, u8x8(p.add(32 + 8 * c)));
        let off = _mm256_sub_ps(
            _mm256_setzero_ps(),
            _mm256_mul_ps(dmin, u8x8(p.add(96 + 8 * c))),
        );
        let w = if FIVE {
            let at = p.add(160 + 160 * c);
            let mut w = nibbles(at.add(32));
            add_bit4(&mut w, ld(at));
            w
        } else {
            nibbles(p.add(160 + 128 * c))
        };
        Ck {
            w,
            fs,
            off,
            off2: off,
            sc: [ones(), ones()],
        }
    }
}

struct Q6Kp;
impl Pk for Q6Kp {
    const REC: usize = 1680;
    const CHUNKS: usize = 8;
    const SUM: Sum = Sum::G2;
    const OFF16: bool = true;
    type S = __m256;
    #[inline(always)]
    unsafe fn rec(p: *const u8) -> __m256 {
        f16x8(p)
    }
    #[inline(always)]
    unsafe fn chunk(p: *const u8, &d: &__m256, c: usize) -> Ck {
        let s0 = p.add(16 + 16 * c);
        let s1 = s0.add(8);
        let m32 = _mm256_mul_ps(d, _mm256_set1_ps(-32.0));
        let at = p.add(144 + 192 * c);
        let mut w = nibbles(at.add(64));
        add_bits45(&mut w[..4], ld(at));
        add_bits45(&mut w[4..], ld(at.add(32)));
        Ck {
            w,
            fs: d,
            off: _mm256_mul_ps(m32, i8x8(s0)),
            off2: _mm256_mul_ps(m32, i8x8(s1)),
            sc: [i8_pairs(s0), i8_pairs(s1)],
        }
    }
}

/// The token's bytes `4j..4j+4` of the chunk at `x`, in every lane.
#[inline(always)]
unsafe fn bx(x: *const i8, j: usize) -> __m256i {
    _mm256_set1_epi32(std::ptr::read_unaligned(x.add(4 * j) as *const i32))
}

/// The eight rows' integer sums of one chunk for the token at `x`.
#[inline(always)]
unsafe fn isum<K: Pk>(ck: &Ck, x: *const i8) -> __m256i {
    let w = &ck.w;
    let m = |j: usize| _mm256_maddubs_epi16(w[j], bx(x, j));
    match K::SUM {
        Sum::G8 => {
            let a = _mm256_add_epi16(_mm256_add_epi16(m(0), m(1)), _mm256_add_epi16(m(2), m(3)));
            let b = _mm256_add_epi16(_mm256_add_epi16(m(4), m(5)), _mm256_add_epi16(m(6), m(7)));
            _mm256_madd_epi16(_mm256_add_epi16(a, b), ones())
        }
        Sum::G4 => {
            let a = _mm256_add_epi16(_mm256_add_epi16(m(0), m(1)), _mm256_add_epi16(m(2), m(3)));
            let b = _mm256_add_epi16(_mm256_add_epi16(m(4), m(5)), _mm256_add_epi16(m(6), m(7)));
            _mm256_add_epi32(_mm256_madd_epi16(a, ones()), _mm256_madd_epi16(b, ones()))
        }
        Sum::G2 => {
            let a0 = _mm256_madd_epi16(_mm256_add_epi16(m(0), m(1)), ck.sc[0]);
            let a1 = _mm256_madd_epi16(_mm256_add_epi16(m(2), m(3)), ck.sc[0]);
            let b0 = _mm256_madd_epi16(_mm256_add_epi16(m(4), m(5)), ck.sc[1]);
            let b1 = _mm256_madd_epi16(_mm256_add_epi16(m(6), m(7)), ck.sc[1]);
            _mm256_add_epi32(_mm256_add_epi32(a0, a1), _mm256_add_epi32(b0, b1))
        }
        Sum::S8 => {
            let s = |j: usize| {
                let xv = _mm256_sign_epi8(bx(x, j), w[j]);
                _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_abs_epi8(w[j]), xv), ones())
            };
            let a = _mm256_add_epi32(_mm256_add_epi32(s(0), s(1)), _mm256_add_epi32(s(2), s(3)));
            let b = _mm256_add_epi32(_mm256_add_epi32(s(4), s(5)), _mm256_add_epi32(s(6), s(7)));
            _mm256_add_epi32(a, b)
        }
    }
}

/// Group `g` × tokens `t0..t0 + T`.
#[inline(always)]
unsafe fn tile<K: Pk, const T: usize>(j: &PJob<'_>, g: usize, t0: usize, prefetch: bool) {
    let x = j.x;
    let (cols, nrec) = (x.cols, j.w.nrec);
    let bpr = cols / 32;
    let mut acc = [_mm256_setzero_ps(); T];
    let base = j.w.bytes().as_ptr().add(g * nrec * K::REC);
    let qs = x.qs.as_ptr();
    let (xd, xsx, xsx16) = (x.d.as_ptr(), x.sx.as_ptr(), x.sx16.as_ptr());
    for r in 0..nrec {
        let p = base.add(r * K::REC);
        if prefetch {
            let mut off = 0;
            while off < K::REC {
                _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(PREFETCH + off) as *const i8);
                off += 64;
            }
        }
        let s = K::rec(p);
        for c in 0..K::CHUNKS {
            let ck = K::chunk(p, &s, c);
            let blk = r * K::CHUNKS + c;
            for (t, a) in acc.iter_mut().enumerate() {
                let tb = (t0 + t) * bpr + blk;
                let is = isum::<K>(&ck, qs.add(32 * tb));
                let s = _mm256_mul_ps(ck.fs, _mm256_broadcast_ss(&*xd.add(tb)));
                *a = _mm256_fmadd_ps(_mm256_cvtepi32_ps(is), s, *a);
                if K::OFF16 {
                    *a = _mm256_fmadd_ps(ck.off, _mm256_broadcast_ss(&*xsx16.add(2 * tb)), *a);
                    *a = _mm256_fmadd_ps(ck.off2, _mm256_broadcast_ss(&*xsx16.add(2 * tb + 1)), *a);
                } else if K::SUM != Sum::S8 {
                    *a = _mm256_fmadd_ps(ck.off, _mm256_broadcast_ss(&*xsx.add(tb)), *a);
                }
            }
        }
    }
    let r0 = g * ROWS;
    let valid = (j.w.rows - r0).min(ROWS);
    let mut bias = [0.0f32; ROWS];
    if let Some(b) = j.bias {
        bias[..valid].copy_from_slice(&b[r0..r0 + valid]);
    }
    let bv = _mm256_loadu_ps(bias.as_ptr());
    for (t, a) in acc.iter().enumerate() {
        let y = j.y.add((t0 + t) * j.ystride + r0);
        let v = _mm256_add_ps(*a, bv);
        if valid == ROWS {
            _mm256_storeu_ps(y, v);
        } else {
            let mut o = [0.0f32; ROWS];
            _mm256_storeu_ps(o.as_mut_ptr(), v);
            std::ptr::copy_nonoverlapping(o.as_ptr(), y, valid);
        }
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn gemm_k<K: Pk>(j: &PJob<'_>) {
    for g in j.g0..j.g1 {
        let mut t = 0;
        while t + 4 <= j.n {
            tile::<K, 4>(j, g, t, t == 0);
            t += 4;
        }
        match j.n - t {
            3 => tile::<K, 3>(j, g, t, t == 0),
            2 => tile::<K, 2>(j, g, t, t == 0),
            1 => tile::<K, 1>(j, g, t, t == 0),
            _ => {}
        }
    }
}

/// Runs the job; false if the type has no GEMM kernel.
///
/// # Safety
/// The CPU has AVX2, FMA and F16C; `x` holds `n` rows of `w.cols`; `y`
/// has `n` rows of `ystride >= w.rows`, and rows of groups `g0..g1` belong
/// to the caller alone; `g1 <= w.groups()`; `bias` has `w.rows` values.
pub(crate) unsafe fn gemm(j: &PJob<'_>) -> bool {
    use GgmlType::*;
    match j.w.ty {
        Q4_0 => gemm_k::<Q40>(j),
        Q4_1 => gemm_k::<Q41>(j),
        Q5_0 => gemm_k::<Q50>(j),
        Q5_1 => gemm_k::<Q51>(j),
        Q8_0 => gemm_k::<Q80>(j),
        Q4K => gemm_k::<Q45K<false>>(j),
        Q5K => gemm_k::<Q45K<true>>(j),
        Q6K => gemm_k::<Q6Kp>(j),
        _ => return false,
    }
    true
}
