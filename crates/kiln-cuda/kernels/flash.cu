// Prefill attention of one sequence's chunk in one pass (flash attention 2):
// scores, online softmax and P·V stay on chip, with f16 tensor-core MMAs
// (mma.sync m16n8k16, f32 accumulation; sm_80+, empty bodies before).
//
// Each warp owns 16 query rows (its Q fragments live in registers); a block
// of FA_BR rows walks the visible keys in tiles of FA_BC, K and V staged in
// shared memory by cp.async so that the next tile's K arrives during P·V and
// this tile's V during Q·Kᵀ. The exponentials use base 2 (scores scaled by
// log2 e once); P is rounded to f16 unnormalized, O divided by the row sum at
// the end — the precision class of the GEMM path (f16 P, f32 accumulation).

#define FA_BR 64
#define FA_BC 64
#define FA_LOG2E 1.4426950408889634f

#if __CUDA_ARCH__ >= 800
// (lo, hi) -> f16x2 register (lo in the low half: the lower column index).
__device__ __forceinline__ u32 fa_pack(float lo, float hi) {
    u32 r;
    asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}

__device__ __forceinline__ void fa_ldsm4(u32 a, u32& r0, u32& r1, u32& r2, u32& r3) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
                 : "r"(a));
}

__device__ __forceinline__ void fa_ldsm4t(u32 a, u32& r0, u32& r1, u32& r2, u32& r3) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
                 : "r"(a));
}

// c += a · b for one 16x8 tile (a: 16x16 f16, b: 16x8 f16, c: f32).
__device__ __forceinline__ void fa_mma(float* c, const u32* a, u32 b0, u32 b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ float fa_exp2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

// Rows j0 .. j0 + FA_BC - 1 (clamped to the last key; masked later) of one
// KV head's K or V into shared memory, 16 bytes per copy.
template <int D>
__device__ __forceinline__ void fa_load_tile(u16* s, const u16* g, int kvd, int j0, int L) {
    constexpr int C = D / 8, RS = D + 8;
    for (int c = threadIdx.x; c < FA_BC * C; c += blockDim.x) {
        int r = c / C, e = (c % C) * 8;
        int key = min(j0 + r, L - 1);
        cp_async16(smem_u32(s + r * RS + e), g + (u64)key * kvd + e);
    }
}
#endif

// q: the chunk's rows (f32, RoPE applied), row stride qstride, head h at
// h * D; kh / vh: the keys the chunk sees, 0..L-1, as f16, row stride kvd
// (positions counted from the gather's first, which a sliding window moves
// past 0); query row i sits at position p0 + i and sees keys lo..p0 + i (lo
// from the sliding window; window <= 0: none); out: f32, row stride ostride.
// grid: (ceil(n / FA_BR), heads); block: 128 (4 warps x 16 rows).
template <int D>
__device__ __forceinline__ void flash_impl(const float* __restrict__ q, int qstride, const u16* __restrict__ kh,
                                           const u16* __restrict__ vh, int kvd, int n, int L, int p0, int group,
                                           float scale, float softcap, int window, float* __restrict__ out,
                                           int ostride) {
#if __CUDA_ARCH__ >= 800
    constexpr int KS = D / 16, DN = D / 8, RS = D + 8;
    __shared__ __align__(16) u16 ks[FA_BC * RS];
    __shared__ __align__(16) u16 vs[FA_BC * RS];
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    int h = blockIdx.y;
    // The latest (longest) query tiles first: the causal tail balances.
    int q0 = (gridDim.x - 1 - blockIdx.x) * FA_BR;
    int ra = q0 + warp * 16 + g;  // this thread's rows: ra, ra + 8
    const u16* kg = kh + (h / group) * D;
    const u16* vg = vh + (h / group) * D;
    int qlast = min(q0 + FA_BR, n) - 1;
    int kmax = min(L - 1, p0 + qlast);
    int kmin = window > 0 ? max(0, p0 + q0 + 1 - window) : 0;
    int jstart = kmin / FA_BC * FA_BC;
    PDL_ENTRY();
    fa_load_tile<D>(ks, kg, kvd, jstart, L);
    cp_async_commit();

    u32 qa[KS][4];
#pragma unroll
    for (int half = 0; half < 2; half++) {
        int r = ra + 8 * half;
        const float* qr = q + (u64)min(r, n - 1) * qstride + h * D;
#pragma unroll
        for (int kk = 0; kk < KS; kk++) {
            float2 a = *(const float2*)(qr + kk * 16 + t * 2);
            float2 b = *(const float2*)(qr + kk * 16 + 8 + t * 2);
            if (r >= n) a = b = make_float2(0.0f, 0.0f);
            qa[kk][half] = fa_pack(a.x, a.y);
            qa[kk][2 + half] = fa_pack(b.x, b.y);
        }
    }
    float o[DN][4];
#pragma unroll
    for (int i = 0; i < DN; i++) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.0f;
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
    int pos[2] = {p0 + ra, p0 + ra + 8};
    float sc = softcap > 0.0f ? scale / softcap : scale * FA_LOG2E;
    float post = softcap > 0.0f ? softcap * FA_LOG2E : 1.0f;
    int mi = lane >> 3, mr = lane & 7;

    for (int j0 = jstart; j0 <= kmax; j0 += FA_BC) {
        __syncthreads();  // every warp is done reading vs
        fa_load_tile<D>(vs, vg, kvd, j0, L);
        cp_async_commit();
        cp_async_wait<1>();
        __syncthreads();  // K(j0) visible

        float s[8][4];
#pragma unroll
        for (int i = 0; i < 8; i++) s[i][0] = s[i][1] = s[i][2] = s[i][3] = 0.0f;
#pragma unroll
        for (int kk = 0; kk < KS; kk++) {
#pragma unroll
            for (int np = 0; np < 4; np++) {
                u32 b0, b1, b2, b3;
                fa_ldsm4(smem_u32(ks + (np * 16 + (mi >> 1) * 8 + mr) * RS + kk * 16 + (mi & 1) * 8), b0, b1, b2, b3);
                fa_mma(s[2 * np], qa[kk], b0, b1);
                fa_mma(s[2 * np + 1], qa[kk], b2, b3);
            }
        }
        // Every key of this tile visible to every row of the block?
        bool full = j0 + FA_BC - 1 <= p0 + q0 && (window <= 0 || j0 > p0 + qlast - window);
        float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
        for (int nt = 0; nt < 8; nt++) {
#pragma unroll
            for (int e = 0; e < 4; e++) {
                float v = s[nt][e] * sc;
                if (softcap > 0.0f) v = tanhf(v) * post;
                if (!full) {
                    int key = j0 + nt * 8 + t * 2 + (e & 1), p = pos[e >> 1];
                    if (key > p || (window > 0 && key <= p - window)) v = -INFINITY;
                }
                s[nt][e] = v;
                mx[e >> 1] = fmaxf(mx[e >> 1], v);
            }
        }
        float base[2], alpha[2];
#pragma unroll
        for (int i = 0; i < 2; i++) {
            mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 1));
            mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 2));
            float mn = fmaxf(m[i], mx[i]);
            base[i] = mn == -INFINITY ? 0.0f : mn;  // nothing visible yet: exp2 gives 0
            alpha[i] = fa_exp2(m[i] - base[i]);
            m[i] = mn;
            l[i] *= alpha[i];
        }
#pragma unroll
        for (int nt = 0; nt < 8; nt++) {
#pragma unroll
            for (int e = 0; e < 4; e++) {
                float p = fa_exp2(s[nt][e] - base[e >> 1]);
                s[nt][e] = p;
                l[e >> 1] += p;
            }
        }
#pragma unroll
        for (int i = 0; i < DN; i++) {
            o[i][0] *= alpha[0];
            o[i][1] *= alpha[0];
            o[i][2] *= alpha[1];
            o[i][3] *= alpha[1];
        }

        cp_async_wait<0>();
        __syncthreads();  // V(j0) visible; every warp is done reading ks
        if (j0 + FA_BC <= kmax) fa_load_tile<D>(ks, kg, kvd, j0 + FA_BC, L);
        cp_async_commit();
#pragma unroll
        for (int kc = 0; kc < 4; kc++) {
            u32 pa[4] = {fa_pack(s[2 * kc][0], s[2 * kc][1]), fa_pack(s[2 * kc][2], s[2 * kc][3]),
                         fa_pack(s[2 * kc + 1][0], s[2 * kc + 1][1]), fa_pack(s[2 * kc + 1][2], s[2 * kc + 1][3])};
#pragma unroll
            for (int dp = 0; dp < D / 16; dp++) {
                u32 b0, b1, b2, b3;
                fa_ldsm4t(smem_u32(vs + (kc * 16 + (mi & 1) * 8 + mr) * RS + dp * 16 + (mi >> 1) * 8), b0, b1, b2,
                          b3);
                fa_mma(o[2 * dp], pa, b0, b1);
                fa_mma(o[2 * dp + 1], pa, b2, b3);
            }
        }
    }
#pragma unroll
    for (int half = 0; half < 2; half++) {
        float li = l[half];
        li += __shfl_xor_sync(0xffffffffu, li, 1);
        li += __shfl_xor_sync(0xffffffffu, li, 2);
        float inv = li > 0.0f ? 1.0f / li : 0.0f;
        int r = ra + 8 * half;
        if (r < n) {
            float* orow = out + (u64)r * ostride + h * D + t * 2;
#pragma unroll
            for (int i = 0; i < DN; i++)
                *(float2*)(orow + i * 8) = make_float2(o[i][2 * half] * inv, o[i][2 * half + 1] * inv);
        }
    }
#endif
}

#define FLASH(D)                                                                                             \
    extern "C" __global__ void __launch_bounds__(128) flash_d##D(                                            \
        const float* __restrict__ q, int qstride, const u16* __restrict__ kh, const u16* __restrict__ vh,    \
        int kvd, int n, int L, int p0, int group, float scale, float softcap, int window,                    \
        float* __restrict__ out, int ostride) {                                                              \
        flash_impl<D>(q, qstride, kh, vh, kvd, n, L, p0, group, scale, softcap, window, out, ostride);       \
    }
FLASH(64)
FLASH(128)
