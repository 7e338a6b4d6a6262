// kiln CUDA kernels: shared helpers. Header-free (NVRTC needs no include
// path): f16 via PTX conversion, bf16 by shifting.

typedef unsigned char u8;
typedef signed char i8;
typedef unsigned short u16;
typedef unsigned int u32;
typedef unsigned long long u64;

#define WARP 32
#define INFINITY __int_as_float(0x7f800000)
#define NORM_RMS 0
#define NORM_LAYER 1
#define ACT_SILU 0
#define ACT_GELU_TANH 1
#define ACT_GELU 2

// Programmatic dependent launch (sm_90+; no-ops before, and when a kernel
// was launched without it): `pdl_wait` blocks until the kernels before this
// one have finished and their writes are visible; `pdl_launch` lets the next
// kernel start its blocks. Every kernel calls PDL_ENTRY() first, except the
// GEMVs, which prefetch their (never written) weights before waiting,
// `attention`, which first loads cache rows no kernel of the step writes, and
// `add_norm*`, which first loads the norm weights and the residual row.
// (A kernel that has passed pdl_wait has seen every kernel before it
// finish, so when this one starts only the one just before may still run.)
#ifdef KILN_TIMELINE
// `$KILN_CUDA_TIMELINE` builds (bench/cuda/timeline.py reads them): warp 0
// of every block that waits stamps the global nanosecond clock before and
// after the wait, and at `tl_mark`s, into its own slot of a host-allocated
// ring (grid launch number mod TL_GRIDS, block): plain stores only, so the
// stamps barely move what they measure (an atomic append cost ~3 us a
// layer). A slot: [before, after, mark 1..5, blocks << 41 | threads << 30 |
// SM << 22 | TL_SEEN] (11 bits of threads: 1,024-thread blocks). The ring's
// shape (TL_GRIDS, TL_BLOCKS, TL_WORDS, TL_SEEN) comes from the host's NVRTC
// options (gpu.rs), which reads it.
__device__ u64* kiln_tl_ptr;
__device__ __forceinline__ u64 tl_now() {
    u64 t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}
__device__ __forceinline__ u64* tl_slot() {
    u64 gid, blk = blockIdx.x + (u64)gridDim.x * (blockIdx.y + (u64)gridDim.y * blockIdx.z);
    asm volatile("mov.u64 %0, %%gridid;" : "=l"(gid));
    if (kiln_tl_ptr == nullptr || blk >= TL_BLOCKS || threadIdx.x >= 32 ||
        (threadIdx.x & 31) != __ffs(__activemask()) - 1)
        return nullptr;
    return kiln_tl_ptr + ((gid % TL_GRIDS) * TL_BLOCKS + blk) * TL_WORDS;
}
#endif
// A phase mark (id 1..5) of a timeline build; nothing otherwise.
__device__ __forceinline__ void tl_mark(int id) {
#ifdef KILN_TIMELINE
    u64* s = tl_slot();
    if (s) s[1 + id] = tl_now();
#endif
}
// A mark once v is computed: the empty asm takes v, and volatile asms keep
// their order, so the clock is read after v's inputs have arrived.
__device__ __forceinline__ void tl_mark_after(int id, double v) {
#ifdef KILN_TIMELINE
    asm volatile("" ::"d"(v));
    tl_mark(id);
#endif
}
__device__ __forceinline__ void pdl_wait() {
#ifdef KILN_TIMELINE
    u64* s = tl_slot();
    u64 t0 = tl_now();
#endif
#if __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
#ifdef KILN_TIMELINE
    u64 t1 = tl_now();
    if (s) {
        u32 sm;
        asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
        u64 nblk = (u64)gridDim.x * gridDim.y * gridDim.z;
        s[0] = t0;
        s[1] = t1;
        s[TL_WORDS - 1] = (nblk << 41) | ((u64)blockDim.x << 30) | ((u64)sm << 22) | TL_SEEN;
    }
#endif
}
__device__ __forceinline__ void pdl_launch() {
#if __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}
// The fence of a "last block merges" hand-off: each block writes its
// partial result, fences, then counts itself with an atomic; the block that
// counts last fences again and reads the others' partials. Release/acquire
// at GPU scope is what that pattern needs; __threadfence() is the
// sequentially consistent fence (MEMBAR.SC.GPU), which orders more.
__device__ __forceinline__ void fence_acq_rel_gpu() {
#if __CUDA_ARCH__ >= 700
    asm volatile("fence.acq_rel.gpu;" ::: "memory");
#else
    __threadfence();
#endif
}
#define PDL_ENTRY() \
    do {            \
        pdl_wait(); \
        pdl_launch(); \
    } while (0)

// Pulls `bytes` at p into L2, lines spread over the warp's lanes.
__device__ __forceinline__ void prefetch_l2(const u8* p, u64 bytes, int lane) {
    for (u64 o = (u64)lane * 128; o < bytes; o += 32 * 128) asm volatile("prefetch.global.L2 [%0];" ::"l"(p + o));
}

// Weights the next GEMV reads, pulled into L2 by a latency-bound kernel
// before it (the decode attention before the O projection, act_mul before
// down): DRAM otherwise idles while that kernel runs. `l2_ahead` issues
// the block's share of the byte ranges a (na bytes) then b (nb), split
// evenly over the grid's blocks, from its thread 0 as bulk prefetches
// (sm_90: the TMA unit walks them; no register waits on them). Pointers and
// sizes are 16-byte multiples (the host's choice, AheadPlan).
__device__ __forceinline__ void bulk_l2(const u8* p, u64 n) {
#if __CUDA_ARCH__ >= 900
    for (u64 o = 0; o < n; o += 32768) {
        u32 m = (u32)min(n - o, (u64)32768);
        asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(p + o), "r"(m) : "memory");
    }
#endif
}

__device__ __forceinline__ void l2_ahead(const u8* a, u64 na, const u8* b, u64 nb) {
    u64 total = na + nb;
    if (total == 0 || threadIdx.x != 0) return;
    u64 nblk = (u64)gridDim.x * gridDim.y * gridDim.z;
    u64 blk = blockIdx.x + (u64)gridDim.x * (blockIdx.y + (u64)gridDim.y * blockIdx.z);
    u64 chunk = ((total + nblk - 1) / nblk + 15) & ~(u64)15;
    u64 lo = blk * chunk, hi = min(lo + chunk, total);
    if (lo >= hi) return;
    if (lo < na) bulk_l2(a + lo, min(hi, na) - lo);
    if (hi > na) {
        u64 s = lo > na ? lo - na : 0;
        bulk_l2(b + s, hi - na - s);
    }
}

// Asynchronous copies from global to shared memory (sm_80+; the 16-byte
// ones kept out of L1): a generic address as a shared one, a 16-byte copy
// (`cp_async16_z`: of the first `src_bytes` of 16, the rest zeros), a
// 4-byte one, the end of a group of copies, and the wait until at most N of
// this thread's groups are pending.
__device__ __forceinline__ u32 smem_u32(const void* p) {
    u32 a;
    asm("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(a) : "l"(p));
    return a;
}
__device__ __forceinline__ void cp_async16(u32 dst, const void* src) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(dst), "l"(src));
}
__device__ __forceinline__ void cp_async16_z(u32 dst, const void* src, u32 src_bytes) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dst), "l"(src), "r"(src_bytes));
}
__device__ __forceinline__ void cp_async4(u32 dst, const void* src) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" ::"r"(dst), "l"(src));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;" ::"n"(N));
}

// The four kernel parameters l2_ahead takes, last in every kernel that has them.
#define L2A_PARAMS const u8 *pfa, u64 pfna, const u8 *pfb, u64 pfnb
#define L2A_ARGS pfa, pfna, pfb, pfnb

__device__ __forceinline__ float h2f(u16 h) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
}

__device__ __forceinline__ float bf2f(u16 h) { return __uint_as_float(((u32)h) << 16); }

// Every block type in ggml has an even size, and tensors start 256-aligned:
// u16 loads at even offsets are always aligned.
__device__ __forceinline__ u16 ld_u16(const u8* p) { return *(const u16*)p; }
// A u32 at an address that is only 2-byte aligned (legacy 18/22/34/210-byte
// blocks, repacked Q5_1's fifth bits).
__device__ __forceinline__ u32 ld_u32_a2(const u8* p) { return (u32)ld_u16(p) | ((u32)ld_u16(p + 2) << 16); }

__device__ __forceinline__ float ld_h(const u8* p) { return h2f(ld_u16(p)); }

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ double warp_sum_d(double v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// Block b of 32 activations (lane i holds value i, all 32 lanes present) to
// 8 bits: d = amax / 127, q = round-half-even(v / d), s = d * Σq — kiln-cpu's
// QAct arithmetic, so GPU and CPU fast paths see the same integers.
__device__ __forceinline__ void quant_q8_warp(float v, int lane, u64 b, i8* q, float* d, float* s) {
    float amax = warp_max(fabsf(v));
    float dd = amax / 127.0f;
    float id = dd > 0.0f ? 1.0f / dd : 0.0f;
    int qi = __float2int_rn(v * id);
    q[b * 32 + lane] = (i8)qi;
    int sum = qi;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
    if (lane == 0) {
        d[b] = dd;
        s[b] = dd * (float)sum;
    }
}

// A row's len values (len % 32 == 0), staged as floats in shared memory sv
// by the whole block (called by all its threads after the __syncthreads
// that follows the writes), to 8 bits as blocks b0, b0 + 1, ...: the same
// d, q and s as quant_q8_warp, bit for bit (a max and an integer sum do
// not depend on order), but four threads a block with 8 values each, so a
// reduction is 2 shuffles instead of 5 and a block's chains 2 x 2 instead
// of 2 x 5. (Lane-per-value chains, serial or interleaved, were most of a
// norm's time on one SM: 8 x 10 dependent shuffles a warp at the 8B shape.)
__device__ __forceinline__ void quant_q8_shared(const float* sv, int len, u64 b0, i8* q, float* d, float* s) {
    int n8 = len >> 3;
    for (int j0 = 0; j0 < n8; j0 += blockDim.x) {
        int j = j0 + threadIdx.x;
        bool on = j < n8;
        float v[8];
        float4 lo = on ? ((const float4*)sv)[2 * j] : make_float4(0.f, 0.f, 0.f, 0.f);
        float4 hi = on ? ((const float4*)sv)[2 * j + 1] : make_float4(0.f, 0.f, 0.f, 0.f);
        v[0] = lo.x, v[1] = lo.y, v[2] = lo.z, v[3] = lo.w, v[4] = hi.x, v[5] = hi.y, v[6] = hi.z, v[7] = hi.w;
        float amax = 0.0f;
#pragma unroll
        for (int k = 0; k < 8; k++) amax = fmaxf(amax, fabsf(v[k]));
        amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 1));
        amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 2));
        float dd = amax / 127.0f;
        float id = dd > 0.0f ? 1.0f / dd : 0.0f;
        int sum = 0;
        u32 w[2] = {0u, 0u};
#pragma unroll
        for (int k = 0; k < 8; k++) {
            int qi = __float2int_rn(v[k] * id);
            sum += qi;
            w[k >> 2] |= ((u32)qi & 0xffu) << (8 * (k & 3));
        }
        sum += __shfl_xor_sync(0xffffffffu, sum, 1);
        sum += __shfl_xor_sync(0xffffffffu, sum, 2);
        u64 b = b0 + (j >> 2);
        if (on) *(uint2*)(q + b * 32 + (j & 3) * 8) = make_uint2(w[0], w[1]);
        if (on && (j & 3) == 0) {
            d[b] = dd;
            s[b] = dd * (float)sum;
        }
    }
}

// add_norm's block (threads) and values per thread held in registers (ops.cu);
// the GEMVs that take its RMSNorm over (gemv.cu, stage_norm_xq) sum as it does.
#define AN_THREADS 512
#define AN_V 8

// Sum over the whole block (blockDim.x a multiple of 32, at most 1024).
// Every thread gets the result.
__device__ double block_sum_d(double v) {
    __shared__ double part[32];
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = warp_sum_d(v);
    __syncthreads();
    if (lane == 0) part[w] = v;
    __syncthreads();
    double t = 0.0;
    for (int i = 0; i < nw; i++) t += part[i];
    return t;
}

// 1 / sqrt(ss / n + eps) in f64, ss a sum of squares over n values (or n
// times a variance): every norm takes its scale so, which is what keeps the
// norms fused into other kernels (the GEMVs' staging, the attention's head
// norm) bit-identical to add_norm / qkv_post.
__device__ __forceinline__ double inv_rms(double ss, int n, float eps) {
    return 1.0 / sqrt(ss / (double)n + (double)eps);
}

// inv_rms of the np partial sums in `part`, added in index order (one
// thread's chain: the callers decide which thread runs it).
__device__ __forceinline__ double parts_inv(const double* part, int np, int n, float eps) {
    double t = 0.0;
    for (int i = 0; i < np; i++) t += part[i];
    return inv_rms(t, n, eps);
}

// parts_inv of `part` (visible to the block: called after the barrier that
// follows their writes) by thread 0 alone, handed to the block through
// shared memory: the bits of every thread summing and dividing itself,
// without every thread repeating that f64 chain (NOTES.md item 66). Every
// thread calls.
__device__ __forceinline__ double parts_inv_rms(const double* part, int np, int n, float eps) {
    __shared__ double r;
    if (threadIdx.x == 0) r = parts_inv(part, np, n, eps);
    __syncthreads();
    return r;
}

// inv_rms(block_sum_d(v), n, eps), bit for bit, through parts_inv_rms.
// (No leading barrier as block_sum_d has: the trailing one orders a second
// call's writes of `part` after this one's reads.)
__device__ __forceinline__ double block_inv_rms(double v, int n, float eps) {
    __shared__ double part[32];
    v = warp_sum_d(v);
    if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = v;
    __syncthreads();
    return parts_inv_rms(part, blockDim.x >> 5, n, eps);
}

// x + the RMS post-norm of y (1 / rms finv, weight w), each step rounded:
// add_norm and the post-norm staging (stage_post_norm_xq) give the same bits.
__device__ __forceinline__ float post_add(float x, float y, float finv, float w) {
    return __fadd_rn(x, __fmul_rn(__fmul_rn(y, finv), w));
}

__device__ __forceinline__ float activate(int kind, float x) {
    if (kind == ACT_SILU) return x / (1.0f + expf(-x));
    double x64 = (double)x;
    if (kind == ACT_GELU_TANH) {
        const double c = 0.7978845608028654;  // sqrt(2/pi)
        return (float)(0.5 * x64 * (1.0 + tanh(c * (x64 + 0.044715 * x64 * x64 * x64))));
    }
    return (float)(0.5 * x64 * (1.0 + erf(x64 * 0.7071067811865476)));
}

// A float as a 16-bit float: fmt 0 = f16 (PTX round to nearest even), 1 =
// bf16 (round to nearest even by bits; NaN kept quiet).
__device__ __forceinline__ u16 f2half(float v, int fmt) {
    if (fmt == 0) {
        u16 h;
        asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(v));
        return h;
    }
    u32 b = __float_as_uint(v);
    if ((b & 0x7fffffffu) > 0x7f800000u) return (u16)((b >> 16) | 0x40u);
    return (u16)((b + 0x7fffu + ((b >> 16) & 1u)) >> 16);
}

// Most splits of a matrix (src/mmq.rs MAX_SPLITS): add_norm's load_parts
// holds that many parts in registers.
#define MMQ_MAX_SPLITS 8
