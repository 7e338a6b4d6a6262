// y[t][r] = W[r] . x[t] + bias[r] for up to NT tokens per block row.
// One warp per weight row; lane l decodes units l, l+32, ... of the row
// (the quantized blocks are read as stored) and dots them with each token.
// grid: (ceil(rows / warps), ceil(n / NT)); block: warps * 32 threads.

template <int T, int NT>
__device__ __forceinline__ void mm_impl(const u8* __restrict__ W, u64 row_bytes, int rows, int cols,
                                        const float* __restrict__ x, int n, float* __restrict__ y,
                                        int ystride, const float* __restrict__ bias) {
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int r = blockIdx.x * (blockDim.x >> 5) + warp;
    int t0 = blockIdx.y * NT;
    if (r >= rows) return;
    const u8* row = W + (u64)r * row_bytes;
    int units = (cols + 31) >> 5;
    bool vec = (cols & 3) == 0;
    float acc[NT];
#pragma unroll
    for (int t = 0; t < NT; t++) acc[t] = 0.0f;
    for (int u = lane; u < units; u += 32) {
        float w[32];
        unit<T>(row, u, cols, w);
        int base = u * 32;
        if (vec && base + 32 <= cols) {
#pragma unroll
            for (int t = 0; t < NT; t++) {
                if (t0 + t < n) {
                    const float4* xp = (const float4*)(x + (u64)(t0 + t) * cols + base);
                    float s = 0.0f;
#pragma unroll
                    for (int i = 0; i < 8; i++) {
                        float4 v = __ldg(xp + i);
                        s += w[4 * i] * v.x + w[4 * i + 1] * v.y + w[4 * i + 2] * v.z + w[4 * i + 3] * v.w;
                    }
                    acc[t] += s;
                }
            }
        } else {
#pragma unroll
            for (int t = 0; t < NT; t++) {
                if (t0 + t < n) {
                    const float* xp = x + (u64)(t0 + t) * cols;
                    float s = 0.0f;
                    for (int i = 0; i < 32 && base + i < cols; i++) s += w[i] * xp[base + i];
                    acc[t] += s;
                }
            }
        }
    }
    float b = bias ? bias[r] : 0.0f;
#pragma unroll
    for (int t = 0; t < NT; t++) {
        float s = warp_sum(acc[t]);
        if (lane == 0 && t0 + t < n) y[(u64)(t0 + t) * ystride + r] = s + b;
    }
}

#define MM(TNAME, T, NT)                                                                       \
    extern "C" __global__ void mm_##TNAME##_##NT(const u8* W, u64 row_bytes, int rows, int cols, \
                                                 const float* x, int n, float* y, int ystride,   \
                                                 const float* bias) { PDL_ENTRY(); \
        mm_impl<T, NT>(W, row_bytes, rows, cols, x, n, y, ystride, bias);                        \
    }

#define MM_ALL(TNAME, T) MM(TNAME, T, 1) MM(TNAME, T, 2) MM(TNAME, T, 4) MM(TNAME, T, 8)

MM_ALL(f32, T_F32)
MM_ALL(f16, T_F16)
MM_ALL(bf16, T_BF16)
MM_ALL(q4_0, T_Q4_0)
MM_ALL(q4_1, T_Q4_1)
MM_ALL(q5_0, T_Q5_0)
MM_ALL(q5_1, T_Q5_1)
MM_ALL(q8_0, T_Q8_0)
MM_ALL(q8_0r, T_Q8_0R)
MM_ALL(q5_0r, T_Q5_0R)
MM_ALL(q4_1r, T_Q4_1R)
MM_ALL(q5_1r, T_Q5_1R)
MM_ALL(q4_0r, T_Q4_0R)
MM_ALL(q6_kr, T_Q6_KR)
MM_ALL(q4_kr, T_Q4_KR)
MM_ALL(q5_kr, T_Q5_KR)
MM_ALL(q3_kr, T_Q3_KR)
MM_ALL(q2_kr, T_Q2_KR)
MM_ALL(q2_k, T_Q2_K)
MM_ALL(q3_k, T_Q3_K)
MM_ALL(q4_k, T_Q4_K)
MM_ALL(q5_k, T_Q5_K)
MM_ALL(q6_k, T_Q6_K)
