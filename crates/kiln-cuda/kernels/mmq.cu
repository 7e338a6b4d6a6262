// Quantized weights times a batch of tokens on the tensor cores (MMQ), for
// steps of gemm_min..=MMQ_MAX_TOKENS tokens (batched decode). The weights
// are read once per 64 tokens; the dequantize-then-cuBLAS path they replace
// wrote every matrix out as f16 and read it back each step (8B Q4_0 at 32
// sequences: 0.92x llama.cpp). The activations are the GEMVs' 8-bit blocks
// (quantize_q8: xq, xd, xs). A unit's integer dot products come from
// `mma.sync.m16n8k32` (s8 x s8 -> s32): the same integers the GEMVs' dp4a
// sums give, turned into the unit's float value by the GEMVs' own formula
// (q4_0_sum; Q8_0: d * dx * s, rounded as rdot does). Per (row, token) the
// units of a split are added in increasing order and mmq_reduce adds the
// splits in order; the split count depends on the matrix only, so a token's
// result does not depend on how many tokens share the step.
//
// A warp computes 16 rows x up to 64 tokens (8 tiles of 8 tokens); a block
// is MMQ_WARPS warps on consecutive row tiles walking the same units, so
// they read each token's x once through L1. grid: (ceil(rows / (16 *
// MMQ_WARPS)), splits, ceil(n / 64)). Repacked layouts only (whole runs of
// 8 units a row: cols % 256 == 0).
#define MMQ_WARPS 4
#define MMQ_TILES 8
// Units a warp has in flight: the next group's weights load while this
// group's products run.
#define MMQ_UNROLL 4

// d = A B (16 x 32 s8 row-major, 32 x 8 s8 column-major), s32. Fragments
// (lane = 4 g + t): a0 = A[g][4t..4t+3], a1 = A[g + 8][4t..], a2 =
// A[g][16 + 4t..], a3 = A[g + 8][16 + 4t..]; b0 = B[4t..4t+3][g], b1 =
// B[16 + 4t..][g]; d0 = D[g][2t], d1 = D[g][2t + 1], d2 = D[g + 8][2t], d3 =
// D[g + 8][2t + 1].
__device__ __forceinline__ void mma_s8_16832(int (&d)[4], const u32 (&a)[4], u32 b0, u32 b1) {
    asm("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%10,%10,%10,%10};"
        : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1), "r"(0));
}

// Per type: the words a lane loads for one unit of its rows g and g + 8
// (MW of them, and the two rows' f16 scales), the A fragment made from
// them, and a unit's float value from its integer sum s.
template <int T>
struct Mq;

// Repacked Q4_0: byte i of a unit holds value i (low nibble) and i + 16
// (high), so one word of the lane's bytes 4t..4t+3 gives both a0 (low) and
// a2 (high). The nibbles go in unsigned; q4_0_sum takes the 8 off through sx.
template <>
struct Mq<T_Q4_0R> {
    static constexpr int MW = 2;
    static __device__ __forceinline__ void load(const u8* rg, const u8* rg8, int u, int t, u32* w, u16* d) {
        w[0] = __ldg((const u32*)(r8_q<16>(rg, u) + 4 * t));
        w[1] = __ldg((const u32*)(r8_q<16>(rg8, u) + 4 * t));
        d[0] = __ldg((const unsigned short*)r8_dp<16>(rg, u));
        d[1] = __ldg((const unsigned short*)r8_dp<16>(rg8, u));
    }
    static __device__ __forceinline__ void frag(const u32* w, u32 (&a)[4]) {
        a[0] = w[0] & 0x0f0f0f0fu;
        a[1] = w[1] & 0x0f0f0f0fu;
        a[2] = (w[0] >> 4) & 0x0f0f0f0fu;
        a[3] = (w[1] >> 4) & 0x0f0f0f0fu;
    }
    static __device__ __forceinline__ float val(float d, int s, float dx, float sx) { return q4_0_sum(d, s, dx, sx); }
};

// Repacked Q8_0: the fragment words are the unit's bytes as stored.
template <>
struct Mq<T_Q8_0R> {
    static constexpr int MW = 4;
    static __device__ __forceinline__ void load(const u8* rg, const u8* rg8, int u, int t, u32* w, u16* d) {
        const u8* pg = r8_q<32>(rg, u) + 4 * t;
        const u8* pg8 = r8_q<32>(rg8, u) + 4 * t;
        w[0] = __ldg((const u32*)pg);
        w[1] = __ldg((const u32*)pg8);
        w[2] = __ldg((const u32*)(pg + 16));
        w[3] = __ldg((const u32*)(pg8 + 16));
        d[0] = __ldg((const unsigned short*)r8_dp<32>(rg, u));
        d[1] = __ldg((const unsigned short*)r8_dp<32>(rg8, u));
    }
    static __device__ __forceinline__ void frag(const u32* w, u32 (&a)[4]) {
        a[0] = w[0];
        a[1] = w[1];
        a[2] = w[2];
        a[3] = w[3];
    }
    static __device__ __forceinline__ float val(float d, int s, float dx, float sx) {
        return __fmul_rn(__fmul_rn(d, dx), (float)s);
    }
};

// The block's x for one group of MMQ_UNROLL units: each token's 8-bit
// values (a row of MMQ_XS bytes: 16 padding, so that the eight tokens of a
// fragment load fall in distinct banks) and its scales and sums.
#define MMQ_TOK (8 * MMQ_TILES)
#define MMQ_XS (32 * MMQ_UNROLL + 16)
// 16-byte pieces of x and scale pairs a thread stages per group.
#define MMQ_XP (MMQ_TOK * MMQ_UNROLL * 2 / (32 * MMQ_WARPS))
#define MMQ_DP (MMQ_TOK * MMQ_UNROLL / (32 * MMQ_WARPS))

// y[t][r] = W[r] . x[t] + bias[r] (splits == 1), else this split's sums into
// part[(split * n + t) * rows + r] for mmq_reduce.
template <int T>
__device__ __forceinline__ void mmq_impl(const u8* __restrict__ W, u64 row_bytes, int rows, int cols,
                                         const i8* __restrict__ xq, const float* __restrict__ xd,
                                         const float* __restrict__ xs, int n, float* __restrict__ y,
                                         int ystride, const float* __restrict__ bias, float* __restrict__ part) {
    constexpr int MW = Mq<T>::MW, U = MMQ_UNROLL;
    __shared__ __align__(16) u8 sq[MMQ_TOK * MMQ_XS];
    __shared__ float sd[U][MMQ_TOK], ss[U][MMQ_TOK];
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    int r0 = (blockIdx.x * MMQ_WARPS + warp) * 16;
    int units = cols >> 5, runs = units >> 3;
    int splits = gridDim.y, s = blockIdx.y;
    // This split's units: whole runs, as evenly as they go.
    int ub = (int)((long long)runs * s / splits) * 8, ue = (int)((long long)runs * (s + 1) / splits) * 8;
    int t0 = blockIdx.z * MMQ_TOK;
    int ntiles = min(MMQ_TILES, (n - t0 + 7) >> 3);
    // Rows past the end read the last row and are never written.
    const u8* rg = W + (u64)min(r0 + g, rows - 1) * row_bytes;
    const u8* rg8 = W + (u64)min(r0 + g + 8, rows - 1) * row_bytes;
    u32 w[U][MW];
    u16 d[U][2];
#pragma unroll
    for (int k = 0; k < U; k++) Mq<T>::load(rg, rg8, ub + k, t, w[k], d[k]);
    // x of the group at unit u0 into registers (zeros past the last token).
    uint4 xr[MMQ_XP];
    float dr[MMQ_DP], sr[MMQ_DP];
    auto load_x = [&](int u0) {
#pragma unroll
        for (int m = 0; m < MMQ_XP; m++) {
            int i = threadIdx.x + m * 32 * MMQ_WARPS, tok = i / (2 * U), k = (i >> 1) % U;
            xr[m] = t0 + tok < n ? __ldg((const uint4*)(xq + (u64)(t0 + tok) * cols + 32 * (u0 + k)) + (i & 1))
                                 : make_uint4(0, 0, 0, 0);
        }
#pragma unroll
        for (int m = 0; m < MMQ_DP; m++) {
            int i = threadIdx.x + m * 32 * MMQ_WARPS, tok = i / U, k = i % U;
            bool in = t0 + tok < n;
            dr[m] = in ? __ldg(xd + (u64)(t0 + tok) * units + u0 + k) : 0.0f;
            sr[m] = in ? __ldg(xs + (u64)(t0 + tok) * units + u0 + k) : 0.0f;
        }
    };
    auto store_x = [&]() {
#pragma unroll
        for (int m = 0; m < MMQ_XP; m++) {
            int i = threadIdx.x + m * 32 * MMQ_WARPS, tok = i / (2 * U), k = (i >> 1) % U;
            *(uint4*)(sq + tok * MMQ_XS + 32 * k + 16 * (i & 1)) = xr[m];
        }
#pragma unroll
        for (int m = 0; m < MMQ_DP; m++) {
            int i = threadIdx.x + m * 32 * MMQ_WARPS, tok = i / U, k = i % U;
            sd[k][tok] = dr[m];
            ss[k][tok] = sr[m];
        }
    };
    PDL_ENTRY();
    load_x(ub);
    store_x();
    __syncthreads();
    float acc[MMQ_TILES][4];
#pragma unroll
    for (int j = 0; j < MMQ_TILES; j++)
#pragma unroll
        for (int i = 0; i < 4; i++) acc[j][i] = 0.0f;
    for (int u0 = ub; u0 < ue; u0 += U) {
        u32 wc[U][MW];
        u16 dc[U][2];
#pragma unroll
        for (int k = 0; k < U; k++) {
#pragma unroll
            for (int i = 0; i < MW; i++) wc[k][i] = w[k][i];
            dc[k][0] = d[k][0];
            dc[k][1] = d[k][1];
        }
        bool more = u0 + U < ue;
        if (more) {
#pragma unroll
            for (int k = 0; k < U; k++) Mq<T>::load(rg, rg8, u0 + U + k, t, w[k], d[k]);
            load_x(u0 + U);
        }
#pragma unroll
        for (int k = 0; k < U; k++) {
            u32 a[4];
            Mq<T>::frag(wc[k], a);
            float dg = h2f(dc[k][0]), dg8 = h2f(dc[k][1]);
#pragma unroll
            for (int j = 0; j < MMQ_TILES; j++) {
                if (j < ntiles) {
                    const u8* xp = sq + (8 * j + g) * MMQ_XS + 32 * k + 4 * t;
                    int c[4];
                    mma_s8_16832(c, a, *(const u32*)xp, *(const u32*)(xp + 16));
                    float2 dx = *(const float2*)&sd[k][8 * j + 2 * t], sx = *(const float2*)&ss[k][8 * j + 2 * t];
                    acc[j][0] = __fadd_rn(acc[j][0], Mq<T>::val(dg, c[0], dx.x, sx.x));
                    acc[j][1] = __fadd_rn(acc[j][1], Mq<T>::val(dg, c[1], dx.y, sx.y));
                    acc[j][2] = __fadd_rn(acc[j][2], Mq<T>::val(dg8, c[2], dx.x, sx.x));
                    acc[j][3] = __fadd_rn(acc[j][3], Mq<T>::val(dg8, c[3], dx.y, sx.y));
                }
            }
        }
        if (more) {
            __syncthreads();  // every warp is done with this group's x
            store_x();
            __syncthreads();
        }
    }
#pragma unroll
    for (int j = 0; j < MMQ_TILES; j++) {
        if (j >= ntiles) continue;
#pragma unroll
        for (int i = 0; i < 4; i++) {
            int r = r0 + g + 8 * (i >> 1), tok = t0 + 8 * j + 2 * t + (i & 1);
            if (r >= rows || tok >= n) continue;
            if (splits == 1)
                y[(u64)tok * ystride + r] = acc[j][i] + (bias ? bias[r] : 0.0f);
            else
                part[((u64)s * n + tok) * rows + r] = acc[j][i];
        }
    }
}

#define MMQ(TNAME, T)                                                                                   \
    extern "C" __global__ void __launch_bounds__(32 * MMQ_WARPS, 2)                                     \
        mmq_##TNAME(const u8* W, u64 row_bytes, int rows, int cols, const i8* xq, const float* xd,     \
                    const float* xs, int n, float* y, int ystride, const float* bias, float* part) {    \
        mmq_impl<T>(W, row_bytes, rows, cols, xq, xd, xs, n, y, ystride, bias, part);                   \
    }
MMQ(q4_0r, T_Q4_0R)
MMQ(q8_0r, T_Q8_0R)

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
