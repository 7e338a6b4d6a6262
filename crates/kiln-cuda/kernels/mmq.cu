// Quantized weights times a batch of tokens on the tensor cores (MMQ), for
// steps of 16-64 tokens (batched decode, short prefill chunks). The weights
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
// A block: MMQ_WARPS warps of 16 rows each, NT tokens (16, 32 or 64: the
// step's count rounded up; the grid's third dimension covers more). Each
// run of 8 units (256 columns) is a stage: the block's rows' bytes of the
// run as stored, the tokens' 8-bit x of those columns and their scales and
// sums, copied into shared memory with cp.async, MMQ_STAGES - 1 runs ahead
// of the one being multiplied. grid: (ceil(rows / (16 * MMQ_WARPS)), splits,
// ceil(n / NT)); dynamic shared memory MMQ_STAGES x mmq_stage_bytes (src/mmq.rs
// computes the same). Repacked layouts only
// (whole runs a row: cols % 256 == 0).
#define MMQ_WARPS 4
#define MMQ_ROWS (16 * MMQ_WARPS)
#define MMQ_STAGES 3
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

// Per type: a run's bytes a row (as stored), unit j's A fragment for the
// lane's rows g and g + 8 and their f16 scales (from the run in shared
// memory), and a unit's contribution added to acc from its integer sum s.
template <int T>
struct Mq;

// Repacked Q4_0 (runs of 8 units: 8 x 16 quant bytes, then 8 f16 scales).
// Byte i of a unit holds value i (low nibble) and i + 16 (high), so the
// lane's word 4t..4t+3 gives both a0 (low) and a2 (high). The nibbles go
// in unsigned, and the 8 comes off through the token's sum sx:
// w . x = d * dx * (s - 8 Σq).
template <>
struct Mq<T_Q4_0R> {
    static constexpr int RB = 144;
    static __device__ __forceinline__ void frag(const u8* sg, const u8* sg8, int j, int t, u32 (&a)[4], float& dg,
                                                float& dg8) {
        u32 w0 = *(const u32*)(sg + 16 * j + 4 * t), w1 = *(const u32*)(sg8 + 16 * j + 4 * t);
        a[0] = w0 & 0x0f0f0f0fu;
        a[1] = w1 & 0x0f0f0f0fu;
        a[2] = (w0 >> 4) & 0x0f0f0f0fu;
        a[3] = (w1 >> 4) & 0x0f0f0f0fu;
        dg = h2f(*(const u16*)(sg + 128 + 2 * j));
        dg8 = h2f(*(const u16*)(sg8 + 128 + 2 * j));
    }
    static __device__ __forceinline__ float add(float acc, float d, float s, float dx, float sx) {
        return fmaf(d, fmaf(dx, s, -8.0f * sx), acc);
    }
};

// Repacked Q8_0 (runs of 8 units: 8 x 32 quant bytes, then 8 f16 scales):
// the fragment words are the unit's bytes as stored.
template <>
struct Mq<T_Q8_0R> {
    static constexpr int RB = 272;
    static __device__ __forceinline__ void frag(const u8* sg, const u8* sg8, int j, int t, u32 (&a)[4], float& dg,
                                                float& dg8) {
        a[0] = *(const u32*)(sg + 32 * j + 4 * t);
        a[1] = *(const u32*)(sg8 + 32 * j + 4 * t);
        a[2] = *(const u32*)(sg + 32 * j + 16 + 4 * t);
        a[3] = *(const u32*)(sg8 + 32 * j + 16 + 4 * t);
        dg = h2f(*(const u16*)(sg + 256 + 2 * j));
        dg8 = h2f(*(const u16*)(sg8 + 256 + 2 * j));
    }
    static __device__ __forceinline__ float add(float acc, float d, float s, float dx, float sx) {
        return fmaf(d * dx, s, acc);
    }
};

template <int T, int NT>
__host__ __device__ constexpr int mmq_stage_bytes() {
    return MMQ_ROWS * Mq<T>::RB + NT * (MMQ_XS + MMQ_DS);
}

// y[t][r] = W[r] . x[t] + bias[r] (splits == 1), else this split's sums into
// part[(split * n + t) * rows + r] for mmq_reduce.
template <int T, int NT>
__device__ __forceinline__ void mmq_impl(const u8* __restrict__ W, u64 row_bytes, int rows, int cols,
                                         const i8* __restrict__ xq, const float* __restrict__ xd,
                                         const float* __restrict__ xs, int n, float* __restrict__ y,
                                         int ystride, const float* __restrict__ bias, float* __restrict__ part) {
    extern __shared__ __align__(16) u8 mmq_smem[];
    constexpr int RB = Mq<T>::RB, S = MMQ_STAGES, TILES = NT / 8;
    constexpr int WB = MMQ_ROWS * RB, XB = NT * MMQ_XS, SB = mmq_stage_bytes<T, NT>();
    int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
    int rb0 = blockIdx.x * MMQ_ROWS;
    int units = cols >> 5, runs = units >> 3;
    int splits = gridDim.y, sp = blockIdx.y;
    // This split's runs, as evenly as they go.
    int rs = (int)((long long)runs * sp / splits), nr = (int)((long long)runs * (sp + 1) / splits) - rs;
    int t0 = blockIdx.z * NT;
    // Stage copies. Rows past the end copy the last row (never written).
    auto copy_w = [&](int i) {
        u8* st = mmq_smem + (i % S) * SB;
        const u8* src = W + (u64)(rs + i) * RB;
        for (int c = tid; c < MMQ_ROWS * (RB / 16); c += 32 * MMQ_WARPS) {
            int row = c / (RB / 16), k = c % (RB / 16);
            cp_async16(smem_u32(st + row * RB + 16 * k), src + (u64)min(rb0 + row, rows - 1) * row_bytes + 16 * k);
        }
    };
    // Tokens past the last are zeros.
    auto copy_x = [&](int i) {
        u8* st = mmq_smem + (i % S) * SB + WB;
        int c0 = (rs + i) * 256;
        for (int c = tid; c < NT * 16; c += 32 * MMQ_WARPS) {
            int tok = c >> 4, k = c & 15;
            bool in = t0 + tok < n;
            const i8* src = in ? xq + (u64)(t0 + tok) * cols + c0 + 16 * k : xq;
            cp_async16_z(smem_u32(st + tok * MMQ_XS + 16 * k), src, in ? 16 : 0);
        }
        for (int c = tid; c < NT * 4; c += 32 * MMQ_WARPS) {
            int tok = c >> 2, k = c & 3;
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
    for (int j = 0; j < TILES; j++)
#pragma unroll
        for (int i = 0; i < 4; i++) acc[j][i] = 0.0f;
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
        const u8* sx = st + WB;
        const float* sd = (const float*)(st + WB + XB);
#pragma unroll
        for (int j = 0; j < 8; j++) {
            u32 a[4];
            float dg, dg8;
            Mq<T>::frag(sg, sg + 8 * RB, j, t, a, dg, dg8);
#pragma unroll
            for (int k = 0; k < TILES; k++) {
                const u8* xp = sx + (8 * k + g) * MMQ_XS + 32 * j + 4 * t;
                int c[4];
                mma_s8_16832(c, a, *(const u32*)xp, *(const u32*)(xp + 16), MMQ_BIAS);
                // Tokens 8k + 2t and 8k + 2t + 1: their scale and sum of unit j.
                const float* da = sd + (8 * k + 2 * t) * (MMQ_DS / 4);
                const float* db = da + MMQ_DS / 4;
                float dxa = da[j], sxa = da[8 + j], dxb = db[j], sxb = db[8 + j];
                acc[k][0] = Mq<T>::add(acc[k][0], dg, mmq_sum(c[0]), dxa, sxa);
                acc[k][1] = Mq<T>::add(acc[k][1], dg, mmq_sum(c[1]), dxb, sxb);
                acc[k][2] = Mq<T>::add(acc[k][2], dg8, mmq_sum(c[2]), dxa, sxa);
                acc[k][3] = Mq<T>::add(acc[k][3], dg8, mmq_sum(c[3]), dxb, sxb);
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
    extern "C" __global__ void __launch_bounds__(32 * MMQ_WARPS)                                       \
        mmq_##TNAME##_##NT(const u8* W, u64 row_bytes, int rows, int cols, const i8* xq, const float* xd, \
                           const float* xs, int n, float* y, int ystride, const float* bias, float* part) { \
        mmq_impl<T, NT>(W, row_bytes, rows, cols, xq, xd, xs, n, y, ystride, bias, part);               \
    }
MMQ(q4_0r, T_Q4_0R, 16)
MMQ(q4_0r, T_Q4_0R, 32)
MMQ(q4_0r, T_Q4_0R, 64)
MMQ(q8_0r, T_Q8_0R, 16)
MMQ(q8_0r, T_Q8_0R, 32)
MMQ(q8_0r, T_Q8_0R, 64)

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
