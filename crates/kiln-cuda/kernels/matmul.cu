// One token: y[r] = W[r] . x + bias[r], R rows per warp so that each lane's
// slice of x is loaded once for R rows (x traffic would otherwise exceed
// the weights' own bytes several times over).
// grid: ceil(rows / (warps * R)); block: warps * 32 threads.
template <int T, int R>
__device__ __forceinline__ void mv_impl(const u8* __restrict__ W, u64 row_bytes, int rows, int cols,
                                        const float* __restrict__ x, float* __restrict__ y,
                                        const float* __restrict__ bias) {
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int r0 = (blockIdx.x * (blockDim.x >> 5) + warp) * R;
    if (r0 >= rows) return;
    int units = (cols + 31) >> 5;
    bool vec = (cols & 3) == 0;
    float acc[R];
#pragma unroll
    for (int k = 0; k < R; k++) acc[k] = 0.0f;
    for (int u = lane; u < units; u += 32) {
        int base = u * 32;
        float xv[32];
        if (vec && base + 32 <= cols) {
            const float4* xp = (const float4*)(x + base);
#pragma unroll
            for (int i = 0; i < 8; i++) {
                float4 v = __ldg(xp + i);
                xv[4 * i] = v.x;
                xv[4 * i + 1] = v.y;
                xv[4 * i + 2] = v.z;
                xv[4 * i + 3] = v.w;
            }
        } else {
#pragma unroll
            for (int i = 0; i < 32; i++) xv[i] = base + i < cols ? x[base + i] : 0.0f;
        }
#pragma unroll
        for (int k = 0; k < R; k++) {
            if (r0 + k < rows) {
                float w[32];
                unit<T>(W + (u64)(r0 + k) * row_bytes, u, cols, w);
                float s = 0.0f;
#pragma unroll
                for (int i = 0; i < 32; i++) s += w[i] * xv[i];
                acc[k] += s;
            }
        }
    }
#pragma unroll
    for (int k = 0; k < R; k++) {
        float s = warp_sum(acc[k]);
        if (lane == 0 && r0 + k < rows) y[r0 + k] = s + (bias ? bias[r0 + k] : 0.0f);
    }
}

#define MV(TNAME, T)                                                                              \
    extern "C" __global__ void mv_##TNAME(const u8* W, u64 row_bytes, int rows, int cols,           \
                                          const float* x, float* y, const float* bias) { PDL_ENTRY(); \
        mv_impl<T, 4>(W, row_bytes, rows, cols, x, y, bias);                                        \
    }

MV(f32, T_F32)
MV(f16, T_F16)
MV(bf16, T_BF16)
MV(q4_0, T_Q4_0)
MV(q4_1, T_Q4_1)
MV(q5_0, T_Q5_0)
MV(q5_1, T_Q5_1)
MV(q8_0, T_Q8_0)
MV(q8_0r, T_Q8_0R)
MV(q5_0r, T_Q5_0R)
MV(q4_1r, T_Q4_1R)
MV(q5_1r, T_Q5_1R)
MV(q4_0r, T_Q4_0R)
MV(q6_kr, T_Q6_KR)
MV(q4_kr, T_Q4_KR)
MV(q5_kr, T_Q5_KR)
MV(q3_kr, T_Q3_KR)
MV(q2_kr, T_Q2_KR)
MV(q2_k, T_Q2_K)
MV(q3_k, T_Q3_K)
MV(q4_k, T_Q4_K)
MV(q5_k, T_Q5_K)
MV(q6_k, T_Q6_K)

// x[t] = W[tok] * scale (+ pos[positions[t]] when pos is non-null, f32), tok =
// ids[t] (the previous step's sampled id) when *chain, else tokens[t]: a chained
// decode step takes its token on the device without a copy before the graph.
// The three words load together. grid: n; block: 128.
template <int T>
__device__ __forceinline__ void embed_impl(const u8* __restrict__ W, u64 row_bytes, int cols,
                                           const u32* __restrict__ tokens, const u32* __restrict__ chain,
                                           const u32* __restrict__ ids, const u32* __restrict__ positions,
                                           float scale, const float* __restrict__ pos, float* __restrict__ x) {
    int t = blockIdx.x;
    u32 fed = tokens[t], sampled = ids[t];
    const u8* row = W + (u64)(*chain ? sampled : fed) * row_bytes;
    float* out = x + (u64)t * cols;
    const float* pr = pos ? pos + (u64)positions[t] * cols : 0;
    int units = (cols + 31) >> 5;
    for (int u = threadIdx.x; u < units; u += blockDim.x) {
        float w[32];
        unit<T>(row, u, cols, w);
#pragma unroll
        for (int i = 0; i < 32; i++) {
            int c = u * 32 + i;
            if (c < cols) {
                float v = w[i] * scale;
                if (pr) v += pr[c];
                out[c] = v;
            }
        }
    }
}

#define EMBED(TNAME, T)                                                                            \
    extern "C" __global__ void embed_##TNAME(const u8* W, u64 row_bytes, int cols, const u32* tokens, \
                                             const u32* chain, const u32* ids, const u32* positions, \
                                             float scale, const float* pos, float* x) { PDL_ENTRY();  \
        embed_impl<T>(W, row_bytes, cols, tokens, chain, ids, positions, scale, pos, x);             \
    }

EMBED(f32, T_F32)
EMBED(f16, T_F16)
EMBED(bf16, T_BF16)
EMBED(q4_0, T_Q4_0)
EMBED(q4_1, T_Q4_1)
EMBED(q5_0, T_Q5_0)
EMBED(q5_1, T_Q5_1)
EMBED(q8_0, T_Q8_0)
EMBED(q8_0r, T_Q8_0R)
EMBED(q5_0r, T_Q5_0R)
EMBED(q4_1r, T_Q4_1R)
EMBED(q5_1r, T_Q5_1R)
EMBED(q4_0r, T_Q4_0R)
EMBED(q6_kr, T_Q6_KR)
EMBED(q4_kr, T_Q4_KR)
EMBED(q5_kr, T_Q5_KR)
EMBED(q3_kr, T_Q3_KR)
EMBED(q2_kr, T_Q2_KR)
EMBED(q2_k, T_Q2_K)
EMBED(q3_k, T_Q3_K)
EMBED(q4_k, T_Q4_K)
EMBED(q5_k, T_Q5_K)
EMBED(q6_k, T_Q6_K)

// ---- Prefill GEMM support: weights and activations as 16-bit floats for
// cuBLAS (f2half's fmt: 0 = f16, 1 = bf16).

// dst[r][c] = W[r][c] as 16-bit floats, r < nrows (dst rows are `cols` wide).
// One thread per 32-value unit. grid: ceil(nrows * units / 256); block: 256.
template <int T>
__device__ __forceinline__ void deq_impl(const u8* __restrict__ W, u64 row_bytes, int nrows, int cols,
                                         u16* __restrict__ dst, int fmt) {
    int units = (cols + 31) >> 5;
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (long long)nrows * units) return;
    int r = (int)(i / units), u = (int)(i % units);
    float w[32];
    unit<T>(W + (u64)r * row_bytes, u, cols, w);
    u16* o = dst + (u64)r * cols + u * 32;
    if ((cols & 31) == 0) {
        u32 p[16];
#pragma unroll
        for (int k = 0; k < 16; k++) p[k] = (u32)f2half(w[2 * k], fmt) | ((u32)f2half(w[2 * k + 1], fmt) << 16);
        uint4* o4 = (uint4*)o;
#pragma unroll
        for (int k = 0; k < 4; k++) {
            uint4 v;
            v.x = p[4 * k];
            v.y = p[4 * k + 1];
            v.z = p[4 * k + 2];
            v.w = p[4 * k + 3];
            o4[k] = v;
        }
    } else {
        for (int k = 0; k < 32 && u * 32 + k < cols; k++) o[k] = f2half(w[k], fmt);
    }
}

#define DEQ(TNAME, T)                                                                          \
    extern "C" __global__ void deq_##TNAME(const u8* W, u64 row_bytes, int nrows, int cols,   \
                                           u16* dst, int fmt) { PDL_ENTRY(); \
        deq_impl<T>(W, row_bytes, nrows, cols, dst, fmt);                                      \
    }

DEQ(f32, T_F32)
DEQ(f16, T_F16)
DEQ(bf16, T_BF16)
DEQ(q4_0, T_Q4_0)
DEQ(q4_1, T_Q4_1)
DEQ(q5_0, T_Q5_0)
DEQ(q5_1, T_Q5_1)
DEQ(q8_0, T_Q8_0)
DEQ(q8_0r, T_Q8_0R)
DEQ(q5_0r, T_Q5_0R)
DEQ(q4_1r, T_Q4_1R)
DEQ(q5_1r, T_Q5_1R)
DEQ(q4_0r, T_Q4_0R)
DEQ(q6_kr, T_Q6_KR)
DEQ(q4_kr, T_Q4_KR)
DEQ(q5_kr, T_Q5_KR)
DEQ(q3_kr, T_Q3_KR)
DEQ(q2_kr, T_Q2_KR)
DEQ(q2_k, T_Q2_K)
DEQ(q3_k, T_Q3_K)
DEQ(q4_k, T_Q4_K)
DEQ(q5_k, T_Q5_K)
DEQ(q6_k, T_Q6_K)

// y[i] = x[i] as 16-bit floats. grid-stride; block: 256.
// Eight values per thread step (two 16-byte loads, one 16-byte store) when
// both pointers are 16-byte aligned: one value per thread ran at 0.9 TB/s.
extern "C" __global__ void to_half(const float* __restrict__ x, u64 n, u16* __restrict__ y, int fmt) { PDL_ENTRY();
    u64 start = (u64)blockIdx.x * blockDim.x + threadIdx.x, step = (u64)gridDim.x * blockDim.x;
    u64 head = 0;
    if ((((u64)x | (u64)y) & 15) == 0) {
        head = n / 8 * 8;
        for (u64 c = start; c < n / 8; c += step) {
            float4 a = __ldg((const float4*)x + 2 * c), b = __ldg((const float4*)x + 2 * c + 1);
            uint4 o;
            o.x = (u32)f2half(a.x, fmt) | ((u32)f2half(a.y, fmt) << 16);
            o.y = (u32)f2half(a.z, fmt) | ((u32)f2half(a.w, fmt) << 16);
            o.z = (u32)f2half(b.x, fmt) | ((u32)f2half(b.y, fmt) << 16);
            o.w = (u32)f2half(b.z, fmt) | ((u32)f2half(b.w, fmt) << 16);
            ((uint4*)y)[c] = o;
        }
    }
    for (u64 i = head + start; i < n; i += step) y[i] = f2half(x[i], fmt);
}

// y[t][r] += bias[r] for t < n, r < rows. grid-stride; block: 256.
extern "C" __global__ void add_bias(float* __restrict__ y, int ystride, int rows, int n,
                                    const float* __restrict__ bias) { PDL_ENTRY();
    u64 total = (u64)rows * n;
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (u64)gridDim.x * blockDim.x) {
        int t = (int)(i / rows), r = (int)(i % rows);
        y[(u64)t * ystride + r] += bias[r];
    }
}
