// Weight decoding: `unit<T>(row, u, cols, w)` writes the 32 values of unit
// `u` of a row (elements 32u .. 32u+31) to registers. A unit is one block of
// the 32-element types and one eighth of a k-quant super-block. The layouts
// and formulas follow kiln-format's reference dequantization (ggml's).
// T is the ggml type id.

#define T_F32 0
#define T_F16 1
#define T_Q4_0 2
#define T_Q4_1 3
#define T_Q5_0 6
#define T_Q5_1 7
#define T_Q8_0 8
#define T_Q2_K 10
#define T_Q3_K 11
#define T_Q4_K 12
#define T_Q5_K 13
#define T_Q6_K 14
#define T_BF16 30

template <int T>
__device__ __forceinline__ void unit(const u8* __restrict__ row, int u, int cols, float* w);

template <>
__device__ __forceinline__ void unit<T_F32>(const u8* __restrict__ row, int u, int cols, float* w) {
    const float* p = (const float*)row + u * 32;
    if (u * 32 + 32 <= cols && ((cols & 3) == 0)) {
        const float4* q = (const float4*)p;
#pragma unroll
        for (int i = 0; i < 8; i++) {
            float4 v = q[i];
            w[4 * i] = v.x;
            w[4 * i + 1] = v.y;
            w[4 * i + 2] = v.z;
            w[4 * i + 3] = v.w;
        }
    } else {
#pragma unroll
        for (int i = 0; i < 32; i++) w[i] = (u * 32 + i < cols) ? p[i] : 0.0f;
    }
}

template <>
__device__ __forceinline__ void unit<T_F16>(const u8* __restrict__ row, int u, int cols, float* w) {
    const u16* p = (const u16*)row + u * 32;
    if (u * 32 + 32 <= cols && ((cols & 7) == 0)) {
        const uint4* q = (const uint4*)p;
#pragma unroll
        for (int i = 0; i < 4; i++) {
            uint4 v = q[i];
            u32 a[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
            for (int j = 0; j < 4; j++) {
                w[8 * i + 2 * j] = h2f((u16)(a[j] & 0xffff));
                w[8 * i + 2 * j + 1] = h2f((u16)(a[j] >> 16));
            }
        }
    } else {
#pragma unroll
        for (int i = 0; i < 32; i++) w[i] = (u * 32 + i < cols) ? h2f(p[i]) : 0.0f;
    }
}

template <>
__device__ __forceinline__ void unit<T_BF16>(const u8* __restrict__ row, int u, int cols, float* w) {
    const u16* p = (const u16*)row + u * 32;
    if (u * 32 + 32 <= cols && ((cols & 7) == 0)) {
        const uint4* q = (const uint4*)p;
#pragma unroll
        for (int i = 0; i < 4; i++) {
            uint4 v = q[i];
            u32 a[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
            for (int j = 0; j < 4; j++) {
                w[8 * i + 2 * j] = __uint_as_float(a[j] << 16);
                w[8 * i + 2 * j + 1] = __uint_as_float(a[j] & 0xffff0000u);
            }
        }
    } else {
#pragma unroll
        for (int i = 0; i < 32; i++) w[i] = (u * 32 + i < cols) ? bf2f(p[i]) : 0.0f;
    }
}

// { f16 d; u8 qs[16] }: x = d * (q - 8)
template <>
__device__ __forceinline__ void unit<T_Q4_0>(const u8* __restrict__ row, int u, int cols, float* w) {
    const u8* b = row + u * 18;
    float d = ld_h(b);
#pragma unroll
    for (int i = 0; i < 8; i++) {
        u16 v = ld_u16(b + 2 + 2 * i);
        int q0 = v & 0xff, q1 = v >> 8;
        w[2 * i] = d * (float)((q0 & 15) - 8);
        w[2 * i + 1] = d * (float)((q1 & 15) - 8);
        w[2 * i + 16] = d * (float)((q0 >> 4) - 8);
        w[2 * i + 17] = d * (float)((q1 >> 4) - 8);
    }
}

// { f16 d; f16 m; u8 qs[16] }: x = d * q + m
template <>
__device__ __forceinline__ void unit<T_Q4_1>(const u8* __restrict__ row, int u, int cols, float* w) {
    const u8* b = row + u * 20;
    float d = ld_h(b), m = ld_h(b + 2);
#pragma unroll
    for (int i = 0; i < 4; i++) {
        u32 v = *(const u32*)(b + 4 + 4 * i);
#pragma unroll
        for (int j = 0; j < 4; j++) {
            int q = (v >> (8 * j)) & 0xff;
            w[4 * i + j] = d * (float)(q & 15) + m;
            w[4 * i + j + 16] = d * (float)(q >> 4) + m;
        }
    }
}

// { f16 d; u32 qh; u8 qs[16] }: x = d * (q - 16)
template <>
__device__ __forceinline__ void unit<T_Q5_0>(const u8* __restrict__ row, int u, int cols, float* w) {
    const u8* b = row + u * 22;
    float d = ld_h(b);
    u32 qh = (u32)ld_u16(b + 2) | ((u32)ld_u16(b + 4) << 16);
#pragma unroll
    for (int i = 0; i < 8; i++) {
        u16 v = ld_u16(b + 6 + 2 * i);
#pragma unroll
        for (int k = 0; k < 2; k++) {
            int j = 2 * i + k;
            int q = k ? (v >> 8) : (v & 0xff);
            int lo = (q & 15) | (((qh >> j) & 1) << 4);
            int hi = (q >> 4) | (((qh >> (j + 16)) & 1) << 4);
            w[j] = d * (float)(lo - 16);
            w[j + 16] = d * (float)(hi - 16);
        }
    }
}

// { f16 d; f16 m; u32 qh; u8 qs[16] }: x = d * q + m
template <>
__device__ __forceinline__ void unit<T_Q5_1>(const u8* __restrict__ row, int u, int cols, float* w) {
    const u8* b = row + u * 24;
    float d = ld_h(b), m = ld_h(b + 2);
    u32 qh = *(const u32*)(b + 4);
#pragma unroll
    for (int i = 0; i < 4; i++) {
        u32 v = *(const u32*)(b + 8 + 4 * i);
#pragma unroll
        for (int k = 0; k < 4; k++) {
            int j = 4 * i + k;
            int q = (v >> (8 * k)) & 0xff;
            int lo = (q & 15) | (((qh >> j) & 1) << 4);
            int hi = (q >> 4) | (((qh >> (j + 16)) & 1) << 4);
            w[j] = d * (float)lo + m;
            w[j + 16] = d * (float)hi + m;
        }
    }
}

// { f16 d; i8 qs[32] }: x = q * d
template <>
__device__ __forceinline__ void unit<T_Q8_0>(const u8* __restrict__ row, int u, int cols, float* w) {
    const u8* b = row + u * 34;
    float d = ld_h(b);
#pragma unroll
    for (int i = 0; i < 16; i++) {
        u16 v = ld_u16(b + 2 + 2 * i);
        w[2 * i] = (float)(i8)(v & 0xff) * d;
        w[2 * i + 1] = (float)(i8)(v >> 8) * d;
    }
}

// { u8 scales[16]; u8 qs[64]; f16 d; f16 dmin }
template <>
__device__ __forceinline__ void unit<T_Q2_K>(const u8* __restrict__ row, int u, int cols, float* w) {
    const u8* b = row + (u >> 3) * 84;
    int j = u & 7;
    float d = ld_h(b + 80), dmin = ld_h(b + 82);
    const u8* qs = b + 16 + (j >> 2) * 32;
    int shift = 2 * (j & 3);
#pragma unroll
    for (int h = 0; h < 2; h++) {
        int sc = b[2 * j + h];
        float dl = d * (float)(sc & 15), ml = dmin * (float)(sc >> 4);
#pragma unroll
        for (int l = 0; l < 16; l++) {
            int q = (qs[16 * h + l] >> shift) & 3;
            w[16 * h + l] = dl * (float)q - ml;
        }
    }
}

// Scale k (0-15) of a Q3_K super-block's 12 scale bytes: 6 bits, stored
// + 32 (ggml's aux shuffle: a nibble of byte k % 8, two bits of byte 8 + k % 4).
__device__ __forceinline__ int q3k_scale(const u8* sc, int k) {
    int low = k < 8 ? (sc[k] & 15) : (sc[k - 8] >> 4);
    int high = (sc[8 + (k & 3)] >> (2 * (k >> 2))) & 3;
    return low | (high << 4);
}

// { u8 hmask[32]; u8 qs[64]; u8 scales[12]; f16 d }
template <>
__device__ __forceinline__ void unit<T_Q3_K>(const u8* __restrict__ row, int u, int cols, float* w) {
    const u8* b = row + (u >> 3) * 110;
    int j = u & 7;
    float d = ld_h(b + 108);
    const u8* hm = b;
    const u8* qs = b + 32 + (j >> 2) * 32;
    const u8* sc = b + 96;
    int shift = 2 * (j & 3);
#pragma unroll
    for (int h = 0; h < 2; h++) {
        float dl = d * (float)(q3k_scale(sc, 2 * j + h) - 32);
#pragma unroll
        for (int l = 0; l < 16; l++) {
            int ll = 16 * h + l;
            int lo = (qs[ll] >> shift) & 3;
            int hb = (hm[ll] >> j) & 1;
            w[ll] = dl * (float)(lo - (hb ? 0 : 4));
        }
    }
}

// get_scale_min_k4 for sub-block j of a Q4_K / Q5_K super-block.
__device__ __forceinline__ void k4_scale(const u8* s, int j, float d, float dmin, float* dl, float* ml) {
    int sc, m;
    if (j < 4) {
        sc = s[j] & 63;
        m = s[j + 4] & 63;
    } else {
        sc = (s[j + 4] & 15) | ((s[j - 4] >> 6) << 4);
        m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
    }
    *dl = d * (float)sc;
    *ml = dmin * (float)m;
}

// Unit u's super-block of a Q4_K (SB = 144) or Q5_K (176) row, plain or
// repacked (the header is the same), and the unit's scale and min.
template <int SB>
__device__ __forceinline__ const u8* k4_block(const u8* row, int u, float* dl, float* ml) {
    const u8* b = row + (u >> 3) * SB;
    k4_scale(b + 4, u & 7, ld_h(b), ld_h(b + 2), dl, ml);
    return b;
}

// { f16 d; f16 dmin; u8 scales[12]; u8 qs[128] }
template <>
__device__ __forceinline__ void unit<T_Q4_K>(const u8* __restrict__ row, int u, int cols, float* w) {
    int j = u & 7;
    float dl, ml;
    const u8* b = k4_block<144>(row, u, &dl, &ml);
    const uint4* qs = (const uint4*)(b + 16 + (j >> 1) * 32);
    int shift = 4 * (j & 1);
#pragma unroll
    for (int i = 0; i < 2; i++) {
        uint4 v = qs[i];
        u32 a[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
        for (int k = 0; k < 16; k++) {
            int q = (a[k >> 2] >> (8 * (k & 3) + shift)) & 15;
            w[16 * i + k] = dl * (float)q - ml;
        }
    }
}

// { f16 d; f16 dmin; u8 scales[12]; u8 qh[32]; u8 qs[128] }
template <>
__device__ __forceinline__ void unit<T_Q5_K>(const u8* __restrict__ row, int u, int cols, float* w) {
    int j = u & 7;
    float dl, ml;
    const u8* b = k4_block<176>(row, u, &dl, &ml);
    const uint4* qs = (const uint4*)(b + 48 + (j >> 1) * 32);
    const uint4* qh = (const uint4*)(b + 16);
    int shift = 4 * (j & 1);
#pragma unroll
    for (int i = 0; i < 2; i++) {
        uint4 v = qs[i], h = qh[i];
        u32 a[4] = {v.x, v.y, v.z, v.w};
        u32 c[4] = {h.x, h.y, h.z, h.w};
#pragma unroll
        for (int k = 0; k < 16; k++) {
            int lo = (a[k >> 2] >> (8 * (k & 3) + shift)) & 15;
            int hi = (c[k >> 2] >> (8 * (k & 3) + j)) & 1;
            w[16 * i + k] = dl * (float)(lo | (hi << 4)) - ml;
        }
    }
}

// { u8 ql[128]; u8 qh[64]; i8 scales[16]; f16 d }
template <>
__device__ __forceinline__ void unit<T_Q6_K>(const u8* __restrict__ row, int u, int cols, float* w) {
    const u8* b = row + (u >> 3) * 210;
    int j = u & 7;
    int half = j >> 2, jj = j & 3;
    float d = ld_h(b + 208);
    const u8* ql = b + half * 64 + (jj & 1) * 32;
    const u8* qh = b + 128 + half * 32;
    int ls = 4 * (jj >> 1), hs = 2 * jj;
#pragma unroll
    for (int h = 0; h < 2; h++) {
        float dl = d * (float)(i8)b[192 + 2 * j + h];
#pragma unroll
        for (int i = 0; i < 8; i++) {
            int l = 16 * h + 2 * i;
            u16 lv = ld_u16(ql + l), hv = ld_u16(qh + l);
#pragma unroll
            for (int k = 0; k < 2; k++) {
                int lo = ((k ? (lv >> 8) : lv) >> ls) & 15;
                int hi = ((k ? (hv >> 8) : hv) >> hs) & 3;
                w[l + k] = dl * (float)((lo | (hi << 4)) - 32);
            }
        }
    }
}

// Bits 0..3 of h moved to bit 4 of bytes 0..3.
__device__ __forceinline__ u32 spread4(u32 h) {
    return ((h & 1u) << 4) | ((h & 2u) << 11) | ((h & 4u) << 18) | ((h & 8u) << 25);
}

// ---- Repacked Q8_0 / Q5_0 / Q4_1 / Q5_1: each run of 8 blocks is
// stored as their 8 quant arrays (QB = 16 or 32 bytes each), then their 8
// second fields (HB bytes each: Q5_0's words of fifth bits, Q4_1's f16
// minimums, Q5_1's minimum and fifth-bit word),
// then their 8 f16 scales. A block's quants
// then start 16-byte aligned and are one or two loads instead of eight or
// sixteen 2-byte ones. Rows of whole runs (cols % 256 == 0) of Q8_0
// are rearranged in place at load (`repack8`: same bytes per row); other
// rows, and Q5_0 / Q4_1 / Q5_1, into a new buffer whose rows are whole runs (`repack8_to`:
// the last run's missing blocks are zeros no kernel reads, since every
// kernel stops at the row's cols / 32 units). Kernel type id: T_REPACKED +
// the ggml id.
//
// Repacked Q4_0 is flat instead (`repack_q4f`): a row's units' 16 quant
// bytes in order, then their f16 scales. A warp's loads of 32 units' quants
// (512 bytes) and scales (64) then fall on whole 32-byte sectors; runs of 8
// (144 bytes) touched 22 sectors for 18 sectors' bytes (NOTES.md item 103).
// Rows whose bytes are a multiple of 16 (cols % 256 == 0) are rearranged
// in place; others into rows padded to 16 bytes.
#define T_REPACKED 48
#define T_Q8_0R (T_REPACKED + T_Q8_0)
#define T_Q4_0R (T_REPACKED + T_Q4_0)
#define T_Q5_0R (T_REPACKED + T_Q5_0)
#define T_Q4_1R (T_REPACKED + T_Q4_1)
#define T_Q5_1R (T_REPACKED + T_Q5_1)

template <int QB, int HB = 0>
__device__ __forceinline__ const u8* r8_q(const u8* row, int u) {
    return row + (u >> 3) * (8 * (QB + HB + 2)) + (u & 7) * QB;
}
// Where unit u's second field sits (HB > 0).
template <int QB, int HB>
__device__ __forceinline__ const u8* r8_hp(const u8* row, int u) {
    return row + (u >> 3) * (8 * (QB + HB + 2)) + 8 * QB + (u & 7) * HB;
}
// Where unit u's f16 scale sits.
template <int QB, int HB = 0>
__device__ __forceinline__ const u8* r8_dp(const u8* row, int u) {
    return row + (u >> 3) * (8 * (QB + HB + 2)) + 8 * (QB + HB) + (u & 7) * 2;
}
template <int QB>
__device__ __forceinline__ float r8_d(const u8* row, int u) {
    return ld_h(r8_dp<QB>(row, u));
}

#define Q4F_MAX_UNITS 2730  // a row in 48 KiB of shared memory (repack_q4f)

// Repacked Q4_0: where unit u's quants and its f16 scale sit in a row of
// `cols` values.
__device__ __forceinline__ const u8* q4f_q(const u8* row, int u) { return row + 16 * u; }
__device__ __forceinline__ const u8* q4f_dp(const u8* row, int u, int cols) { return row + (cols >> 1) + 2 * u; }

template <>
__device__ __forceinline__ void unit<T_Q4_0R>(const u8* __restrict__ row, int u, int cols, float* w) {
    uint4 v = *(const uint4*)q4f_q(row, u);
    float d = ld_h(q4f_dp(row, u, cols));
    u32 a[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int i = 0; i < 16; i++) {
        int q = (a[i >> 2] >> (8 * (i & 3))) & 0xff;
        w[i] = d * (float)((q & 15) - 8);
        w[i + 16] = d * (float)((q >> 4) - 8);
    }
}

// Values i and 16 + i of a 5-bit unit: byte i's two nibbles (of the
// unit's 16 quant bytes in a) and fifth bits i and 16 + i of qh.
__device__ __forceinline__ void q5_pair(const u32* a, u32 qh, int i, int* lo, int* hi) {
    int q = (a[i >> 2] >> (8 * (i & 3))) & 0xff;
    *lo = (q & 15) | (((qh >> i) & 1) << 4);
    *hi = (q >> 4) | (((qh >> (i + 16)) & 1) << 4);
}

// Repacked Q5_0: w = d * (q - 16), q's fifth bit from the unit's word
// (bit i: value i, bit 16 + i: value 16 + i).
template <>
__device__ __forceinline__ void unit<T_Q5_0R>(const u8* __restrict__ row, int u, int cols, float* w) {
    uint4 v = *(const uint4*)r8_q<16, 4>(row, u);
    u32 qh = *(const u32*)r8_hp<16, 4>(row, u);
    float d = ld_h(r8_dp<16, 4>(row, u));
    u32 a[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int i = 0; i < 16; i++) {
        int lo, hi;
        q5_pair(a, qh, i, &lo, &hi);
        w[i] = d * (float)(lo - 16);
        w[i + 16] = d * (float)(hi - 16);
    }
}

// Repacked Q4_1: w = d * q + m.
template <>
__device__ __forceinline__ void unit<T_Q4_1R>(const u8* __restrict__ row, int u, int cols, float* w) {
    uint4 v = *(const uint4*)r8_q<16, 2>(row, u);
    float m = ld_h(r8_hp<16, 2>(row, u)), d = ld_h(r8_dp<16, 2>(row, u));
    u32 a[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int i = 0; i < 16; i++) {
        int q = (a[i >> 2] >> (8 * (i & 3))) & 0xff;
        w[i] = d * (float)(q & 15) + m;
        w[i + 16] = d * (float)(q >> 4) + m;
    }
}

// Repacked Q5_1: w = d * q + m; the 6-byte second field is the file's f16
// minimum, then its fifth-bit word (2-byte aligned).
template <>
__device__ __forceinline__ void unit<T_Q5_1R>(const u8* __restrict__ row, int u, int cols, float* w) {
    uint4 v = *(const uint4*)r8_q<16, 6>(row, u);
    const u8* h = r8_hp<16, 6>(row, u);
    float m = ld_h(h), d = ld_h(r8_dp<16, 6>(row, u));
    u32 qh = ld_u32_a2(h + 2);
    u32 a[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int i = 0; i < 16; i++) {
        int lo, hi;
        q5_pair(a, qh, i, &lo, &hi);
        // As unit<T_Q5_1>: the same expression per value.
        w[i] = d * (float)lo + m;
        w[i + 16] = d * (float)hi + m;
    }
}

template <>
__device__ __forceinline__ void unit<T_Q8_0R>(const u8* __restrict__ row, int u, int cols, float* w) {
    const uint4* p = (const uint4*)r8_q<32>(row, u);
    uint4 v0 = p[0], v1 = p[1];
    float d = r8_d<32>(row, u);
    u32 a[8] = {v0.x, v0.y, v0.z, v0.w, v1.x, v1.y, v1.z, v1.w};
#pragma unroll
    for (int i = 0; i < 32; i++) w[i] = (float)(i8)((a[i >> 2] >> (8 * (i & 3))) & 0xff) * d;
}

// ---- Repacked Q6_K (rows of up to Q6KR_MAX_SB super-blocks, rearranged at
// load by `repack_q6k`: in place where a row is whole runs of 8 super-blocks,
// otherwise into rows padded to 16 bytes). A row is runs of 4 super-blocks
// (32 units), 832 bytes each, then its super-blocks' f16 scales d in order
// (2 bytes each), the row padded to 16 bytes (a last run of fewer than 4
// super-blocks keeps the run's addresses, its missing units never read).
// Inside a run, field by field over its 32 units: their 16 bytes of low
// nibbles (byte i: values i and i + 16, as repacked Q4_0), then their 8
// bytes of high bit pairs (value 4k + b: byte 4 * (k / 4) + b, bits
// 2 * (k % 4), so a shift and a mask give the 4 values of activation word
// k), then their two int8 sub-block scales as in the file. So a warp's
// loads of 32 units fall on whole sectors (as repacked Q4_0's, NOTES.md
// item 103) and a row is read as one stream (flat fields over the whole
// row were three, item 104). A unit's quants are one 16-byte and one
// 8-byte load instead of 32 two-byte ones. Same values; a row of nsb
// super-blocks takes 840 ceil(nsb / 4) bytes padded to 16 (the file's 210
// nsb when nsb % 8 == 0). Kernel type id: T_REPACKED + T_Q6_K.
#define T_Q6_KR (T_REPACKED + T_Q6_K)
#define Q6KR_MAX_SB 234  // a row in 48 KiB of shared memory (repack_q6k)
#define Q6KR_RUN 832     // bytes of a run of 4 super-blocks' units

// Unit u's run, and its low nibbles, high bit pairs and sub-block scales
// in it (unit u + 32 k's: Q6KR_RUN k bytes on).
__device__ __forceinline__ const u8* q6kr_run(const u8* row, int u) { return row + Q6KR_RUN * (u >> 5); }
__device__ __forceinline__ const u8* q6kr_lo(const u8* row, int u) { return q6kr_run(row, u) + 16 * (u & 31); }
__device__ __forceinline__ const u8* q6kr_hi(const u8* row, int u) { return q6kr_run(row, u) + 512 + 8 * (u & 31); }
__device__ __forceinline__ const u8* q6kr_sc(const u8* row, int u) { return q6kr_run(row, u) + 768 + 2 * (u & 31); }
// Where super-block sb's d sits in a row of nsb.
__device__ __forceinline__ const u8* q6kr_dp(const u8* row, int sb, int nsb) {
    return row + Q6KR_RUN * ((nsb + 3) >> 2) + 2 * sb;
}

template <>
__device__ __forceinline__ void unit<T_Q6_KR>(const u8* __restrict__ row, int u, int cols, float* w) {
    const u8* sc = q6kr_sc(row, u);
    float d = ld_h(q6kr_dp(row, u >> 3, cols >> 8));
    uint4 lo = *(const uint4*)q6kr_lo(row, u);
    uint2 hi = *(const uint2*)q6kr_hi(row, u);
    u32 l[4] = {lo.x, lo.y, lo.z, lo.w};
#pragma unroll
    for (int h = 0; h < 2; h++) {
        // As unit<T_Q6_K>: the same products in the same order.
        float dl = d * (float)(i8)sc[h];
        u32 hw = h ? hi.y : hi.x;
#pragma unroll
        for (int i = 0; i < 16; i++) {
            int q = ((l[i >> 2] >> (8 * (i & 3) + 4 * h)) & 15) | (((hw >> (8 * (i & 3) + 2 * (i >> 2))) & 3) << 4);
            w[16 * h + i] = dl * (float)(q - 32);
        }
    }
}

// ---- Repacked Q4_K (rows of whole super-blocks, rearranged in place at
// load by `repack_q4k`). A super-block keeps its 144 bytes and its 16-byte
// header (f16 d, f16 dmin, the 12 bytes of packed scales and mins); its
// 128 quant bytes become 8 x 16, one run per 32-value unit, byte i holding
// values i (low nibble) and i + 16 (high), as repacked Q4_0. In the file,
// units 2p and 2p + 1 share 32 bytes (low and high nibbles), so a unit took
// two 16-byte loads and used half of each, plus byte loads for its scale
// and min; now it is one 16-byte load of quants and one of the header
// (coalesced across the 8 lanes of a super-block). Same bytes per row,
// same values. Kernel type id: T_REPACKED + T_Q4_K.
#define T_Q4_KR (T_REPACKED + T_Q4_K)

// Unit j's 6-bit scale and min from a repacked Q4_K / Q5_K super-block's
// header words (h.x = d | dmin << 16, h.y / h.z / h.w = scale bytes 0-3 /
// 4-7 / 8-11; k4_scale_i's selection by shifts).
__device__ __forceinline__ void k4_hscale(const uint4& h, int j, int& sc, int& m) {
    int sh = 8 * (j & 3);
    u32 lo = h.y >> sh, mid = h.z >> sh, hi = h.w >> sh;
    if (j < 4) {
        sc = (int)(lo & 63);
        m = (int)(mid & 63);
    } else {
        sc = (int)((hi & 15) | (((lo >> 6) & 3) << 4));
        m = (int)(((hi >> 4) & 15) | (((mid >> 6) & 3) << 4));
    }
}

template <>
__device__ __forceinline__ void unit<T_Q4_KR>(const u8* __restrict__ row, int u, int cols, float* w) {
    float dl, ml;
    const u8* b = k4_block<144>(row, u, &dl, &ml);
    uint4 v = *(const uint4*)(b + 16 + 16 * (u & 7));
    u32 a[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int i = 0; i < 16; i++) {
        int q = (a[i >> 2] >> (8 * (i & 3))) & 0xff;
        // As unit<T_Q4_K>: the same expression per value.
        w[i] = dl * (float)(q & 15) - ml;
        w[i + 16] = dl * (float)(q >> 4) - ml;
    }
}

// ---- Repacked Q5_K (rows of whole super-blocks, rearranged in place at
// load by `repack_q5k`). A super-block keeps its 176 bytes and its 16-byte
// header; then its 8 units' low nibbles as 8 x 16 bytes (byte i: values i
// and i + 16, as repacked Q4_K), then their fifth bits as 8 words (bit v:
// value v). In the file a unit's fifth bits are bit j of all 32 qh bytes
// and its nibbles half of 32 bytes shared with the next unit: 64 quant
// bytes loaded for 20 used. Now one 16-byte and one 4-byte load, plus the
// header. Same bytes per row, same values. Kernel type id: T_REPACKED + T_Q5_K.
#define T_Q5_KR (T_REPACKED + T_Q5_K)

template <>
__device__ __forceinline__ void unit<T_Q5_KR>(const u8* __restrict__ row, int u, int cols, float* w) {
    float dl, ml;
    const u8* b = k4_block<176>(row, u, &dl, &ml);
    uint4 v = *(const uint4*)(b + 16 + 16 * (u & 7));
    u32 h = *(const u32*)(b + 144 + 4 * (u & 7));
    u32 a[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int i = 0; i < 16; i++) {
        int q = (a[i >> 2] >> (8 * (i & 3))) & 0xff;
        // As unit<T_Q5_K>: the same expression per value.
        w[i] = dl * (float)((q & 15) | (((h >> i) & 1) << 4)) - ml;
        w[i + 16] = dl * (float)((q >> 4) | (((h >> (i + 16)) & 1) << 4)) - ml;
    }
}

// ---- Repacked Q3_K (rows of whole super-blocks, rewritten into a new buffer
// at load by `repack_q3k`: 110 -> 112 bytes a super-block, so that each
// starts 16-byte aligned). A super-block: a 16-byte header (words x / y:
// the low 4 bits of scales 0-7 / 8-15, scale k at bits 4 (k % 8); z: their
// high 2 bits, scale k at bits 2k; w: d), then per unit 8 bytes of 2-bit
// values (words A / B: dp4a word k's 4 values, byte i value 4k + i, at bits
// k of A for even k, of B for odd k, in pairs: shift 2 (k / 2)), then per
// unit a word of high bits (value 4k + i at bit 8i + k). In the file a
// unit's 2-bit values are a quarter of 32 bytes shared with 3 units and
// its high bits bit j of all 32 hmask bytes: 64 bytes loaded for 12 used.
// Now an 8-byte and a 4-byte load, plus the header (coalesced across the 8
// lanes of a super-block). Same values. Kernel type id: T_REPACKED + T_Q3_K.
#define T_Q3_KR (T_REPACKED + T_Q3_K)

// Unit j's two 6-bit scales (values 0-15 and 16-31), stored + 32, from a
// repacked Q3_K header.
__device__ __forceinline__ void q3kr_scales(const uint4& h, int j, int& sc0, int& sc1) {
    u32 lo = (j < 4 ? h.x : h.y) >> (8 * (j & 3)), hi = h.z >> (4 * j);
    sc0 = (int)((lo & 15) | ((hi & 3) << 4));
    sc1 = (int)(((lo >> 4) & 15) | (((hi >> 2) & 3) << 4));
}

// Dp4a word k (values 4k..4k+3, byte i: value 4k + i) of a repacked Q3_K
// unit's 2-bit words a / b and high-bit word h, as the unsigned 3-bit
// values (2 bits + 4 * high bit).
__device__ __forceinline__ u32 q3kr_word(u32 a, u32 b, u32 h, int k) {
    return (((k & 1 ? b : a) >> (2 * (k >> 1))) & 0x03030303u) | (((h >> k) & 0x01010101u) << 2);
}

// The same as the signed values q - 4, a byte each, as the products take them.
__device__ __forceinline__ u32 q3kr_sword(u32 a, u32 b, u32 h, int k) {
    return __vsub4(q3kr_word(a, b, h, k), 0x04040404u);
}

template <>
__device__ __forceinline__ void unit<T_Q3_KR>(const u8* __restrict__ row, int u, int cols, float* w) {
    const u8* b = row + (u >> 3) * 112;
    int j = u & 7;
    uint4 hd = *(const uint4*)b;
    uint2 q = *(const uint2*)(b + 16 + 8 * j);
    u32 hm = *(const u32*)(b + 80 + 4 * j);
    float d = h2f((u16)(hd.w & 0xffff));
    int sc[2];
    q3kr_scales(hd, j, sc[0], sc[1]);
#pragma unroll
    for (int h = 0; h < 2; h++) {
        // As unit<T_Q3_K>: the same expression per value.
        float dl = d * (float)(sc[h] - 32);
#pragma unroll
        for (int k = 4 * h; k < 4 * h + 4; k++) {
            u32 v = q3kr_word(q.x, q.y, hm, k);
#pragma unroll
            for (int i = 0; i < 4; i++) {
                int qv = (int)((v >> (8 * i)) & 7);
                w[4 * k + i] = dl * (float)((qv & 3) - (qv & 4 ? 0 : 4));
            }
        }
    }
}

// ---- Repacked Q2_K (rows rewritten at load by `repack_q2k` into a new
// buffer of whole runs of 4 super-blocks, the last run's missing ones zeros
// no kernel reads). A run (336 bytes: 16-byte aligned, where a super-block's
// 84 are not): its 32 units' 2-bit values (8 bytes a unit, words A / B as
// repacked Q3_K's), then their scale bytes (2 a unit, as in the file), then
// the 4 super-blocks' d / dmin pairs. In the file a unit's values are a
// quarter of 32 bytes shared with 3 units. Now one 8-byte, one 2-byte and
// one 4-byte load. Kernel type id: T_REPACKED + T_Q2_K.
#define T_Q2_KR (T_REPACKED + T_Q2_K)

template <>
__device__ __forceinline__ void unit<T_Q2_KR>(const u8* __restrict__ row, int u, int cols, float* w) {
    const u8* b = row + (u >> 5) * 336;
    int t = u & 31;
    uint2 q = *(const uint2*)(b + 8 * t);
    const u8* sc = b + 256 + 2 * t;
    float d = ld_h(b + 320 + 4 * (t >> 3)), dmin = ld_h(b + 322 + 4 * (t >> 3));
#pragma unroll
    for (int h = 0; h < 2; h++) {
        // As unit<T_Q2_K>: the same expression per value.
        int s = sc[h];
        float dl = d * (float)(s & 15), ml = dmin * (float)(s >> 4);
#pragma unroll
        for (int k = 4 * h; k < 4 * h + 4; k++) {
            u32 v = q3kr_word(q.x, q.y, 0u, k);
#pragma unroll
            for (int i = 0; i < 4; i++) w[4 * k + i] = dl * (float)((v >> (8 * i)) & 3) - ml;
        }
    }
}
