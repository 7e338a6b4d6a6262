// Quantized weights times a batch of tokens on the tensor cores (MMQ), for
// steps of 2-128 tokens (batched decode, short prefill chunks). The weights
// are read once per 64 tokens; the dequantize-then-cuBLAS path they replace
// wrote every matrix out as f16 and read it back each step (8B Q4_0 at 32
// sequences: 0.92x llama.cpp). The activations are the GEMVs' 8-bit blocks
// (quantize_q8: xq, xd, xs). A unit's integer dot products come from
// `mma.sync.m16n8k32` (s8 x s8 -> s32), the same integers the GEMVs' dp4a
// sums give; the float arithmetic after them uses fused multiply-adds, so
// results match the GEMVs' to rounding, not bit for bit. Per (row, token)
// the units of a split are added in increasing order and mmq_reduce adds
// the splits in order; the split count depends on the matrix only, so a
// token's result does not depend on how many tokens share the step.
//
// A block: MMQ_WARPS warps of 16 rows each, NT tokens (8, 16, 32 or 64: the
// step's count rounded up; the grid's third dimension covers more). Each
// run of 8 units (256 columns) is a stage: the block's rows' bytes of the
// run (as stored; Q2_K's from two places of its run of four, Q4_0's quants
// and scales from the two parts of its row), the tokens' 8-bit x of those
// columns and their scales and sums, copied into shared memory with
// cp.async, S - 1 runs ahead of the one being multiplied (mmq_stages: 3, or
// 2 where three would keep a second block off the SM).
// grid: (ceil(rows / (16 * MMQ_WARPS)), splits, ceil(n / NT)); dynamic
// shared memory mmq_stages x mmq_stage_bytes (src/mmq.rs computes the
// same). Repacked layouts only (whole runs a row: cols % 256 == 0).
#define MMQ_WARPS 4
#define MMQ_ROWS (16 * MMQ_WARPS)
#define MMQ_THREADS (32 * MMQ_WARPS)
#define MMQ_STAGES 3
// Shared memory two blocks of an SM may take between them (of the H100's 228 KB).
#define MMQ_SMEM_PAIR 116736
// A token's x in a stage: 256 bytes and 16 of padding, so that the eight
// tokens of a fragment load fall in distinct banks; its scales (8 floats)
// then sums (8), padded to 80 bytes for the same reason.
#define MMQ_XS 272
#define MMQ_DS 80

// d = A B (16 x 32 s8 row-major, 32 x 8 s8 column-major) + c, s32.
// Fragments (lane = 4 g + t): a0 = A[g][4t..4t+3], a1 = A[g + 8][4t..], a2 =
// A[g][16 + 4t..], a3 = A[g + 8][16 + 4t..]; b0 = B[4t..4t+3][g], b1 =
// B[16 + 4t..][g]; d0 = D[g][2t], d1 = D[g][2t + 1], d2 = D[g + 8][2t], d3 =
// D[g + 8][2t + 1].
__device__ __forceinline__ void mma_s8_16832(int (&d)[4], const u32 (&a)[4], u32 b0, u32 b1, int c) {
    asm("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%10,%10,%10,%10};"
        : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1), "r"(c));
}

// The products start from the bits of 1.5 * 2^23: an integer sum s (|s| <
// 2^22; a unit's is at most 32 * 127 * 127) then reads as the float 1.5 *
// 2^23 + s exactly, and one subtraction gives s as a float without a
// conversion instruction.
#define MMQ_BIAS 0x4B400000
__device__ __forceinline__ float mmq_sum(int c) { return __int_as_float(c) - 12582912.0f; }

// Per type: RB, the bytes of a run of 8 units of a row as stored (a
// super-block for the k-quants) and where they start (`src`); EXTRA, whether
// a run also needs a word kept elsewhere in its row (`dword`, its bits taken
// by `extra`); Stage, what a lane takes from its rows g and g + 8 once a
// run (a k-quant's header or scale); Unit, unit j's A fragments and row scales, and `tile`, which adds
// its products with one tile of 8 tokens (x words b0, b1; tokens 2t and
// 2t + 1's scales and sums) into the lane's four accumulators.
template <int T>
struct Mq;

// Rows of runs (or super-blocks) of RB_ bytes back to back, nothing taken
// once a run beyond them. A stage's row of RB bytes comes from FIELDS
// places in the row: field f gives FCH(f) 16-byte chunks of it (the stage's
// chunks in field order), run `run`'s from field_off(f, runs) +
// field_run(f, run) bytes after the row's start (a row of `runs` runs).
// One field here; a layout kept field by field over its row (flat Q4_0,
// Q6_K's runs of 4, Q2_K's) has more.
template <int RB_>
struct MqRuns {
    static constexpr int RB = RB_;
    static constexpr bool EXTRA = false;
    static constexpr int FIELDS = 1;
    static __host__ __device__ constexpr int FCH(int f) { return RB_ / 16; }
    static __device__ __forceinline__ u64 field_run(int f, int run) { return (u64)run * RB; }
    static __device__ __forceinline__ u32 field_off(int f, int runs) { return 0; }
    struct Stage {
        __device__ __forceinline__ Stage(const u8* sg, const u8* sg8, u32 eg, u32 eg8) {}
    };
};

// A unit's nibble A fragments from rows g and g + 8's words of its bytes
// 4t..4t+3 (w0, w1): the low nibbles are values 4t.. (a0, a1), the high
// ones values 16 + 4t.. (a2, a3); repacked Q4_0 and Q4_K lay units out so.
__device__ __forceinline__ void nib_frags(u32 (&a)[4], u32 w0, u32 w1) {
    a[0] = w0 & 0x0f0f0f0fu;
    a[1] = w1 & 0x0f0f0f0fu;
    a[2] = (w0 >> 4) & 0x0f0f0f0fu;
    a[3] = (w1 >> 4) & 0x0f0f0f0fu;
}

// Repacked Q4_0 (flat: a row's units' 16 quant bytes, then their f16
// scales). A stage is 8 units: their quants (chunks 0-7) and scales (chunk
// 8, from the row's scales), 144 bytes as runs of 8 held them.
// Byte i of a unit holds value i (low nibble) and i + 16 (high), so the
// lane's word 4t..4t+3 gives both a0 (low) and a2 (high). The nibbles go
// in unsigned, and the 8 comes off through the token's sum sx:
// w . x = d * (dx * s - 8 sx).
template <>
struct Mq<T_Q4_0R> : MqRuns<144> {
    static constexpr int FIELDS = 2;
    static __host__ __device__ constexpr int FCH(int f) { return f ? 1 : 8; }
    static __device__ __forceinline__ u64 field_run(int f, int run) { return (u64)run * (f ? 16 : 128); }
    static __device__ __forceinline__ u32 field_off(int f, int runs) { return f ? 128 * runs : 0; }
    struct Unit {
        u32 a[4];
        float dg, dg8;
        __device__ __forceinline__ Unit(const Stage&, const u8* sg, const u8* sg8, int j, int t) {
            nib_frags(a, *(const u32*)(sg + 16 * j + 4 * t), *(const u32*)(sg8 + 16 * j + 4 * t));
            dg = h2f(*(const u16*)(sg + 128 + 2 * j));
            dg8 = h2f(*(const u16*)(sg8 + 128 + 2 * j));
        }
        __device__ __forceinline__ void tile(float (&acc)[4], u32 b0, u32 b1, float dxa, float sxa, float dxb,
                                             float sxb) const {
            int c[4];
            mma_s8_16832(c, a, b0, b1, MMQ_BIAS);
            acc[0] = fmaf(dg, fmaf(dxa, mmq_sum(c[0]), -8.0f * sxa), acc[0]);
            acc[1] = fmaf(dg, fmaf(dxb, mmq_sum(c[1]), -8.0f * sxb), acc[1]);
            acc[2] = fmaf(dg8, fmaf(dxa, mmq_sum(c[2]), -8.0f * sxa), acc[2]);
            acc[3] = fmaf(dg8, fmaf(dxb, mmq_sum(c[3]), -8.0f * sxb), acc[3]);
        }
    };
};

// Repacked Q8_0 (runs of 8 units: 8 x 32 quant bytes, then 8 f16 scales):
// the fragment words are the unit's bytes as stored.
template <>
struct Mq<T_Q8_0R> : MqRuns<272> {
    struct Unit {
        u32 a[4];
        float dg, dg8;
        __device__ __forceinline__ Unit(const Stage&, const u8* sg, const u8* sg8, int j, int t) {
            a[0] = *(const u32*)(sg + 32 * j + 4 * t);
            a[1] = *(const u32*)(sg8 + 32 * j + 4 * t);
            a[2] = *(const u32*)(sg + 32 * j + 16 + 4 * t);
            a[3] = *(const u32*)(sg8 + 32 * j + 16 + 4 * t);
            dg = h2f(*(const u16*)(sg + 256 + 2 * j));
            dg8 = h2f(*(const u16*)(sg8 + 256 + 2 * j));
        }
        __device__ __forceinline__ void tile(float (&acc)[4], u32 b0, u32 b1, float dxa, float sxa, float dxb,
                                             float sxb) const {
            int c[4];
            mma_s8_16832(c, a, b0, b1, MMQ_BIAS);
            acc[0] = fmaf(dg * dxa, mmq_sum(c[0]), acc[0]);
            acc[1] = fmaf(dg * dxb, mmq_sum(c[1]), acc[1]);
            acc[2] = fmaf(dg8 * dxa, mmq_sum(c[2]), acc[2]);
            acc[3] = fmaf(dg8 * dxb, mmq_sum(c[3]), acc[3]);
        }
    };
};

// Repacked Q4_K (super-blocks of 144 bytes: the 16-byte header, then 8
// units of 16 quant bytes laid out as repacked Q4_0's). Unit j's value
// w = d sc_j q - dmin m_j (k4_hsum's scale and min from the header), so
// w . x = d sc_j dx s - dmin m_j sx.
template <>
struct Mq<T_Q4_KR> : MqRuns<144> {
    struct Stage {
        uint4 hg, hg8;
        __device__ __forceinline__ Stage(const u8* sg, const u8* sg8, u32 eg, u32 eg8)
            : hg(*(const uint4*)sg), hg8(*(const uint4*)sg8) {}
    };
    // Unit j's d sc_j and dmin m_j from a header.
    static __device__ __forceinline__ void scale_min(const uint4& h, int j, float& ds, float& dm) {
        int sc, m;
        k4_hscale(h, j, sc, m);
        ds = h2f((u16)(h.x & 0xffff)) * (float)sc;
        dm = h2f((u16)(h.x >> 16)) * (float)m;
    }
    struct Unit {
        u32 a[4];
        float dg, dg8, mg, mg8;
        __device__ __forceinline__ Unit(const Stage& st, const u8* sg, const u8* sg8, int j, int t) {
            nib_frags(a, *(const u32*)(sg + 16 + 16 * j + 4 * t), *(const u32*)(sg8 + 16 + 16 * j + 4 * t));
            scale_min(st.hg, j, dg, mg);
            scale_min(st.hg8, j, dg8, mg8);
        }
        __device__ __forceinline__ void tile(float (&acc)[4], u32 b0, u32 b1, float dxa, float sxa, float dxb,
                                             float sxb) const {
            int c[4];
            mma_s8_16832(c, a, b0, b1, MMQ_BIAS);
            acc[0] = fmaf(dg, dxa * mmq_sum(c[0]), fmaf(-mg, sxa, acc[0]));
            acc[1] = fmaf(dg, dxb * mmq_sum(c[1]), fmaf(-mg, sxb, acc[1]));
            acc[2] = fmaf(dg8, dxa * mmq_sum(c[2]), fmaf(-mg8, sxa, acc[2]));
            acc[3] = fmaf(dg8, dxb * mmq_sum(c[3]), fmaf(-mg8, sxb, acc[3]));
        }
    };
};

// Repacked Q5_K (super-blocks of 176 bytes: Q4_K's header and nibbles, then
// a word of fifth bits a unit, bit v for value v): as Q4_K with each value's
// fifth bit (spread4) above its nibble.
template <>
struct Mq<T_Q5_KR> : MqRuns<176> {
    using Stage = Mq<T_Q4_KR>::Stage;
    struct Unit : Mq<T_Q4_KR>::Unit {
        __device__ __forceinline__ Unit(const Stage& st, const u8* sg, const u8* sg8, int j, int t)
            : Mq<T_Q4_KR>::Unit(st, sg, sg8, j, t) {
            u32 h = *(const u32*)(sg + 144 + 4 * j), h8 = *(const u32*)(sg8 + 144 + 4 * j);
            a[0] |= spread4(h >> (4 * t));
            a[1] |= spread4(h8 >> (4 * t));
            a[2] |= spread4(h >> (16 + 4 * t));
            a[3] |= spread4(h8 >> (16 + 4 * t));
        }
    };
};

// d = A B (16 x 16 s8, 16 x 8 s8), s32: a0 = A[g][4t..], a1 = A[g + 8][4t..],
// b0 = B[4t..][g]; d as mma_s8_16832's.
__device__ __forceinline__ void mma_s8_16816(int (&d)[4], u32 a0, u32 a1, u32 b0) {
    asm("mma.sync.aligned.m16n8k16.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5}, {%6}, {%7,%7,%7,%7};"
        : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3])
        : "r"(a0), "r"(a1), "r"(b0), "r"(0));
}

// A unit whose halves (values 0-15, 16-31) have their own integer scales
// (Q6_K, Q3_K): a0 / a1 half 0's values 4t..4t+3 of rows g / g + 8, a2 / a3
// half 1's, each half one k = 16 product. sg*: the rows' halves' scales,
// dg / dg8 the rows' d. w . x = d dx (sc_0 s_0 + sc_1 s_1), the integer
// part exact.
struct MqHalves {
    u32 a[4];
    int sg0, sg1, sg80, sg81;
    float dg, dg8;
    __device__ __forceinline__ void tile(float (&acc)[4], u32 b0, u32 b1, float dxa, float sxa, float dxb,
                                         float sxb) const {
        int c0[4], c1[4];
        mma_s8_16816(c0, a[0], a[1], b0);
        mma_s8_16816(c1, a[2], a[3], b1);
        acc[0] = fmaf(dg * dxa, (float)(sg0 * c0[0] + sg1 * c1[0]), acc[0]);
        acc[1] = fmaf(dg * dxb, (float)(sg0 * c0[1] + sg1 * c1[1]), acc[1]);
        acc[2] = fmaf(dg8 * dxa, (float)(sg80 * c0[2] + sg81 * c1[2]), acc[2]);
        acc[3] = fmaf(dg8 * dxb, (float)(sg80 * c0[3] + sg81 * c1[3]), acc[3]);
    }
};

// Repacked Q6_K (a stage: a super-block's 8 units' 16 low-nibble bytes, 8 x
// 8 bytes of high bit pairs, 16 int8 scales, 208 bytes from the row's three
// fields; its f16 d elsewhere in the row, copied as the 4-byte word holding
// it). A unit's
// halves (values 0-15 and 16-31) have their own scales, so each is one
// k = 16 product: a0 / a1 hold half 0's values 4t..4t+3 of rows g / g + 8,
// a2 / a3 half 1's. Values q - 32 (q < 64): (q + 96) ^ 128 bytewise.
// w . x = d dx (sc_0 s_0 + sc_1 s_1), the integer part exact.
template <>
struct Mq<T_Q6_KR> : MqRuns<208> {
    static constexpr bool EXTRA = true;
    // A stage's chunks 0-7 (low nibbles), 8-11 (high bit pairs), 12 (scales)
    // from the three fields of its run of four super-blocks.
    static constexpr int FIELDS = 3;
    static __host__ __device__ constexpr int FCH(int f) { return f == 0 ? 8 : f == 1 ? 4 : 1; }
    static __device__ __forceinline__ u64 field_run(int f, int run) {
        return (u64)(run >> 2) * Q6KR_RUN + (run & 3) * (f == 0 ? 128 : f == 1 ? 64 : 16);
    }
    static __device__ __forceinline__ u32 field_off(int f, int runs) { return f == 0 ? 0 : f == 1 ? 512 : 768; }
    // The 4-byte word holding super-block `run`'s d, and the d from it.
    static __device__ __forceinline__ const u8* dword(const u8* row, int run, int runs) {
        return (const u8*)((u64)q6kr_dp(row, run, runs) & ~(u64)3);
    }
    static __device__ __forceinline__ u32 extra(u32 word, const u8* row, int run, int runs) {
        return word >> (16 * (((u64)q6kr_dp(row, run, runs) >> 1) & 1));
    }
    struct Stage {
        float dg, dg8;
        // eg / eg8: the rows' d bits (`extra`).
        __device__ __forceinline__ Stage(const u8* sg, const u8* sg8, u32 eg, u32 eg8) {
            dg = h2f((u16)eg);
            dg8 = h2f((u16)eg8);
        }
    };
    static __device__ __forceinline__ u32 q6(u32 lo, u32 hi) { return ((lo | (hi << 4)) + 0x60606060u) ^ 0x80808080u; }
    struct Unit : MqHalves {
        __device__ __forceinline__ Unit(const Stage& st, const u8* sg, const u8* sg8, int j, int t) {
            u32 lg = *(const u32*)(sg + 16 * j + 4 * t), lg8 = *(const u32*)(sg8 + 16 * j + 4 * t);
            uint2 hg = *(const uint2*)(sg + 128 + 8 * j), hg8 = *(const uint2*)(sg8 + 128 + 8 * j);
            a[0] = q6(lg & 0x0f0f0f0fu, (hg.x >> (2 * t)) & 0x03030303u);
            a[1] = q6(lg8 & 0x0f0f0f0fu, (hg8.x >> (2 * t)) & 0x03030303u);
            a[2] = q6((lg >> 4) & 0x0f0f0f0fu, (hg.y >> (2 * t)) & 0x03030303u);
            a[3] = q6((lg8 >> 4) & 0x0f0f0f0fu, (hg8.y >> (2 * t)) & 0x03030303u);
            sg0 = (int)(i8)sg[192 + 2 * j];
            sg1 = (int)(i8)sg[193 + 2 * j];
            sg80 = (int)(i8)sg8[192 + 2 * j];
            sg81 = (int)(i8)sg8[193 + 2 * j];
            dg = st.dg;
            dg8 = st.dg8;
        }
    };
};

// Repacked Q3_K (super-blocks of 112 bytes: the 16-byte header, then 8
// units' 2-bit word pairs, then their high-bit words). As Q6_K, a unit's
// halves have their own scales, so each is one k = 16 product; a0 / a1 are
// half 0's dp4a word t (values 4t..4t+3) of rows g / g + 8, a2 / a3 half 1's
// (word 4 + t); values q - 4 as signed bytes.
// w . x = d dx ((sc_0 - 32) s_0 + (sc_1 - 32) s_1), the integer part exact.
template <>
struct Mq<T_Q3_KR> : MqRuns<112> {
    using Stage = Mq<T_Q4_KR>::Stage;
    static __device__ __forceinline__ u32 q3(const u8* sg, int j, int k) {
        uint2 w = *(const uint2*)(sg + 16 + 8 * j);
        return q3kr_sword(w.x, w.y, *(const u32*)(sg + 80 + 4 * j), k);
    }
    struct Unit : MqHalves {
        __device__ __forceinline__ Unit(const Stage& st, const u8* sg, const u8* sg8, int j, int t) {
            a[0] = q3(sg, j, t);
            a[1] = q3(sg8, j, t);
            a[2] = q3(sg, j, 4 + t);
            a[3] = q3(sg8, j, 4 + t);
            q3kr_scales(st.hg, j, sg0, sg1);
            q3kr_scales(st.hg8, j, sg80, sg81);
            sg0 -= 32;
            sg1 -= 32;
            sg80 -= 32;
            sg81 -= 32;
            dg = h2f((u16)(st.hg.w & 0xffff));
            dg8 = h2f((u16)(st.hg8.w & 0xffff));
        }
    };
};

// Repacked Q2_K (runs of 4 super-blocks, 336 bytes: the 32 units' 8-byte
// words of 2-bit values, their 64 scale bytes, the 4 f16 d / dmin pairs). A
// stage is a super-block: its units' words (64 bytes) and scale bytes (16)
// from two places in the run, its d / dmin pair as the row's word (EXTRA).
// A half's scale is at most 15 and a value 3, so (sc & 15) q fits a byte:
// w . x = d dx s_d - dmin dx s_m, s_d one k = 32 product of the scaled
// values and s_m one of the halves' minimums (sc >> 4 in each byte) with the
// same x, both exact.
template <>
struct Mq<T_Q2_KR> : MqRuns<80> {
    static constexpr bool EXTRA = true;
    // Chunks 0-3: the words; 4: the scale bytes.
    static constexpr int FIELDS = 2;
    static __host__ __device__ constexpr int FCH(int f) { return f ? 1 : 4; }
    static __device__ __forceinline__ u64 field_run(int f, int run) {
        return (u64)(run >> 2) * 336 + (run & 3) * (f ? 16 : 64);
    }
    static __device__ __forceinline__ u32 field_off(int f, int runs) { return f ? 256 : 0; }
    static __device__ __forceinline__ const u8* dword(const u8* row, int run, int runs) {
        return row + (u64)(run >> 2) * 336 + 320 + 4 * (run & 3);
    }
    static __device__ __forceinline__ u32 extra(u32 word, const u8* row, int run, int runs) { return word; }
    struct Stage {
        u32 eg, eg8;
        __device__ __forceinline__ Stage(const u8* sg, const u8* sg8, u32 eg, u32 eg8) : eg(eg), eg8(eg8) {}
    };
    struct Unit {
        u32 a[4], m[4];
        float dg, dg8, mg, mg8;
        __device__ __forceinline__ Unit(const Stage& st, const u8* sg, const u8* sg8, int j, int t) {
            uint2 w = *(const uint2*)(sg + 8 * j), w8 = *(const uint2*)(sg8 + 8 * j);
            u32 s0 = sg[64 + 2 * j], s1 = sg[65 + 2 * j], s80 = sg8[64 + 2 * j], s81 = sg8[65 + 2 * j];
            a[0] = q3kr_word(w.x, w.y, 0u, t) * (s0 & 15);
            a[1] = q3kr_word(w8.x, w8.y, 0u, t) * (s80 & 15);
            a[2] = q3kr_word(w.x, w.y, 0u, 4 + t) * (s1 & 15);
            a[3] = q3kr_word(w8.x, w8.y, 0u, 4 + t) * (s81 & 15);
            m[0] = (s0 >> 4) * 0x01010101u;
            m[1] = (s80 >> 4) * 0x01010101u;
            m[2] = (s1 >> 4) * 0x01010101u;
            m[3] = (s81 >> 4) * 0x01010101u;
            dg = h2f((u16)(st.eg & 0xffff));
            dg8 = h2f((u16)(st.eg8 & 0xffff));
            mg = h2f((u16)(st.eg >> 16));
            mg8 = h2f((u16)(st.eg8 >> 16));
        }
        __device__ __forceinline__ void tile(float (&acc)[4], u32 b0, u32 b1, float dxa, float sxa, float dxb,
                                             float sxb) const {
            int c[4], cm[4];
            mma_s8_16832(c, a, b0, b1, MMQ_BIAS);
            mma_s8_16832(cm, m, b0, b1, MMQ_BIAS);
            acc[0] = fmaf(dg * dxa, mmq_sum(c[0]), fmaf(-mg * dxa, mmq_sum(cm[0]), acc[0]));
            acc[1] = fmaf(dg * dxb, mmq_sum(c[1]), fmaf(-mg * dxb, mmq_sum(cm[1]), acc[1]));
            acc[2] = fmaf(dg8 * dxa, mmq_sum(c[2]), fmaf(-mg8 * dxa, mmq_sum(cm[2]), acc[2]));
            acc[3] = fmaf(dg8 * dxb, mmq_sum(c[3]), fmaf(-mg8 * dxb, mmq_sum(cm[3]), acc[3]));
        }
    };
};

// A stage row's first chunk from field f (Mq<T>::FCH), and a thread's
// weight copies a stage for fields 0 .. f - 1 (the block's MMQ_THREADS
// threads taking MMQ_ROWS rows' chunks of each field).
template <class M>
__host__ __device__ constexpr int mq_chunk0(int f) {
    int s = 0;
    for (int i = 0; i < f; i++) s += M::FCH(i);
    return s;
}
template <class M>
__host__ __device__ constexpr int mq_copies(int f) {
    int s = 0;
    for (int i = 0; i < f; i++) s += (MMQ_ROWS * M::FCH(i) + MMQ_THREADS - 1) / MMQ_THREADS;
    return s;
}
// fn(Field<f>{}) for each field f of M, f known at compile time.
template <int F>
struct Field {
    static constexpr int f = F;
};
template <class M, class Fn>
__device__ __forceinline__ void mq_fields(Fn&& fn) {
    static_assert(M::FIELDS <= 3, "fields");
    fn(Field<0>{});
    if constexpr (M::FIELDS > 1) fn(Field<1>{});
    if constexpr (M::FIELDS > 2) fn(Field<2>{});
}

// A stage: the block's rows' run bytes, the tokens' x and scales / sums,
// then a word a row (Mq<T>::EXTRA).
template <int T, int NT>
__host__ __device__ constexpr int mmq_stage_bytes() {
    return MMQ_ROWS * Mq<T>::RB + NT * (MMQ_XS + MMQ_DS) + 4 * MMQ_ROWS;
}

template <int T, int NT>
__host__ __device__ constexpr int mmq_stages() {
    return MMQ_STAGES * mmq_stage_bytes<T, NT>() <= MMQ_SMEM_PAIR ? MMQ_STAGES : 2;
}

// y[t][r] = W[r] . x[t] + bias[r] (splits == 1), else this split's sums into
// part[(split * n + t) * rows + r] for mmq_reduce.
template <int T, int NT>
__device__ __forceinline__ void mmq_impl(const u8* __restrict__ W, u64 row_bytes, int rows, int cols,
                                         const i8* __restrict__ xq, const float* __restrict__ xd,
                                         const float* __restrict__ xs, int n, float* __restrict__ y,
                                         int ystride, const float* __restrict__ bias, float* __restrict__ part) {
    extern __shared__ __align__(16) u8 mmq_smem[];
    using M = Mq<T>;
    constexpr int RB = M::RB, S = mmq_stages<T, NT>(), TILES = NT / 8;
    constexpr int WB = MMQ_ROWS * RB, XB = NT * MMQ_XS, DB = NT * MMQ_DS, SB = mmq_stage_bytes<T, NT>();
    int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
    int rb0 = blockIdx.x * MMQ_ROWS;
    int units = cols >> 5, runs = units >> 3;
    int splits = gridDim.y, sp = blockIdx.y;
    // This split's runs, as evenly as they go.
    int rs = (int)((long long)runs * sp / splits), nr = (int)((long long)runs * (sp + 1) / splits) - rs;
    int t0 = blockIdx.z * NT;
    auto row_ptr = [&](int r) { return W + (u64)min(r, rows - 1) * row_bytes; };
    // Stage copies. Each thread's sources are fixed but for the run, so
    // their offsets are taken once here (the per-copy address arithmetic
    // was half of the 8-token kernels' instructions). Weights, field by
    // field (so a copy's stride over runs is the field's, known at compile
    // time): the block's rows' chunks of field f in order, copy tid + NTH j
    // of it (so a warp's copies are contiguous runs of rows). Rows past the
    // end copy the last row (never written).
    constexpr int NTH = MMQ_THREADS;
    static_assert(16 * mq_chunk0<M>(M::FIELDS) == RB, "the fields make up the stage row");
    const u8* wb = W + (u64)rb0 * row_bytes;
    u32 woff[mq_copies<M>(M::FIELDS)];
    mq_fields<M>([&](auto fld) {
        constexpr int f = decltype(fld)::f, fc = M::FCH(f), j0 = mq_copies<M>(f);
#pragma unroll
        for (int j = 0; j < mq_copies<M>(f + 1) - j0; j++) {
            int c = min(tid + NTH * j, MMQ_ROWS * fc - 1), row = c / fc;
            woff[j0 + j] = (u32)(row_ptr(rb0 + row) - wb) + M::field_off(f, runs) + 16 * (c % fc);
        }
    });
    // x: 16 threads a token, chunk tid % 16 of tokens tid / 16 + 8 m; scales
    // and sums: 4 threads a token (two 16-byte chunks of each).
    constexpr int XM = NT * 16 / NTH, DM = (NT * 4 + NTH - 1) / NTH;
    static_assert(NT * 16 % NTH == 0, "whole passes of tokens");
    const i8* xsrc = xq + (u64)(t0 + tid / 16) * cols + 16 * (tid % 16);
    auto copy_w = [&](int i) {
        u8* st = mmq_smem + (i % S) * SB;
        u32 sw = smem_u32(st);
        mq_fields<M>([&](auto fld) {
            constexpr int f = decltype(fld)::f, fc = M::FCH(f), j0 = mq_copies<M>(f);
            const u8* fb = wb + M::field_run(f, rs + i);
#pragma unroll
            for (int j = 0; j < mq_copies<M>(f + 1) - j0; j++) {
                int c = tid + NTH * j;
                // Chunk c % fc of field f is the stage row's chunk
                // FCH(0) + .. + FCH(f - 1) + c % fc; one field: chunk c
                // (the same number, without a division by 9 for 144-byte
                // runs: 59,533 SASS lines against 60,829 for the mmq
                // kernels).
                int dst = M::FIELDS == 1 ? 16 * c : RB * (c / fc) + 16 * (mq_chunk0<M>(f) + c % fc);
                if (NTH * (j + 1) <= MMQ_ROWS * fc || c < MMQ_ROWS * fc) cp_async16(sw + dst, fb + woff[j0 + j]);
            }
        });
        if constexpr (M::EXTRA) {
            for (int row = tid; row < MMQ_ROWS; row += NTH)
                cp_async4(smem_u32(st + WB + XB + DB + 4 * row), M::dword(row_ptr(rb0 + row), rs + i, runs));
        }
    };
    // Tokens past the last are zeros.
    auto copy_x = [&](int i) {
        u8* st = mmq_smem + (i % S) * SB + WB;
        int c0 = (rs + i) * 256;
#pragma unroll
        for (int m = 0; m < XM; m++) {
            int tok = tid / 16 + 8 * m;
            bool in = t0 + tok < n;
            const i8* src = in ? xsrc + (u64)m * 8 * cols + c0 : xq;
            cp_async16_z(smem_u32(st + tok * MMQ_XS + 16 * (tid % 16)), src, in ? 16 : 0);
        }
#pragma unroll
        for (int m = 0; m < DM; m++) {
            int c = tid + NTH * m, tok = c >> 2, k = c & 3;
            if (c >= NT * 4) break;
            bool in = t0 + tok < n;
            const float* src = (k < 2 ? xd : xs) + (in ? (u64)(t0 + tok) * units + (rs + i) * 8 + 4 * (k & 1) : 0);
            cp_async16_z(smem_u32(st + XB + tok * MMQ_DS + 16 * k), src, in ? 16 : 0);
        }
    };
    // The first stages' weights before the wait for x (they overlap the
    // kernel before), then their x, a group a stage.
    for (int i = 0; i < S - 1 && i < nr; i++) copy_w(i);
    PDL_ENTRY();
    for (int i = 0; i < S - 1; i++) {
        if (i < nr) copy_x(i);
        cp_async_commit();
    }
    float acc[TILES][4];
#pragma unroll
    for (int k = 0; k < TILES; k++)
#pragma unroll
        for (int i = 0; i < 4; i++) acc[k][i] = 0.0f;
    int rg = rb0 + warp * 16 + g;
    for (int i = 0; i < nr; i++) {
        cp_async_wait<S - 2>();
        __syncthreads();  // stage i landed for every thread; stage i - 1 is read by none
        if (i + S - 1 < nr) {
            copy_w(i + S - 1);
            copy_x(i + S - 1);
        }
        cp_async_commit();
        const u8* st = mmq_smem + (i % S) * SB;
        const u8* sg = st + (warp * 16 + g) * RB;
        const u8* sg8 = sg + 8 * RB;
        const u8* sx = st + WB;
        const float* sd = (const float*)(st + WB + XB);
        u32 eg = 0, eg8 = 0;
        if constexpr (M::EXTRA) {
            const u32* ex = (const u32*)(st + WB + XB + DB) + warp * 16 + g;
            eg = M::extra(ex[0], row_ptr(rg), rs + i, runs);
            eg8 = M::extra(ex[8], row_ptr(rg + 8), rs + i, runs);
        }
        typename M::Stage stg(sg, sg8, eg, eg8);
#pragma unroll
        for (int j = 0; j < 8; j++) {
            typename M::Unit un(stg, sg, sg8, j, t);
#pragma unroll
            for (int k = 0; k < TILES; k++) {
                const u8* xp = sx + (8 * k + g) * MMQ_XS + 32 * j + 4 * t;
                // Tokens 8k + 2t and 8k + 2t + 1: their scale and sum of unit j.
                const float* da = sd + (8 * k + 2 * t) * (MMQ_DS / 4);
                const float* db = da + MMQ_DS / 4;
                un.tile(acc[k], *(const u32*)xp, *(const u32*)(xp + 16), da[j], da[8 + j], db[j], db[8 + j]);
            }
        }
    }
    cp_async_wait<0>();
    int r0 = rb0 + warp * 16;
#pragma unroll
    for (int k = 0; k < TILES; k++) {
#pragma unroll
        for (int i = 0; i < 4; i++) {
            int r = r0 + g + 8 * (i >> 1), tok = t0 + 8 * k + 2 * t + (i & 1);
            if (r >= rows || tok >= n) continue;
            if (splits == 1)
                y[(u64)tok * ystride + r] = acc[k][i] + (bias ? bias[r] : 0.0f);
            else
                part[((u64)sp * n + tok) * rows + r] = acc[k][i];
        }
    }
}

#define MMQ(TNAME, T, NT)                                                                               \
    extern "C" __global__ void __launch_bounds__(MMQ_THREADS)                                       \
        mmq_##TNAME##_##NT(const u8* W, u64 row_bytes, int rows, int cols, const i8* xq, const float* xd, \
                           const float* xs, int n, float* y, int ystride, const float* bias, float* part) { \
        mmq_impl<T, NT>(W, row_bytes, rows, cols, xq, xd, xs, n, y, ystride, bias, part);               \
    }
MMQ(q4_0r, T_Q4_0R, 8)
MMQ(q4_0r, T_Q4_0R, 16)
MMQ(q4_0r, T_Q4_0R, 32)
MMQ(q4_0r, T_Q4_0R, 64)
MMQ(q8_0r, T_Q8_0R, 8)
MMQ(q8_0r, T_Q8_0R, 16)
MMQ(q8_0r, T_Q8_0R, 32)
MMQ(q8_0r, T_Q8_0R, 64)
MMQ(q4_kr, T_Q4_KR, 8)
MMQ(q4_kr, T_Q4_KR, 16)
MMQ(q4_kr, T_Q4_KR, 32)
MMQ(q4_kr, T_Q4_KR, 64)
MMQ(q5_kr, T_Q5_KR, 8)
MMQ(q5_kr, T_Q5_KR, 16)
MMQ(q5_kr, T_Q5_KR, 32)
MMQ(q5_kr, T_Q5_KR, 64)
MMQ(q3_kr, T_Q3_KR, 8)
MMQ(q3_kr, T_Q3_KR, 16)
MMQ(q3_kr, T_Q3_KR, 32)
MMQ(q3_kr, T_Q3_KR, 64)
MMQ(q2_kr, T_Q2_KR, 8)
MMQ(q2_kr, T_Q2_KR, 16)
MMQ(q2_kr, T_Q2_KR, 32)
MMQ(q2_kr, T_Q2_KR, 64)
MMQ(q6_kr, T_Q6_KR, 8)
MMQ(q6_kr, T_Q6_KR, 16)
MMQ(q6_kr, T_Q6_KR, 32)
MMQ(q6_kr, T_Q6_KR, 64)

// y[t][r] = the splits' sums of mmq_* added in split order, + bias[r].
extern "C" __global__ void mmq_reduce(const float* part, int splits, int n, int rows, float* y, int ystride,
                                      const float* bias) {
    PDL_ENTRY();
    u64 total = (u64)n * rows;
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (u64)gridDim.x * blockDim.x) {
        int tok = (int)(i / rows), r = (int)(i % rows);
        float v = part[i];
        for (int s = 1; s < splits; s++) v = __fadd_rn(v, part[(u64)s * total + i]);
        y[(u64)tok * ystride + r] = v + (bias ? bias[r] : 0.0f);
    }
}
