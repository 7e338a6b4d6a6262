// Norms, the attention block's per-head work, attention, activations, logits.

// Mean and 1/std (LayerNorm) or 0 and 1/rms (RMSNorm) of v[0..n], sums in
// f64 like the CPU reference. Every thread gets both.
__device__ __forceinline__ void norm_stats(const float* v, int n, int kind, float eps, double* mean,
                                           double* inv) {
    double s = 0.0;
    double m = 0.0;
    if (kind == NORM_LAYER) {
        for (int i = threadIdx.x; i < n; i += blockDim.x) s += (double)v[i];
        m = block_sum_d(s) / (double)n;
        s = 0.0;
        for (int i = threadIdx.x; i < n; i += blockDim.x) {
            double d = (double)v[i] - m;
            s += d * d;
        }
    } else {
        for (int i = threadIdx.x; i < n; i += blockDim.x) {
            double d = (double)v[i];
            s += d * d;
        }
    }
    *mean = m;
    *inv = block_inv_rms(s, n, eps);
}

// With the weight and bias values given (1 and 0 without them).
__device__ __forceinline__ float norm_val(float v, int kind, double mean, double inv, float finv, float w,
                                          float b) {
    if (kind == NORM_LAYER) {
        float nv = (float)(((double)v - mean) * inv);
        return nv * w + b;
    }
    return v * finv * w;
}

__device__ __forceinline__ float norm_one(float v, int i, int kind, double mean, double inv, float finv,
                                          const float* w, const float* b) {
    return norm_val(v, kind, mean, inv, finv, w ? w[i] : 1.0f, b ? b[i] : 0.0f);
}

// Sum over the thread-block cluster (sm_90; the block itself before): the
// blocks' sums added in rank order, so every block gets the same value.
// Every thread of every block in the cluster must call it.
__device__ double cluster_sum_d(double v) {
#if __CUDA_ARCH__ >= 900
    __shared__ double part, total;
    double b = block_sum_d(v);
    if (threadIdx.x == 0) part = b;
    asm volatile("barrier.cluster.arrive.release.aligned;\n\tbarrier.cluster.wait.acquire.aligned;" ::: "memory");
    if (threadIdx.x == 0) {
        u32 n, a;
        u64 g;
        asm("mov.u32 %0, %%cluster_nctarank;" : "=r"(n));
        asm("cvta.to.shared.u64 %0, %1;" : "=l"(g) : "l"((u64)&part));
        a = (u32)g;
        double t = 0.0;
        for (u32 r = 0; r < n; r++) {
            u32 ra;
            double pv;
            asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(ra) : "r"(a), "r"(r));
            asm volatile("ld.shared::cluster.f64 %0, [%1];" : "=d"(pv) : "r"(ra) : "memory");
            t += pv;
        }
        total = t;
    }
    // Every block has read every part (they may be overwritten, the blocks
    // may exit), and `total` is visible in the block.
    asm volatile("barrier.cluster.arrive.release.aligned;\n\tbarrier.cluster.wait.acquire.aligned;" ::: "memory");
    return total;
#else
    return block_sum_d(v);
#endif
}

template <bool CL>
__device__ __forceinline__ double red_sum_d(double v) {
    return CL ? cluster_sum_d(v) : block_sum_d(v);
}

// Mean and 1/std (LayerNorm) or 0 and 1/rms (RMSNorm) of n values held in
// registers by the block (CL: by the cluster's blocks): v[k] is element
// threadIdx.x + k * blockDim.x of this block's `len` (0 past it). f64 sums
// as norm_stats.
template <int V, bool CL>
__device__ __forceinline__ void reg_stats(const float* v, int len, int n, int kind, float eps, double* mean,
                                          double* inv) {
    double s = 0.0, m = 0.0;
    if (kind == NORM_LAYER) {
#pragma unroll
        for (int k = 0; k < V; k++) s += (double)v[k];
        m = red_sum_d<CL>(s) / (double)n;
        s = 0.0;
#pragma unroll
        for (int k = 0; k < V; k++) {
            double d = (double)v[k] - m;
            if (threadIdx.x + k * blockDim.x < len) s += d * d;
        }
    } else {
#pragma unroll
        for (int k = 0; k < V; k++) s += (double)v[k] * (double)v[k];
    }
    *mean = m;
    *inv = CL ? inv_rms(cluster_sum_d(s), n, eps) : block_inv_rms(s, n, eps);
}

// Per token:
//   if y: x += post ? norm(y; pw, pb) : y
//   if w: out = norm(x; w, b), and with q (hid % 32 == 0) also quantized to
//         8 bits for the next GEMV (q, qd, qs as quantize_q8, token-major).
// The values stay in registers (one global read of x and y, one write each:
// the kernel is latency-bound at decode). add_norm: one block per token
// (grid: n; block: AN_THREADS), rows of up to AN_THREADS * AN_V values, else
// a loop through memory. add_norm_cl (sm_90): a cluster of blocks per token,
// each holding a slice of hid / gridDim.x values (a multiple of 32, at most
// AN_V per thread) and the norms' sums taken over the cluster (grid:
// (cluster size, n); block: min(slice, 256)); one block for a whole
// 4096-value row was ~10 us a call, 65 calls a token at the 8B shape.
// v[k] = p[threadIdx.x + k * blockDim.x] for the first `len` (0 past them).
__device__ __forceinline__ void load_regs(const float* p, int len, float* v) {
#pragma unroll
    for (int k = 0; k < AN_V; k++) {
        int i = threadIdx.x + k * blockDim.x;
        v[k] = i < len ? p[i] : 0.0f;
    }
}

// v[k] = y[threadIdx.x + k * blockDim.x] for the first `len` where y is the
// sum of `ys` parts `sstride` floats apart (a split product's sums that
// mmq_reduce was not launched for), added in mmq_reduce's order with its
// bits (the + 0.0f of a row without bias included); every part's loads
// issue before the first add.
__device__ __forceinline__ void load_parts(const float* p, int len, float* v, int ys, u64 sstride) {
    load_regs(p, len, v);
    if (ys <= 1) return;
    float w[MMQ_MAX_SPLITS - 1][AN_V];
#pragma unroll
    for (int s = 1; s < MMQ_MAX_SPLITS; s++) {
#pragma unroll
        for (int k = 0; k < AN_V; k++) {
            int i = threadIdx.x + k * blockDim.x;
            w[s - 1][k] = s < ys && i < len ? p[(u64)s * sstride + i] : 0.0f;
        }
    }
#pragma unroll
    for (int s = 1; s < MMQ_MAX_SPLITS; s++) {
        if (s < ys) {
#pragma unroll
            for (int k = 0; k < AN_V; k++) v[k] = __fadd_rn(v[k], w[s - 1][k]);
        }
    }
#pragma unroll
    for (int k = 0; k < AN_V; k++) v[k] = __fadd_rn(v[k], 0.0f);
}

template <bool CL>
__device__ __forceinline__ void add_norm_regs(float* x, const float* y, const float* pw, const float* pb,
                                              const float* w, const float* b, float* out, int hid, float eps,
                                              int kind, i8* q, float* qd, float* qs, u16* oh, int fmt, int t,
                                              int base, int len, int ys, u64 ysstride) {
    float* xr = x + (u64)t * hid + base;
    double mean, inv;
    // Before waiting for the kernel before this one (it writes y): the
    // norm's weights, and with y also x, last written by an add_norm at least
    // three kernels back (a kernel past its wait has seen every kernel
    // before it finish). One dependent round trip fewer after the wait.
    float xv[AN_V], wv[AN_V], bv[AN_V];
    if (y) load_regs(xr, len, xv);
    if (w) {
#pragma unroll
        for (int k = 0; k < AN_V; k++) {
            int i = threadIdx.x + k * blockDim.x;
            wv[k] = i < len ? w[base + i] : 1.0f;
            bv[k] = i < len && b ? b[base + i] : 0.0f;
        }
    }
    PDL_ENTRY();
    if (!y) load_regs(xr, len, xv);
    if (y) {
        float yv[AN_V];
        load_parts(y + (u64)t * hid + base, len, yv, ys, ysstride);
        if (pw) {
            reg_stats<AN_V, CL>(yv, len, hid, kind, eps, &mean, &inv);
            float finv = (float)inv;
#pragma unroll
            for (int k = 0; k < AN_V; k++) {
                int i = threadIdx.x + k * blockDim.x;
                if (i < len)
                    xv[k] = kind == NORM_RMS && !pb ? post_add(xv[k], yv[k], finv, pw[base + i])
                                                    : xv[k] + norm_one(yv[k], base + i, kind, mean, inv, finv, pw, pb);
            }
        } else {
#pragma unroll
            for (int k = 0; k < AN_V; k++) xv[k] += yv[k];
        }
#pragma unroll
        for (int k = 0; k < AN_V; k++) {
            int i = threadIdx.x + k * blockDim.x;
            if (i < len) xr[i] = xv[k];
        }
    }
    if (w) {
        reg_stats<AN_V, CL>(xv, len, hid, kind, eps, &mean, &inv);
        float finv = (float)inv;
        float* o = out + (u64)t * hid + base;
        __shared__ float4 sv4[AN_THREADS * AN_V / 4];
        float* sv = (float*)sv4;
#pragma unroll
        for (int k = 0; k < AN_V; k++) {
            int i = threadIdx.x + k * blockDim.x;
            if (i < len) {
                float v = norm_val(xv[k], kind, mean, inv, finv, wv[k], bv[k]);
                if (oh)
                    oh[(u64)t * hid + base + i] = f2half(v, fmt);
                else
                    o[i] = v;
                if (q) sv[i] = v;
            }
        }
        // hid % 32 == 0 with q, and base a multiple of 32 (add_norm_cl).
        if (q) {
            __syncthreads();
            quant_q8_shared(sv, len, (u64)t * (hid >> 5) + (base >> 5), q, qd, qs);
        }
    }
}

// oh: when a GEMM consumes `out`, the normalized row goes there instead,
// as f16 (fmt 0) or bf16 (1), and `out` is not written. ys, ysstride: y is
// the sum of ys parts ysstride floats apart (load_parts; 1: y itself).
// Does nothing but order itself between its neighbours: launched before
// every kernel with `$KILN_CUDA_BOUNDARY=1`, it prices one kernel boundary
// in place (outputs stay right).
extern "C" __global__ void nop() { PDL_ENTRY(); }

// `cuda_check --sync-micro`: what a persistent decode kernel's grid-wide
// barrier costs against the kernel boundary it would replace. A phase:
// every block writes w floats of its own (a GEMV's output rows), then,
// after all blocks' writes are visible, reads r floats of what they all
// wrote (the next phase's x). sync_rounds: n phases in one kernel of G
// co-resident blocks meeting at a counter (release / acquire, thread 0
// spinning); `count` starts at 0 and `err` is set when a spin gives up.
// sync_phase: one phase a kernel, launched n times under PDL.
__device__ __forceinline__ float phase_read(const float* in, int total, int r) {
    float acc = 0.0f;
    for (int j = threadIdx.x; j < r; j += blockDim.x) acc += __ldcg(in + j % total);
    return acc;
}

__device__ __forceinline__ void phase_write(float* out, int w, float acc) {
    for (int j = threadIdx.x; j < w; j += blockDim.x) out[(u64)blockIdx.x * w + j] = acc + (float)j;
}

extern "C" __global__ void sync_rounds(u32* count, u32* err, float* buf, int n, int w, int r, float* sink) {
    PDL_ENTRY();
    int total = max(1, (int)gridDim.x * w);
    float acc = 0.0f;
    for (int i = 1; i <= n; i++) {
        float* out = buf + (u64)(i & 1) * total;
        phase_write(out, w, acc);
        __syncthreads();
        if (threadIdx.x == 0) {
            fence_acq_rel_gpu();
            atomicAdd(count, 1u);
            u32 target = (u32)i * gridDim.x, v = 0;
            for (u32 spin = 0; spin < (1u << 24); spin++) {
                asm volatile("ld.acquire.gpu.u32 %0, [%1];" : "=r"(v) : "l"(count) : "memory");
                if (v >= target) break;
            }
            if (v < target) atomicExch(err, 1u);
        }
        __syncthreads();
        if (r > 0) acc += phase_read(out, total, r);
    }
    if (acc == 1.2345e30f) sink[0] = acc;
}

extern "C" __global__ void sync_phase(float* buf, int i, int w, int r, float* sink) {
    PDL_ENTRY();
    int total = max(1, (int)gridDim.x * w);
    float acc = r > 0 ? phase_read(buf + (u64)(i & 1) * total, total, r) : 0.0f;
    phase_write(buf + (u64)((i + 1) & 1) * total, w, acc);
    if (acc == 1.2345e30f) sink[0] = acc;
}

extern "C" __global__ void __launch_bounds__(AN_THREADS) add_norm(float* x, const float* y, const float* pw, const float* pb,
                                    const float* w, const float* b, float* out, int hid, float eps,
                                    int kind, i8* q, float* qd, float* qs, u16* oh, int fmt, int ys,
                                    u64 ysstride) {
    int t = blockIdx.x;
    float* xr = x + (u64)t * hid;
    double mean, inv;
    if (hid <= AN_V * (int)blockDim.x) {
        add_norm_regs<false>(x, y, pw, pb, w, b, out, hid, eps, kind, q, qd, qs, oh, fmt, t, 0, hid, ys,
                             ysstride);
        return;
    }
    PDL_ENTRY();
    if (y) {
        float* yr = (float*)y + (u64)t * hid;
        // Rows past the registers: the parts summed into the first one
        // (each value by the thread that reads it below).
        if (ys > 1) {
            for (int i = threadIdx.x; i < hid; i += blockDim.x) {
                float v = yr[i];
                for (int s = 1; s < ys; s++) v = __fadd_rn(v, yr[(u64)s * ysstride + i]);
                yr[i] = __fadd_rn(v, 0.0f);
            }
            __syncthreads();
        }
        if (pw) {
            norm_stats(yr, hid, kind, eps, &mean, &inv);
            float finv = (float)inv;
            for (int i = threadIdx.x; i < hid; i += blockDim.x)
                xr[i] += norm_one(yr[i], i, kind, mean, inv, finv, pw, pb);
        } else {
            for (int i = threadIdx.x; i < hid; i += blockDim.x) xr[i] += yr[i];
        }
        __syncthreads();
    }
    if (w) {
        norm_stats(xr, hid, kind, eps, &mean, &inv);
        float finv = (float)inv;
        float* o = out + (u64)t * hid;
        if (oh) {
            for (int i = threadIdx.x; i < hid; i += blockDim.x)
                oh[(u64)t * hid + i] = f2half(norm_one(xr[i], i, kind, mean, inv, finv, w, b), fmt);
            return;
        }
        for (int i = threadIdx.x; i < hid; i += blockDim.x) o[i] = norm_one(xr[i], i, kind, mean, inv, finv, w, b);
        if (q) {
            __syncthreads();
            int lane = threadIdx.x & 31;
            for (int blk = threadIdx.x >> 5; blk < hid / 32; blk += blockDim.x >> 5)
                quant_q8_warp(o[blk * 32 + lane], lane, (u64)t * (hid >> 5) + blk, q, qd, qs);
        }
    }
}

extern "C" __global__ void __launch_bounds__(256) add_norm_cl(float* x, const float* y, const float* pw,
                                    const float* pb, const float* w, const float* b, float* out, int hid,
                                    float eps, int kind, i8* q, float* qd, float* qs, u16* oh, int fmt,
                                    int ys, u64 ysstride) {
    int len = hid / gridDim.x;
    add_norm_regs<true>(x, y, pw, pb, w, b, out, hid, eps, kind, q, qd, qs, oh, fmt, blockIdx.y,
                        blockIdx.x * len, len, ys, ysstride);
}

// out[k] = norm(x[rows[k]]) (grid: number of rows; block: 256).
// With q (hid % 32 == 0): also quantized to 8 bits per 32 values for the
// output projection's one-token GEMV. Rows of up to 256 * GN_V values are
// read once into registers (reg_stats: norm_stats' sums in its order) and
// quantized from shared memory (quant_q8_shared: quant_q8_warp's bits):
// reading x twice and `out` back cost two more round trips, under the
// output GEMV's weight preloads, and a warp's eight quantizations ran in
// series (8.9 us of a 1B step, NOTES.md item 66). The norm's weights are
// loaded before the wait.
#define GN_V 16
extern "C" __global__ void __launch_bounds__(256) gather_norm(const float* x, const u32* rows, const float* w,
                                                              const float* b, float* out, int hid, float eps,
                                                              int kind, i8* q, float* qd, float* qs) {
    __shared__ float4 sv4[256 * GN_V / 4];
    float* sv = (float*)sv4;
    // The norm's weights (never written) before the wait.
    float wv[GN_V], bv[GN_V];
#pragma unroll
    for (int k = 0; k < GN_V; k++) {
        int i = threadIdx.x + k * 256;
        bool in = i < hid && hid <= 256 * GN_V;
        wv[k] = in && w ? w[i] : 1.0f;
        bv[k] = in && b ? b[i] : 0.0f;
    }
    PDL_ENTRY();
    const float* xr = x + (u64)rows[blockIdx.x] * hid;
    float* o = out + (u64)blockIdx.x * hid;
    double mean, inv;
    if (hid > 256 * GN_V) {
        norm_stats(xr, hid, kind, eps, &mean, &inv);
        float finv = (float)inv;
        for (int i = threadIdx.x; i < hid; i += blockDim.x) o[i] = norm_one(xr[i], i, kind, mean, inv, finv, w, b);
        if (!q) return;
        __syncthreads();
        int lane = threadIdx.x & 31;
        for (int blk = threadIdx.x >> 5; blk < hid / 32; blk += blockDim.x >> 5)
            quant_q8_warp(o[blk * 32 + lane], lane, (u64)blockIdx.x * (hid >> 5) + blk, q, qd, qs);
        return;
    }
    float v[GN_V];
#pragma unroll
    for (int k = 0; k < GN_V; k++) {
        int i = threadIdx.x + k * 256;
        v[k] = i < hid ? xr[i] : 0.0f;
    }
    reg_stats<GN_V, false>(v, hid, hid, kind, eps, &mean, &inv);
    float finv = (float)inv;
#pragma unroll
    for (int k = 0; k < GN_V; k++) {
        int i = threadIdx.x + k * 256;
        if (i < hid) {
            float nv = norm_val(v[k], kind, mean, inv, finv, wv[k], bv[k]);
            o[i] = nv;
            sv[i] = nv;
        }
    }
    if (!q) return;
    __syncthreads();
    quant_q8_shared(sv, hid, (u64)blockIdx.x * (hid >> 5), q, qd, qs);
}

// out[t][i] = gated ? act(gu[t][i]) * gu[t][inter + i] : act(gu[t][i]).
// With q (inter % 32 == 0, block a multiple of 32): also quantized to 8
// bits per 32 values (a warp holds 32 consecutive, aligned values).
// L2A: a window for the down projection after it (l2_ahead; zeros: none).
extern "C" __global__ void act_mul(const float* gu, int stride, int inter, int n, int gated, int kind,
                                   float* out, i8* q, float* qd, float* qs, u16* oh, int fmt, L2A_PARAMS) {
    l2_ahead(L2A_ARGS);
    PDL_ENTRY();
    // grid: (blocks over inter, tokens); q needs inter % 32 == 0 (whole warps
    // on aligned 32-value blocks); oh as in add_norm.
    for (int t = blockIdx.y; t < n; t += gridDim.y) {
        const float* r = gu + (u64)t * stride;
        for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < inter; i += gridDim.x * blockDim.x) {
            float v = activate(kind, r[i]);
            if (gated) v *= r[inter + i];
            u64 k = (u64)t * inter + i;
            if (oh)
                oh[k] = f2half(v, fmt);
            else
                out[k] = v;
            if (q) quant_q8_warp(v, threadIdx.x & 31, k >> 5, q, qd, qs);
        }
    }
}

// x = tanh(x / c) * c in place.
extern "C" __global__ void softcap(float* x, u64 n, float c) { PDL_ENTRY();
    for (u64 k = (u64)blockIdx.x * blockDim.x + threadIdx.x; k < n; k += (u64)gridDim.x * blockDim.x)
        x[k] = tanhf(x[k] / c) * c;
}

// (value, index) pairs: the larger value wins, the lower index on ties;
// index NO_IDX is empty (NaN values are never entered).
#define NO_IDX 0xffffffffu
__device__ __forceinline__ void am_merge(float& best, u32& idx, float ov, u32 oi) {
    if (oi != NO_IDX && (idx == NO_IDX || ov > best || (ov == best && oi < idx))) {
        best = ov;
        idx = oi;
    }
}

// The block's best pair, left in thread 0 (blockDim.x a multiple of 32).
__device__ __forceinline__ void block_argmax(float& best, u32& idx) {
    __shared__ float bv[32];
    __shared__ u32 bi[32];
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        float ov = __shfl_xor_sync(0xffffffffu, best, o);
        u32 oi = __shfl_xor_sync(0xffffffffu, idx, o);
        am_merge(best, idx, ov, oi);
    }
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    __syncthreads();
    if (lane == 0) {
        bv[w] = best;
        bi[w] = idx;
    }
    __syncthreads();
    if (threadIdx.x == 0)
        for (int k = 1; k < (int)(blockDim.x >> 5); k++) am_merge(best, idx, bv[k], bi[k]);
}

// Greedy: index of the largest of each row (lowest index on ties; NaN and
// -inf never win; 0 when nothing else is there). grid: (slices, rows); block: 256. Each block
// takes one slice of the row (one block for a whole 128k-entry row was 54 us
// a token); the last block of a row to finish merges the slices' pairs,
// written to pv / pi, and resets the row's counter for the next launch.
extern "C" __global__ void argmax_rows(const float* x, u64 cols, u32* out, float* pv, u32* pi, u32* count) {
    PDL_ENTRY();
    __shared__ bool last;
    u32 nb = gridDim.x, b = blockIdx.x, row = blockIdx.y;
    u64 per = (cols + nb - 1) / nb;
    u64 lo = (u64)b * per, hi = min(cols, lo + per);
    const float* r = x + (u64)row * cols;
    float best = -INFINITY;
    u32 idx = NO_IDX;
    // AM_U loads a thread in flight before the first compare: one L2 round
    // trip for a 4096-entry slice instead of one per 256 entries (the pairs
    // merge in any order to the same winner).
    constexpr int AM_U = 16;
    for (u64 base = lo + threadIdx.x; base < hi; base += (u64)AM_U * blockDim.x) {
        float v[AM_U];
#pragma unroll
        for (int k = 0; k < AM_U; k++) {
            u64 i = base + (u64)k * blockDim.x;
            v[k] = i < hi ? r[i] : -INFINITY;
        }
        // As kiln_core::sampler::argmax: only values above -inf (not NaN).
#pragma unroll
        for (int k = 0; k < AM_U; k++)
            if (v[k] > -INFINITY) am_merge(best, idx, v[k], (u32)(base + (u64)k * blockDim.x));
    }
    block_argmax(best, idx);
    if (nb == 1) {
        if (threadIdx.x == 0) out[row] = idx == NO_IDX ? 0u : idx;
        return;
    }
    if (threadIdx.x == 0) {
        pv[(u64)row * nb + b] = best;
        pi[(u64)row * nb + b] = idx;
        fence_acq_rel_gpu();
        last = atomicAdd(&count[row], 1u) == nb - 1;
    }
    __syncthreads();
    if (!last) return;
    fence_acq_rel_gpu();
    best = -INFINITY;
    idx = NO_IDX;
    for (u32 k = threadIdx.x; k < nb; k += blockDim.x)
        am_merge(best, idx, ((volatile float*)pv)[(u64)row * nb + k], ((volatile u32*)pi)[(u64)row * nb + k]);
    block_argmax(best, idx);
    if (threadIdx.x == 0) {
        out[row] = idx == NO_IDX ? 0u : idx;
        count[row] = 0;
    }
}

// ---- Sampling: Gumbel-max over the top-k of each row.
// Order-preserving map of a float to u32 (larger float, larger key).
__device__ __forceinline__ u32 fkey(float f) {
    u32 b = __float_as_uint(f);
    return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}

// splitmix64 finaliser: a counter-based generator (seed, index) -> 64 bits.
__device__ __forceinline__ u64 mix64(u64 z) {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

// One id per row: argmax over i of logits[i] / temp + Gumbel(seed, i), among
// the top_k largest logits (all when top_k is 0 or >= cols; ties at the k-th
// value are all kept). The k-th value is found by a 4-pass radix select on
// the float keys. params per row (u32 x4): temp (f32 bits), top_k, seed lo,
// seed hi. NaN logits never win; temp <= 0 is the plain argmax.
// grid: rows; block: 1024.
extern "C" __global__ void sample_rows(const float* x, u64 cols, const u32* params, u32* out) { PDL_ENTRY();
    __shared__ u32 hist[256];
    __shared__ u32 s_prefix, s_k;
    const float* r = x + (u64)blockIdx.x * cols;
    const u32* p = params + 4 * blockIdx.x;
    float temp = __uint_as_float(p[0]);
    bool noise = temp > 0.0f;  // temp <= 0: plain argmax among the top k
    float inv_t = noise ? 1.0f / temp : 1.0f;
    u32 topk = p[1];
    u64 seed = (u64)p[2] | ((u64)p[3] << 32);
    u32 thresh = 0;
    if (topk > 0 && (u64)topk < cols) {
        u32 prefix = 0, mask = 0, k = topk;
        for (int shift = 24; shift >= 0; shift -= 8) {
            for (int i = threadIdx.x; i < 256; i += blockDim.x) hist[i] = 0;
            __syncthreads();
            for (u64 i = threadIdx.x; i < cols; i += blockDim.x) {
                u32 key = fkey(r[i]);
                if ((key & mask) == prefix) atomicAdd(&hist[(key >> shift) & 255u], 1u);
            }
            __syncthreads();
            if (threadIdx.x == 0) {
                u32 acc = 0;
                int b = 255;
                for (; b > 0; b--) {
                    if (acc + hist[b] >= k) break;
                    acc += hist[b];
                }
                s_prefix = prefix | ((u32)b << shift);
                s_k = k - acc;
            }
            __syncthreads();
            prefix = s_prefix;
            k = s_k;
            mask |= 255u << shift;
            __syncthreads();
        }
        thresh = prefix;
    }
    float best = -INFINITY;
    u32 idx = NO_IDX;
    for (u64 i = threadIdx.x; i < cols; i += blockDim.x) {
        float v = r[i];
        if (v != v || fkey(v) < thresh) continue;
        u64 h = mix64(seed + (i + 1) * 0x9e3779b97f4a7c15ull);
        float u = ((float)(h >> 40) + 0.5f) * (1.0f / 16777216.0f);
        float s = noise ? v * inv_t - logf(-logf(u)) : v;
        am_merge(best, idx, s, (u32)i);
    }
    block_argmax(best, idx);
    if (threadIdx.x == 0) out[blockIdx.x] = idx == NO_IDX ? 0u : idx;
}

// Prefill attention through cuBLAS (one sequence's chunk of n tokens from
// position p0, against its L = p0 + n visible positions): S = scale * Q K^T
// was written by a GEMM (f32, heads x n x L); this makes P = softmax over each
// row's visible keys (causal, sliding window, softcap) as 16-bit floats (0
// where masked) for the P V GEMM. grid: (n, heads); block: 256.
extern "C" __global__ void softmax_causal(const float* __restrict__ S, u16* __restrict__ P, int n, int L,
                                          int p0, float softcap, int window) { PDL_ENTRY();
    int i = blockIdx.x, h = blockIdx.y;
    const float* s = S + ((u64)h * n + i) * L;
    u16* p = P + ((u64)h * n + i) * L;
    int hi = p0 + i;
    int lo = window > 0 ? max(0, hi + 1 - window) : 0;
    __shared__ float red[32];
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
    float m = -INFINITY;
    for (int j = lo + threadIdx.x; j <= hi; j += blockDim.x) {
        float v = s[j];
        if (softcap > 0.0f) v = tanhf(v / softcap) * softcap;
        m = fmaxf(m, v);
    }
    m = warp_max(m);
    if (lane == 0) red[w] = m;
    __syncthreads();
    m = -INFINITY;
    for (int k = 0; k < nw; k++) m = fmaxf(m, red[k]);
    __syncthreads();
    float sum = 0.0f;
    for (int j = lo + threadIdx.x; j <= hi; j += blockDim.x) {
        float v = s[j];
        if (softcap > 0.0f) v = tanhf(v / softcap) * softcap;
        sum += __expf(v - m);
    }
    sum = warp_sum(sum);
    if (lane == 0) red[w] = sum;
    __syncthreads();
    sum = 0.0f;
    for (int k = 0; k < nw; k++) sum += red[k];
    float inv = sum > 0.0f ? 1.0f / sum : 0.0f;
    for (int j = threadIdx.x; j < L; j += blockDim.x) {
        float e = 0.0f;
        if (j >= lo && j <= hi) {
            float v = s[j];
            if (softcap > 0.0f) v = tanhf(v / softcap) * softcap;
            e = __expf(v - m) * inv;
        }
        p[j] = f2half(e, 0);
    }
}
