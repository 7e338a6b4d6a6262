// One-token GEMV at the memory floor (decode). Two families:
//
// * float weights (F32/F16/BF16), f32 activations: a warp per row, each lane
//   reading 16 bytes per step so that one load instruction of the warp covers
//   512 consecutive bytes, MVF_UNROLL loads issued before the first is used
//   (bytes in flight hide DRAM latency; the old kernel had ~4 warps per SM
//   waiting on 64-byte units).
// * quantized weights against activations quantized to 8 bits per 32 values
//   (`quantize_q8`: d = amax / 127, q = round-half-even(x / d), s = d * Σq,
//   the same arithmetic as kiln-cpu's QAct): integer dot products of 4 bytes
//   at a time (`__dp4a`), then one float scale per unit. A warp per row,
//   each lane one 32-value unit per step, two units in flight.

// A weight stream's L2 fetch (ld_stream*'s LINE): the hardware's choice, or
// the whole 128-byte line (.L2::128B). Whole lines gained on the repacked
// K-quants, whose super-blocks (84-176 bytes) straddle lines (8B tg256
// Q4_K_M +0.5%, Q5_K_M / Q3_K_M / Q2_K +0.15-0.3%), and nothing on Q8_0, Q4_0
// or bf16; 256-byte blocks lost 0.4-5% (NOTES.md item 118).
// 16 bytes from global memory, not kept in L1 (weights are read once).
template <bool LINE = false>
__device__ __forceinline__ uint4 ld_stream16(const void* p) {
    uint4 v;
    if constexpr (LINE)
        asm("ld.global.nc.L1::no_allocate.L2::128B.v4.u32 {%0, %1, %2, %3}, [%4];"
            : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
            : "l"(p));
    else
        asm("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
            : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
            : "l"(p));
    return v;
}

__device__ __forceinline__ int warp_sum_i(int v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

// ---- float weights

template <int T>
__device__ __forceinline__ void dec16(uint4 v, float* w);

template <>
__device__ __forceinline__ void dec16<T_F32>(uint4 v, float* w) {
    w[0] = __uint_as_float(v.x);
    w[1] = __uint_as_float(v.y);
    w[2] = __uint_as_float(v.z);
    w[3] = __uint_as_float(v.w);
}

template <>
__device__ __forceinline__ void dec16<T_F16>(uint4 v, float* w) {
    u32 a[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int j = 0; j < 4; j++) {
        w[2 * j] = h2f((u16)(a[j] & 0xffff));
        w[2 * j + 1] = h2f((u16)(a[j] >> 16));
    }
}

template <>
__device__ __forceinline__ void dec16<T_BF16>(uint4 v, float* w) {
    u32 a[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int j = 0; j < 4; j++) {
        w[2 * j] = __uint_as_float(a[j] << 16);
        w[2 * j + 1] = __uint_as_float(a[j] & 0xffff0000u);
    }
}

// 16-byte loads per lane in flight. 4 beats 8 (8B bf16 layer chain 4.92 ->
// 4.71 ms, 1B 0.835 -> 0.765 in `cuda_check --gemv-micro`: 52 registers, more
// warps resident); 2, 3, 6, 12, 16, two rows per warp and a two-set
// software pipeline all measured slower (crates/kiln-cuda/NOTES.md run 49).
#define MVF_UNROLL 4

// Row wr's dot product with x (chunks 16-byte chunks of weights, the
// lane's first MVF_UNROLL already in wv), x read through L1 (__ldg) or, with
// SH, from shared memory: the same sums in the same order either way.
template <int T, bool SH>
__device__ __forceinline__ float mvf_row(const uint4* __restrict__ wr, int chunks, int lane, uint4* wv,
                                         const float4* __restrict__ x) {
    constexpr int E = T == T_F32 ? 4 : 8;
    float acc = 0.0f;
    for (int c0 = lane; c0 < chunks; c0 += 32 * MVF_UNROLL) {
        if (c0 != lane) {
#pragma unroll
            for (int k = 0; k < MVF_UNROLL; k++) {
                int c = c0 + 32 * k;
                if (c < chunks) wv[k] = ld_stream16(wr + c);
            }
        }
#pragma unroll
        for (int k = 0; k < MVF_UNROLL; k++) {
            int c = c0 + 32 * k;
            if (c < chunks) {
                float w[E];
                dec16<T>(wv[k], w);
                const float4* xp = x + c * (E / 4);
#pragma unroll
                for (int i = 0; i < E / 4; i++) {
                    float4 v = SH ? xp[i] : __ldg(xp + i);
                    acc += w[4 * i] * v.x + w[4 * i + 1] * v.y + w[4 * i + 2] * v.z + w[4 * i + 3] * v.w;
                }
            }
        }
    }
    return acc;
}

// The residual stream's value at row r for a RES GEMV's add, read before
// its PDL wait (lane 0; 0 otherwise): under fuse_norm only the O and down
// GEMVs write the stream, and when one of them starts, every kernel before
// the one just ahead of it has finished (common.cu), which takes in the
// other one's writes; the one ahead (attention, or gate|up) reads the
// stream and never writes it. From L2: this SM's L1 may hold the row from
// before the last write. Saves the add's dependent round trip at the end.
template <bool RES>
__device__ __forceinline__ float res_early(const float* y, int r, int rows, int lane) {
    return RES && lane == 0 && r < rows ? __ldcg(y + r) : 0.0f;
}

// A warp's work item (mvf_impl, mvfn_impl): a whole row, or part `part` of a tail
// row (chunks lo..hi).
struct MvfPiece {
    int row, lo, hi, part;
};

// Work item r: row r below `whole`, past it part (r - whole) % tp of tail
// row whole + (r - whole) / tp.
__device__ __forceinline__ MvfPiece mvf_piece(int r, int whole, int tp, int chunks) {
    if (r < whole) return {r, 0, chunks, 0};
    int q = r - whole, part = q % tp;
    return {whole + q / tp, chunks * part / tp, chunks * (part + 1) / tp, part};
}

// A piece's first MVF_UNROLL loads a lane (mvf_row's first step).
__device__ __forceinline__ void mvf_first_loads(const u8* __restrict__ W, u64 row_bytes, MvfPiece pc, int lane,
                                                uint4* wv) {
    const uint4* wr = (const uint4*)(W + (u64)pc.row * row_bytes) + pc.lo;
#pragma unroll
    for (int k = 0; k < MVF_UNROLL; k++) {
        int c = lane + 32 * k;
        if (c < pc.hi - pc.lo) wv[k] = ld_stream16(wr + c);
    }
}

// Needs cols * sizeof(T) % 16 == 0 and 16-byte aligned rows (checked by the host).
// grid: ceil(rows / warps); block: warps * 32.
// RES: y is the residual stream, y[r] = y[r] + (W[r] . x + bias[r]) as
// add_norm adds it (CudaOptions::fuse_norm), y[r] read early (res_early).
template <int T, bool RES = false>
__device__ __forceinline__ void mvf_impl(const u8* __restrict__ W, u64 row_bytes, int rows, int cols,
                                         const float* __restrict__ x, float* __restrict__ y,
                                         const float* __restrict__ bias) {
    constexpr int E = T == T_F32 ? 4 : 8;
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int r = blockIdx.x * (blockDim.x >> 5) + warp;
    if (r >= rows) return;
    const uint4* wr = (const uint4*)(W + (u64)r * row_bytes);
    int chunks = cols / E;
    // The first step's weight loads are issued before waiting for x (they
    // overlap the previous kernel under programmatic dependent launch).
    uint4 wv[MVF_UNROLL];
    mvf_first_loads(W, row_bytes, {r, 0, chunks, 0}, lane, wv);
    float yr = res_early<RES>(y, r, rows, lane);
    PDL_ENTRY();
    float acc = warp_sum(mvf_row<T, false>(wr, chunks, lane, wv, (const float4*)x));
    if (lane == 0) {
        float o = acc + (bias ? bias[r] : 0.0f);
        y[r] = RES ? yr + o : o;
    }
}

// add_norm's RMSNorm of one value (norm_val: v * finv * w, two rounded
// products, so the consumer sees the bits add_norm would have written).
__device__ __forceinline__ float rms_val(float v, float finv, float w) { return __fmul_rn(__fmul_rn(v, finv), w); }

// This thread's float4s of a row of `cols` floats (float4 i = threadIdx.x
// + k * blockDim.x, k < SV) copied from src to dst in shared memory, as one
// cp.async group.
template <int SV>
__device__ __forceinline__ void own_float4s_async(float4* dst, const float* __restrict__ src, int cols) {
#pragma unroll
    for (int k = 0; k < SV; k++) {
        int i = threadIdx.x + k * blockDim.x;
        if (i < cols / 4) cp_async16(smem_u32(dst + i), (const float4*)src + i);
    }
    cp_async_commit();
}

// The rows past a fused-norm GEMV's last whole round (rows % rstep of them)
// leave the other warps idle while they stream. Split in tp parts over tp
// warps of a block each, they take a tp-th of a round: the largest tp of
// 2 / 4 / 8 dividing the block's warps with tp such rows a warp at most and
// a step (32 x MVF_UNROLL chunks) a part at least (the 8B bf16 QKV: 6,144
// rows of 4 steps on 4,224 warps, the last 1,920 rows in halves). A row of
// one step has all its loads in flight at once: split, it lost (SmolLM2-360M
// bf16 -5.7%, its gate|up rows in quarters; NOTES.md item 114).
#define MVF_TAIL_WARPS 8
__device__ __forceinline__ int mvf_tail_parts(int rows, int rstep, int warps, int chunks) {
    int rem = rows % rstep, steps = (chunks + 32 * MVF_UNROLL - 1) / (32 * MVF_UNROLL), tp = 1;
    while (rem && warps <= MVF_TAIL_WARPS && 2 * tp <= warps && warps % (2 * tp) == 0 && 2 * tp <= steps &&
           (u64)rem * 2 * tp <= (u64)rstep)
        tp *= 2;
    return tp;
}

// Barrier 1 + g (g < MVF_TAIL_WARPS / 2; 0 is __syncthreads') for
// `threads` threads of the block. Constant ids: ptxas reserves all 16 of a
// block's barriers for a computed one.
__device__ __forceinline__ void tail_barrier(int g, int threads) {
    switch (g) {
    case 0: asm volatile("bar.sync 1, %0;" ::"r"(threads) : "memory"); break;
    case 1: asm volatile("bar.sync 2, %0;" ::"r"(threads) : "memory"); break;
    case 2: asm volatile("bar.sync 3, %0;" ::"r"(threads) : "memory"); break;
    default: asm volatile("bar.sync 4, %0;" ::"r"(threads) : "memory"); break;
    }
}

#define MVFN_THREADS 256
// CudaOptions::fuse_norm for float weights (NOTES.md items 31, 71): mvf_impl
// with the layer's RMSNorm inside. x is the residual stream (cols <=
// AN_THREADS * AN_V): the block stages x * w (w the norm's weights) once in
// shared memory, its warps read it there as mvf_impl reads x from L1, and a
// row's sum is scaled by 1 / rms at its end: the norm's f64 chain (the
// block's sum of squares, then the division) is off the path to the first
// dot products. A grid of what fits resident, each warp taking rows r, r +
// rstep, ..., the next row's first loads issued before this one's reduction.
// POST (post-norm layers, Gemma 3): x is first x + post_norm(yp; pw), as
// add_norm would have made it (post_add's roundings; y's f64 sum of squares
// in this block's order, not add_norm's), written to xo by block 0.
// GLU (pre-norm, the gate|up product of a gated FFN, rows = 2 * inter):
// act_mul's work too. Warps 2p and 2p + 1 of a block take gate row i and up
// row inter + i of the same pairs i; the up warp hands its value to the gate
// warp through shared memory, which writes y[i] = act(gate) * up as act_mul
// does (the same bits).
template <int T, bool POST = false, bool GLU = false>
__device__ __forceinline__ void mvfn_impl(const u8* __restrict__ W, u64 row_bytes, int rows, int cols,
                                          const float* __restrict__ x, float* __restrict__ y,
                                          const float* __restrict__ bias, const float* __restrict__ nw,
                                          float eps, const float* __restrict__ yp = nullptr,
                                          const float* __restrict__ pw = nullptr, float* __restrict__ xo = nullptr,
                                          int act = 0) {
    __shared__ float4 sx[AN_THREADS * AN_V / 4];
    __shared__ double part[32];
    constexpr int E = T == T_F32 ? 4 : 8;
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int r = blockIdx.x * (blockDim.x >> 5) + warp, rstep = gridDim.x * (blockDim.x >> 5);
    if constexpr (GLU) {
        // Items are pairs; the up warp's rows and biases start inter rows on.
        r = blockIdx.x * (blockDim.x >> 6) + (warp >> 1);
        rstep = gridDim.x * (blockDim.x >> 6);
        rows >>= 1;
        if (warp & 1) {
            W += (u64)rows * row_bytes;
            if (bias) bias += rows;
        }
    }
    int chunks = cols / E;
    // Work items r, r + rstep, ...: whole rows below `whole`, then the tail
    // rows' parts (mvf_tail_parts).
    int tp = GLU ? 1 : mvf_tail_parts(rows, rstep, blockDim.x >> 5, chunks);
    int whole = rows - (tp > 1 ? rows % rstep : 0), end = whole + (rows - whole) * tp;
    uint4 wv[MVF_UNROLL];
    if (r < end) mvf_first_loads(W, row_bytes, mvf_piece(r, whole, tp, chunks), lane, wv);
    // The norm's weights (a load-time table) before the wait, all of a
    // thread's at once: float4 i = threadIdx.x + k * blockDim.x (blockDim.x
    // >= MVFN_THREADS covers the row).
    constexpr int SV = AN_THREADS * AN_V / 4 / MVFN_THREADS;
    float4 gs[SV];
#pragma unroll
    for (int k = 0; k < SV; k++) {
        int i = threadIdx.x + k * blockDim.x;
        if (i < cols / 4) gs[k] = __ldg((const float4*)nw + i);
    }
    // POST: the post-norm's weights (also a load-time table) and then y go
    // to shared memory, each thread copying the float4s it uses (sx holds y
    // until this thread overwrites its own values with x * w), so the
    // staging takes no registers beyond x's.
    __shared__ float4 spw[POST ? AN_THREADS * AN_V / 4 : 1];
    if constexpr (POST) own_float4s_async<SV>(spw, pw, cols);
    PDL_ENTRY();
    if constexpr (POST) own_float4s_async<SV>(sx, yp, cols);
    float4 xs[SV];
#pragma unroll
    for (int k = 0; k < SV; k++) {
        int i = threadIdx.x + k * blockDim.x;
        xs[k] = i < cols / 4 ? __ldg((const float4*)x + i) : make_float4(0.f, 0.f, 0.f, 0.f);
    }
    if constexpr (POST) {
        cp_async_wait<0>();
        double ysq = 0.0;
#pragma unroll
        for (int k = 0; k < SV; k++) {
            int i = threadIdx.x + k * blockDim.x;
            float4 v = i < cols / 4 ? sx[i] : make_float4(0.f, 0.f, 0.f, 0.f);
            ysq += (double)v.x * v.x + (double)v.y * v.y + (double)v.z * v.z + (double)v.w * v.w;
        }
        ysq = warp_sum_d(ysq);
        if (lane == 0) part[warp] = ysq;
        __syncthreads();
        // Its barrier after thread 0's read frees `part` for x's sum below.
        float pinv = (float)parts_inv_rms(part, blockDim.x >> 5, cols, eps);
#pragma unroll
        for (int k = 0; k < SV; k++) {
            int i = threadIdx.x + k * blockDim.x;
            if (i < cols / 4) {
                float4 v = sx[i], w = spw[i];
                xs[k] = make_float4(post_add(xs[k].x, v.x, pinv, w.x), post_add(xs[k].y, v.y, pinv, w.y),
                                    post_add(xs[k].z, v.z, pinv, w.z), post_add(xs[k].w, v.w, pinv, w.w));
                if (blockIdx.x == 0) ((float4*)xo)[i] = xs[k];
            }
        }
    }
    double ssq = 0.0;
#pragma unroll
    for (int k = 0; k < SV; k++) {
        int i = threadIdx.x + k * blockDim.x;
        if (i < cols / 4)
            sx[i] = make_float4(__fmul_rn(xs[k].x, gs[k].x), __fmul_rn(xs[k].y, gs[k].y),
                                __fmul_rn(xs[k].z, gs[k].z), __fmul_rn(xs[k].w, gs[k].w));
        ssq += (double)xs[k].x * xs[k].x + (double)xs[k].y * xs[k].y + (double)xs[k].z * xs[k].z +
               (double)xs[k].w * xs[k].w;
    }
    ssq = warp_sum_d(ssq);
    if (lane == 0) part[warp] = ssq;
    __syncthreads();
    tl_mark(1);
    float finv = 0.0f;
    bool scaled = false;
    int glu_round = 0;
    while (r < whole) {
        float acc = mvf_row<T, true>((const uint4*)(W + (u64)r * row_bytes), chunks, lane, wv, sx);
        int rn = r + rstep;
        if (rn < end) mvf_first_loads(W, row_bytes, mvf_piece(rn, whole, tp, chunks), lane, wv);
        acc = warp_sum(acc);
        float v = 0.0f;
        if (lane == 0) {
            // Once a warp, after its first row's next loads have issued.
            if (!scaled) finv = (float)parts_inv(part, blockDim.x >> 5, cols, eps);
            scaled = true;
            v = __fmul_rn(acc, finv) + (bias ? bias[r] : 0.0f);
            if (!GLU) y[r] = v;
        }
        if constexpr (GLU) {
            // Two slots a pair by round: the up warp writes round k + 2's only after the
            // barrier of round k + 1, which the gate warp reaches after reading round k's.
            __shared__ float up[2][MVF_TAIL_WARPS / 2];
            if (lane == 0 && (warp & 1)) up[glu_round & 1][warp >> 1] = v;
            tail_barrier(warp >> 1, 64);
            if (lane == 0 && !(warp & 1)) y[r] = activate(act, v) * up[glu_round & 1][warp >> 1];
            glu_round++;
        }
        r = rn;
    }
    if (r < end) {
        // A tail row's parts are tp consecutive warps of this block, summed
        // in part order by the first: the same bits whichever ends first.
        __shared__ float tail_sum[MVF_TAIL_WARPS];
        MvfPiece pc = mvf_piece(r, whole, tp, chunks);
        const uint4* wr = (const uint4*)(W + (u64)pc.row * row_bytes) + pc.lo;
        float acc = warp_sum(mvf_row<T, true>(wr, pc.hi - pc.lo, lane, wv, sx + pc.lo * (E / 4)));
        if (lane == 0 && pc.part) tail_sum[warp] = acc;
        tail_barrier(warp / tp, 32 * tp);
        if (lane == 0 && pc.part == 0) {
            for (int k = 1; k < tp; k++) acc += tail_sum[warp + k];
            if (!scaled) finv = (float)parts_inv(part, blockDim.x >> 5, cols, eps);
            y[pc.row] = __fmul_rn(acc, finv) + (bias ? bias[pc.row] : 0.0f);
        }
    }
    tl_mark(2);
}

// mvf_* and its fused-norm (mvfn_*, mvfnq_* behind a post-norm, mvfg_* doing
// act_mul's work too) and residual (mvfr_*) versions. mvfnq takes 83
// registers, three blocks an SM; held to four (64, spilling 48 bytes)
// Gemma-3-1B bf16 lost its gain (NOTES.md item 83).
#define MVF(TNAME, T)                                                                              \
    extern "C" __global__ void mvf_##TNAME(const u8* W, u64 row_bytes, int rows, int cols,          \
                                           const float* x, float* y, const float* bias) {           \
        mvf_impl<T>(W, row_bytes, rows, cols, x, y, bias);                                          \
    }                                                                                              \
    extern "C" __global__ void mvfn_##TNAME(const u8* W, u64 row_bytes, int rows, int cols,         \
                                            const float* x, float* y, const float* bias,            \
                                            const float* nw, float eps) {                           \
        mvfn_impl<T>(W, row_bytes, rows, cols, x, y, bias, nw, eps);                                \
    }                                                                                              \
    extern "C" __global__ void mvfr_##TNAME(const u8* W, u64 row_bytes, int rows, int cols,         \
                                            const float* x, float* y, const float* bias) {          \
        mvf_impl<T, true>(W, row_bytes, rows, cols, x, y, bias);                                    \
    }                                                                                              \
    extern "C" __global__ void mvfnq_##TNAME(const u8* W, u64 row_bytes, int rows, int cols,        \
                                             const float* x, float* y, const float* bias,           \
                                             const float* nw, float eps, const float* yp,           \
                                             const float* pw, float* xo) {                          \
        mvfn_impl<T, true>(W, row_bytes, rows, cols, x, y, bias, nw, eps, yp, pw, xo);              \
    }                                                                                              \
    extern "C" __global__ void mvfg_##TNAME(const u8* W, u64 row_bytes, int rows, int cols,         \
                                            const float* x, float* y, const float* bias,            \
                                            const float* nw, float eps, int act) {                  \
        mvfn_impl<T, false, true>(W, row_bytes, rows, cols, x, y, bias, nw, eps, nullptr, nullptr,  \
                                  nullptr, act);                                                   \
    }

MVF(f32, T_F32)
MVF(f16, T_F16)
MVF(bf16, T_BF16)

// ---- 8-bit activations

// x: nblocks blocks of 32 floats -> q (int8), d, s = d * Σq.
// grid: ceil(nblocks / 8); block: 256 (a warp per block).
extern "C" __global__ void quantize_q8(const float* __restrict__ x, int nblocks, i8* __restrict__ q,
                                       float* __restrict__ d, float* __restrict__ s) { PDL_ENTRY();
    int b = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    if (b >= nblocks) return;
    quant_q8_warp(x[(u64)b * 32 + lane], lane, (u64)b, q, d, s);
}

// A block of 32 8-bit activations (two 16-byte words) as 8 words.
__device__ __forceinline__ void xq_words(int4 a, int4 c, int* xv) {
    xv[0] = a.x;
    xv[1] = a.y;
    xv[2] = a.z;
    xv[3] = a.w;
    xv[4] = c.x;
    xv[5] = c.y;
    xv[6] = c.z;
    xv[7] = c.w;
}

// Block b of the 8-bit activations (32 values) as 8 words.
__device__ __forceinline__ void ld_xq(const i8* __restrict__ xq, u64 b, int* xv) {
    const int4* p = (const int4*)(xq + b * 32);
    xq_words(__ldg(p), __ldg(p + 1), xv);
}

// Σ over unit u of a row: w · x, where x = dx * xv (xv: the unit's 32 int8
// activations as 8 words) and sx = dx * Σ xv.
template <int T>
__device__ __forceinline__ float qdot(const u8* __restrict__ row, int u, int cols, const int* xv, float dx, float sx);

// The integer dot product of a Q4_0 block's 32 4-bit values (word i's
// byte j: value 4 i + j in its low nibble, 16 + 4 i + j in its high one)
// with x's 8 words, each high nibble shifted down first.
__device__ __forceinline__ int nib_dot_shift(const u32* a, const int* xv) {
    int s = 0;
#pragma unroll
    for (int i = 0; i < 4; i++) {
        s = __dp4a((int)(a[i] & 0x0f0f0f0fu), xv[i], s);
        s = __dp4a((int)((a[i] >> 4) & 0x0f0f0f0fu), xv[4 + i], s);
    }
    return s;
}

// A Q4_0 unit's sum from its scale d and integer dot product s. Rounded
// operations (no fused multiply-add): plain and repacked kernels give the same bits.
__device__ __forceinline__ float q4_0_sum(float d, int s, float dx, float sx) {
    return __fmul_rn(d, __fsub_rn(__fmul_rn(dx, (float)s), __fmul_rn(8.0f, sx)));
}

// { f16 d; u8 qs[16] }: w = d * (q - 8)
template <>
__device__ __forceinline__ float qdot<T_Q4_0>(const u8* __restrict__ row, int u, int cols, const int* xv, float dx, float sx) {
    const u8* b = row + u * 18;
    // Each word's loads beside its dot products (nib_dot_shift over loaded
    // words schedules mvq_q4_0's loads differently).
    int s = 0;
#pragma unroll
    for (int i = 0; i < 4; i++) {
        u32 v = ld_u32_a2(b + 2 + 4 * i);
        s = __dp4a((int)(v & 0x0f0f0f0fu), xv[i], s);
        s = __dp4a((int)((v >> 4) & 0x0f0f0f0fu), xv[4 + i], s);
    }
    return q4_0_sum(ld_h(b), s, dx, sx);
}

// A Q4_1 unit's sum, rounded as q4_0_sum: plain and repacked kernels give the same bits.
__device__ __forceinline__ float q4_1_sum(float d, float m, int s, float dx, float sx) {
    return __fadd_rn(__fmul_rn(__fmul_rn(d, dx), (float)s), __fmul_rn(m, sx));
}

// { f16 d; f16 m; u8 qs[16] }: w = d * q + m
template <>
__device__ __forceinline__ float qdot<T_Q4_1>(const u8* __restrict__ row, int u, int cols, const int* xv, float dx, float sx) {
    const u8* b = row + u * 20;
    int s = 0;
#pragma unroll
    for (int i = 0; i < 4; i++) {
        u32 v = *(const u32*)(b + 4 + 4 * i);
        s = __dp4a((int)(v & 0x0f0f0f0fu), xv[i], s);
        s = __dp4a((int)((v >> 4) & 0x0f0f0f0fu), xv[4 + i], s);
    }
    return q4_1_sum(ld_h(b), ld_h(b + 2), s, dx, sx);
}

// The integer dot product of a Q5_0 block's low nibbles (word i's byte j:
// value 4 i + j low, 16 + 4 i + j high) and fifth bits qh with x's 8 words.
__device__ __forceinline__ int q5_dot(const u32* a, u32 qh, const int* xv) {
    int s = 0;
#pragma unroll
    for (int i = 0; i < 4; i++) {
        s = __dp4a((int)((a[i] & 0x0f0f0f0fu) | spread4(qh >> (4 * i))), xv[i], s);
        s = __dp4a((int)(((a[i] >> 4) & 0x0f0f0f0fu) | spread4(qh >> (16 + 4 * i))), xv[4 + i], s);
    }
    return s;
}

// A Q5_0 unit's sum, rounded as q4_0_sum: plain and repacked kernels give the same bits.
__device__ __forceinline__ float q5_0_sum(float d, int s, float dx, float sx) {
    return __fmul_rn(d, __fsub_rn(__fmul_rn(dx, (float)s), __fmul_rn(16.0f, sx)));
}

// { f16 d; u32 qh; u8 qs[16] }: w = d * (q - 16)
template <>
__device__ __forceinline__ float qdot<T_Q5_0>(const u8* __restrict__ row, int u, int cols, const int* xv, float dx, float sx) {
    const u8* b = row + u * 22;
    u32 a[4];
#pragma unroll
    for (int i = 0; i < 4; i++) a[i] = ld_u32_a2(b + 6 + 4 * i);
    return q5_0_sum(ld_h(b), q5_dot(a, ld_u32_a2(b + 2), xv), dx, sx);
}

// { f16 d; f16 m; u32 qh; u8 qs[16] }: w = d * q + m; the sum rounded as
// q4_1_sum, so plain and repacked kernels give the same bits.
template <>
__device__ __forceinline__ float qdot<T_Q5_1>(const u8* __restrict__ row, int u, int cols, const int* xv, float dx, float sx) {
    const u8* b = row + u * 24;
    u32 a[4];
#pragma unroll
    for (int i = 0; i < 4; i++) a[i] = *(const u32*)(b + 8 + 4 * i);
    return q4_1_sum(ld_h(b), ld_h(b + 2), q5_dot(a, *(const u32*)(b + 4), xv), dx, sx);
}

// { f16 d; i8 qs[32] }: w = d * q
template <>
__device__ __forceinline__ float qdot<T_Q8_0>(const u8* __restrict__ row, int u, int cols, const int* xv, float dx, float sx) {
    const u8* b = row + u * 34;
    int s = 0;
#pragma unroll
    for (int i = 0; i < 8; i++) s = __dp4a((int)ld_u32_a2(b + 2 + 4 * i), xv[i], s);
    // Rounded products (no fused multiply-add): the repacked kernel gives the same bits.
    return __fmul_rn(__fmul_rn(ld_h(b), dx), (float)s);
}

// Repacked Q4_0 / Q8_0 (see quant.cu): a block's quants as QW 16-byte
// words and its f16 scale, loaded into registers (`rload`) apart from the
// arithmetic (`rdot`), so a lane can have all its blocks in flight at once.
template <int T>
struct Rq;
template <>
struct Rq<T_Q8_0R> {
    // UW: 16-byte words per lane in flight in mvqr_impl (4 beat 8, 2 and 6
    // for Q8_0: 8B layer chain 2.89 -> 2.67 ms, NOTES.md run 50).
    static constexpr int QB = 32, QW = 2, UW = 4;
};

template <>
struct Rq<T_Q4_0R> {
    static constexpr int QB = 16, QW = 1, UW = 8;
};

// Repacked Q4_1: word 0 the unit's quants, word 1's x its f16 minimum.
template <>
struct Rq<T_Q4_1R> {
    static constexpr int QW = 2, UW = 8;
};

// Repacked Q5_0: word 0 the unit's low nibbles, word 1's x its fifth bits;
// four units a lane in flight, as Q4_0R's eight 16-byte words.
template <>
struct Rq<T_Q5_0R> {
    static constexpr int QW = 2, UW = 8;
};

// Repacked Q5_1: word 0 the unit's low nibbles, word 1's x its fifth bits
// and y its f16 minimum.
template <>
struct Rq<T_Q5_1R> {
    static constexpr int QW = 2, UW = 8;
};

// Repacked Q6_K: word 0 the unit's low nibbles, word 1 its high bit pairs
// (x, y) and its two sub-block scales (z); 4 units per lane in flight, as
// the plain Q6_K kernel found best.
template <>
struct Rq<T_Q6_KR> {
    static constexpr int QW = 2, UW = 8;
};

// Repacked Q4_K: word 0 the unit's quants, word 1 its super-block's
// header; `d` carries the unit's index in the super-block (rdot picks its
// scale and min from the header with it). Two units per lane in flight:
// micro (8B layer chain, H100) 1.70 ms against 1.97 with four and 1.92 for
// the plain layout's `mvq_q4_k` (four); the 14,336-column down projection
// 19.9 -> 14.0 µs, the other matrices within 0.3 µs.
template <>
struct Rq<T_Q4_KR> {
    static constexpr int QW = 2, UW = 4;
};

// Repacked Q5_K: as Q4_KR, and word 2's x the unit's fifth bits.
template <>
struct Rq<T_Q5_KR> {
    static constexpr int QW = 3, UW = 6;
};

// Repacked Q2_K: x / y the unit's 2-bit words, z its two scale bytes, w its
// super-block's d and dmin. Four units a lane in flight, as Q4_0R.
template <>
struct Rq<T_Q2_KR> {
    static constexpr int QW = 1, UW = 4;
};

// Repacked Q3_K: word 0 the super-block's header, word 1 the unit's 2-bit
// words (x, y) and high-bit word (z); `d` carries the unit's index in the
// super-block, as Q4_KR's. Two units a lane in flight, as Q4_KR.
template <>
struct Rq<T_Q3_KR> {
    static constexpr int QW = 2, UW = 4;
};

template <int T>
__device__ __forceinline__ void rload(const u8* __restrict__ row, int u, int cols, uint4* q, u16* d) {
    const u8* p = r8_q<Rq<T>::QB>(row, u);
#pragma unroll
    for (int i = 0; i < Rq<T>::QW; i++) q[i] = ld_stream16(p + 16 * i);
    *d = ld_u16(r8_dp<Rq<T>::QB>(row, u));
}

// Unit u0 + 32 k of a row (u0 + 32 k sits 4 k runs or super-blocks past
// u0): for the layouts where that is a constant number of bytes, the
// address is u0's plus an immediate (ptxas otherwise redoes the 64-bit
// address arithmetic for every unit).
template <int T>
__device__ __forceinline__ void rload_k(const u8* __restrict__ row, int u0, int k, int cols, uint4* q, u16* d);

// 8 bytes from global memory, not kept in L1.
template <bool LINE = false>
__device__ __forceinline__ uint2 ld_stream8(const void* p) {
    uint2 v;
    if constexpr (LINE)
        asm("ld.global.nc.L1::no_allocate.L2::128B.v2.u32 {%0, %1}, [%2];" : "=r"(v.x), "=r"(v.y) : "l"(p));
    else
        asm("ld.global.nc.L1::no_allocate.v2.u32 {%0, %1}, [%2];" : "=r"(v.x), "=r"(v.y) : "l"(p));
    return v;
}

// Unit u + 32 k of a repacked Q6_K row: its fields k runs (Q6KR_RUN k
// bytes) past unit u's, its super-block's d 4 k super-blocks on (rload and
// rload_k).
__device__ __forceinline__ void q6kr_load(const u8* __restrict__ row, int u, int k, int cols, uint4* q, u16* d) {
    q[0] = ld_stream16<true>(q6kr_lo(row, u) + Q6KR_RUN * k);
    uint2 h = ld_stream8<true>(q6kr_hi(row, u) + Q6KR_RUN * k);
    q[1] = make_uint4(h.x, h.y, ld_u16(q6kr_sc(row, u) + Q6KR_RUN * k), 0u);
    *d = ld_u16(q6kr_dp(row, (u >> 3) + 4 * k, cols >> 8));
}

template <>
__device__ __forceinline__ void rload<T_Q6_KR>(const u8* __restrict__ row, int u, int cols, uint4* q, u16* d) {
    q6kr_load(row, u, 0, cols, q, d);
}

template <>
__device__ __forceinline__ void rload<T_Q4_KR>(const u8* __restrict__ row, int u, int cols, uint4* q, u16* d) {
    const u8* b = row + (u >> 3) * 144;
    q[0] = ld_stream16<true>(b + 16 + 16 * (u & 7));
    q[1] = ld_stream16<true>(b);
    *d = (u16)(u & 7);
}

// 4 bytes from global memory, not kept in L1.
template <bool LINE = false>
__device__ __forceinline__ u32 ld_stream4(const void* p) {
    u32 v;
    if constexpr (LINE)
        asm("ld.global.nc.L1::no_allocate.L2::128B.u32 %0, [%1];" : "=r"(v) : "l"(p));
    else
        asm("ld.global.nc.L1::no_allocate.u32 %0, [%1];" : "=r"(v) : "l"(p));
    return v;
}

template <>
__device__ __forceinline__ void rload<T_Q5_KR>(const u8* __restrict__ row, int u, int cols, uint4* q, u16* d) {
    const u8* b = row + (u >> 3) * 176;
    q[0] = ld_stream16<true>(b + 16 + 16 * (u & 7));
    q[1] = ld_stream16<true>(b);
    q[2] = make_uint4(ld_stream4<true>(b + 144 + 4 * (u & 7)), 0u, 0u, 0u);
    *d = (u16)(u & 7);
}

// Unit u + 32 k of a repacked Q2_K row: its 2-bit words, its scale bytes
// and its super-block's d / dmin (rload and rload_k). The run's address
// is formed here: passed in as a pointer, ptxas formed each k's address
// apart (mvqsr4_q2_kr 568 -> 624 instructions; tg256 -0.7-1.1%).
__device__ __forceinline__ void q2kr_load(const u8* __restrict__ row, int u, int k, uint4* q) {
    const u8* b = row + (u >> 5) * 336 + 336 * k;
    int t = u & 31;
    uint2 v = ld_stream8<true>(b + 8 * t);
    q[0] = make_uint4(v.x, v.y, (u32)ld_u16(b + 256 + 2 * t), ld_stream4<true>(b + 320 + 4 * (t >> 3)));
}

// Unit j of the repacked Q3_K super-block at b: the header, then its 2-bit
// words and high-bit word.
__device__ __forceinline__ void q3kr_load(const u8* b, int j, uint4* q) {
    q[0] = ld_stream16<true>(b);
    uint2 v = ld_stream8<true>(b + 16 + 8 * j);
    q[1] = make_uint4(v.x, v.y, ld_stream4<true>(b + 80 + 4 * j), 0u);
}

template <>
__device__ __forceinline__ void rload<T_Q2_KR>(const u8* __restrict__ row, int u, int cols, uint4* q, u16* d) {
    q2kr_load(row, u, 0, q);
    *d = 0;
}

template <>
__device__ __forceinline__ void rload<T_Q3_KR>(const u8* __restrict__ row, int u, int cols, uint4* q, u16* d) {
    q3kr_load(row + (u >> 3) * 112, u & 7, q);
    *d = (u16)(u & 7);
}

// Unit u of a run layout with an HB-byte second field (Q5_0R's fifth bits,
// 4 bytes; Q4_1R's minimum, 2; Q5_1R's minimum and fifth bits, 6), `off`
// bytes further on: its quants, the field in q[1] (fifth bits or minimum
// in x; Q5_1R: fifth bits in x, minimum in y) and its scale.
template <int HB>
__device__ __forceinline__ void r8h_load(const u8* __restrict__ row, int u, int off, uint4* q, u16* d) {
    q[0] = ld_stream16(r8_q<16, HB>(row, u) + off);
    const u8* h = r8_hp<16, HB>(row, u) + off;
    if (HB == 6)
        q[1] = make_uint4(ld_u32_a2(h + 2), (u32)ld_u16(h), 0u, 0u);
    else
        q[1] = make_uint4(HB == 4 ? ld_stream4(h) : (u32)ld_u16(h), 0u, 0u, 0u);
    *d = ld_u16(r8_dp<16, HB>(row, u) + off);
}

template <>
__device__ __forceinline__ void rload<T_Q5_0R>(const u8* __restrict__ row, int u, int cols, uint4* q, u16* d) {
    r8h_load<4>(row, u, 0, q, d);
}

template <>
__device__ __forceinline__ void rload<T_Q4_1R>(const u8* __restrict__ row, int u, int cols, uint4* q, u16* d) {
    r8h_load<2>(row, u, 0, q, d);
}

template <>
__device__ __forceinline__ void rload<T_Q5_1R>(const u8* __restrict__ row, int u, int cols, uint4* q, u16* d) {
    r8h_load<6>(row, u, 0, q, d);
}

template <int T>
__device__ __forceinline__ void rload_k(const u8* __restrict__ row, int u0, int k, int cols, uint4* q, u16* d) {
    rload<T>(row, u0 + 32 * k, cols, q, d);
}
// The lane's pointers are taken once (u0's), each unit's loads at a
// constant offset from them: 32 k units (Q4_0R), or 4 k runs or
// super-blocks past u0. (Q8_0R keeps rload: its mvq_q8_0r lost 4-6% this
// way, NOTES.md item 72.)
// Repacked Q4_0 (flat): unit u + 32 k, 512 quant and 64 scale bytes past
// unit u's (rload and rload_k; T_Q4_0RS too).
__device__ __forceinline__ void q4f_load(const u8* __restrict__ row, int u, int k, int cols, uint4* q, u16* d) {
    q[0] = ld_stream16(q4f_q(row, u) + 512 * k);
    *d = ld_u16(q4f_dp(row, u, cols) + 64 * k);
}
template <>
__device__ __forceinline__ void rload<T_Q4_0R>(const u8* __restrict__ row, int u, int cols, uint4* q, u16* d) {
    q4f_load(row, u, 0, cols, q, d);
}
template <>
__device__ __forceinline__ void rload_k<T_Q4_0R>(const u8* __restrict__ row, int u0, int k, int cols, uint4* q, u16* d) {
    q4f_load(row, u0, k, cols, q, d);
}
template <>
__device__ __forceinline__ void rload_k<T_Q4_1R>(const u8* __restrict__ row, int u0, int k, int cols, uint4* q, u16* d) {
    r8h_load<2>(row, u0, 4 * 8 * (16 + 2 + 2) * k, q, d);
}
template <>
__device__ __forceinline__ void rload_k<T_Q5_0R>(const u8* __restrict__ row, int u0, int k, int cols, uint4* q, u16* d) {
    r8h_load<4>(row, u0, 4 * 8 * (16 + 4 + 2) * k, q, d);
}
template <>
__device__ __forceinline__ void rload_k<T_Q5_1R>(const u8* __restrict__ row, int u0, int k, int cols, uint4* q, u16* d) {
    r8h_load<6>(row, u0, 4 * 8 * (16 + 6 + 2) * k, q, d);
}
template <>
__device__ __forceinline__ void rload_k<T_Q4_KR>(const u8* __restrict__ row, int u0, int k, int cols, uint4* q, u16* d) {
    const u8* b = row + (u0 >> 3) * 144;
    const u8* pq = b + 16 + 16 * (u0 & 7);
    q[0] = ld_stream16<true>(pq + 4 * 144 * k);
    q[1] = ld_stream16<true>(b + 4 * 144 * k);
    *d = (u16)(u0 & 7);
}
template <>
__device__ __forceinline__ void rload_k<T_Q6_KR>(const u8* __restrict__ row, int u0, int k, int cols, uint4* q, u16* d) {
    q6kr_load(row, u0, k, cols, q, d);
}
template <>
__device__ __forceinline__ void rload_k<T_Q2_KR>(const u8* __restrict__ row, int u0, int k, int cols, uint4* q, u16* d) {
    q2kr_load(row, u0, k, q);
    *d = 0;
}
template <>
__device__ __forceinline__ void rload_k<T_Q3_KR>(const u8* __restrict__ row, int u0, int k, int cols, uint4* q, u16* d) {
    q3kr_load(row + (u0 >> 3) * 112 + 4 * 112 * k, u0 & 7, q);
    *d = (u16)(u0 & 7);
}
template <>
__device__ __forceinline__ void rload_k<T_Q5_KR>(const u8* __restrict__ row, int u0, int k, int cols, uint4* q, u16* d) {
    const u8* b = row + (u0 >> 3) * 176;
    const u8* pq = b + 16 + 16 * (u0 & 7);
    const u8* ph = b + 144 + 4 * (u0 & 7);
    q[0] = ld_stream16<true>(pq + 4 * 176 * k);
    q[1] = ld_stream16<true>(b + 4 * 176 * k);
    q[2] = make_uint4(ld_stream4<true>(ph + 4 * 176 * k), 0u, 0u, 0u);
    *d = (u16)(u0 & 7);
}

template <int T>
__device__ __forceinline__ float rdot(const uint4* q, u16 d, const int* xv, float dx, float sx);

template <>
__device__ __forceinline__ float rdot<T_Q8_0R>(const uint4* q, u16 d, const int* xv, float dx, float sx) {
    int a[8] = {(int)q[0].x, (int)q[0].y, (int)q[0].z, (int)q[0].w,
                (int)q[1].x, (int)q[1].y, (int)q[1].z, (int)q[1].w};
    int s = 0;
#pragma unroll
    for (int i = 0; i < 8; i++) s = __dp4a(a[i], xv[i], s);
    return __fmul_rn(__fmul_rn(h2f(d), dx), (float)s);
}

// The integer dot product of 32 4-bit values stored as in repacked Q4_0
// and Q4_K (byte i: values i, low nibble, and i + 16) with x's 8 words.
// The high nibbles stay in place (16 q, unsigned bytes) and the sum is
// divided by 16 at the end, exactly: a mask where a shift and a mask were.
__device__ __forceinline__ int dp4a_us(u32 a, int b, int c) {
    int d;
    asm("dp4a.u32.s32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
    return d;
}
__device__ __forceinline__ int nib_dot(const uint4& q, const int* xv) {
    u32 a[4] = {q.x, q.y, q.z, q.w};
    int s = 0, h = 0;
#pragma unroll
    for (int i = 0; i < 4; i++) {
        s = __dp4a((int)(a[i] & 0x0f0f0f0fu), xv[i], s);
        h = dp4a_us(a[i] & 0xf0f0f0f0u, xv[4 + i], h);
    }
    return s + (h >> 4);
}

template <>
__device__ __forceinline__ float rdot<T_Q4_0R>(const uint4* q, u16 d, const int* xv, float dx, float sx) {
    return q4_0_sum(h2f(d), nib_dot(q[0], xv), dx, sx);
}

template <>
__device__ __forceinline__ float rdot<T_Q4_1R>(const uint4* q, u16 d, const int* xv, float dx, float sx) {
    return q4_1_sum(h2f(d), h2f((u16)q[1].x), nib_dot(q[0], xv), dx, sx);
}

template <>
__device__ __forceinline__ float rdot<T_Q5_0R>(const uint4* q, u16 d, const int* xv, float dx, float sx) {
    u32 a[4] = {q[0].x, q[0].y, q[0].z, q[0].w};
    return q5_0_sum(h2f(d), q5_dot(a, q[1].x, xv), dx, sx);
}

template <>
__device__ __forceinline__ float rdot<T_Q5_1R>(const uint4* q, u16 d, const int* xv, float dx, float sx) {
    u32 a[4] = {q[0].x, q[0].y, q[0].z, q[0].w};
    return q4_1_sum(h2f(d), h2f((u16)q[1].y), q5_dot(a, q[1].x, xv), dx, sx);
}

// Repacked Q4_0 summed with nib_dot_shift (nib_dot's earlier form; the same
// integers, so the same bits): the plain streaming kernel of rows where a
// lane holds four units, where it holds two registers more and gives the 8B
// Q4_0 with fuse_norm off 449 -> 461 tok/s (NOTES.md item 73). A kernel type
// id of its own, outside ggml's.
#define T_Q4_0RS (T_Q4_0R + 100)
template <>
struct Rq<T_Q4_0RS> : Rq<T_Q4_0R> {};
template <>
__device__ __forceinline__ void rload<T_Q4_0RS>(const u8* __restrict__ row, int u, int cols, uint4* q, u16* d) {
    q4f_load(row, u, 0, cols, q, d);
}
template <>
__device__ __forceinline__ float rdot<T_Q4_0RS>(const uint4* q, u16 d, const int* xv, float dx, float sx) {
    u32 a[4] = {q[0].x, q[0].y, q[0].z, q[0].w};
    return q4_0_sum(h2f(d), nib_dot_shift(a, xv), dx, sx);
}

// The integer sums and the float arithmetic of qdot<T_Q6_K>.
template <>
__device__ __forceinline__ float rdot<T_Q6_KR>(const uint4* q, u16 d, const int* xv, float dx, float sx) {
    u32 l[4] = {q[0].x, q[0].y, q[0].z, q[0].w};
    u32 h0 = q[1].x, h1 = q[1].y, sc = q[1].z;
    int s0 = 0, s1 = 0;
#pragma unroll
    for (int k = 0; k < 4; k++) {
        u32 a = (l[k] & 0x0f0f0f0fu) | (((h0 >> (2 * k)) & 0x03030303u) << 4);
        u32 b = ((l[k] >> 4) & 0x0f0f0f0fu) | (((h1 >> (2 * k)) & 0x03030303u) << 4);
        s0 = __dp4a((int)__vsub4(a, 0x20202020u), xv[k], s0);
        s1 = __dp4a((int)__vsub4(b, 0x20202020u), xv[4 + k], s1);
    }
    int sc0 = (int)(i8)(sc & 0xff), sc1 = (int)(i8)(sc >> 8);
    return h2f(d) * dx * (float)(sc0 * s0 + sc1 * s1);
}

// A Q4_K / Q5_K unit's sum from its integer dot product s (plain and
// repacked: one expression, so the same bits).
__device__ __forceinline__ float k4_sum(float d, float dmin, int sc, int m, int s, float dx, float sx) {
    return d * (float)sc * dx * (float)s - dmin * (float)m * sx;
}

// k4_sum for unit j of a repacked Q4_K / Q5_K super-block from its header.
__device__ __forceinline__ float k4_hsum(const uint4& h, int j, int s, float dx, float sx) {
    int sc, m;
    k4_hscale(h, j, sc, m);
    return k4_sum(h2f((u16)(h.x & 0xffff)), h2f((u16)(h.x >> 16)), sc, m, s, dx, sx);
}

template <>
__device__ __forceinline__ float rdot<T_Q4_KR>(const uint4* q, u16 d, const int* xv, float dx, float sx) {
    return k4_hsum(q[1], d, nib_dot(q[0], xv), dx, sx);
}

// The fifth bits of word k's 4 values: spread4 of bits 4k..4k+3 (low
// nibbles, values 0-15) and 16+4k.. (high nibbles, values 16-31).
template <>
__device__ __forceinline__ float rdot<T_Q5_KR>(const uint4* q, u16 d, const int* xv, float dx, float sx) {
    u32 a[4] = {q[0].x, q[0].y, q[0].z, q[0].w};
    u32 h = q[2].x;
    int s = 0;
#pragma unroll
    for (int i = 0; i < 4; i++) {
        s = __dp4a((int)((a[i] & 0x0f0f0f0fu) | spread4(h >> (4 * i))), xv[i], s);
        s = __dp4a((int)(((a[i] >> 4) & 0x0f0f0f0fu) | spread4(h >> (16 + 4 * i))), xv[4 + i], s);
    }
    return k4_hsum(q[1], d, s, dx, sx);
}

// The integer sums of a unit's two 16-value halves (dp4a words 0-3 and
// 4-7, word k from word(k)) with x's 8 words.
template <typename W>
__device__ __forceinline__ void half_dots(W word, const int* xv, int& s0, int& s1) {
    s0 = s1 = 0;
#pragma unroll
    for (int k = 0; k < 8; k++) {
        if (k < 4)
            s0 = __dp4a((int)word(k), xv[k], s0);
        else
            s1 = __dp4a((int)word(k), xv[k], s1);
    }
}

// A Q2_K unit's sum from its halves' sums s0, s1 and scale bytes sc0, sc1
// (scale low, minimum high): the minimum's term takes the sum of the 8-bit
// x of each half (as llama.cpp's Q2_K dot does), not xs. Plain and repacked
// kernels share it, so they give the same bits.
__device__ __forceinline__ float q2k_sum(float d, float dmin, int sc0, int sc1, int s0, int s1, const int* xv,
                                         float dx) {
    int m0, m1;
    half_dots([](int) { return 0x01010101u; }, xv, m0, m1);
    float sd = (float)((sc0 & 15) * s0 + (sc1 & 15) * s1);
    float sm = (float)((sc0 >> 4) * m0 + (sc1 >> 4) * m1);
    return dx * (d * sd - dmin * sm);
}

// A Q3_K unit's sum from its halves' sums and their 6-bit scales (stored +
// 32), shared by the plain and repacked kernels.
__device__ __forceinline__ float q3k_sum(float d, int sc0, int sc1, int s0, int s1, float dx) {
    return d * dx * (float)((sc0 - 32) * s0 + (sc1 - 32) * s1);
}

template <>
__device__ __forceinline__ float rdot<T_Q2_KR>(const uint4* q, u16 d, const int* xv, float dx, float sx) {
    int s0, s1;
    half_dots([&](int k) { return q3kr_word(q[0].x, q[0].y, 0u, k); }, xv, s0, s1);
    return q2k_sum(h2f((u16)(q[0].w & 0xffff)), h2f((u16)(q[0].w >> 16)), q[0].z & 255, (q[0].z >> 8) & 255, s0,
                   s1, xv, dx);
}

template <>
__device__ __forceinline__ float rdot<T_Q3_KR>(const uint4* q, u16 d, const int* xv, float dx, float sx) {
    int s0, s1, sc0, sc1;
    half_dots([&](int k) { return q3kr_sword(q[1].x, q[1].y, q[1].z, k); }, xv, s0, s1);
    q3kr_scales(q[0], d, sc0, sc1);
    return q3k_sum(h2f((u16)(q[0].w & 0xffff)), sc0, sc1, s0, s1, dx);
}

// qdot of a repacked type: its registers loaded, then rdot.
template <int T>
__device__ __forceinline__ float rqdot(const u8* __restrict__ row, int u, int cols, const int* xv, float dx, float sx) {
    uint4 q[Rq<T>::QW];
    u16 d;
    rload<T>(row, u, cols, q, &d);
    return rdot<T>(q, d, xv, dx, sx);
}

template <>
__device__ __forceinline__ float qdot<T_Q4_0R>(const u8* __restrict__ row, int u, int cols, const int* xv, float dx, float sx) {
    return rqdot<T_Q4_0R>(row, u, cols, xv, dx, sx);
}

template <>
__device__ __forceinline__ float qdot<T_Q4_1R>(const u8* __restrict__ row, int u, int cols, const int* xv, float dx, float sx) {
    return rqdot<T_Q4_1R>(row, u, cols, xv, dx, sx);
}

template <>
__device__ __forceinline__ float qdot<T_Q5_0R>(const u8* __restrict__ row, int u, int cols, const int* xv, float dx, float sx) {
    return rqdot<T_Q5_0R>(row, u, cols, xv, dx, sx);
}

template <>
__device__ __forceinline__ float qdot<T_Q5_1R>(const u8* __restrict__ row, int u, int cols, const int* xv, float dx, float sx) {
    return rqdot<T_Q5_1R>(row, u, cols, xv, dx, sx);
}

template <>
__device__ __forceinline__ float qdot<T_Q8_0R>(const u8* __restrict__ row, int u, int cols, const int* xv, float dx, float sx) {
    return rqdot<T_Q8_0R>(row, u, cols, xv, dx, sx);
}

template <>
__device__ __forceinline__ float qdot<T_Q6_KR>(const u8* __restrict__ row, int u, int cols, const int* xv, float dx, float sx) {
    return rqdot<T_Q6_KR>(row, u, cols, xv, dx, sx);
}

template <>
__device__ __forceinline__ float qdot<T_Q4_KR>(const u8* __restrict__ row, int u, int cols, const int* xv, float dx, float sx) {
    return rqdot<T_Q4_KR>(row, u, cols, xv, dx, sx);
}

template <>
__device__ __forceinline__ float qdot<T_Q5_KR>(const u8* __restrict__ row, int u, int cols, const int* xv, float dx, float sx) {
    return rqdot<T_Q5_KR>(row, u, cols, xv, dx, sx);
}

template <>
__device__ __forceinline__ float qdot<T_Q2_KR>(const u8* __restrict__ row, int u, int cols, const int* xv, float dx, float sx) {
    return rqdot<T_Q2_KR>(row, u, cols, xv, dx, sx);
}

template <>
__device__ __forceinline__ float qdot<T_Q3_KR>(const u8* __restrict__ row, int u, int cols, const int* xv, float dx, float sx) {
    return rqdot<T_Q3_KR>(row, u, cols, xv, dx, sx);
}

// get_scale_min_k4 as integers.
__device__ __forceinline__ void k4_scale_i(const u8* s, int j, int* sc, int* m) {
    if (j < 4) {
        *sc = s[j] & 63;
        *m = s[j + 4] & 63;
    } else {
        *sc = (s[j + 4] & 15) | ((s[j - 4] >> 6) << 4);
        *m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
    }
}

// { f16 d; f16 dmin; u8 scales[12]; u8 qs[128] }: w = d * sc * q - dmin * m
template <>
__device__ __forceinline__ float qdot<T_Q4_K>(const u8* __restrict__ row, int u, int cols, const int* xv, float dx, float sx) {
    const u8* b = row + (u >> 3) * 144;
    int j = u & 7;
    int sc, m;
    k4_scale_i(b + 4, j, &sc, &m);
    uint4 q0 = *(const uint4*)(b + 16 + (j >> 1) * 32);
    uint4 q1 = *(const uint4*)(b + 32 + (j >> 1) * 32);
    u32 a[8] = {q0.x, q0.y, q0.z, q0.w, q1.x, q1.y, q1.z, q1.w};
    int shift = 4 * (j & 1);
    int s = 0;
#pragma unroll
    for (int k = 0; k < 8; k++) s = __dp4a((int)((a[k] >> shift) & 0x0f0f0f0fu), xv[k], s);
    return k4_sum(ld_h(b), ld_h(b + 2), sc, m, s, dx, sx);
}

// { f16 d; f16 dmin; u8 scales[12]; u8 qh[32]; u8 qs[128] }
template <>
__device__ __forceinline__ float qdot<T_Q5_K>(const u8* __restrict__ row, int u, int cols, const int* xv, float dx, float sx) {
    const u8* b = row + (u >> 3) * 176;
    int j = u & 7;
    int sc, m;
    k4_scale_i(b + 4, j, &sc, &m);
    uint4 q0 = *(const uint4*)(b + 48 + (j >> 1) * 32);
    uint4 q1 = *(const uint4*)(b + 64 + (j >> 1) * 32);
    uint4 h0 = *(const uint4*)(b + 16);
    uint4 h1 = *(const uint4*)(b + 32);
    u32 a[8] = {q0.x, q0.y, q0.z, q0.w, q1.x, q1.y, q1.z, q1.w};
    u32 c[8] = {h0.x, h0.y, h0.z, h0.w, h1.x, h1.y, h1.z, h1.w};
    int shift = 4 * (j & 1);
    int s = 0;
#pragma unroll
    for (int k = 0; k < 8; k++) {
        u32 q = ((a[k] >> shift) & 0x0f0f0f0fu) | (((c[k] >> j) & 0x01010101u) << 4);
        s = __dp4a((int)q, xv[k], s);
    }
    return k4_sum(ld_h(b), ld_h(b + 2), sc, m, s, dx, sx);
}

// { u8 ql[128]; u8 qh[64]; i8 scales[16]; f16 d }: w = d * sc * (q - 32), a scale per 16 values
template <>
__device__ __forceinline__ float qdot<T_Q6_K>(const u8* __restrict__ row, int u, int cols, const int* xv, float dx, float sx) {
    const u8* b = row + (u >> 3) * 210;
    int j = u & 7;
    int half = j >> 2, jj = j & 3;
    const u8* ql = b + half * 64 + (jj & 1) * 32;
    const u8* qh = b + 128 + half * 32;
    int ls = 4 * (jj >> 1), hs = 2 * jj;
    int s0 = 0, s1 = 0;
#pragma unroll
    for (int k = 0; k < 8; k++) {
        u32 lv = ld_u32_a2(ql + 4 * k), hv = ld_u32_a2(qh + 4 * k);
        u32 q = ((lv >> ls) & 0x0f0f0f0fu) | (((hv >> hs) & 0x03030303u) << 4);
        int qs = (int)__vsub4(q, 0x20202020u);
        if (k < 4)
            s0 = __dp4a(qs, xv[k], s0);
        else
            s1 = __dp4a(qs, xv[k], s1);
    }
    int sc0 = (int)(i8)b[192 + 2 * j], sc1 = (int)(i8)b[193 + 2 * j];
    return ld_h(b + 208) * dx * (float)(sc0 * s0 + sc1 * s1);
}

// { u8 hmask[32]; u8 qs[64]; u8 scales[12]; f16 d }: w = d * (sc - 32) * q,
// q = the 2-bit value + 4 * its hmask bit - 4, a 6-bit scale per 16 values.
// Unit j of a super-block: qs bytes 32 (j / 4) + l shifted by 2 (j % 4),
// hmask bit j of byte l (as unit<T_Q3_K>).
template <>
__device__ __forceinline__ float qdot<T_Q3_K>(const u8* __restrict__ row, int u, int cols, const int* xv, float dx, float sx) {
    const u8* b = row + (u >> 3) * 110;
    int j = u & 7;
    const u8* qs = b + 32 + (j >> 2) * 32;
    int shift = 2 * (j & 3);
    int s0, s1;
    half_dots(
        [&](int k) {
            u32 lv = ld_u32_a2(qs + 4 * k), hv = ld_u32_a2(b + 4 * k);
            return __vsub4(((lv >> shift) & 0x03030303u) | (((hv >> j) & 0x01010101u) << 2), 0x04040404u);
        },
        xv, s0, s1);
    return q3k_sum(ld_h(b + 108), q3k_scale(b + 96, 2 * j), q3k_scale(b + 96, 2 * j + 1), s0, s1, dx);
}

// { u8 scales[16]; u8 qs[64]; f16 d; f16 dmin }: w = d * (sc & 15) * q -
// dmin * (sc >> 4), a scale byte per 16 values (q2k_sum).
template <>
__device__ __forceinline__ float qdot<T_Q2_K>(const u8* __restrict__ row, int u, int cols, const int* xv, float dx, float sx) {
    const u8* b = row + (u >> 3) * 84;
    int j = u & 7;
    const u8* qs = b + 16 + (j >> 2) * 32;
    int shift = 2 * (j & 3);
    int s0, s1;
    half_dots([&](int k) { return (ld_u32_a2(qs + 4 * k) >> shift) & 0x03030303u; }, xv, s0, s1);
    return q2k_sum(ld_h(b + 80), ld_h(b + 82), b[2 * j], b[2 * j + 1], s0, s1, xv, dx);
}

// Units per lane in flight. (Two rows per warp sharing the activation loads
// measured 5-10% slower at the 1B shape: half the warps, each longer.) Four
// for Q4_K and Q6_K: +4-5% decode (1B and 8B shapes); Q4_0 measured the same
// or 1% slower with four.
#define MVQ_UNROLL 2
template <int T>
__device__ __forceinline__ constexpr int mvq_unroll() {
    return T == T_Q4_K || T == T_Q6_K ? 4 : MVQ_UNROLL;
}

// y[r] = W[r] . x + bias[r] with x given as 8-bit blocks (xq, xd, xs), cols % 32 == 0
// (% 256 for the k-quants). grid: ceil(rows / warps); block: warps * 32.
template <int T>
__device__ __forceinline__ void mvq_impl(const u8* __restrict__ W, u64 row_bytes, int rows, int cols,
                                         const i8* __restrict__ xq, const float* __restrict__ xd,
                                         const float* __restrict__ xs, float* __restrict__ y,
                                         const float* __restrict__ bias) {
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int r = blockIdx.x * (blockDim.x >> 5) + warp;
    if (r >= rows) return;
    const u8* row = W + (u64)r * row_bytes;
    prefetch_l2(row, row_bytes, lane);
    PDL_ENTRY();
    int units = cols >> 5;
    float acc = 0.0f;
    constexpr int U = mvq_unroll<T>();
    for (int u0 = lane; u0 < units; u0 += 32 * U) {
#pragma unroll
        for (int k = 0; k < U; k++) {
            int u = u0 + 32 * k;
            if (u < units) {
                int xv[8];
                ld_xq(xq, (u64)u, xv);
                acc = __fadd_rn(acc, qdot<T>(row, u, cols, xv, __ldg(xd + u), __ldg(xs + u)));
            }
        }
    }
    acc = warp_sum(acc);
    if (lane == 0) y[r] = acc + (bias ? bias[r] : 0.0f);
}

// One token, repacked types: a lane's first Rq<T>::UW 16-byte words of
// quants (2 Q8_0 blocks, 8 Q4_0 blocks) are loaded into registers before
// waiting for x, so they overlap the previous kernel under programmatic
// dependent launch, and each later round trip brings as many again.
// Units are still summed in increasing order per lane, as in mvq_impl.
// RES: y is the residual stream, y[r] = y[r] + (W[r] . x + bias[r]) as
// add_norm adds it (CudaOptions::fuse_norm, `mvqa_*`), y[r] read early
// (res_early).
template <int T, int U = Rq<T>::UW / Rq<T>::QW, bool RES = false>
__device__ __forceinline__ void mvqr_impl(const u8* __restrict__ W, u64 row_bytes, int rows, int cols,
                                          const i8* __restrict__ xq, const float* __restrict__ xd,
                                          const float* __restrict__ xs, float* __restrict__ y,
                                          const float* __restrict__ bias) {
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int r = blockIdx.x * (blockDim.x >> 5) + warp;
    if (r >= rows) return;
    const u8* row = W + (u64)r * row_bytes;
    int units = cols >> 5;
    uint4 q[U][Rq<T>::QW];
    u16 d[U];
#pragma unroll
    for (int k = 0; k < U; k++)
        if (lane + 32 * k < units) rload_k<T>(row, lane, k, cols, q[k], &d[k]);
    float yr = res_early<RES>(y, r, rows, lane);
    PDL_ENTRY();
    float acc = 0.0f;
    for (int u0 = lane; u0 < units; u0 += 32 * U) {
        if (u0 != lane) {
#pragma unroll
            for (int k = 0; k < U; k++)
                if (u0 + 32 * k < units) rload_k<T>(row, u0, k, cols, q[k], &d[k]);
        }
#pragma unroll
        for (int k = 0; k < U; k++) {
            int u = u0 + 32 * k;
            if (u < units) {
                int xv[8];
                ld_xq(xq, (u64)u, xv);
                acc = __fadd_rn(acc, rdot<T>(q[k], d[k], xv, __ldg(xd + u), __ldg(xs + u)));
            }
        }
    }
    acc = warp_sum(acc);
    if (lane == 0) {
        float o = acc + (bias ? bias[r] : 0.0f);
        y[r] = RES ? yr + o : o;
    }
}

#define MVQR(TNAME, T)                                                                                \
    extern "C" __global__ void mvq_##TNAME(const u8* W, u64 row_bytes, int rows, int cols, const i8* xq, \
                                           const float* xd, const float* xs, float* y, const float* bias) { \
        mvqr_impl<T>(W, row_bytes, rows, cols, xq, xd, xs, y, bias);                                    \
    }

// The residual-adding version, for the fused norm's O and down products (mvqp_fused_types).
#define MVQA(TNAME, T)                                                                                \
    extern "C" __global__ void mvqa_##TNAME(const u8* W, u64 row_bytes, int rows, int cols, const i8* xq, \
                                            const float* xd, const float* xs, float* y, const float* bias) { \
        mvqr_impl<T, Rq<T>::UW / Rq<T>::QW, true>(W, row_bytes, rows, cols, xq, xd, xs, y, bias);      \
    }

#define MVQ(TNAME, T)                                                                                 \
    extern "C" __global__ void mvq_##TNAME(const u8* W, u64 row_bytes, int rows, int cols, const i8* xq, \
                                           const float* xd, const float* xs, float* y, const float* bias) { \
        mvq_impl<T>(W, row_bytes, rows, cols, xq, xd, xs, y, bias);                                     \
    }

MVQ(q4_0, T_Q4_0)
MVQ(q4_1, T_Q4_1)
MVQ(q5_0, T_Q5_0)
MVQ(q5_1, T_Q5_1)
MVQ(q8_0, T_Q8_0)
MVQR(q8_0r, T_Q8_0R)
MVQR(q5_0r, T_Q5_0R)
MVQR(q4_1r, T_Q4_1R)
MVQR(q5_1r, T_Q5_1R)
MVQ(q2_k, T_Q2_K)
MVQ(q3_k, T_Q3_K)
MVQ(q4_k, T_Q4_K)
MVQ(q5_k, T_Q5_K)
MVQ(q6_k, T_Q6_K)
MVQR(q4_0r, T_Q4_0R)
MVQR(q6_kr, T_Q6_KR)
MVQR(q4_kr, T_Q4_KR)
MVQR(q5_kr, T_Q5_KR)
MVQR(q3_kr, T_Q3_KR)
MVQR(q2_kr, T_Q2_KR)
MVQA(q4_kr, T_Q4_KR)
MVQA(q5_kr, T_Q5_KR)
MVQA(q3_kr, T_Q3_KR)
MVQA(q2_kr, T_Q2_KR)
MVQA(q6_kr, T_Q6_KR)
// Q6_KR with two units per lane in flight, for rows of at most 2,048
// columns (MVQ_NARROW_COLS in backend.rs): there a lane has at most two
// units, and mvq_q6_kr's registers for four (128 a thread) only cost
// occupancy. `cuda_check --gemv-micro`, H100, 1B shape: gate|up 13.5 -> 10.8 µs,
// qkv 3.7 -> 2.8; on rows of 8,192 columns four in flight stay faster (6.4
// against 8.5).
extern "C" __global__ void mvq2_q6_kr(const u8* W, u64 row_bytes, int rows, int cols, const i8* xq,
                                      const float* xd, const float* xs, float* y, const float* bias) {
    mvqr_impl<T_Q6_KR, 2>(W, row_bytes, rows, cols, xq, xd, xs, y, bias);
}
extern "C" __global__ void mvqa2_q6_kr(const u8* W, u64 row_bytes, int rows, int cols, const i8* xq,
                                       const float* xd, const float* xs, float* y, const float* bias) {
    mvqr_impl<T_Q6_KR, 2, true>(W, row_bytes, rows, cols, xq, xd, xs, y, bias);
}

// Streaming one-token GEMV for the repacked types (rows of at most
// MVQS_COLS): the block's 8-bit x staged once in shared memory (its warps
// read it there instead of each going to L1/L2 per unit: mvqr_impl holds
// it in registers at 96 per thread for Q4_0), a lane's first U blocks
// loaded before waiting for x, and each next chunk's loads (later in the
// row, or in the warp's next row when the grid strides) issued before the
// current row's reduction. Per lane units in increasing order, as mvq_impl:
// the same sums. Measured over the 8B shape's layer matrices (`cuda_check
// --gemv-micro`, H100): Q4_0 2.07 -> 1.60 ms per token (plain-layout
// mvq_q4_0), where reading the same bytes takes 1.37 ms; one row per warp
// beat a persistent grid. U per shape: `mvqs_kernel` in backend.rs. (Q4_K
// the same way, a lane per pair of units sharing 32 quant bytes, measured
// 3-8% slower than its mvq_q4_k: docs/BENCHMARKS.md.)
#define MVQS_COLS 16384

// 8-bit x of `cols` values into the block's shared memory: one token's (cols <=
// MVQS_COLS), or several tokens' rows back to back (mvqst_impl).
__device__ __forceinline__ void stage_xq(int4* sq, float* sd, float* ss, const i8* __restrict__ xq,
                                         const float* __restrict__ xd, const float* __restrict__ xs, int cols) {
    for (int i = threadIdx.x; i < cols / 16; i += blockDim.x) sq[i] = __ldg((const int4*)xq + i);
    for (int i = threadIdx.x; i < cols / 32; i += blockDim.x) {
        sd[i] = __ldg(xd + i);
        ss[i] = __ldg(xs + i);
    }
    __syncthreads();
}

// The decode layer's RMSNorm inside the streaming kernel (blockDim.x ==
// AN_THREADS, cols <= AN_THREADS * AN_V; CudaOptions::fuse_norm): x (the
// residual stream) normalized and quantized into the block's shared memory
// exactly as add_norm does it for the next GEMV: thread j holds values j +
// AN_THREADS * k as add_norm's thread j does (same f64 sums in the same
// order), then the normalized row goes through sx to quant_q8_shared. One
// round trip for x; gw, the norm's weights, loaded by the caller before its
// PDL wait. (Each warp quantizing its own whole blocks from registers,
// quant_q8_warp with REDUX max / sum, lost 2.7%: NOTES.md item 66.)
__device__ __forceinline__ void stage_norm_regs(int4* sq, float* sd, float* ss, float* sx, float* xv, const float* gw,
                                                float eps, int cols, double* part) {
    double s = 0.0;
#pragma unroll
    for (int k = 0; k < AN_V; k++) s += (double)xv[k] * (double)xv[k];
    tl_mark_after(3, s);
    s = warp_sum_d(s);
    if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = s;
    __syncthreads();
    tl_mark(4);
    float finv = (float)parts_inv_rms(part, AN_THREADS / 32, cols, eps);
#pragma unroll
    for (int k = 0; k < AN_V; k++) {
        int i = threadIdx.x + k * AN_THREADS;
        if (i < cols) sx[i] = rms_val(xv[k], finv, gw[k]);
    }
    __syncthreads();
    tl_mark(5);
    quant_q8_shared(sx, cols, 0, (i8*)sq, sd, ss);
    __syncthreads();
}
__device__ __forceinline__ void stage_norm_xq(int4* sq, float* sd, float* ss, float* sx, const float* __restrict__ x,
                                              const float* gw, float eps, int cols) {
    __shared__ double part[AN_THREADS / 32];
    float xv[AN_V];
#pragma unroll
    for (int k = 0; k < AN_V; k++) {
        int i = threadIdx.x + k * AN_THREADS;
        xv[k] = i < cols ? x[i] : 0.0f;
    }
    stage_norm_regs(sq, sd, ss, sx, xv, gw, eps, cols, part);
}

// stage_norm_xq behind a post-norm (Gemma 3's layers), doing the add_norm
// that would come before it: x + post_norm(y; pw) (y's f64 sum of squares
// in add_norm's order, post_add's rounding), written to xo by the blocks
// with `write` (xo is not x: other blocks may still be reading x), then
// normalized and quantized. x, y and pw in one round trip after the wait; with
// PW_EARLY, pw's values are pwe (thread j's j + AN_THREADS * k, as gw), loaded
// by the caller before the wait.
template <bool PW_EARLY>
__device__ __forceinline__ void stage_post_norm_xq(int4* sq, float* sd, float* ss, float* sx, const float* __restrict__ x,
                                                   const float* __restrict__ yp, const float* __restrict__ pw,
                                                   const float* pwe, float* __restrict__ xo, bool write,
                                                   const float* gw, float eps, int cols) {
    __shared__ double part[AN_THREADS / 32];
    float xv[AN_V], yv[AN_V], wv[AN_V];
#pragma unroll
    for (int k = 0; k < AN_V; k++) {
        int i = threadIdx.x + k * AN_THREADS;
        bool in = i < cols;
        // x and y are the kernels before this one's writes: coherent loads (ld.global.cg).
        // Through the read-only path (what `const __restrict__` gives) ptxas may issue them
        // above the PDL wait, as it did in mvqsgq4_q4_0r once no launch_dependents followed
        // the wait (NOTES.md item 111: the tiny Gemma's decode wrong).
        xv[k] = in ? __ldcg(x + i) : 0.0f;
        yv[k] = in ? __ldcg(yp + i) : 0.0f;
        wv[k] = PW_EARLY ? pwe[k] : in ? pw[i] : 0.0f;
    }
    double s = 0.0;
#pragma unroll
    for (int k = 0; k < AN_V; k++) s += (double)yv[k] * (double)yv[k];
    // block_inv_rms's steps (add_norm's post-norm sum, the same bits) with
    // the staging's constant part count, as stage_norm_regs takes them.
    s = warp_sum_d(s);
    if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = s;
    __syncthreads();
    float pinv = (float)parts_inv_rms(part, AN_THREADS / 32, cols, eps);
#pragma unroll
    for (int k = 0; k < AN_V; k++) {
        int i = threadIdx.x + k * AN_THREADS;
        if (i < cols) {
            xv[k] = post_add(xv[k], yv[k], pinv, wv[k]);
            if (write) xo[i] = xv[k];
        }
    }
    stage_norm_regs(sq, sd, ss, sx, xv, gw, eps, cols, part);
}

// acc plus unit u against the staged x.
template <int T>
__device__ __forceinline__ float racc(float acc, const uint4* q, u16 d, int u, const int4* sq, const float* sd,
                                      const float* ss) {
    int xv[8];
    xq_words(sq[2 * u], sq[2 * u + 1], xv);
    return __fadd_rn(acc, rdot<T>(q, d, xv, sd[u], ss[u]));
}

// Ranges of 32 gate|up outputs one block of a GLU mvqs takes at most (the
// host sizes the grid for it: MVQS_GLU_RANGES in backend.rs).
#define GLU_RANGES 8

// Row j of a block's share of a gate|up product (GLU): its range k = j / 64
// is range g = block + k * blocks of the inter / 32, whose 32 gate rows
// (j % 64 < 32) and 32 up rows the block takes; `rows` past the last.
__device__ __forceinline__ int glu_row(int j, int inter, int rows) {
    int g = blockIdx.x + (j >> 6) * gridDim.x, lr = j & 63;
    if (g >= inter >> 5) return rows;
    return lr < 32 ? 32 * g + lr : inter + 32 * g + lr - 32;
}

// The streaming kernel's shared memory: one set per (NORM, GLU), whatever
// the weights' type, so that mvqsnp's two matrices share it.
template <bool NORM, bool GLU>
struct MvqsSmem {
    int4 sq[MVQS_COLS / 16];
    float gsum[GLU ? GLU_RANGES : 1][64];
    int gdone[GLU ? GLU_RANGES : 1];
    float sd[MVQS_COLS / 32], ss[MVQS_COLS / 32];
    float4 sx[NORM ? AN_THREADS * AN_V / 4 : 1];
};
template <bool NORM, bool GLU>
__device__ __forceinline__ MvqsSmem<NORM, GLU>& mvqs_smem() {
    __shared__ MvqsSmem<NORM, GLU> m;
    return m;
}

// Unit u0 + 32 k for mvqs_impl: at constant offsets (rload_k) in the fused
// kernels (8B Q4_0 tg256 +0.8%, 1B +2.5%), as rload in the plain one (8B
// Q4_0 with fuse_norm off lost 1.9% with rload_k: NOTES.md item 72).
template <int T, bool K>
__device__ __forceinline__ void mvqs_load(const u8* __restrict__ row, int u0, int k, int cols, uint4* q, u16* d) {
    if (K)
        rload_k<T>(row, u0, k, cols, q, d);
    else
        rload<T>(row, u0 + 32 * k, cols, q, d);
}

// NORM (the QKV and gate|up products): xf is the residual stream and normw
// the RMSNorm's weights, normalized and quantized per block (stage_norm_xq)
// instead of read from xq, xd, xs. RES (the O and down products): y is the
// residual stream, y[r] = y[r] + (W[r] . x + bias[r]) as add_norm adds it,
// each row's y[r] read with its first loads (res_early). Either replaces an
// add_norm launch. GLU (with NORM, the gate|up product of a gated FFN,
// rows = 2 * inter): act_mul's work too. Each block takes whole
// ranges of 32 gate and 32 up rows; the warp finishing a range's 64th row
// applies the activation and product to its 32 pairs exactly as act_mul
// does and quantizes them into oq / od / os, the down product's 8-bit x (y
// is not written). POST (with NORM): the add_norm of a post-norm layer
// first (stage_post_norm_xq: xf + post_norm(yp; pw), written to xo by
// block 0 of this matrix). The rows' sums are the plain kernel's. bx / gx: the
// block's index and the grid's size as far as this matrix goes (a second
// matrix in the same launch: mvqsnp). R > 1 (short rows, of at most 32 U / R units: the
// host's `mvqs_rows`): R rows a chunk, U / R units of each a lane, so a warp has as many
// bytes in flight as on a long row instead of one row's few (Gemma 3's 1,152 columns of
// Q5_0: 36 units against the 128 that four a lane cover); each row still summed a lane
// in increasing unit order, so the same bits.
template <int T, int U, bool NORM = false, bool RES = false, bool GLU = false, bool POST = false, int R = 1>
__device__ __forceinline__ void mvqs_impl(const u8* __restrict__ W, u64 row_bytes, int rows, int cols,
                                          const i8* __restrict__ xq, const float* __restrict__ xd,
                                          const float* __restrict__ xs, float* __restrict__ y,
                                          const float* __restrict__ bias, const float* __restrict__ xf = nullptr,
                                          const float* __restrict__ normw = nullptr, float eps = 0.0f,
                                          int inter = 0, int act = 0, i8* __restrict__ oq = nullptr,
                                          float* __restrict__ od = nullptr, float* __restrict__ os = nullptr,
                                          int bx = -1, int gx = 0, const float* __restrict__ yp = nullptr,
                                          const float* __restrict__ pw = nullptr, float* __restrict__ xo = nullptr) {
    if (bx < 0) {
        bx = blockIdx.x;
        gx = gridDim.x;
    }
    MvqsSmem<NORM, GLU>& sm = mvqs_smem<NORM, GLU>();
    int4* sq = sm.sq;
    auto& gsum = sm.gsum;
    int* gdone = sm.gdone;
    float *sd = sm.sd, *ss = sm.ss;
    float4* sx = sm.sx;
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int nw = blockDim.x >> 5;
    int j = warp;  // GLU: the warp's row of the block's share
    int r = GLU ? glu_row(j, inter, rows) : bx * nw + warp, rstep = gx * nw;
    int units = cols >> 5;
    // Cleared before stage_norm_xq's barrier, which orders it before any use.
    if (GLU && threadIdx.x < GLU_RANGES) gdone[threadIdx.x] = 0;
    // Row r's sum (acc, this lane's share) reduced and written; GLU: row jj
    // of the block's share into its range, the range's last row applying the
    // activation and product and quantizing the range for the down product.
    auto finish = [&](float acc, int r, int jj, float yr) {
        float v = warp_sum(acc);
        if (GLU) {
            int k = jj >> 6;
            bool last = false;
            if (lane == 0) {
                gsum[k][jj & 63] = v + (bias ? bias[r] : 0.0f);
                __threadfence_block();
                last = atomicAdd(&gdone[k], 1) == 63;
            }
            if (__shfl_sync(0xffffffffu, last, 0)) {
                __threadfence_block();
                const volatile float* gk = gsum[k];
                float h = activate(act, gk[lane]) * gk[32 + lane];
                quant_q8_warp(h, lane, (u64)(blockIdx.x + k * gridDim.x), oq, od, os);
            }
        } else if (lane == 0) {
            float o = v + (bias ? bias[r] : 0.0f);
            y[r] = RES ? yr + o : o;
        }
    };
    // The norm weights' loads and the staging as steps too: ptxas schedules
    // this form as NOTES.md item 72 measured it (the inline form differs).
    // Behind a post-norm its weights (pw, a load-time table) too, so that the
    // staging's round trip after the wait is x and y only; not in the GLU
    // kernels, which spill at their 64 registers already.
    constexpr bool PW_EARLY = NORM && POST && !GLU;
    float gw[NORM ? AN_V : 1], pwv[PW_EARLY ? AN_V : 1];
    auto load_gw = [&]() {
        if (NORM) {
#pragma unroll
            for (int k = 0; k < AN_V; k++) {
                int i = threadIdx.x + k * AN_THREADS;
                gw[k] = i < cols ? normw[i] : 0.0f;
                if (PW_EARLY) pwv[k] = i < cols ? pw[i] : 0.0f;
            }
        }
    };
    // The PDL wait, and where the next kernel may launch. Behind a post-norm the GLU kernel
    // lets the down product (there the plain mvq kernel, a block per 8 rows) launch only once
    // its rows are done: launched at the wait, the down's blocks take the SMs a gate|up block
    // left half free (Gemma-3-1B: 144 blocks on ~46 SMs) and keep them (with the QKV pair
    // behind a post-norm: Gemma-3-1B Q4_K_M tg256 +4.7%, Q4_0 +1.1%). Pre-norm layers keep the
    // early launch: their resident-grid down preloads under the gate|up (every GLU late:
    // Llama-3.1-8B -2.9% / -4.6%; NOTES.md item 111). Without the launch_dependents after the
    // wait, ptxas may issue read-only loads above the wait: the staging's x and y are __ldcg
    // loads for it (stage_post_norm_xq).
    auto enter = [&]() {
        if (GLU && POST)
            pdl_wait();
        else
            PDL_ENTRY();
    };
    auto leave = [&]() {
        if (GLU && POST) pdl_launch();
        tl_mark(2);
    };
    auto stage = [&]() {
        if (NORM && POST)
            stage_post_norm_xq<PW_EARLY>(sq, sd, ss, (float*)sx, xf, yp, pw, pwv, xo, bx == 0, gw, eps, cols);
        else if (NORM)
            stage_norm_xq(sq, sd, ss, (float*)sx, xf, gw, eps, cols);
        else
            stage_xq(sq, sd, ss, xq, xd, xs, cols);
        tl_mark(1);
    };
    uint4 q[U][Rq<T>::QW];
    u16 d[U];
    if constexpr (R > 1) {
        constexpr int KPR = U / R;
        // The current chunk's row i: the warp's row R c + i (GLU: of the block's share, j
        // counting rows; otherwise r stepping by rstep), ascending, so past `rows` once one
        // is. Recomputed where needed rather than held (registers).
        auto row_at = [&](int i) { return GLU ? glu_row(j + i * nw, inter, rows) : r + i * rstep; };
        auto load_chunk = [&]() {
#pragma unroll
            for (int i = 0; i < R; i++) {
                int ri = row_at(i);
                if (ri < rows) {
                    const u8* row = W + (u64)ri * row_bytes;
#pragma unroll
                    for (int k = 0; k < KPR; k++)
                        if (lane + 32 * k < units)
                            mvqs_load<T, NORM || RES>(row, lane, k, cols, q[i * KPR + k], &d[i * KPR + k]);
                }
            }
        };
        float yr[R];
        load_chunk();
#pragma unroll
        for (int i = 0; i < R; i++) yr[i] = res_early<RES>(y, row_at(i), rows, lane);
        load_gw();
        enter();
        stage();
        while (row_at(0) < rows) {
            float acc[R];
#pragma unroll
            for (int i = 0; i < R; i++) {
                acc[i] = 0.0f;
                bool in = row_at(i) < rows;
#pragma unroll
                for (int k = 0; k < KPR; k++)
                    if (in && lane + 32 * k < units)
                        acc[i] = racc<T>(acc[i], q[i * KPR + k], d[i * KPR + k], lane + 32 * k, sq, sd, ss);
            }
            float yc[R];
#pragma unroll
            for (int i = 0; i < R; i++) yc[i] = yr[i];
            // The next chunk's loads before this one's sums, as below.
            if (GLU)
                j += R * nw;
            else
                r += R * rstep;
            load_chunk();
#pragma unroll
            for (int i = 0; i < R; i++) yr[i] = res_early<RES>(y, row_at(i), rows, lane);
#pragma unroll
            for (int i = 0; i < R; i++) {
                int ri = row_at(i - R);
                if (ri < rows) finish(acc[i], ri, j - (R - i) * nw, yc[i]);
            }
        }
        leave();
        return;
    }
    if (r < rows) {
        const u8* row = W + (u64)r * row_bytes;
#pragma unroll
        for (int k = 0; k < U; k++)
            if (lane + 32 * k < units) mvqs_load<T, NORM || RES>(row, lane, k, cols, q[k], &d[k]);
    }
    float yr = res_early<RES>(y, r, rows, lane), yn = 0.0f;
    load_gw();
    enter();
    stage();
    float acc = 0.0f;
    int u0 = lane;
    while (r < rows) {
#pragma unroll
        for (int k = 0; k < U; k++)
            if (u0 + 32 * k < units) acc = racc<T>(acc, q[k], d[k], u0 + 32 * k, sq, sd, ss);
        // The next chunk: later in this row, or the start of the warp's next row.
        int rn = r;
        u0 += 32 * U;
        bool end = u0 >= units;
        if (end) {
            rn = GLU ? glu_row(j + nw, inter, rows) : r + rstep;
            u0 = lane;
        }
        if (rn < rows) {
            const u8* row = W + (u64)rn * row_bytes;
#pragma unroll
            for (int k = 0; k < U; k++)
                if (u0 + 32 * k < units) mvqs_load<T, NORM || RES>(row, u0, k, cols, q[k], &d[k]);
            if (RES && end) yn = res_early<RES>(y, rn, rows, lane);
        }
        if (end) {
            finish(acc, r, j, yr);
            if (GLU) j += nw;
            yr = yn;
            acc = 0.0f;
        }
        r = rn;
    }
    leave();
}

// The GLU kernel of MVQSN; R > 1: its short-row version (mvqs_impl's R; the host's mvqs_rows).
#define MVQSG_R(TNAME, T, U, R, SUF)                                                                  \
    /* mvqsg at U <= 4 held to 64 registers, two blocks an SM (Q6_KR's four units spill there). */    \
    extern "C" __global__ void __launch_bounds__(AN_THREADS, U <= 4 && !(T == T_Q6_KR && U == 4) ? 2 : 1) \
        mvqsg##U##SUF##_##TNAME(const u8* W, u64 row_bytes, int rows, int cols, const float* x, float* y, \
                           const float* bias, const float* nw, float eps, int inter, int act, i8* oq, \
                           float* od, float* os) {                                                    \
        mvqs_impl<T, U, true, false, true, false, R>(W, row_bytes, rows, cols, nullptr, nullptr, nullptr, y, bias, \
                                           x, nw, eps, inter, act, oq, od, os);                       \
    }

// The fused norm's GEMV (CudaOptions::fuse_norm): the streaming kernel
// staging the normalized x on a resident grid. Instantiated with MVQS, and
// below it for the types whose plain one-token GEMV is the register-preloading
// mvqr_impl, with U units a lane in flight as mvqr_impl has them (the same
// words in flight; units summed in the same order, so the same bits; their
// residual adds are mvqr_impl's, `mvqa_*`).
#define MVQSN(TNAME, T, U)                                                                            \
    extern "C" __global__ void mvqsn##U##_##TNAME(const u8* W, u64 row_bytes, int rows, int cols,      \
                                                  const float* x, float* y, const float* bias,         \
                                                  const float* nw, float eps) {                        \
        mvqs_impl<T, U, true, false>(W, row_bytes, rows, cols, nullptr, nullptr, nullptr, y, bias, x,  \
                                     nw, eps);                                                         \
    }                                                                                                 \
    MVQSG_R(TNAME, T, U, 1, )                                                                         \
    /* The same behind a post-norm (POST: Gemma 3's layers; yp, pw, xo as mvqs_impl's). */            \
    extern "C" __global__ void mvqsnq##U##_##TNAME(const u8* W, u64 row_bytes, int rows, int cols,     \
                                                   const float* x, float* y, const float* bias,        \
                                                   const float* nw, float eps, const float* yp,        \
                                                   const float* pw, float* xo) {                       \
        mvqs_impl<T, U, true, false, false, true>(W, row_bytes, rows, cols, nullptr, nullptr, nullptr, y, \
                                                  bias, x, nw, eps, 0, 0, nullptr, nullptr, nullptr, -1, \
                                                  0, yp, pw, xo);                                      \
    }                                                                                                 \
    extern "C" __global__ void __launch_bounds__(AN_THREADS, U <= 4 && !(T == T_Q6_KR && U == 4) ? 2 : 1) \
        mvqsgq##U##_##TNAME(const u8* W, u64 row_bytes, int rows, int cols, const float* x, float* y, \
                            const float* bias, const float* nw, float eps, int inter, int act, i8* oq, \
                            float* od, float* os, const float* yp, const float* pw, float* xo) {      \
        mvqs_impl<T, U, true, false, true, true>(W, row_bytes, rows, cols, nullptr, nullptr, nullptr, y, \
                                                 bias, x, nw, eps, inter, act, oq, od, os, -1, 0, yp, pw, \
                                                 xo);                                                  \
    }

#define MVQS(TNAME, T, U)                                                                             \
    extern "C" __global__ void mvqs##U##_##TNAME(const u8* W, u64 row_bytes, int rows, int cols,       \
                                                 const i8* xq, const float* xd, const float* xs, float* y, \
                                                 const float* bias) {                                  \
        mvqs_impl<T, U>(W, row_bytes, rows, cols, xq, xd, xs, y, bias);                                \
    }                                                                                                 \
    MVQSN(TNAME, T, U)                                                                                \
    MVQSR(TNAME, T, U)

// The residual kernels held to 64 registers (two blocks an SM): the 8B
// Q4_0 down product at one block an SM lost 7% (NOTES.md item 44).
#define MVQSR(TNAME, T, U)                                                                            \
    extern "C" __global__ void __launch_bounds__(AN_THREADS, 2)                                       \
        mvqsr##U##_##TNAME(const u8* W, u64 row_bytes, int rows, int cols, const i8* xq, const float* xd, \
                           const float* xs, float* y, const float* bias) {                            \
        mvqs_impl<T, U, false, true>(W, row_bytes, rows, cols, xq, xd, xs, y, bias);                   \
    }
MVQS(q4_0r, T_Q4_0R, 4)
MVQS(q4_0r, T_Q4_0R, 8)
extern "C" __global__ void mvqs4s_q4_0r(const u8* W, u64 row_bytes, int rows, int cols, const i8* xq, const float* xd,
                                        const float* xs, float* y, const float* bias) {
    mvqs_impl<T_Q4_0RS, 4>(W, row_bytes, rows, cols, xq, xd, xs, y, bias);
}

// The plain streaming kernel for steps of NT tokens (2-4: small batched
// decode steps): each warp's row is loaded once and multiplied with every
// token's 8-bit x, each token summed as mvqs_impl sums one, so a token's
// y is the one-token kernel's bits whatever else shares the step. x (NT
// tokens, token-major as quantize_q8 writes it) goes to dynamic shared
// memory: NT x (cols + cols / 4) bytes (src/backend.rs mvqst_smem). grid: a
// warp a row; y[t][r] at y + t ystride + r.
template <int T, int U, int NT>
__device__ __forceinline__ void mvqst_impl(const u8* __restrict__ W, u64 row_bytes, int rows, int cols,
                                           const i8* __restrict__ xq, const float* __restrict__ xd,
                                           const float* __restrict__ xs, float* __restrict__ y, int ystride,
                                           const float* __restrict__ bias) {
    extern __shared__ __align__(16) u8 mvqst_smem[];
    int n16 = cols >> 4, n32 = cols >> 5;
    int4* sq = (int4*)mvqst_smem;
    float* sd = (float*)(sq + NT * n16);
    float* ss = sd + NT * n32;
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, nw = blockDim.x >> 5;
    int r = blockIdx.x * nw + warp, rstep = gridDim.x * nw;
    int units = n32;
    uint4 q[U][Rq<T>::QW];
    u16 d[U];
    if (r < rows) {
        const u8* row = W + (u64)r * row_bytes;
#pragma unroll
        for (int k = 0; k < U; k++)
            if (lane + 32 * k < units) mvqs_load<T, false>(row, lane, k, cols, q[k], &d[k]);
    }
    PDL_ENTRY();
    // The tokens' rows lie back to back: one staging of NT x cols values.
    stage_xq(sq, sd, ss, xq, xd, xs, NT * cols);
    float acc[NT];
#pragma unroll
    for (int t = 0; t < NT; t++) acc[t] = 0.0f;
    int u0 = lane;
    while (r < rows) {
#pragma unroll
        for (int k = 0; k < U; k++)
            if (u0 + 32 * k < units) {
#pragma unroll
                for (int t = 0; t < NT; t++)
                    acc[t] = racc<T>(acc[t], q[k], d[k], u0 + 32 * k, sq + t * n16, sd + t * n32, ss + t * n32);
            }
        int rn = r;
        u0 += 32 * U;
        bool end = u0 >= units;
        if (end) {
            rn = r + rstep;
            u0 = lane;
        }
        if (rn < rows) {
            const u8* row = W + (u64)rn * row_bytes;
#pragma unroll
            for (int k = 0; k < U; k++)
                if (u0 + 32 * k < units) mvqs_load<T, false>(row, u0, k, cols, q[k], &d[k]);
        }
        if (end) {
#pragma unroll
            for (int t = 0; t < NT; t++) {
                float v = warp_sum(acc[t]);
                if (lane == 0) y[(u64)t * ystride + r] = v + (bias ? bias[r] : 0.0f);
                acc[t] = 0.0f;
            }
        }
        r = rn;
    }
}
// mvqst{NT}_{4, 8, 4s}_q4_0r: the forms of mvqs4 / mvqs8 / mvqs4s. (The
// row loads repeat mvqs_impl's plain path rather than share a helper with
// it, so that the one-token kernels' compiled code stays as measured.)
#define MVQST(NT)                                                                                      \
    extern "C" __global__ void mvqst##NT##_4_q4_0r(const u8* W, u64 row_bytes, int rows, int cols,      \
                                                   const i8* xq, const float* xd, const float* xs,      \
                                                   float* y, int ystride, const float* bias) {          \
        mvqst_impl<T_Q4_0R, 4, NT>(W, row_bytes, rows, cols, xq, xd, xs, y, ystride, bias);            \
    }                                                                                                 \
    extern "C" __global__ void mvqst##NT##_8_q4_0r(const u8* W, u64 row_bytes, int rows, int cols,      \
                                                   const i8* xq, const float* xd, const float* xs,      \
                                                   float* y, int ystride, const float* bias) {          \
        mvqst_impl<T_Q4_0R, 8, NT>(W, row_bytes, rows, cols, xq, xd, xs, y, ystride, bias);            \
    }                                                                                                 \
    extern "C" __global__ void mvqst##NT##_4s_q4_0r(const u8* W, u64 row_bytes, int rows, int cols,     \
                                                    const i8* xq, const float* xd, const float* xs,     \
                                                    float* y, int ystride, const float* bias) {         \
        mvqst_impl<T_Q4_0RS, 4, NT>(W, row_bytes, rows, cols, xq, xd, xs, y, ystride, bias);           \
    }
MVQST(2)
MVQST(3)
MVQST(4)

MVQSN(q4_kr, T_Q4_KR, 2)
MVQSN(q5_kr, T_Q5_KR, 2)
MVQSN(q3_kr, T_Q3_KR, 2)
MVQSN(q2_kr, T_Q2_KR, 4)
MVQSN(q6_kr, T_Q6_KR, 4)
MVQSN(q6_kr, T_Q6_KR, 2)
MVQSR(q4_kr, T_Q4_KR, 2)
MVQSR(q5_kr, T_Q5_KR, 2)
MVQSR(q3_kr, T_Q3_KR, 2)
MVQSR(q2_kr, T_Q2_KR, 4)
MVQSR(q6_kr, T_Q6_KR, 4)
// The k-quant mixes of models whose rows are not whole super-blocks (960,
// 1,152 columns): Q5_0 products, and Q8_0 V products staging the norm
// beside them (a Q8_0 model's own products keep add_norm: mvqp_fused_types);
// Q4_1 models.
MVQSN(q5_0r, T_Q5_0R, 4)
MVQSR(q5_0r, T_Q5_0R, 4)
MVQSG_R(q5_0r, T_Q5_0R, 4, 2, x2)
MVQSG_R(q5_0r, T_Q5_0R, 4, 4, x4)
MVQA(q5_0r, T_Q5_0R)
MVQSN(q8_0r, T_Q8_0R, 2)
MVQSN(q4_1r, T_Q4_1R, 4)
MVQSR(q4_1r, T_Q4_1R, 4)
MVQA(q4_1r, T_Q4_1R)
MVQSN(q5_1r, T_Q5_1R, 4)
MVQSR(q5_1r, T_Q5_1R, 4)
MVQA(q5_1r, T_Q5_1R)

// The norm-staging GEMV over two matrices of different types that share
// x and follow each other in y (a Q4_K_M layer's Q|K in Q4_K and its V in
// Q6_K): blocks [0, blocks1) take W's rows as mvqsn does, the others W2's
// into y + rows. One launch and one staging a block instead of a kernel
// each. Held to 64 registers (two blocks an SM), so Q6_KR with two units a
// lane (the same sums as with four: units in increasing order a lane).
// The pair's body, pre-norm (mvqsnp*) or behind a post-norm (POST, mvqsnpq_*:
// Gemma 3's Q|K and V; yp, pw, xo as mvqs_impl's, the post-norm add staged once
// a block as in mvqsnq; each matrix's block 0 writes xo, the same values).
template <int T1, int U1, int R1, int T2, int U2, int R2, bool POST>
__device__ __forceinline__ void mvqsnp_impl(const u8* W, u64 row_bytes, int rows, int cols, const float* x, float* y,
                                            const float* bias, const float* nw, float eps, const u8* W2,
                                            u64 row_bytes2, int rows2, int blocks1, const float* yp = nullptr,
                                            const float* pw = nullptr, float* xo = nullptr) {
    if ((int)blockIdx.x < blocks1)
        mvqs_impl<T1, U1, true, false, false, POST, R1>(W, row_bytes, rows, cols, nullptr, nullptr, nullptr, y, bias,
                                                        x, nw, eps, 0, 0, nullptr, nullptr, nullptr, blockIdx.x,
                                                        blocks1, yp, pw, xo);
    else
        mvqs_impl<T2, U2, true, false, false, POST, R2>(W2, row_bytes2, rows2, cols, nullptr, nullptr, nullptr,
                                                        y + rows, bias ? bias + rows : nullptr, x, nw, eps, 0, 0,
                                                        nullptr, nullptr, nullptr, blockIdx.x - blocks1,
                                                        gridDim.x - blocks1, yp, pw, xo);
}
#define MVQSNP_R(N1, T1, U1, R1, N2, T2, U2, R2, SUF)                                                 \
    extern "C" __global__ void __launch_bounds__(AN_THREADS, 2)                                       \
        mvqsnp##SUF##_##N1##_##N2(const u8* W, u64 row_bytes, int rows, int cols, const float* x, float* y, \
                           const float* bias, const float* nw, float eps, const u8* W2, u64 row_bytes2, \
                           int rows2, int blocks1) {                                                  \
        mvqsnp_impl<T1, U1, R1, T2, U2, R2, false>(W, row_bytes, rows, cols, x, y, bias, nw, eps, W2,   \
                                                   row_bytes2, rows2, blocks1);                        \
    }
// One block an SM behind a post-norm, as mvqsnq: at two the staging's post-norm values spill
// (64 registers, 88-112 bytes).
#define MVQSNPQ(N1, T1, U1, N2, T2, U2)                                                               \
    extern "C" __global__ void __launch_bounds__(AN_THREADS, 1)                                       \
        mvqsnpq_##N1##_##N2(const u8* W, u64 row_bytes, int rows, int cols, const float* x, float* y,  \
                            const float* bias, const float* nw, float eps, const u8* W2, u64 row_bytes2, \
                            int rows2, int blocks1, const float* yp, const float* pw, float* xo) {      \
        mvqsnp_impl<T1, U1, 1, T2, U2, 1, true>(W, row_bytes, rows, cols, x, y, bias, nw, eps, W2,      \
                                                row_bytes2, rows2, blocks1, yp, pw, xo);               \
    }
#define MVQSNP(N1, T1, U1, N2, T2, U2) \
    MVQSNP_R(N1, T1, U1, 1, N2, T2, U2, 1, ) MVQSNPQ(N1, T1, U1, N2, T2, U2)
MVQSNP(q4_kr, T_Q4_KR, 2, q6_kr, T_Q6_KR, 2)
MVQSNP(q5_kr, T_Q5_KR, 2, q6_kr, T_Q6_KR, 2)
MVQSNP(q5_0r, T_Q5_0R, 4, q8_0r, T_Q8_0R, 2)
// Their short-row versions (mvqs_impl's R; the host's mvqs_rows by the first matrix): rows of up
// to 64 / 32 units, the Q8_0 V at two units a lane one / two rows a chunk.
MVQSNP_R(q5_0r, T_Q5_0R, 4, 2, q8_0r, T_Q8_0R, 2, 1, x2)
MVQSNP_R(q5_0r, T_Q5_0R, 4, 4, q8_0r, T_Q8_0R, 2, 2, x4)
// Q3_K_M's Q|K with its V (Q5_K in the first two layers, Q4_K after).
MVQSNP(q3_kr, T_Q3_KR, 2, q4_kr, T_Q4_KR, 2)
MVQSNP(q3_kr, T_Q3_KR, 2, q5_kr, T_Q5_KR, 2)

// The ceiling of a warp-per-row GEMV for `cuda_check --gemv-micro`: the
// row's bytes in 16-byte loads, 8 in flight per lane, no arithmetic but an xor.
extern "C" __global__ void rd_rows(const u8* W, u64 row_bytes, int rows, int cols, const i8* xq,
                                   const float* xd, const float* xs, float* y, const float* bias) {
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int r = blockIdx.x * (blockDim.x >> 5) + warp;
    if (r >= rows) return;
    const uint4* p = (const uint4*)(W + (u64)r * row_bytes);
    int n = (int)(row_bytes / 16);
    u32 acc = 0;
    for (int c0 = lane; c0 < n; c0 += 256) {
        uint4 v[8];
#pragma unroll
        for (int k = 0; k < 8; k++)
            if (c0 + 32 * k < n) v[k] = ld_stream16(p + c0 + 32 * k);
        if (c0 == lane) PDL_ENTRY();
#pragma unroll
        for (int k = 0; k < 8; k++)
            if (c0 + 32 * k < n) acc ^= v[k].x ^ v[k].y ^ v[k].z ^ v[k].w;
    }
    acc = (u32)warp_sum_i((int)acc);
    if (lane == 0) y[r] = (float)acc;
}

// Access-pattern ceilings for `cuda_check --gemv-micro`: a warp per row as
// mvqs_impl runs it (U units a lane in flight, the next row's loads issued
// before this one's reduction), no arithmetic but an xor, in T's layout
// (rload). FLAT: the same bytes laid out as a row's quants, then its scales,
// instead of repacked runs of 8 (NOTES.md item 72: Q8_0's 8B chain 2.64 ->
// 2.52 ms flat).
template <int T, int U, bool FLAT>
__device__ __forceinline__ void rdq_impl(const u8* __restrict__ W, u64 row_bytes, int rows, int cols, float* y) {
    constexpr int QB = Rq<T>::QB, QW = Rq<T>::QW;
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int r = blockIdx.x * (blockDim.x >> 5) + warp, rstep = gridDim.x * (blockDim.x >> 5);
    int units = cols >> 5;
    uint4 q[U][QW];
    u16 d[U];
    auto load = [&](int rr, int u0) {
        const u8* row = W + (u64)rr * row_bytes;
#pragma unroll
        for (int k = 0; k < U; k++) {
            int u = u0 + 32 * k;
            if (u >= units) continue;
            if (FLAT) {
#pragma unroll
                for (int i = 0; i < QW; i++) q[k][i] = ld_stream16(row + (u64)u * QB + 16 * i);
                d[k] = ld_u16(row + (u64)units * QB + 2 * u);
            } else {
                rload<T>(row, u, cols, q[k], &d[k]);
            }
        }
    };
    if (r < rows) load(r, lane);
    PDL_ENTRY();
    u32 acc = 0;
    int u0 = lane;
    while (r < rows) {
#pragma unroll
        for (int k = 0; k < U; k++)
            if (u0 + 32 * k < units) {
#pragma unroll
                for (int i = 0; i < QW; i++) acc ^= q[k][i].x ^ q[k][i].y ^ q[k][i].z ^ q[k][i].w;
                acc ^= d[k];
            }
        int rn = r;
        u0 += 32 * U;
        bool end = u0 >= units;
        if (end) {
            rn = r + rstep;
            u0 = lane;
        }
        if (rn < rows) load(rn, u0);
        if (end) {
            u32 v = (u32)warp_sum_i((int)acc);
            if (lane == 0) y[r] = (float)v;
            acc = 0;
        }
        r = rn;
    }
}
#define RDQ(NAME, T, U, FLAT, BOUNDS)                                                                  \
    extern "C" __global__ void BOUNDS NAME(const u8* W, u64 row_bytes, int rows, int cols, const i8* xq,  \
                                           const float* xd, const float* xs, float* y, const float* bias) { \
        rdq_impl<T, U, FLAT>(W, row_bytes, rows, cols, y);                                             \
    }
// The Q4_0 pattern bounded to three blocks of 512 an SM, so that it can be
// timed at 48 warps an SM.
#define RDQ_B3 __launch_bounds__(512, 3)
RDQ(rdq4_pat, T_Q4_0R, 4, false, RDQ_B3)
RDQ(rdq8_pat, T_Q8_0R, 2, false, )
RDQ(rdq8_flat, T_Q8_0R, 2, true, )

// ---- A few tokens (decode batches of several sequences): the one-token
// kernels above with each weight load shared by up to MV_NT tokens. Per
// token the arithmetic and its order are those of mvf_* / mvq_*, so a
// sequence's logits do not depend on what else is in the batch.
// x / xq rows are `cols` long; y row stride `ystride`.
// grid: (ceil(rows / warps), ceil(n / MV_NT)); block: warps * 32.
#define MV_NT 8

// Float weights: MVF_NT_R rows per warp, 8 warps per block, the columns in
// tiles of MVF_NT_TILE 16-byte weight chunks: the block stages its (up to 8)
// tokens' x for a tile in shared memory once, and every x value read from
// there feeds MVF_NT_R rows. (Two rows per warp reading x straight from
// global memory moved 8 tokens x 4 bytes of x through L1/L2 per 2 bytes of
// bf16 weight: 8 sequences of the 8B shape took 16 ms a step, 3x the weight
// read.) A lane still takes chunks lane, lane + 32, ... of its rows in
// increasing order with mvf_*'s arithmetic, so results match it bit for bit.
// Each chunk's weights for the next tile are loaded as soon as this tile's
// are decoded (one DRAM round trip per tile in a row measured 13.6 ms a step).
#define MVF_NT_R 4
#define MVF_NT_U 2
#define MVF_NT_TILE (32 * MVF_NT_U)
template <int T>
__device__ __forceinline__ void mvf_nt_impl(const u8* __restrict__ W, u64 row_bytes, int rows, int cols,
                                            const float* __restrict__ x, int n, float* __restrict__ y,
                                            int ystride, const float* __restrict__ bias) {
    constexpr int E = T == T_F32 ? 4 : 8;
    constexpr int F4 = MVF_NT_TILE * E / 4;  // float4 of x per token per tile
    __shared__ float4 xs[MV_NT][F4];
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int r0 = (blockIdx.x * (blockDim.x >> 5) + warp) * MVF_NT_R;
    int t0 = blockIdx.y * MV_NT;
    int nt = min(MV_NT, n - t0);
    // Warps past the last row still help stage x (the block synchronizes).
    int nr = max(0, min(MVF_NT_R, rows - r0));
    const uint4* wr = (const uint4*)(W + (u64)min(r0, rows - 1) * row_bytes);
    u64 rstride = row_bytes / 16;
    int chunks = cols / E;
    uint4 wv[MVF_NT_R][MVF_NT_U];
#pragma unroll
    for (int j = 0; j < MVF_NT_R; j++)
#pragma unroll
        for (int k = 0; k < MVF_NT_U; k++) {
            int c = lane + 32 * k;
            wv[j][k] = j < nr && c < chunks ? ld_stream16(wr + j * rstride + c) : make_uint4(0, 0, 0, 0);
        }
    PDL_ENTRY();
    float acc[MVF_NT_R][MV_NT];
#pragma unroll
    for (int j = 0; j < MVF_NT_R; j++)
#pragma unroll
        for (int t = 0; t < MV_NT; t++) acc[j][t] = 0.0f;
    int cols4 = cols / 4;
    for (int tb = 0; tb < chunks; tb += MVF_NT_TILE) {
        if (tb) __syncthreads();  // the previous tile's x is no longer read
        for (int i = threadIdx.x; i < MV_NT * F4; i += blockDim.x) {
            int t = i / F4, q = i % F4;
            int c4 = tb * (E / 4) + q;
            xs[t][q] = t < nt && c4 < cols4 ? __ldg((const float4*)(x + (u64)(t0 + t) * cols) + c4)
                                            : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        }
        __syncthreads();
#pragma unroll
        for (int k = 0; k < MVF_NT_U; k++) {
            int c = tb + lane + 32 * k;
            if (c < chunks) {
                float w[MVF_NT_R][E];
                // Decode this tile's weights, then load the next tile's into
                // the same registers: they arrive while this tile computes.
                int cn = c + MVF_NT_TILE;
#pragma unroll
                for (int j = 0; j < MVF_NT_R; j++) {
                    dec16<T>(wv[j][k], w[j]);
                    if (j < nr && cn < chunks) wv[j][k] = ld_stream16(wr + j * rstride + cn);
                }
#pragma unroll
                for (int t = 0; t < MV_NT; t++) {
                    if (t < nt) {
                        float4 xv[E / 4];
#pragma unroll
                        for (int i = 0; i < E / 4; i++) xv[i] = xs[t][(lane + 32 * k) * (E / 4) + i];
#pragma unroll
                        for (int j = 0; j < MVF_NT_R; j++) {
#pragma unroll
                            for (int i = 0; i < E / 4; i++)
                                acc[j][t] += w[j][4 * i] * xv[i].x + w[j][4 * i + 1] * xv[i].y +
                                             w[j][4 * i + 2] * xv[i].z + w[j][4 * i + 3] * xv[i].w;
                        }
                    }
                }
            }
        }
    }
#pragma unroll
    for (int j = 0; j < MVF_NT_R; j++)
#pragma unroll
        for (int t = 0; t < MV_NT; t++) {
            float v = warp_sum(acc[j][t]);
            if (lane == 0 && j < nr && t < nt)
                y[(u64)(t0 + t) * ystride + r0 + j] = v + (bias ? bias[r0 + j] : 0.0f);
        }
}

template <int T>
__device__ __forceinline__ void mvq_nt_impl(const u8* __restrict__ W, u64 row_bytes, int rows, int cols,
                                            const i8* __restrict__ xq, const float* __restrict__ xd,
                                            const float* __restrict__ xs, int n, float* __restrict__ y,
                                            int ystride, const float* __restrict__ bias) {
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int r = blockIdx.x * (blockDim.x >> 5) + warp;
    int t0 = blockIdx.y * MV_NT;
    if (r >= rows) return;
    const u8* row = W + (u64)r * row_bytes;
    prefetch_l2(row, row_bytes, lane);
    PDL_ENTRY();
    int units = cols >> 5;
    float acc[MV_NT];
#pragma unroll
    for (int t = 0; t < MV_NT; t++) acc[t] = 0.0f;
    for (int u = lane; u < units; u += 32) {
#pragma unroll
        for (int t = 0; t < MV_NT; t++) {
            if (t0 + t < n) {
                u64 b = (u64)(t0 + t) * units + u;
                int xv[8];
                ld_xq(xq, b, xv);
                acc[t] = __fadd_rn(acc[t], qdot<T>(row, u, cols, xv, __ldg(xd + b), __ldg(xs + b)));
            }
        }
    }
#pragma unroll
    for (int t = 0; t < MV_NT; t++) {
        float v = warp_sum(acc[t]);
        if (lane == 0 && t0 + t < n) y[(u64)(t0 + t) * ystride + r] = v + (bias ? bias[r] : 0.0f);
    }
}

#define MVF_NT(TNAME, T)                                                                              \
    extern "C" __global__ void mvf_nt_##TNAME(const u8* W, u64 row_bytes, int rows, int cols,          \
                                              const float* x, int n, float* y, int ystride,            \
                                              const float* bias) {                                     \
        mvf_nt_impl<T>(W, row_bytes, rows, cols, x, n, y, ystride, bias);                              \
    }

MVF_NT(f32, T_F32)
MVF_NT(f16, T_F16)
MVF_NT(bf16, T_BF16)

#define MVQ_NT(TNAME, T)                                                                              \
    extern "C" __global__ void mvq_nt_##TNAME(const u8* W, u64 row_bytes, int rows, int cols,          \
                                              const i8* xq, const float* xd, const float* xs, int n,   \
                                              float* y, int ystride, const float* bias) {              \
        mvq_nt_impl<T>(W, row_bytes, rows, cols, xq, xd, xs, n, y, ystride, bias);                     \
    }

MVQ_NT(q4_0, T_Q4_0)
MVQ_NT(q4_1, T_Q4_1)
MVQ_NT(q5_0, T_Q5_0)
MVQ_NT(q5_1, T_Q5_1)
MVQ_NT(q8_0, T_Q8_0)
MVQ_NT(q8_0r, T_Q8_0R)
MVQ_NT(q5_0r, T_Q5_0R)
MVQ_NT(q4_1r, T_Q4_1R)
MVQ_NT(q5_1r, T_Q5_1R)
MVQ_NT(q4_0r, T_Q4_0R)
MVQ_NT(q6_kr, T_Q6_KR)
MVQ_NT(q4_kr, T_Q4_KR)
MVQ_NT(q5_kr, T_Q5_KR)
MVQ_NT(q3_kr, T_Q3_KR)
MVQ_NT(q2_kr, T_Q2_KR)
MVQ_NT(q2_k, T_Q2_K)
MVQ_NT(q3_k, T_Q3_K)
MVQ_NT(q4_k, T_Q4_K)
MVQ_NT(q5_k, T_Q5_K)
MVQ_NT(q6_k, T_Q6_K)
