// The attention kernels over the paged K/V cache, as templates and the
// macros that instantiate them (attention_f32.cu, attention_f16.cu: one
// module each, so the two K/V types compile in parallel): the QKV product's
// epilogue (qkv_post: RoPE, QK-norm, the cache write), decode attention
// (split, clustered, grouped, wide and tiled walks), and the cache gather
// for prefill's GEMM attention.

// Offset of position p's row (kvd values) in a layer's paged K or V cache,
// [block][layer in group][position in block][kv_dim]; `table`: the
// sequence's block table. (P: the caller's index type, kept for its division.)
template <typename P>
__device__ __forceinline__ u64 kv_row(const u32* table, P p, int bs, int nlg, int lig, int kvd) {
    return (((u64)table[p / bs] * nlg + lig) * bs + p % bs) * kvd;
}

// The KV cache's element: float, or f16 bits (u16, `--cache-type-k/v f16`:
// half the memory and half the bytes attention reads). Stored rounded to
// nearest even (as the CPU backend's f16 cache), read back exactly; kv_round
// is a store and a load, for values used both directly and from the cache.
// kv_f: a loaded element as float. Where the raw value waits in a register
// for its turn (the decode attention's rows in flight), converting it at the
// load (kv_ld) would stall the warp there until the load lands.
__device__ __forceinline__ float kv_f(float x) { return x; }
__device__ __forceinline__ float kv_f(u16 h) { return h2f(h); }
template <typename KV>
__device__ __forceinline__ float kv_ld(const KV* p) { return kv_f(*p); }
__device__ __forceinline__ void kv_st(float* p, float v) { *p = v; }
__device__ __forceinline__ void kv_st(u16* p, float v) { *p = f2half(v, 0); }
template <typename KV>
__device__ __forceinline__ float kv_round(float v) {
    return sizeof(KV) == 4 ? v : h2f(f2half(v, 0));
}

// One RoPE pair (x0, x1) rotated by (c, s), each output's multiply-adds
// spelled out so that qkv_post and the fused decode attention round alike
// (left to the compiler, the contraction differed between them).
__device__ __forceinline__ float rope_lo(float x0, float x1, float c, float s) {
    return __fmaf_rn(x0, c, -__fmul_rn(x1, s));
}
__device__ __forceinline__ float rope_hi(float x0, float x1, float c, float s) {
    return __fmaf_rn(x0, s, __fmul_rn(x1, c));
}

// After the QKV projection, a warp per (head, token) (grid: (ceil((n_heads +
// 2 n_kv) / warps), n); block: warps x 32, at most QP_WARPS warps):
// Q and K heads: optional per-head RMSNorm, RoPE; Q and K are written back in
// place, K and V go to the paged cache at the token's position.
// Cache layout: [block][layer in group][position in block][kv_dim].
#define QP_WARPS 4
template <typename KV>
__device__ __forceinline__ void qkv_post_impl(float* qkv, int stride, int n_heads, int n_kv, int hd,
                                              const float* qnw, const float* knw, float eps,
                                              const float* cosb, const float* sinb, int rope_dim, int neox,
                                              const u32* positions, const u32* rowidx, const u32* tables,
                                              int tstride, int bs, int nlg, int lig, KV* kc, KV* vc) {
    PDL_ENTRY();
    __shared__ float hs[QP_WARPS][512];
    int w = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int hi = blockIdx.x * (blockDim.x >> 5) + w, t = blockIdx.y;
    if (hi >= n_heads + 2 * n_kv) return;
    float* h = hs[w];
    int kvd = n_kv * hd;
    float* base = qkv + (u64)t * stride;
    float* p;
    int kind;  // 0 q, 1 k, 2 v
    int kh = 0;
    if (hi < n_heads) {
        p = base + hi * hd;
        kind = 0;
    } else if (hi < n_heads + n_kv) {
        kh = hi - n_heads;
        p = base + n_heads * hd + kh * hd;
        kind = 1;
    } else {
        kh = hi - n_heads - n_kv;
        p = base + n_heads * hd + kvd + kh * hd;
        kind = 2;
    }
    // Unrolled: a lane's loads issue together (one round trip, not hd / 32).
#pragma unroll 8
    for (int i = lane; i < hd; i += 32) h[i] = p[i];
    __syncwarp();
    u32 pos = positions[t];
    if (kind < 2) {
        const float* nw = kind == 0 ? qnw : knw;
        if (nw) {
            double s = 0.0;
#pragma unroll 8
            for (int i = lane; i < hd; i += 32) s += (double)h[i] * (double)h[i];
            double ss = warp_sum_d(s);
            float inv = (float)inv_rms(ss, hd, eps);
            __syncwarp();
#pragma unroll 8
            for (int i = lane; i < hd; i += 32) h[i] = h[i] * inv * nw[i];
            __syncwarp();
        }
        if (cosb) {
            int half = rope_dim >> 1;
            const float* cs = cosb + (u64)pos * half;
            const float* sn = sinb + (u64)pos * half;
#pragma unroll 4
            for (int i = lane; i < half; i += 32) {
                int a = neox ? i : 2 * i;
                int bb = neox ? i + half : 2 * i + 1;
                float x0 = h[a], x1 = h[bb], c = cs[i], s = sn[i];
                h[a] = rope_lo(x0, x1, c, s);
                h[bb] = rope_hi(x0, x1, c, s);
            }
            __syncwarp();
        }
    }
    // Q and K are written back too (the GEMM prefill attention reads Q
    // from here), K and V also go to the cache.
    if (kind < 2) {
#pragma unroll 8
        for (int i = lane; i < hd; i += 32) p[i] = h[i];
    }
    if (kind == 0) return;
    u64 at = kv_row(tables + (u64)rowidx[t] * tstride, pos, bs, nlg, lig, kvd) + (u64)kh * hd;
    KV* dst = (kind == 1 ? kc : vc) + at;
#pragma unroll 8
    for (int i = lane; i < hd; i += 32) kv_st(dst + i, h[i]);
}
#define QKV_POST(NAME, KV)                                                                             \
    extern "C" __global__ void NAME(float* qkv, int stride, int n_heads, int n_kv, int hd, const float* qnw, \
                                    const float* knw, float eps, const float* cosb, const float* sinb,  \
                                    int rope_dim, int neox, const u32* positions, const u32* rowidx,   \
                                    const u32* tables, int tstride, int bs, int nlg, int lig, KV* kc,  \
                                    KV* vc) {                                                          \
        qkv_post_impl<KV>(qkv, stride, n_heads, n_kv, hd, qnw, knw, eps, cosb, sinb, rope_dim, neox,   \
                          positions, rowidx, tables, tstride, bs, nlg, lig, kc, vc);                   \
    }

// Attention for one (query head, token) per block (grid: (n_heads, n, S); block: 128).
// Each warp walks a strided share of the visible positions with an online
// softmax; the warps' partial results are merged at the end. Lane l holds
// head dimensions l, l + 32, ... (head_dim <= 256).
// Split-K over positions (flash-decoding) when S = gridDim.z > 1: block s takes
// the s-th of S equal slices of the visible range and leaves (max, sum,
// unnormalised output) in `part`; the last block of the (head, token) to
// finish (a counter per pair, reset by that block for the next launch or
// graph replay) merges the S partials. A few heads x tokens would otherwise
// keep most SMs idle at long contexts. (Quantizing the output here for the
// next GEMV, instead of quantize_q8, measured 3.7 us slower per call than the
// 3.1 us kernel it saved: docs/BENCHMARKS.md.)
#define ATT_WARPS 4
// Warps a block of the split decode attention (attention_impl) for DPL
// dims a lane and G query heads a block: one head, 8 for heads of up to 64
// (half the positions each warp walks at long contexts; 61 registers, 4
// blocks an SM still hold a one-sequence step's 512 blocks), 4 above
// (96-168 registers: 8 would take two waves; at head dim 256, 8 lost 8-21%
// in Gemma-3-1B's steps of 2-8 sequences, NOTES.md item 113: steps of few
// blocks take the deep kernels instead); grouped (G = 4), 16: as many
// warps an SM as four one-head blocks, each walking a quarter of the
// positions for four heads (NOTES.md items 43, 62; backend.rs
// att_dec_threads).
#define ATT_DEC_WARPS(DPL, G) ((G) > 1 ? 16 : (DPL) <= 2 ? 8 : 4)
#define ATT_DPL 8
// K/V rows a warp of the decode attention keeps in flight (its first ones
// loaded before the PDL wait): 4, 2 for head dims above 128 (registers; 4
// there read 2-6.5% slower at Gemma-3-1B's positions 256-4,096, NOTES.md
// item 113).
#define ATT_PRE 4

// K and V of cache position p for KV head kh: lane l holds dims l, l + 32, ...
// (raw cache elements: att_step converts them).
template <int DPL, typename KV>
__device__ __forceinline__ void load_kv_row(const KV* kc, const KV* vc, const u32* table, int p, int bs,
                                            int nlg, int lig, int kvd, int kh, int hd, int lane, KV* kv,
                                            KV* vv) {
    u64 at = kv_row(table, p, bs, nlg, lig, kvd) + (u64)kh * hd;
#pragma unroll
    for (int i = 0; i < DPL; i++) {
        int d = lane + 32 * i;
        kv[i] = d < hd ? kc[at + d] : (KV)0;
        vv[i] = d < hd ? vc[at + d] : (KV)0;
    }
}

// qkv_post's per-head work on a head held as attention holds it (lane l:
// dims l, l + 32, ...; hd == 32 * DPL), the same operations in the same
// order: optional RMSNorm (nw), then RoPE over the whole head (cosb; NeoX
// pairs (i, i + hd / 2) sit in one lane, pairs (2i, 2i + 1) in a lane and
// its neighbour).
// What head_post reads besides the head: the norm's weights for this
// lane's dims (w[i]: dim lane + 32 i) and RoPE's cos / sin at the token's
// position (c[i], s[i]: pair of dim lane + 32 i). All load-time tables, so
// the fused attention reads them before its PDL wait.
template <int DPL>
struct HeadTables {
    float qw[DPL], kw[DPL], c[DPL], s[DPL];
};

template <int DPL>
__device__ __forceinline__ void head_tables(HeadTables<DPL>& t, const float* qnw, const float* knw,
                                            const float* cosb, const float* sinb, int neox, u32 pos, int lane) {
    constexpr int half = 16 * DPL;
#pragma unroll
    for (int i = 0; i < DPL; i++) {
        int d = lane + 32 * i;
        t.qw[i] = qnw ? qnw[d] : 0.0f;
        t.kw[i] = knw ? knw[d] : 0.0f;
        // NeoX rotates dims d and d + half by pair d (i < DPL / 2); GGUF
        // rotates dims 2j and 2j + 1 by pair j.
        int j = neox ? (i < DPL / 2 ? d : 0) : d >> 1;
        t.c[i] = cosb ? cosb[(u64)pos * half + j] : 0.0f;
        t.s[i] = cosb ? sinb[(u64)pos * half + j] : 0.0f;
    }
}

// Optional per-head RMSNorm (w: its weights, norm: whether there is one),
// then RoPE over the whole head (rope: whether there is one) with the
// cos / sin of head_tables.
template <int DPL>
__device__ __forceinline__ void head_post(float* v, bool norm, const float* w, float eps, bool rope, int neox,
                                          const float* c, const float* s, int lane) {
    constexpr int hd = 32 * DPL;
    if (norm) {
        double ss = 0.0;
#pragma unroll
        for (int i = 0; i < DPL; i++) ss = __fma_rn((double)v[i], (double)v[i], ss);
        ss = warp_sum_d(ss);
        float inv = (float)inv_rms(ss, hd, eps);
#pragma unroll
        for (int i = 0; i < DPL; i++) v[i] = v[i] * inv * w[i];
    }
    if (!rope) return;
    if (neox) {
#pragma unroll
        for (int i = 0; i < DPL / 2; i++) {
            float x0 = v[i], x1 = v[i + DPL / 2];
            v[i] = rope_lo(x0, x1, c[i], s[i]);
            v[i + DPL / 2] = rope_hi(x0, x1, c[i], s[i]);
        }
    } else {
#pragma unroll
        for (int i = 0; i < DPL; i++) {
            int d = lane + 32 * i;
            float o = __shfl_xor_sync(0xffffffffu, v[i], 1);
            v[i] = (d & 1) == 0 ? rope_lo(v[i], o, c[i], s[i]) : rope_hi(o, v[i], c[i], s[i]);
        }
    }
}

// A head's row at p (a query row, or the token's own K or V in its QKV
// row) into registers as attention holds a head (lane l: dims l, l + 32,
// ...), zeros past hd.
template <int DPL>
__device__ __forceinline__ void att_row(const float* p, int hd, int lane, float* v) {
#pragma unroll
    for (int i = 0; i < DPL; i++) {
        int d = lane + 32 * i;
        v[i] = d < hd ? p[d] : 0.0f;
    }
}

// The query rows of G heads (row_of(g): the g-th head's) into registers
// (att_row), and each head's online softmax state cleared.
template <int G, int DPL, typename R>
__device__ __forceinline__ void att_heads_init(R row_of, int hd, int lane, float (*qv)[DPL], float (*acc)[DPL],
                                               float* m, float* l) {
#pragma unroll
    for (int g = 0; g < G; g++) {
        att_row<DPL>(row_of(g), hd, lane, qv[g]);
#pragma unroll
        for (int i = 0; i < DPL; i++) acc[g][i] = 0.0f;
        m[g] = -INFINITY;
        l[g] = 0.0f;
    }
}

// exp(x) as `__expf` computes it (ex2 of x * log2(e) rounded to float),
// flushing results below 2^-126 to zero: those weigh nothing next to the
// running maximum's 1, and `__expf`'s non-flushing form spends three more
// instructions an exponential on the range check, on every position's chain
// (logits unchanged bit for bit; decode after 2,048 positions 8B Q4_K_M /
// bf16 +0.8-0.9%, tg256 +0.2-0.3%; NOTES.md item 116).
__device__ __forceinline__ float att_exp(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(__fmul_rn(x, 1.44269504088896341f)));
    return y;
}

// A head's score for one position into its online softmax: the running
// maximum m and sum l updated; corr rescales what was accumulated, e weighs
// the position.
__device__ __forceinline__ void att_online(float s, float scale, float softcap, float& m, float& l, float& corr,
                                           float& e) {
    s *= scale;
    if (softcap > 0.0f) s = tanhf(s / softcap) * softcap;
    float mn = fmaxf(m, s);
    corr = att_exp(m - mn);
    e = att_exp(s - mn);
    l = __fmaf_rn(l, corr, e);
    m = mn;
}

// One position into a warp's online softmax for its query head (lane l:
// dims l, l + 32, ...): score, running maximum and sum, accumulated e * V
// (K and V as float or raw cache elements, kv_f). The grouped decode
// kernels walk with split lanes instead (att_step_split). The fused
// multiply-adds are spelled out: left to the compiler, kernels of different
// layouts contracted `acc * corr + e * v` on different sides (logits 3e-6
// apart, more with an f16 cache).
template <int DPL, typename T>
__device__ __forceinline__ void att_step(const float* qv, const T* kv, const T* vv, int hd, int lane, float scale,
                                         float softcap, float& m, float& l, float* acc) {
    float s = 0.0f;
#pragma unroll
    for (int i = 0; i < DPL; i++) {
        int d = lane + 32 * i;
        if (d < hd) s = __fmaf_rn(qv[i], kv_f(kv[i]), s);
    }
    float corr, e;
    att_online(warp_sum(s), scale, softcap, m, l, corr, e);
#pragma unroll
    for (int i = 0; i < DPL; i++) {
        int d = lane + 32 * i;
        acc[i] = __fmaf_rn(acc[i], corr, d < hd ? __fmul_rn(e, kv_f(vv[i])) : 0.0f);
    }
}

// A tile of PRE scores (the first nv count) into an online softmax (m, l):
// each score scaled (and soft-capped) in place, m raised to the tile's
// maximum once, e[j] the positions' weights, l rescaled and added to; the
// correction for what was accumulated is returned. att_tile and
// att_tile_split share it.
template <int PRE>
__device__ __forceinline__ float att_tile_softmax(float* s, int nv, float scale, float softcap, float& m, float& l,
                                                  float* e) {
    float mt = -INFINITY;
#pragma unroll
    for (int j = 0; j < PRE; j++) {
        float v = s[j] * scale;
        if (softcap > 0.0f) v = tanhf(v / softcap) * softcap;
        s[j] = v;
        mt = fmaxf(mt, j < nv ? v : -INFINITY);
    }
    float mn = fmaxf(m, mt);
    float corr = att_exp(m - mn);
    m = mn;
    float le = 0.0f;
#pragma unroll
    for (int j = 0; j < PRE; j++) {
        e[j] = j < nv ? att_exp(s[j] - mn) : 0.0f;
        le += e[j];
    }
    l = __fmaf_rn(l, corr, le);
    return corr;
}

// att_step over the first nv of PRE slots' positions at once (the wide
// kernels' walk): the scores' dots and shuffles are independent chains,
// and the softmax rescales once a tile, as att_tile_split does for split
// lanes. A position at a time, a warp's ~7 positions at 200 were ~4 us of
// dependent shuffles and exps (NOTES.md item 67).
template <int DPL, int PRE, typename T>
__device__ __forceinline__ void att_tile(const float* qv, const T (*kv)[DPL], const T (*vv)[DPL], int nv, int hd,
                                         int lane, float scale, float softcap, float& m, float& l, float* acc) {
    float s[PRE];
#pragma unroll
    for (int j = 0; j < PRE; j++) {
        s[j] = 0.0f;
#pragma unroll
        for (int i = 0; i < DPL; i++)
            if (lane + 32 * i < hd) s[j] = __fmaf_rn(qv[i], kv_f(kv[j][i]), s[j]);
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
#pragma unroll
        for (int j = 0; j < PRE; j++) s[j] += __shfl_xor_sync(0xffffffffu, s[j], o);
    float e[PRE];
    float corr = att_tile_softmax<PRE>(s, nv, scale, softcap, m, l, e);
#pragma unroll
    for (int i = 0; i < DPL; i++) {
        float a = acc[i] * corr;
#pragma unroll
        for (int j = 0; j < PRE; j++) a = j < nv ? __fmaf_rn(e[j], kv_f(vv[j][i]), a) : a;
        acc[i] = lane + 32 * i < hd ? a : 0.0f;
    }
}

// The token's own K and V (for KV head kh: kr its K in the QKV row, its V
// kvd further) as attention holds a head. (Not two att_row calls: K's and
// V's loads interleaved are what the one-head kernels were measured with.)
template <int DPL>
__device__ __forceinline__ void att_own_rows(const float* kr, int kvd, int hd, int lane, float* okv, float* ovv) {
#pragma unroll
    for (int i = 0; i < DPL; i++) {
        int d = lane + 32 * i;
        okv[i] = d < hd ? kr[d] : 0.0f;
        ovv[i] = d < hd ? kr[kvd + d] : 0.0f;
    }
}

// A head's output (lane l: dims l, l + 32, ...) into out, and with xq also
// as the 8-bit blocks (32 dims each, from block blk0) that the O projection
// reads, so no quantize_q8 pass runs between (the backend passes xq only
// when hd % 32 == 0: every block whole, in one warp).
// Out of line: inlined, it cost the attention kernels 20-30 registers. The
// values travel by value, not read back from o: that was one more dependent
// round trip to L2 at the end of every merge.
template <int DPL>
struct AttRow {
    float v[DPL];
};
template <int DPL>
__device__ __noinline__ void att_quant(AttRow<DPL> o, int hd, int lane, i8* xq, float* xqd, float* xqs, u64 blk0) {
#pragma unroll
    for (int i = 0; i < DPL; i++)
        if (32 * i < hd) quant_q8_warp(o.v[i], lane, blk0 + i, xq, xqd, xqs);
}

template <int DPL>
__device__ __forceinline__ void att_store(float* o, const float* v, int hd, int lane, i8* xq, float* xqd,
                                          float* xqs, u64 blk0) {
    AttRow<DPL> r;
#pragma unroll
    for (int i = 0; i < DPL; i++) {
        int d = lane + 32 * i;
        if (d < hd) o[d] = v[i];
        r.v[i] = v[i];
    }
    if (xq) att_quant<DPL>(r, hd, lane, xq, xqd, xqs, blk0);
}

// Slice merge inside a thread-block cluster (sm_90): a (query head, token)
// pair's S slices are one cluster (grid (S, heads, tokens)), each slice's
// (M, L, Σ e·v) stays in its block's shared memory and the first block
// reads the others' through distributed shared memory after a cluster
// barrier: no partials in global memory, no fence, no atomic counter, no
// second pass over L2 (those were ~3 dependent round trips per call).
__device__ __forceinline__ void cluster_sync_all() {
#if __CUDA_ARCH__ >= 900
    asm volatile("barrier.cluster.arrive.release.aligned;\n\tbarrier.cluster.wait.acquire.aligned;" ::: "memory");
#endif
}

// The float at `p` in the shared memory of the cluster's block `rank`.
__device__ __forceinline__ float ld_cluster(const float* p, u32 rank) {
    float v = 0.0f;
#if __CUDA_ARCH__ >= 900
    u32 a = (u32)__cvta_generic_to_shared(p), ra;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(ra) : "r"(a), "r"(rank));
    asm volatile("ld.shared::cluster.f32 %0, [%1];" : "=f"(v) : "r"(ra) : "memory");
#endif
    return v;
}

// Warp 0's view of its block's warps: their running maxima folded into M,
// their sums into L, each warp's weight f[w] = exp(m_w - M).
template <int W>
__device__ __forceinline__ void att_block_weights(const float* sm, const float* sl, float* f, float& M, float& L) {
    M = -INFINITY;
    for (int w = 0; w < W; w++) M = fmaxf(M, sm[w]);
    L = 0.0f;
    for (int w = 0; w < W; w++) {
        f[w] = sm[w] == -INFINITY ? 0.0f : att_exp(sm[w] - M);
        L = __fmaf_rn(sl[w], f[w], L);
    }
}

// The block's Σ e·v for dim d: the warps' sums weighted by f.
template <int DPL, int W>
__device__ __forceinline__ float att_block_sum(const float (*sacc)[DPL * 32], const float* f, int d) {
    float s = 0.0f;
    for (int w = 0; w < W; w++) s = __fmaf_rn(sacc[w][d], f[w], s);
    return s;
}

// The block's slice as (M, L, Σ e·v) at dst (global slot or shared memory).
template <int DPL, int W>
__device__ __forceinline__ void att_slice_put(float* dst, const float (*sacc)[DPL * 32], const float* f, float M,
                                              float L, int hd, int lane) {
#pragma unroll
    for (int i = 0; i < DPL; i++) {
        int d = lane + 32 * i;
        if (d < hd) dst[2 + d] = att_block_sum<DPL, W>(sacc, f, d);
    }
    if (lane == 0) {
        dst[0] = M;
        dst[1] = L;
    }
}

// Merges S slices' (M, L, Σ e·v) — slot k's value at offset o is ld(k, o):
// M at 0, L at 1, dims from 2 — into os (lane l: dims l, l + 32, ...), S <=
// 32. Lane k loads slot k's (M, L), each weight exp(M_k - GM) is computed
// once and passed by shuffles, and the loads of the outputs depend on
// nothing loaded before them. (Walking the slices with dependent volatile
// loads was ~12 us of serial L2 round trips per call: attention cost 18-26
// us a layer.)
template <int DPL, typename Ld>
__device__ __forceinline__ void att_merge(Ld ld, int S, int hd, int lane, float* os) {
    float mk = lane < S ? ld(lane, 0) : -INFINITY;
    float lk = lane < S ? ld(lane, 1) : 0.0f;
    float GM = warp_max(mk);
    float wk = mk == -INFINITY ? 0.0f : att_exp(mk - GM);
    float GL = 0.0f;
    for (int k = 0; k < S; k++) GL += __shfl_sync(0xffffffffu, lk * wk, k);
    float invL = GL > 0.0f ? 1.0f / GL : 0.0f;
#pragma unroll
    for (int i = 0; i < DPL; i++) os[i] = 0.0f;
#pragma unroll 16
    for (int k = 0; k < S; k++) {
        float w = __shfl_sync(0xffffffffu, wk, k);
#pragma unroll
        for (int i = 0; i < DPL; i++) {
            int d = lane + 32 * i;
            if (d < hd) os[i] = __fmaf_rn(ld(k, 2 + d), w, os[i]);
        }
    }
#pragma unroll
    for (int i = 0; i < DPL; i++) os[i] *= invL;
}

// The end of a CLU attention block: warp g folds the block's warps into
// head g's slice (M, L, Σ e·v) as the global-memory merge does, warp g of
// the first block of the cluster merges head g's S slices in the same order
// with the same arithmetic (so results equal the unclustered split bit for
// bit), and every block waits until it has been read. All threads of every
// block call it. ob: the token's output row; xrow: its first value's index
// (the 8-bit blocks' numbering).
template <int DPL, int W, int G>
__device__ __forceinline__ void attention_cluster_merge(const float (*sm)[W], const float (*sl)[W],
                                                        const float (*sacc)[W][DPL * 32], int hd, int S, int sp,
                                                        int warp, int lane, int h0, int gn, float* ob, u64 xrow,
                                                        i8* xq, float* xqd, float* xqs) {
    __shared__ float cp[G][2 + DPL * 32];
    if (warp < gn) {
        float M, L, f[W];
        att_block_weights<W>(sm[warp], sl[warp], f, M, L);
        att_slice_put<DPL, W>(cp[warp], sacc[warp], f, M, L, hd, lane);
    }
    cluster_sync_all();
    // Timeline marks as the global merge's: 3 past the barrier, 4 stored.
    tl_mark(3);
    if (sp == 0 && warp < gn) {
        float os[DPL];
        const float* c = cp[warp];
        att_merge<DPL>([&](int k, int off) { return ld_cluster(c + off, k); }, S, hd, lane, os);
        int h = h0 + warp;
        att_store<DPL>(ob + (u64)h * hd, os, hd, lane, xq, xqd, xqs, (xrow + (u64)h * hd) >> 5);
        tl_mark(4);
    }
    // The other blocks' shared memory is read: they may exit.
    cluster_sync_all();
}

// The tensor-core walk of the grouped kernels over an f16 cache (TC; head
// dim 128): scores and values through mma.m16n8k16 f16 with K and V as the
// cache holds them, and q and the weights, which are f32, split in an f16
// high part and the f16 rounding of the rest (two products each), so that
// the sums keep nearly f32's accuracy (2.4e-6 of the largest logit against
// the CUDA-core walk on a 2-layer model; more over many layers, where a K or
// V value rounds to the other f16 neighbour). An f32 cache's version
// (3xTF32, mma.m16n8k8) lost 5% to the CUDA-core walk at 2,048 positions
// (NOTES.md item 117).
// d += A B: A 16 x 16 (a0 [g][2t, 2t + 1], a1 [g + 8][2t, 2t + 1], a2
// [g][2t + 8, 2t + 9], a3 [g + 8][2t + 8, 2t + 9]), B 16 x 8 (b0 [2t, 2t +
// 1][g], b1 [2t + 8, 2t + 9][g]; f16 pairs, the lower index in the low
// half), d as [g][2t], [g][2t + 1], [g + 8][2t], [g + 8][2t + 1] (g = lane /
// 4, t = lane % 4).
__device__ __forceinline__ void mma_f16(float (&d)[4], u32 a0, u32 a1, u32 a2, u32 a3, u32 b0, u32 b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}
// (x0, x1) as an f16 pair (x0 low) and the pair of what rounding left.
__device__ __forceinline__ void f16x2_split(float x0, float x1, u32& hi, u32& lo) {
    asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(hi) : "f"(x1), "f"(x0));
    float r0 = x0 - h2f((u16)(hi & 0xffffu)), r1 = x1 - h2f((u16)(hi >> 16));
    asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(lo) : "f"(r1), "f"(r0));
}

// One 16-position tile of an f16 cache as lane (g, t) of att_walk_tc_h
// holds it: k[h] = position b + 8 h + g's dims 32 t .. 32 t + 31, v[j] =
// position b + (j & 1) + 2 t + 8 (j >> 1)'s dims 16 g .. 16 g + 15.
struct TcTileH {
    uint4 k[2][4], v[4][2];
};
// Lane (g, t)'s rows of the tile at b, positions past `last` taken as
// `last`, those up to `skip` left out (SKIP): fk(h, p, words) for K rows h
// = 0, 1 (position p, its 4 words of the lane), fv(j, p, words) for V rows
// j = 0 .. 3 (2 words) — the tile's geometry for its loads, mends and
// prefetches alike.
template <bool SKIP = false, typename RowAt, typename FK, typename FV>
__device__ __forceinline__ void tc_h_rows(const u16* kc, const u16* vc, RowAt row_at, int b, int last, int g, int t,
                                          FK fk, FV fv, int skip = 0) {
#pragma unroll
    for (int h = 0; h < 2; h++) {
        int p = min(b + 8 * h + g, last);
        if (SKIP && p <= skip) continue;
        fk(h, p, (const uint4*)(kc + row_at(p) + 32 * t));
    }
#pragma unroll
    for (int j = 0; j < 4; j++) {
        int p = min(b + (j & 1) + 2 * t + 8 * (j >> 1), last);
        if (SKIP && p <= skip) continue;
        fv(j, p, (const uint4*)(vc + row_at(p) + 16 * g));
    }
}
// Positions past `last` load the last one's rows: unconditional loads stay
// together ahead of their uses (conditional ones were placed at each use,
// a round trip a step); those positions' weights are 0 and their (finite)
// values add nothing.
template <typename RowAt>
__device__ __forceinline__ void tc_h_load(const u16* kc, const u16* vc, RowAt row_at, int b, int last, int g, int t,
                                          TcTileH& x) {
    tc_h_rows(
        kc, vc, row_at, b, last, g, t,
        [&](int h, int, const uint4* kp) {
#pragma unroll
            for (int i = 0; i < 4; i++) x.k[h][i] = kp[i];
        },
        [&](int j, int, const uint4* vp) {
            x.v[j][0] = vp[0];
            x.v[j][1] = vp[1];
        });
}
// The rows of a tile loaded before the PDL wait (positions up to `safe`,
// which finished steps wrote) that lie past it: the token's own position
// from `own` (its K and V rounded to f16 and back, so exact), others again
// from the cache (written by then).
template <typename RowAt>
__device__ __forceinline__ void tc_h_fix(const u16* kc, const u16* vc, RowAt row_at, int b, int last, int safe,
                                         int own_pos, const float (*own)[128], int g, int t, TcTileH& x) {
    auto pair = [&](int k, int d) {
        return (u32)f2half(own[k][d], 0) | ((u32)f2half(own[k][d + 1], 0) << 16);
    };
    // Dims d .. d + 7 of position p's K (k = 0) or V (1) row; src: the cache's.
    auto word8 = [&](int k, int p, int d, const uint4* src) {
        return p == own_pos ? make_uint4(pair(k, d), pair(k, d + 2), pair(k, d + 4), pair(k, d + 6)) : *src;
    };
    tc_h_rows<true>(
        kc, vc, row_at, b, last, g, t,
        [&](int h, int p, const uint4* kp) {
#pragma unroll
            for (int i = 0; i < 4; i++) x.k[h][i] = word8(0, p, 32 * t + 8 * i, kp + i);
        },
        [&](int j, int p, const uint4* vp) {
#pragma unroll
            for (int i = 0; i < 2; i++) x.v[j][i] = word8(1, p, 16 * g + 8 * i, vp + i);
        },
        safe);
}

// The walk of one warp over tiles of 16 positions (b .. b + 15,
// W * 16 apart). S = Q K^T in two groups of 8 positions (B's columns: lane
// (g, t) holds positions b + g and b + 8 + g, dims 32 t .. 32 t + 31: word
// j = dims 32 t + 2j, + 1, so k-step s's rows 2t, 2t + 1 are dims 32 t + 4 s,
// + 1 and rows 2t + 8, + 9 are + 2, + 3); sqh row 4 h + t holds head h's
// same pairs per step as {hi, hi, lo, lo}. Lane (g < 4, t) gets head g's
// scores of positions 2t, 2t + 1 (group 0) and 8 + 2t, 9 + 2t (group 1):
// exactly B = P^T of O^T += V^T P^T with position r as k-row r; its A (V^T,
// m-tile mt: rows g, g + 8 = dims 16 g + 2 mt and + 1) pairs positions 2t,
// 2t + 1 and 8 + 2t, 9 + 2t of the lane's dims 16 g .. 16 g + 15 (byte
// permutes of the loaded words). o[mt]: dims 16 g + 2 mt (+1 for
// 2, 3) of heads 2t, 2t + 1 (NH = 4: lanes t >= 2 hold padding heads,
// zero). NH: the block's heads, 4 or 8 (A's rows 0-7 and B's columns 0-7
// are there either way: 8 heads take the same products). `pre`:
// `first` already holds the warp's first tile (tc_h_load before the PDL
// wait, tc_h_fix after the barrier); else it is loaded here.
template <int NH, typename RowAt>
__device__ __forceinline__ void att_walk_tc_h(const u16* kc, const u16* vc, RowAt row_at, const u32 (*sqh)[36],
                                              int start, int lend, int warp, int W, int lane, float scale, bool pre,
                                              TcTileH& first, float& m, float& l, float (&o)[8][4]) {
    static_assert(NH == 4 || NH == 8, "the walk's heads: 4 or 8");
    int g = lane >> 2, t = lane & 3;
    bool hq = g < NH;
    m = -INFINITY;
    l = 0.0f;
#pragma unroll
    for (int mt = 0; mt < 8; mt++)
#pragma unroll
        for (int i = 0; i < 4; i++) o[mt][i] = 0.0f;
    // The warp's later tiles into L2 while the first is walked: their loads
    // then take an L2 round trip each, not a DRAM one (8B Q4_K_M at 8,192
    // positions: 422 -> 432 tok/s against the slice's rows prefetched by the
    // whole block before the PDL wait, which cost the CUDA-core walk 5%).
    auto prefetch = [](int, int, const uint4* row) { asm volatile("prefetch.global.L2 [%0];" ::"l"(row)); };
    for (int b = start + 16 * warp + 16 * W; b < lend; b += 16 * W)
        tc_h_rows(kc, vc, row_at, b, lend - 1, g, t, prefetch, prefetch);
    auto step = [&](int b, const TcTileH& tile) {
        int nv = min(16, lend - b);
        auto& kx = tile.k;
        auto& vx = tile.v;
        // Every load's first word into the first product's accumulator (0
        // times it, as an f16 read as a finite float) so that all 16 are
        // issued before any product.
        float guard = 0.0f;
#pragma unroll
        for (int i = 0; i < 4; i++) {
            guard = __fmaf_rn(h2f((u16)kx[0][i].x), 0.0f, guard);
            guard = __fmaf_rn(h2f((u16)kx[1][i].x), 0.0f, guard);
            guard = __fmaf_rn(h2f((u16)vx[i][0].x), 0.0f, guard);
            guard = __fmaf_rn(h2f((u16)vx[i][1].x), 0.0f, guard);
        }
        float sc[2][4] = {{guard, 0.0f, 0.0f, 0.0f}, {0.0f, 0.0f, 0.0f, 0.0f}};
#pragma unroll
        for (int st = 0; st < 8; st++) {
            uint4 qv = hq ? *(const uint4*)&sqh[4 * g + t][4 * st] : make_uint4(0u, 0u, 0u, 0u);
#pragma unroll
            for (int h = 0; h < 2; h++) {
                const uint4& w = kx[h][st >> 1];
                u32 b0 = (st & 1) ? w.z : w.x, b1 = (st & 1) ? w.w : w.y;
                mma_f16(sc[h], qv.x, 0u, qv.y, 0u, b0, b1);
                mma_f16(sc[h], qv.z, 0u, qv.w, 0u, b0, b1);
            }
        }
        float x[4] = {sc[0][0], sc[0][1], sc[1][0], sc[1][1]};
        int pr[4] = {2 * t, 2 * t + 1, 8 + 2 * t, 9 + 2 * t};
        float tm = -INFINITY;
#pragma unroll
        for (int i = 0; i < 4; i++) {
            x[i] = pr[i] < nv ? x[i] * scale : -INFINITY;
            tm = fmaxf(tm, x[i]);
        }
        tm = fmaxf(tm, __shfl_xor_sync(0xffffffffu, tm, 1));
        tm = fmaxf(tm, __shfl_xor_sync(0xffffffffu, tm, 2));
        float mn = fmaxf(m, tm), corr = att_exp(m - mn), e[4];
#pragma unroll
        for (int i = 0; i < 4; i++) e[i] = hq ? att_exp(x[i] - mn) : 0.0f;
        if (!hq) corr = 1.0f;
        l = __fmaf_rn(l, corr, (e[0] + e[1]) + (e[2] + e[3]));
        m = mn;
        float cA = __shfl_sync(0xffffffffu, corr, 8 * t), cB = __shfl_sync(0xffffffffu, corr, 8 * t + 4);
        u32 ph0, pl0, ph1, pl1;
        f16x2_split(e[0], e[1], ph0, pl0);
        f16x2_split(e[2], e[3], ph1, pl1);
#pragma unroll
        for (int mt = 0; mt < 8; mt++) {
            o[mt][0] *= cA;
            o[mt][1] *= cB;
            o[mt][2] *= cA;
            o[mt][3] *= cB;
            // Word mt of the lane's 8: dims 16 g + 2 mt (low half), + 1 (high).
            auto word = [&](int j) {
                const uint4& v = vx[j][mt >> 2];
                int k = mt & 3;
                return k == 0 ? v.x : k == 1 ? v.y : k == 2 ? v.z : v.w;
            };
            u32 w0 = word(0), w1 = word(1), w2 = word(2), w3 = word(3);
            u32 a0 = __byte_perm(w0, w1, 0x5410), a1 = __byte_perm(w0, w1, 0x7632);
            u32 a2 = __byte_perm(w2, w3, 0x5410), a3 = __byte_perm(w2, w3, 0x7632);
            mma_f16(o[mt], a0, a1, a2, a3, ph0, ph1);
            mma_f16(o[mt], a0, a1, a2, a3, pl0, pl1);
        }
    };
    // The first tile apart: `first` is then dead in the loop.
    int b = start + 16 * warp;
    if (b < lend) {
        if (!pre) tc_h_load(kc, vc, row_at, b, lend - 1, g, t, first);
        step(b, first);
    }
    for (b += 16 * W; b < lend; b += 16 * W) {
        TcTileH tile;
        tc_h_load(kc, vc, row_at, b, lend - 1, g, t, tile);
        step(b, tile);
    }
    l += __shfl_xor_sync(0xffffffffu, l, 1);
    l += __shfl_xor_sync(0xffffffffu, l, 2);
}
// Lane (g, tq)'s walk sums (att_walk_tc_h's o: two heads' dims 16 g + 2 mt
// and + 1) into head slots slot and slot + 1 of sacc at this warp.
template <int W>
__device__ __forceinline__ void tc_h_sacc(float (*sacc)[W][128], const float (&o)[8][4], int warp, int g, int slot) {
#pragma unroll
    for (int mt = 0; mt < 8; mt++) {
        int d0 = 16 * g + 2 * mt;
        sacc[slot][warp][d0] = o[mt][0];
        sacc[slot + 1][warp][d0] = o[mt][1];
        sacc[slot][warp][d0 + 1] = o[mt][2];
        sacc[slot + 1][warp][d0 + 1] = o[mt][3];
    }
}

// Grouped blocks (G = 4) walk their positions with the lanes split over the
// heads: a head's dims over LPH = hd / 8 lanes (hd = 32 DPL: 8 lanes for
// head dims up to 64, 16 up to 128), so a warp holds HP = 32 / LPH heads at
// once and takes the block's four in G / HP passes over the same K / V
// registers. A lane holds 8 dims of a head (two 16-byte words of a float
// cache, one of f16), word n of lane j being elements E (LPH n + j) .. + E - 1
// (E per word): the lanes of a head read contiguous bytes. A position's
// scores then take log2(LPH) shuffles a pass (the passes independent) and a
// lane computes one exp pair a pass, where a warp holding all four heads
// (lane l: dims l, l + 32, ...) spent ten shuffles and four heads' exps in
// series on every position (NOTES.md item 63). The backend takes these
// kernels for head dims that 8 divides.
template <int DPL, typename KV>
struct SplitLanes {
    static constexpr int LPH = 4 * DPL, HP = 32 / LPH, NP = 4 / HP;
    static constexpr int E = 16 / (int)sizeof(KV), NV = 8 / E;
    // The head dim of a lane's element i (0 .. 7).
    static __device__ __forceinline__ int dim(int j, int i) { return E * (LPH * (i / E) + j) + i % E; }
};
// Registers a lane gives the K / V words of the positions it keeps in flight.
#define ATT_SPLIT_REGS 64

// A lane's words of one position's K and V rows (raw cache elements).
template <typename KV>
struct KvWords {
    static constexpr int NV = 8 * (int)sizeof(KV) / 16;
    uint4 k[NV], v[NV];
};

// Word n of lane j's share of the K or V row at `at`; zeros past hd.
template <int DPL, typename KV>
__device__ __forceinline__ uint4 kv_word(const KV* c, u64 at, int j, int hd, int n) {
    using SL = SplitLanes<DPL, KV>;
    int d = SL::E * (SL::LPH * n + j);
    return d < hd ? *(const uint4*)(c + at + d) : make_uint4(0, 0, 0, 0);
}

// Lane j's words of one K or V row at `at`.
template <int DPL, typename KV, int NV>
__device__ __forceinline__ void load_kv_half(const KV* c, u64 at, int j, int hd, uint4 (&w)[NV]) {
#pragma unroll
    for (int n = 0; n < NV; n++) w[n] = kv_word<DPL>(c, at, j, hd, n);
}

// Lane j's words of the K and V rows at `at`.
template <int DPL, typename KV>
__device__ __forceinline__ void load_kv_words(const KV* kc, const KV* vc, u64 at, int j, int hd, KvWords<KV>& r) {
#pragma unroll
    for (int n = 0; n < KvWords<KV>::NV; n++) {
        r.k[n] = kv_word<DPL>(kc, at, j, hd, n);
        r.v[n] = kv_word<DPL>(vc, at, j, hd, n);
    }
}

// Element i of a lane's words as a float (the last argument picks the
// cache's element), converted where it is used so that registers hold the
// raw words (half as many with an f16 cache).
template <int NV>
__device__ __forceinline__ float word_at(const uint4 (&w)[NV], int i, const float*) {
    const uint4& x = w[i >> 2];
    u32 b = (i & 3) == 0 ? x.x : (i & 3) == 1 ? x.y : (i & 3) == 2 ? x.z : x.w;
    return __uint_as_float(b);
}
template <int NV>
__device__ __forceinline__ float word_at(const uint4 (&w)[NV], int i, const u16*) {
    const uint4& x = w[i >> 3];
    int k = (i >> 1) & 3;
    u32 b = k == 0 ? x.x : k == 1 ? x.y : k == 2 ? x.z : x.w;
    return h2f((u16)((i & 1) ? b >> 16 : b & 0xffffu));
}

// One position into a lane's NP online softmaxes (one head a pass; q: the
// lane's 8 dims of each; K, V through k_at / v_at): each score summed over
// the head's LPH lanes, the passes' chains interleaved.
template <int LPH, int NP, typename KAt, typename VAt>
__device__ __forceinline__ void att_step_split(const float (*qf)[8], KAt k_at, VAt v_at, float scale,
                                               float softcap, float* m, float* l, float (*acc)[8]) {
    float s[NP];
#pragma unroll
    for (int k = 0; k < NP; k++) {
        float s2[2] = {0.0f, 0.0f};
#pragma unroll
        for (int i = 0; i < 8; i++) s2[i & 1] = __fmaf_rn(qf[k][i], k_at(i), s2[i & 1]);
        s[k] = s2[0] + s2[1];
    }
#pragma unroll
    for (int o = 1; o < LPH; o <<= 1)
#pragma unroll
        for (int k = 0; k < NP; k++) s[k] += __shfl_xor_sync(0xffffffffu, s[k], o);
#pragma unroll
    for (int k = 0; k < NP; k++) {
        float corr, e;
        att_online(s[k], scale, softcap, m[k], l[k], corr, e);
#pragma unroll
        for (int i = 0; i < 8; i++) acc[k][i] = __fmaf_rn(acc[k][i], corr, __fmul_rn(e, v_at(i)));
    }
}

// att_step_split for the position whose words a slot holds.
template <int LPH, int NP, typename KV>
__device__ __forceinline__ void att_step_words(const float (*qf)[8], const KvWords<KV>& c, float scale,
                                               float softcap, float* m, float* l, float (*acc)[8]) {
    att_step_split<LPH, NP>(
        qf, [&](int i) { return word_at(c.k, i, (const KV*)nullptr); },
        [&](int i) { return word_at(c.v, i, (const KV*)nullptr); }, scale, softcap, m, l, acc);
}

// PRE positions at once into a lane's NP online softmaxes, as
// att_step_split takes one (slot j: words r[j]; the first nv slots count,
// the others' words reach nothing but selects). The PRE x NP scores' sums
// and shuffles are independent chains, and the softmax rescales once a
// tile: one correction exp a pass, then one fused multiply-add per position
// and dim, where a position at a time paid an exp and a multiply per
// position and dim, each waiting on the last. The slots' K words are
// refilled (refill_k(j)) as soon as the scores are taken, their V words
// (refill_v(j)) once accumulated. Head dims up to 64 only (NOTES.md item 64).
template <int LPH, int NP, int PRE, typename KV, typename RK, typename RV>
__device__ __forceinline__ void att_tile_split(const float (*qf)[8], KvWords<KV>* r, int nv, float scale,
                                               float softcap, float* m, float* l, float (*acc)[8], RK refill_k,
                                               RV refill_v) {
    float s[PRE][NP];
#pragma unroll
    for (int j = 0; j < PRE; j++)
#pragma unroll
        for (int k = 0; k < NP; k++) {
            float s2[2] = {0.0f, 0.0f};
#pragma unroll
            for (int i = 0; i < 8; i++)
                s2[i & 1] = __fmaf_rn(qf[k][i], word_at(r[j].k, i, (const KV*)nullptr), s2[i & 1]);
            s[j][k] = s2[0] + s2[1];
        }
#pragma unroll
    for (int j = 0; j < PRE; j++) refill_k(j);
#pragma unroll
    for (int o = 1; o < LPH; o <<= 1)
#pragma unroll
        for (int j = 0; j < PRE; j++)
#pragma unroll
            for (int k = 0; k < NP; k++) s[j][k] += __shfl_xor_sync(0xffffffffu, s[j][k], o);
#pragma unroll
    for (int k = 0; k < NP; k++) {
        float sk[PRE], e[PRE];
#pragma unroll
        for (int j = 0; j < PRE; j++) sk[j] = s[j][k];
        float corr = att_tile_softmax<PRE>(sk, nv, scale, softcap, m[k], l[k], e);
#pragma unroll
        for (int i = 0; i < 8; i++) {
            float a = acc[k][i] * corr;
#pragma unroll
            for (int j = 0; j < PRE; j++) {
                float w = word_at(r[j].v, i, (const KV*)nullptr);
                a = j < nv ? __fmaf_rn(e[j], w, a) : a;
            }
            acc[k][i] = a;
        }
    }
#pragma unroll
    for (int j = 0; j < PRE; j++) refill_v(j);
}

// The end of a wide block (attention_impl's WN = W warps, 32 or 16, one
// slice): lane k of a warp reads warp k's (m, l), and warp i sums dims 32 i
// .. 32 i + 31 over the W warps (four chains), then stores them and
// quantizes them as the O projection's 8-bit block blk0 + i. No partials in
// global memory, no fence, no counter: that chain (the slice's store, a
// fence, an atomic, the last block's loads of 16 slices) was ~3.5 of a
// 1B layer's 6.6 us of attention (NOTES.md item 67).
template <int DPL, int W>
__device__ __forceinline__ void att_wide_merge(const float* sm, const float* sl, const float (*sacc)[DPL * 32],
                                               int hd, int warp, int lane, float* o, i8* xq, float* xqd,
                                               float* xqs, u64 blk0) {
    static_assert(W <= 32 && W % 4 == 0, "a lane per warp, four chains");
    if (warp >= DPL || 32 * warp >= hd) return;
    int d = lane + 32 * warp;
    float mk = lane < W ? sm[lane] : -INFINITY;
    float M = warp_max(mk);
    float fk = mk == -INFINITY ? 0.0f : att_exp(mk - M);
    float L = warp_sum(lane < W ? sl[lane] * fk : 0.0f);
    float s[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
    for (int k = 0; k < W; k++) s[k & 3] = __fmaf_rn(sacc[k][d], __shfl_sync(0xffffffffu, fk, k), s[k & 3]);
    float v = ((s[0] + s[1]) + (s[2] + s[3])) * (L > 0.0f ? 1.0f / L : 0.0f);
    if (d < hd) o[d] = v;
    if (xq) quant_q8_warp(v, lane, blk0 + warp, xq, xqd, xqs);
}

// FUSED (one token per sequence in the step, causal): qkv_post's work is
// done here instead. q is then the raw QKV row; every block applies the
// norm and RoPE to its query heads, the block holding the token's own
// position computes that position's K (and reads V) from the QKV row rather
// than the cache, and the first block of each KV group writes both to the
// cache for later steps. CLU: the slices merge inside a cluster
// (attention_cluster_merge). L2W: the block also issues its share of an L2
// window (l2_ahead) for the O projection after it, before its PDL wait.
// G: query heads a block serves, up to G of one KV group, so each K / V row
// it loads serves all of them (a block per query head loads the group's
// rows group times: at long contexts those loads and their round trips are
// the kernel's time). A larger group splits evenly over ceil(group / G)
// blocks; a block of fewer heads than G computes copies of its last (never
// stored). G = 4 blocks walk with split lanes (SplitLanes, 16 warps) and
// then merge as the one-head kernel does; their sums run in another order,
// so logits round apart (cuda_check's grouped rows). backend.rs
// att_head_blocks must agree.
// WN: warps a block, when not ATT_DEC_WARPS (the wide kernels, one slice,
// att_wide_merge: 32 for head dims up to 64, 16 up to 128 and up to 256).
// WD: warps a block of the split kernels, when not ATT_DEC_WARPS (the deep
// kernels: 16 at head dim 256 in steps of few blocks, backend.rs).
template <typename KV, int DPL, bool FUSED, bool CLU = false, bool L2W = false, int G = 1, int WN = 0,
          int WD = 0, bool TC = false>
__device__ __forceinline__ void attention_impl(const float* q, int qstride, const KV* kc, const KV* vc,
                                               int n_heads, int n_kv, int hd, const u32* positions,
                                               const u32* ends, const u32* rowidx, const u32* tables,
                                               int tstride, int bs, int nlg, int lig, int window, float scale,
                                               float softcap, float* out, int ostride, float* part, u32* counters,
                                               i8* xq, float* xqd, float* xqs, const float* qnw, const float* knw,
                                               float eps, const float* cosb, const float* sinb, int neox,
                                               const u8* pfa = nullptr, u64 pfna = 0, const u8* pfb = nullptr,
                                               u64 pfnb = 0) {
    constexpr int W = WN > 0 ? WN : WD > 0 ? WD : ATT_DEC_WARPS(DPL, G);
    static_assert(W >= G, "a warp per head for the merges");
    static_assert(WN == 0 || ((WN == 32 || WN == 16) && G == 1 && !CLU), "wide blocks: 32 or 16 warps, one head");
    // TWO: the tensor-core walk's blocks of 8 heads (groups of 5-8) put their
    // warps' sums through sacc four heads at a time (8 heads' would be 64 KB).
    constexpr bool TWO = TC && G > 4;
    static_assert(!TWO || (G == 8 && !CLU && WN == 0), "8-head blocks: the tensor-core walk, global merge");
    __shared__ float sm[G][W], sl[G][W];
    __shared__ float sacc[TWO ? 4 : G][W][DPL * 32];
    __shared__ int last;
    // CLU: grid (S, head blocks, tokens) in clusters of S; else (head
    // blocks, tokens, S).
    int hb = CLU ? blockIdx.y : blockIdx.x, t = CLU ? blockIdx.z : blockIdx.y;
    int S = CLU ? gridDim.x : gridDim.z, sp = CLU ? blockIdx.x : blockIdx.z;
    int ntok = CLU ? gridDim.z : gridDim.y;
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int group = n_heads / n_kv;
    // This block's heads: h0 .. h0 + gn - 1 of KV head kh, the sub-th
    // block of its group.
    int kh, sub, h0, gn;
    if (G == 1) {
        h0 = hb;
        kh = hb / group;
        sub = hb % group;
        gn = 1;
    } else {
        int nsub = (group + G - 1) / G, gper = (group + nsub - 1) / nsub;
        kh = hb / nsub;
        sub = hb - kh * nsub;
        h0 = kh * group + sub * gper;
        gn = min(gper, group - sub * gper);
    }
    int kvd = n_kv * hd;
    u32 pos = positions[t];
    int end = (int)ends[t];
    int start = window > 0 ? max(0, (int)pos + 1 - window) : 0;
    if (S > 1) {
        int len = (end - start + S - 1) / S;
        int s0 = start + sp * len;
        end = min(end, s0 + len);
        start = s0;
    }
    const u32* table = tables + (u64)rowidx[t] * tstride;
    // The tensor-core walk's sums (lane (g, tq): heads 2 tq, 2 tq + 1's dims
    // 16 g + 2 mt, + 1), kept for TWO's second round.
    [[maybe_unused]] float tco[8][4];
    if constexpr (G > 1) {
        // The split-lane walk (att_step_split); as the one-head walk below
        // otherwise: its first positions loaded before the PDL wait, PRE in
        // flight, the token's own position last.
        using SL = SplitLanes<DPL, KV>;
        constexpr int LPH = SL::LPH, HP = SL::HP, NP = SL::NP;
        constexpr int PRE = ATT_SPLIT_REGS / (8 * (int)sizeof(KV) / 2);
        static_assert(TC || (G == 4 && HP * NP == G), "split lanes: four heads");
        __shared__ float sq[G][DPL * 32], sown[2][DPL * 32];
        int hs = lane / LPH, jl = lane % LPH;
        int p0 = start + warp;
        bool pre[PRE];
        KvWords<KV> r[PRE];
        auto row_at = [&](int p) { return kv_row(table, p, bs, nlg, lig, kvd) + (u64)kh * hd; };
#pragma unroll
        for (int j = 0; j < PRE; j++) {
            int p = p0 + j * W;
            pre[j] = !TC && p < end && p + ntok <= (int)pos;
            if (pre[j]) load_kv_words<DPL>(kc, vc, row_at(p), jl, hd, r[j]);
        }
        // TC: the warp's first tile loaded before the wait, as far as finished
        // steps wrote (`safe`; tc_h_fix mends the rows past it).
        [[maybe_unused]] TcTileH first;
        int safe = min(end - 1, (int)pos - ntok);
        bool tc_pre = false;
        if constexpr (TC) {
            tc_pre = start + 16 * warp <= safe;
            if (tc_pre)
                tc_h_load((const u16*)kc, (const u16*)vc, row_at, start + 16 * warp, safe, lane >> 2, lane & 3,
                          first);
        }
        HeadTables<DPL> ht;
        if (FUSED) head_tables<DPL>(ht, qnw, knw, cosb, sinb, neox, pos, lane);
        if (L2W) l2_ahead(L2A_ARGS);
        PDL_ENTRY();
        // Warp w < G: head slot w's query row, after qkv_post's work, for
        // the lanes that take it through sq.
        if (warp < G) {
            float qv[DPL];
            att_row<DPL>(q + (u64)t * qstride + (u64)(h0 + min(warp, gn - 1)) * hd, hd, lane, qv);
            if (FUSED) head_post<DPL>(qv, qnw != nullptr, ht.qw, eps, cosb != nullptr, neox, ht.c, ht.s, lane);
#pragma unroll
            for (int i = 0; i < DPL; i++) sq[warp][lane + 32 * i] = qv[i];
        }
        // The own warp: the token's K (after qkv_post's work) and V as the
        // cache holds them, into the cache and for every lane through sown.
        bool own = FUSED && end == (int)pos + 1;
        bool own_warp = own && (int)pos >= p0 && ((int)pos - p0) % W == 0;
        if (own_warp) {
            const float* kr = q + (u64)t * qstride + n_heads * hd + kh * hd;
            float okv[DPL], ovv[DPL];
            att_own_rows<DPL>(kr, kvd, hd, lane, okv, ovv);
            head_post<DPL>(okv, knw != nullptr, ht.kw, eps, cosb != nullptr, neox, ht.c, ht.s, lane);
            u64 at = row_at((int)pos);
#pragma unroll
            for (int i = 0; i < DPL; i++) {
                int d = lane + 32 * i;
                okv[i] = kv_round<KV>(okv[i]);
                ovv[i] = kv_round<KV>(ovv[i]);
                // The tensor-core walk reads the own position back from the
                // cache in its tiles, so every block of a group stores it
                // (the same bits); the CUDA-core walk takes it from sown.
                if ((TC || sub == 0) && d < hd) {
                    kv_st((KV*)kc + at + d, okv[i]);
                    kv_st((KV*)vc + at + d, ovv[i]);
                }
                sown[0][d] = okv[i];
                sown[1][d] = ovv[i];
            }
        }
        __syncthreads();
        if constexpr (TC) {
            static_assert(DPL == 4 && sizeof(KV) == 2, "the tensor-core walk: head dim 128, f16 cache");
            // The heads' q as (hi, lo) f16 pairs in mma step order (dims d, d + 1
            // of head gq: step (d % 32) / 4, pair (d % 4) / 2).
            __shared__ __align__(16) u32 sqh[4 * G][36];
            if (threadIdx.x < 64 * G) {
                int gq = threadIdx.x >> 6, d = 2 * (threadIdx.x & 63), j = d & 31;
                u32 h, lo;
                f16x2_split(sq[gq][d], sq[gq][d + 1], h, lo);
                sqh[4 * gq + (d >> 5)][4 * (j >> 2) + ((j >> 1) & 1)] = h;
                sqh[4 * gq + (d >> 5)][4 * (j >> 2) + 2 + ((j >> 1) & 1)] = lo;
            }
            __syncthreads();
            const u16 *kh = (const u16*)kc, *vh = (const u16*)vc;
            if (tc_pre)
                tc_h_fix(kh, vh, row_at, start + 16 * warp, end - 1, safe, own ? (int)pos : -1, sown, lane >> 2,
                         lane & 3, first);
            float mw, lw, o[8][4];
            att_walk_tc_h<G>(kh, vh, row_at, sqh, start, end, warp, W, lane, scale, tc_pre, first, mw, lw, o);
            tl_mark_after(5, (double)o[0][0]);
            // Lane (g, tq): head g's (m, l), heads 2 tq and 2 tq + 1's dims 16 g
            // + 2 mt and + 1 (tq < 2).
            int g = lane >> 2, tq = lane & 3;
            if (g < G && tq == 0) {
                sm[g][warp] = mw;
                sl[g][warp] = lw;
            }
            // TWO: heads 4-7 (lanes tq >= 2) after heads 0-3 are put (below).
            if (tq < 2) tc_h_sacc(sacc, o, warp, g, 2 * tq);
            if constexpr (TWO) {
#pragma unroll
                for (int mt = 0; mt < 8; mt++)
#pragma unroll
                    for (int i = 0; i < 4; i++) tco[mt][i] = o[mt][i];
            }
        } else {
        float qf[NP][8], acc[NP][8], m[NP], l[NP];
#pragma unroll
        for (int k = 0; k < NP; k++) {
#pragma unroll
            for (int i = 0; i < 8; i++) {
                qf[k][i] = sq[k * HP + hs][SL::dim(jl, i)];
                acc[k][i] = 0.0f;
            }
            m[k] = -INFINITY;
            l[k] = 0.0f;
        }
        int lend = own ? end - 1 : end;
#pragma unroll
        for (int j = 0; j < PRE; j++) {
            int p = p0 + j * W;
            if (!pre[j] && p < lend) load_kv_words<DPL>(kc, vc, row_at(p), jl, hd, r[j]);
        }
        if constexpr (DPL > 2) {
            // Head dims past 64: a position at a time (tiles of 2 or 4 lost 3-4%
            // at 512-1,024 positions, 8B; NOTES.md item 64).
            for (int b = p0; b < lend; b += PRE * W) {
#pragma unroll
                for (int j = 0; j < PRE; j++) {
                    int p = b + j * W;
                    if (p < lend) {
                        att_step_words<LPH, NP>(qf, r[j], scale, softcap, m, l, acc);
                        int pn = p + PRE * W;
                        if (pn < lend) load_kv_words<DPL>(kc, vc, row_at(pn), jl, hd, r[j]);
                    }
                }
            }
        } else {
            // Tiles of T slots (att_tile_split).
            constexpr int T = PRE < 4 ? PRE : 4;
            for (int b = p0; b < lend; b += PRE * W) {
#pragma unroll
                for (int j0 = 0; j0 < PRE; j0 += T) {
                    int nv = min(T, (lend - b - j0 * W + W - 1) / W);
                    if (nv <= 0) continue;
                    if (nv == 1) {
                        // A warp's last position alone (short slices: often
                        // its only one); nothing after it to load.
                        att_step_words<LPH, NP>(qf, r[j0], scale, softcap, m, l, acc);
                        continue;
                    }
                    // The V refill takes its row's offset again (an L1 hit):
                    // holding the K refills' offsets cost spills.
                    att_tile_split<LPH, NP, T>(
                        qf, r + j0, nv, scale, softcap, m, l, acc,
                        [&](int j) {
                            int pn = b + (j0 + j + PRE) * W;
                            if (pn < lend) load_kv_half<DPL>(kc, row_at(pn), jl, hd, r[j0 + j].k);
                        },
                        [&](int j) {
                            int pn = b + (j0 + j + PRE) * W;
                            if (pn < lend) load_kv_half<DPL>(vc, row_at(pn), jl, hd, r[j0 + j].v);
                        });
                }
            }
        }
        if (own_warp)
            att_step_split<LPH, NP>(
                qf, [&](int i) { return sown[0][SL::dim(jl, i)]; }, [&](int i) { return sown[1][SL::dim(jl, i)]; },
                scale, softcap, m, l, acc);
        // Timeline mark 5: warp 0's walk done (the grouped kernels' marks 1,
        // 2 and 4 are the merging block's).
        tl_mark_after(5, (double)acc[0][0]);
#pragma unroll
        for (int k = 0; k < NP; k++) {
            int g = k * HP + hs;
            if (jl == 0) {
                sm[g][warp] = m[k];
                sl[g][warp] = l[k];
            }
#pragma unroll
            for (int i = 0; i < 8; i++) sacc[g][warp][SL::dim(jl, i)] = acc[k][i];
        }
        }
    } else {
        // Before waiting for the kernels before this one: the step's metadata
        // and block tables come from the host, and the cache rows of positions
        // no token of this step writes (this step's tokens of a sequence are
        // its last n at most) were written by finished steps. So the warp's
        // first position's K and V are loaded while qkv_post still runs.
        // Its first PRE positions, in fact (a 16-slice split of a few hundred
        // positions gives each warp one or two); the loop then keeps PRE
        // loads in flight (below).
        constexpr int PRE = DPL > 4 ? 2 : ATT_PRE;
        int p0 = start + warp;
        bool pre[PRE];
        KV k0[PRE][DPL], v0[PRE][DPL];
#pragma unroll
        for (int j = 0; j < PRE; j++) {
            int p = p0 + j * W;
            pre[j] = p < end && p + ntok <= (int)pos;
            if (pre[j]) load_kv_row<DPL>(kc, vc, table, p, bs, nlg, lig, kvd, kh, hd, lane, k0[j], v0[j]);
        }
        HeadTables<DPL> ht;
        if (FUSED) head_tables<DPL>(ht, qnw, knw, cosb, sinb, neox, pos, lane);
        if (L2W) l2_ahead(L2A_ARGS);
        PDL_ENTRY();
        float qv[DPL], acc[DPL], m = -INFINITY, l = 0.0f;
        att_row<DPL>(q + (u64)t * qstride + (u64)h0 * hd, hd, lane, qv);
#pragma unroll
        for (int i = 0; i < DPL; i++) acc[i] = 0.0f;
        // FUSED: the token's own position (the last of the range, so the last
        // of its warp's) is taken after the loop, from the QKV row, whose K and
        // V are loaded here with q (one round trip for both).
        bool own = FUSED && end == (int)pos + 1;
        bool own_warp = own && (int)pos >= p0 && ((int)pos - p0) % W == 0;
        float okv[DPL], ovv[DPL];
        if (own_warp) {
            const float* kr = q + (u64)t * qstride + n_heads * hd + kh * hd;
            att_own_rows<DPL>(kr, kvd, hd, lane, okv, ovv);
        }
        if (FUSED) head_post<DPL>(qv, qnw != nullptr, ht.qw, eps, cosb != nullptr, neox, ht.c, ht.s, lane);
        tl_mark(1);
        int lend = own ? end - 1 : end;
        // The warp's positions in order, slot j holding every PRE-th: each slot
        // is refilled with the position PRE on as soon as it is used, so PRE
        // round trips overlap instead of one per position in series (V loaded
        // with K). Slots not filled before the wait (positions this step
        // writes, with several tokens of a sequence) are filled now.
#pragma unroll
        for (int j = 0; j < PRE; j++) {
            int p = p0 + j * W;
            if (!pre[j] && p < lend) load_kv_row<DPL>(kc, vc, table, p, bs, nlg, lig, kvd, kh, hd, lane, k0[j], v0[j]);
        }
        if constexpr (WN > 0) {
            // Whole tiles of PRE slots (att_tile), refilled after each.
            for (int b = p0; b < lend; b += PRE * W) {
                // Tiles of two where that covers the warp's positions: a
                // short context's one or two (below 2 W) pay no masked slots.
                int nv = min(PRE, (lend - b + W - 1) / W);
                if (nv > 2)
                    att_tile<DPL, PRE>(qv, k0, v0, nv, hd, lane, scale, softcap, m, l, acc);
                else
                    att_tile<DPL, 2>(qv, k0, v0, nv, hd, lane, scale, softcap, m, l, acc);
#pragma unroll
                for (int j = 0; j < PRE; j++) {
                    int pn = b + (j + PRE) * W;
                    if (pn < lend)
                        load_kv_row<DPL>(kc, vc, table, pn, bs, nlg, lig, kvd, kh, hd, lane, k0[j], v0[j]);
                }
            }
        } else {
            for (int b = p0; b < lend; b += PRE * W) {
#pragma unroll
                for (int j = 0; j < PRE; j++) {
                    int p = b + j * W;
                    if (p < lend) {
                        att_step<DPL>(qv, k0[j], v0[j], hd, lane, scale, softcap, m, l, acc);
                        int pn = p + PRE * W;
                        if (pn < lend)
                            load_kv_row<DPL>(kc, vc, table, pn, bs, nlg, lig, kvd, kh, hd, lane, k0[j], v0[j]);
                    }
                }
            }
        }
        if (own_warp) {
            head_post<DPL>(okv, knw != nullptr, ht.kw, eps, cosb != nullptr, neox, ht.c, ht.s, lane);
            // As the cache holds them: what the unfused path reads back.
#pragma unroll
            for (int i = 0; i < DPL; i++) {
                okv[i] = kv_round<KV>(okv[i]);
                ovv[i] = kv_round<KV>(ovv[i]);
            }
            if (sub == 0) {
                u64 at = kv_row(table, pos, bs, nlg, lig, kvd) + (u64)kh * hd;
#pragma unroll
                for (int i = 0; i < DPL; i++) {
                    int d = lane + 32 * i;
                    if (d < hd) {
                        kv_st((KV*)kc + at + d, okv[i]);
                        kv_st((KV*)vc + at + d, ovv[i]);
                    }
                }
            }
            att_step<DPL>(qv, okv, ovv, hd, lane, scale, softcap, m, l, acc);
        }
        if (lane == 0) {
            sm[0][warp] = m;
            sl[0][warp] = l;
        }
#pragma unroll
        for (int i = 0; i < DPL; i++) sacc[0][warp][lane + 32 * i] = acc[i];
        tl_mark(2);
    }
    __syncthreads();
    float* ob = out + (u64)t * ostride;
    u64 xrow = (u64)t * ostride;
    if (CLU) {
        attention_cluster_merge<DPL, W, G>(sm, sl, sacc, hd, S, sp, warp, lane, h0, gn, ob, xrow, xq, xqd, xqs);
        return;
    }
    if constexpr (WN > 0) {
        // One slice (the host launches a wide grid with gridDim.z = 1).
        att_wide_merge<DPL, W>(sm[0], sl[0], sacc[0], hd, warp, lane, ob + (u64)h0 * hd, xq, xqd, xqs,
                               (xrow + (u64)h0 * hd) >> 5);
        tl_mark(4);
        return;
    }
    // Warp g takes head h0 + g from here on (one head: warp 0 alone, no
    // block barrier).
    if (G == 1 && warp != 0) return;
    int h = h0 + warp;
    if constexpr (TWO) {
        // Heads 0-3 from sacc, then heads 4-7 (written over them).
        u64 pair0 = (u64)t * n_heads + h0;
#pragma unroll
        for (int pass = 0; pass < 2; pass++) {
            if (pass == 1) {
                __syncthreads();
                if ((lane & 3) >= 2) tc_h_sacc(sacc, tco, warp, lane >> 2, 2 * (lane & 3) - 4);
                __syncthreads();
            }
            if (warp < 4 * pass || warp >= 4 * pass + 4 || warp >= gn) continue;
            const auto& acc = sacc[warp - 4 * pass];
            float M, L, f[W];
            att_block_weights<W>(sm[warp], sl[warp], f, M, L);
            if (S == 1) {
                float invL = L > 0.0f ? 1.0f / L : 0.0f;
                float ov[DPL];
#pragma unroll
                for (int i = 0; i < DPL; i++) {
                    int d = lane + 32 * i;
                    ov[i] = (d < hd ? att_block_sum<DPL, W>(acc, f, d) : 0.0f) * invL;
                }
                att_store<DPL>(ob + (u64)h * hd, ov, hd, lane, xq, xqd, xqs, (xrow + (u64)h * hd) >> 5);
            } else {
                att_slice_put<DPL, W>(part + ((pair0 + warp) * S + sp) * (hd + 2), acc, f, M, L, hd, lane);
                fence_acq_rel_gpu();
            }
        }
        if (S == 1) return;
    } else if (S == 1) {
        if (warp >= gn) return;
        float M, L, f[W];
        att_block_weights<W>(sm[warp], sl[warp], f, M, L);
        float invL = L > 0.0f ? 1.0f / L : 0.0f;
        float ov[DPL];
#pragma unroll
        for (int i = 0; i < DPL; i++) {
            int d = lane + 32 * i;
            ov[i] = (d < hd ? att_block_sum<DPL, W>(sacc[warp], f, d) : 0.0f) * invL;
        }
        att_store<DPL>(ob + (u64)h * hd, ov, hd, lane, xq, xqd, xqs, (xrow + (u64)h * hd) >> 5);
        return;
    }
    // Partial (M, L, Σ e·v) of this slice for each head; the slices of a
    // (token, head) pair are contiguous. One counter a block, at its first
    // head's pair.
    u64 pair0 = (u64)t * n_heads + h0;
    if (!TWO && warp < gn) {
        float M, L, f[W];
        att_block_weights<W>(sm[warp], sl[warp], f, M, L);
        att_slice_put<DPL, W>(part + ((pair0 + warp) * S + sp) * (hd + 2), sacc[warp], f, M, L, hd, lane);
        fence_acq_rel_gpu();
    }
    if (G > 1) __syncthreads();
    if (threadIdx.x == 0) last = atomicAdd(counters + pair0, 1u) == (u32)(S - 1);
    if (G > 1)
        __syncthreads();
    else
        __syncwarp();
    tl_mark(3);
    if (!last || warp >= gn) return;
    fence_acq_rel_gpu();
    // Timeline marks of a grouped kernel's merging block (marks 1 and 2 are
    // the walk's in the one-head kernels): 1 past its fence, 2 merged, 4
    // stored (8B at 2,100 positions, stamped build: ~0.7, ~1.7 and, with the
    // 8-bit O input, ~1.4 us more; NOTES.md item 115).
    if (G > 1) tl_mark(1);
    // L2 loads (__ldcg): this SM's L1 may hold the slots from an earlier launch.
    const float* base = part + (pair0 + warp) * S * (hd + 2);
    float os[DPL];
    att_merge<DPL>([&](int k, int off) { return __ldcg(base + k * (hd + 2) + off); }, S, hd, lane, os);
    if (G > 1) tl_mark_after(2, (double)os[0]);
    att_store<DPL>(ob + (u64)h * hd, os, hd, lane, xq, xqd, xqs, (xrow + (u64)h * hd) >> 5);
    tl_mark(4);
    // Every slice has counted: ready for the next launch.
    if (threadIdx.x == 0) counters[pair0] = 0;
}

// Head dims up to 32 * DPL (the backend picks the smallest): registers
// sized for the head, not for 256. D: attention_d* (or, CLU, attention_cd*:
// the slices of a (head, token) pair merged inside a cluster, grid (S, heads,
// tokens) in clusters of S >= 2); F: the same doing qkv_post's work.
// The fused (F) kernels' parameters, and the same names passed on to
// attention_impl; the window versions (FL) take L2A_PARAMS after them.
#define ATT_F_PARAMS(KV)                                                                               \
    const float *q, int qstride, KV *kc, KV *vc, int n_heads, int n_kv, int hd, const u32 *positions,   \
        const u32 *ends, const u32 *rowidx, const u32 *tables, int tstride, int bs, int nlg, int lig,  \
        int window, float scale, float softcap, float *out, int ostride, float *part, u32 *counters,   \
        i8 *xq, float *xqd, float *xqs, const float *qnw, const float *knw, float eps, const float *cosb, \
        const float *sinb, int neox
#define ATT_F_ARGS                                                                                     \
    q, qstride, kc, vc, n_heads, n_kv, hd, positions, ends, rowidx, tables, tstride, bs, nlg, lig, window, \
        scale, softcap, out, ostride, part, counters, xq, xqd, xqs, qnw, knw, eps, cosb, sinb, neox
// Launch bounds by G and DPL: the grouped kernels' 512 threads need one
// (registers); one-head blocks of 8 warps (DPL 2) must stay at 64 registers
// so that 4 blocks an SM hold a one-sequence step's 512 in one wave (at 69,
// the window kernel's 3 an SM cost 1B bf16 3.5% at tg256); the others had
// none.
#define ATT_LB_1_2 __launch_bounds__(32 * 8, 4)
#define ATT_LB_1_4
#define ATT_LB_1_8
#define ATT_LB_4_2 __launch_bounds__(32 * 16)
#define ATT_LB_4_4 __launch_bounds__(32 * 16)
#define ATTENTION_LB(LB, D, F, DPL, CLU, KV, G, WD)                                                    \
    extern "C" __global__ void LB D(                                                                   \
        const float* q, int qstride, const KV* kc, const KV* vc, int n_heads, int n_kv, int hd,        \
        const u32* positions, const u32* ends, const u32* rowidx, const u32* tables, int tstride, int bs, \
        int nlg, int lig, int window, float scale, float softcap, float* out, int ostride, float* part, \
        u32* counters, i8* xq, float* xqd, float* xqs) {                                               \
        attention_impl<KV, DPL, false, CLU, false, G, 0, WD>(q, qstride, kc, vc, n_heads, n_kv, hd, positions, \
                                                             ends, rowidx, tables, tstride, bs, nlg, lig, window, \
                                                             scale, softcap, out, ostride, part, counters, xq, \
                                                             xqd, xqs, 0, 0, 0.0f, 0, 0, 0);             \
    }                                                                                                  \
    extern "C" __global__ void LB F(ATT_F_PARAMS(KV)) {                                                \
        attention_impl<KV, DPL, true, CLU, false, G, 0, WD>(ATT_F_ARGS);                               \
    }
#define ATTENTION(D, F, DPL, CLU, KV, G) ATTENTION_LB(ATT_LB_##G##_##DPL, D, F, DPL, CLU, KV, G, 0)
// The grouped fused kernels at head dim 128 over an f16 cache with the
// tensor-core walk (att_walk_tc_h), plain and with an L2 window.
#define ATTENTION_TC_G(S, T, G)                                                                        \
    extern "C" __global__ void ATT_LB_4_4 attention_fgt##G##S(ATT_F_PARAMS(T)) {                       \
        attention_impl<T, 4, true, false, false, G, 0, 0, true>(ATT_F_ARGS);                          \
    }                                                                                                  \
    extern "C" __global__ void ATT_LB_4_4 attention_flgt##G##S(ATT_F_PARAMS(T), L2A_PARAMS) {          \
        attention_impl<T, 4, true, false, true, G, 0, 0, true>(ATT_F_ARGS, L2A_ARGS);                 \
    }
// Blocks of 4 heads, and of 8 for groups of 5-8 (one block a group, where
// two of 4 would each walk the group's K / V).
#define ATTENTION_TC(S, T) ATTENTION_TC_G(S, T, 4) ATTENTION_TC_G(S, T, 8)
// The deep kernels (head dim 256, steps of at most ATT_DEEP_SM_SHARE of
// the SMs' count in blocks, backend.rs): 16 warps a block, each walking a
// quarter of the positions the 4 of ATTENTION's walk, held to 128 registers
// (32-64 bytes spilled). Gemma-3-1B, one sequence: as fast as 4 warps at
// 256 positions, +7% at 1,024, +18% at 4,096 (NOTES.md item 113).
#define ATTENTION_DEEP(D, F, DPL, CLU, KV) ATTENTION_LB(__launch_bounds__(32 * 16, 1), D, F, DPL, CLU, KV, 1, 16)
// Four query heads a block (G = 4), for long contexts (backend.rs AttReach).
// The same over an f16 cache (`_h`).

// One block of WN warps a (query head, token) and no slices, for steps whose
// positions are all short (backend.rs AttReach::Wide): each warp walks every
// WN-th position, and the block merges its warps in shared memory
// (att_wide_merge). Fused only, and with an L2 window (FL). Head dims up to
// 64: 32 warps at 64 registers, as the one-head blocks of 8 warps; up to
// 128: 16 warps, 128 registers (DPL 4's rows do not fit 64); up to 256
// (Gemma 3): 16 warps, 128 registers (16-40 bytes spilled; 8 warps at 139
// without spills read 9% below 16 at Gemma-3-1B Q4_K_M, NOTES.md item 110), without
// the window version (no float O takes one at that head dim).
#define ATTENTION_WIDE_F(F, KV, DPL, WN)                                                               \
    extern "C" __global__ void __launch_bounds__(32 * WN, 1) F(ATT_F_PARAMS(KV)) {                    \
        attention_impl<KV, DPL, true, false, false, 1, WN>(ATT_F_ARGS);                                \
    }
#define ATTENTION_WIDE(F, FL, KV, DPL, WN)                                                             \
    ATTENTION_WIDE_F(F, KV, DPL, WN)                                                                   \
    extern "C" __global__ void __launch_bounds__(32 * WN, 1) FL(ATT_F_PARAMS(KV), L2A_PARAMS) {       \
        attention_impl<KV, DPL, true, false, true, 1, WN>(ATT_F_ARGS, L2A_ARGS);                       \
    }

// The F kernels with an L2 window (l2_ahead), for layers whose O projection
// reads float weights (the backend's AheadPlan); their own kernels so that
// the others keep their code as it was.
#define ATTENTION_L2W(FL, DPL, CLU, KV, G)                                                             \
    extern "C" __global__ void ATT_LB_##G##_##DPL FL(ATT_F_PARAMS(KV), L2A_PARAMS) { \
        attention_impl<KV, DPL, true, CLU, true, G>(ATT_F_ARGS, L2A_ARGS);                             \
    }

// Prefill attention sharing each K/V load among the G query heads of a
// GQA group: one (KV head, token) per block (grid: (n_kv, n); block: 128).
// Each warp walks a strided share of the positions, keeps G online softmaxes,
// and the warps' partial results are merged at the end. Same arguments and
// arithmetic per head as `attention` (which reads K/V once per query head).
template <int G, typename KV>
__device__ __forceinline__ void attention_gqa_impl(const float* q, int qstride, const KV* kc,
                                                   const KV* vc, int n_heads, int n_kv, int hd,
                                                   const u32* positions, const u32* ends,
                                                   const u32* rowidx, const u32* tables, int tstride,
                                                   int bs, int nlg, int lig, int window, float scale,
                                                   float softcap, float* out, int ostride) {
    __shared__ float sm[ATT_WARPS][G], sl[ATT_WARPS][G];
    __shared__ float sacc[ATT_WARPS][G][ATT_DPL * 32];
    int kh = blockIdx.x, t = blockIdx.y;
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int kvd = n_kv * hd;
    u32 pos = positions[t];
    int end = (int)ends[t];
    int start = window > 0 ? max(0, (int)pos + 1 - window) : 0;
    const u32* table = tables + (u64)rowidx[t] * tstride;
    float qv[G][ATT_DPL], acc[G][ATT_DPL], m[G], l[G];
    att_heads_init<G, ATT_DPL>([&](int g) { return q + (u64)t * qstride + (kh * G + g) * hd; }, hd, lane, qv, acc, m,
                               l);
    for (int p = start + warp; p < end; p += ATT_WARPS) {
        u64 at = kv_row(table, p, bs, nlg, lig, kvd) + (u64)kh * hd;
        const KV* kp = kc + at;
        const KV* vp = vc + at;
        float kx[ATT_DPL], vx[ATT_DPL];
#pragma unroll
        for (int i = 0; i < ATT_DPL; i++) {
            int d = lane + 32 * i;
            kx[i] = d < hd ? kv_ld(kp + d) : 0.0f;
            vx[i] = d < hd ? kv_ld(vp + d) : 0.0f;
        }
        float s[G];
#pragma unroll
        for (int g = 0; g < G; g++) {
            float a = 0.0f;
#pragma unroll
            for (int i = 0; i < ATT_DPL; i++) a += qv[g][i] * kx[i];
            s[g] = a;
        }
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
#pragma unroll
            for (int g = 0; g < G; g++) s[g] += __shfl_xor_sync(0xffffffffu, s[g], o);
        }
#pragma unroll
        for (int g = 0; g < G; g++) {
            float corr, e;
            att_online(s[g], scale, softcap, m[g], l[g], corr, e);
#pragma unroll
            for (int i = 0; i < ATT_DPL; i++) acc[g][i] = acc[g][i] * corr + e * vx[i];
        }
    }
#pragma unroll
    for (int g = 0; g < G; g++) {
        if (lane == 0) {
            sm[warp][g] = m[g];
            sl[warp][g] = l[g];
        }
#pragma unroll
        for (int i = 0; i < ATT_DPL; i++) sacc[warp][g][lane + 32 * i] = acc[g][i];
    }
    __syncthreads();
    for (int g = warp; g < G; g += ATT_WARPS) {
        float M = -INFINITY;
        for (int w = 0; w < ATT_WARPS; w++) M = fmaxf(M, sm[w][g]);
        float L = 0.0f;
        float f[ATT_WARPS];
        for (int w = 0; w < ATT_WARPS; w++) {
            f[w] = sm[w][g] == -INFINITY ? 0.0f : att_exp(sm[w][g] - M);
            L += sl[w][g] * f[w];
        }
        float invL = L > 0.0f ? 1.0f / L : 0.0f;
        float* o = out + (u64)t * ostride + (kh * G + g) * hd;
#pragma unroll
        for (int i = 0; i < ATT_DPL; i++) {
            int d = lane + 32 * i;
            if (d < hd) {
                float s = 0.0f;
                for (int w = 0; w < ATT_WARPS; w++) s += sacc[w][g][d] * f[w];
                o[d] = s * invL;
            }
        }
    }
}

#define ATT_GQA(NAME, G, KV)                                                                          \
    extern "C" __global__ void NAME(                                                                  \
        const float* q, int qstride, const KV* kc, const KV* vc, int n_heads, int n_kv, int hd,       \
        const u32* positions, const u32* ends, const u32* rowidx, const u32* tables, int tstride,     \
        int bs, int nlg, int lig, int window, float scale, float softcap, float* out, int ostride) {  \
        PDL_ENTRY();                                                                                  \
        attention_gqa_impl<G>(q, qstride, kc, vc, n_heads, n_kv, hd, positions, ends, rowidx, tables, \
                              tstride, bs, nlg, lig, window, scale, softcap, out, ostride);           \
    }

// Prefill attention for a batch of ONE sequence: a block takes one KV head
// and 32 / G consecutive tokens (32 query rows: token-major, the G heads of
// the group within), and walks the union of their visible positions in
// chunks of 32 keys staged in shared memory (K, then V in the same buffer),
// so each K/V element is read once per tile instead of once per token.
// Row r is handled by warp r % 4; in the score phase lane j takes key j, in
// the value phase lane l takes dimensions l, l + 32, ... (hd <= 128,
// hd % 4 == 0).
// grid: (n_kv, ceil(n / (32 / G))); block: 128.
#define AT_ROWS 32
#define AT_KC 32
#define AT_HD 128
#define AT_KS (AT_HD + 4)
#define AT_RPW (AT_ROWS / 4)
template <typename KV>
__device__ __forceinline__ void attention_tile_impl(const float* q, int qstride, const KV* kc, const KV* vc,
                                                    int n, int n_kv, int hd, int G, const u32* positions,
                                                    const u32* ends, const u32* rowidx, const u32* tables,
                                                    int tstride, int bs, int nlg, int lig, int window,
                                                    float scale, float softcap, float* out, int ostride) {
    PDL_ENTRY();
    // q rows at stride AT_HD; K/V rows at stride AT_KS (16-byte aligned, and
    // lanes reading float4s of different rows hit different banks).
    __shared__ float4 qs4[AT_ROWS * AT_HD / 4];
    __shared__ float4 kvs4[AT_KC * AT_KS / 4];
    __shared__ int s_lo, s_hi;
    float* qs = (float*)qs4;
    float* kvs = (float*)kvs4;
    int kh = blockIdx.x;
    int tq = AT_ROWS / G;
    int t0 = blockIdx.y * tq;
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int kvd = n_kv * hd;
    int hd4 = hd >> 2;
    const u32* table = tables + (u64)rowidx[t0] * tstride;
    for (int idx = threadIdx.x; idx < AT_ROWS * hd; idx += blockDim.x) {
        int r = idx / hd, d = idx % hd;
        int t = t0 + r / G;
        qs[r * AT_HD + d] = t < n ? q[(u64)t * qstride + (kh * G + r % G) * hd + d] : 0.0f;
    }
    if (threadIdx.x == 0) {
        int lo = 0x7fffffff, hi = 0;
        for (int k = 0; k < tq && t0 + k < n; k++) {
            int pos = (int)positions[t0 + k];
            int st = window > 0 ? max(0, pos + 1 - window) : 0;
            lo = min(lo, st);
            hi = max(hi, (int)ends[t0 + k]);
        }
        s_lo = lo;
        s_hi = hi;
    }
    __syncthreads();
    int lo = s_lo, hi = s_hi;
    int rst[AT_RPW], ren[AT_RPW];
    float m[AT_RPW], l[AT_RPW], acc[AT_RPW][AT_HD / 32];
#pragma unroll
    for (int k = 0; k < AT_RPW; k++) {
        int r = warp + 4 * k;
        int t = t0 + r / G;
        if (t < n) {
            int pos = (int)positions[t];
            rst[k] = window > 0 ? max(0, pos + 1 - window) : 0;
            ren[k] = (int)ends[t];
        } else {
            rst[k] = 0;
            ren[k] = 0;
        }
        m[k] = -INFINITY;
        l[k] = 0.0f;
#pragma unroll
        for (int i = 0; i < AT_HD / 32; i++) acc[k][i] = 0.0f;
    }
    for (int c0 = lo; c0 < hi; c0 += AT_KC) {
        // K chunk.
        for (int idx = threadIdx.x; idx < AT_KC * hd; idx += blockDim.x) {
            int j = idx / hd, d = idx % hd;
            int p = c0 + j;
            float v = 0.0f;
            if (p < hi) v = kv_ld(kc + kv_row(table, p, bs, nlg, lig, kvd) + (u64)kh * hd + d);
            kvs[j * AT_KS + d] = v;
        }
        __syncthreads();
        // Scores: lane j takes key c0 + j for all of the warp's rows (one K
        // float4 serves AT_RPW rows; q float4s are broadcasts).
        float sc[AT_RPW];
#pragma unroll
        for (int k = 0; k < AT_RPW; k++) sc[k] = 0.0f;
        const float4* kr = kvs4 + lane * (AT_KS / 4);
        for (int d4 = 0; d4 < hd4; d4++) {
            float4 kv = kr[d4];
#pragma unroll
            for (int k = 0; k < AT_RPW; k++) {
                float4 qq = qs4[(warp + 4 * k) * (AT_HD / 4) + d4];
                sc[k] += qq.x * kv.x + qq.y * kv.y + qq.z * kv.z + qq.w * kv.w;
            }
        }
        float pr[AT_RPW];
        float corr[AT_RPW];
        int p = c0 + lane;
#pragma unroll
        for (int k = 0; k < AT_RPW; k++) {
            bool ok = p >= rst[k] && p < ren[k];
            float s = -INFINITY;
            if (ok) {
                s = sc[k] * scale;
                if (softcap > 0.0f) s = tanhf(s / softcap) * softcap;
            }
            float mx = warp_max(s);
            float mn = fmaxf(m[k], mx);
            if (mn == -INFINITY) {
                pr[k] = 0.0f;
                corr[k] = 1.0f;
            } else {
                pr[k] = ok ? att_exp(s - mn) : 0.0f;
                corr[k] = att_exp(m[k] - mn);
                l[k] = l[k] * corr[k] + warp_sum(pr[k]);
                m[k] = mn;
            }
        }
        __syncthreads();
        // V chunk, into the same buffer.
        for (int idx = threadIdx.x; idx < AT_KC * hd; idx += blockDim.x) {
            int j = idx / hd, d = idx % hd;
            int pp = c0 + j;
            float v = 0.0f;
            if (pp < hi) v = kv_ld(vc + kv_row(table, pp, bs, nlg, lig, kvd) + (u64)kh * hd + d);
            kvs[j * AT_KS + d] = v;
        }
        __syncthreads();
#pragma unroll
        for (int k = 0; k < AT_RPW; k++) {
#pragma unroll
            for (int i = 0; i < AT_HD / 32; i++) acc[k][i] *= corr[k];
        }
        for (int j = 0; j < AT_KC; j++) {
            float v[AT_HD / 32];
#pragma unroll
            for (int i = 0; i < AT_HD / 32; i++) {
                int d = lane + 32 * i;
                v[i] = d < hd ? kvs[j * AT_KS + d] : 0.0f;
            }
#pragma unroll
            for (int k = 0; k < AT_RPW; k++) {
                float pj = __shfl_sync(0xffffffffu, pr[k], j);
#pragma unroll
                for (int i = 0; i < AT_HD / 32; i++) acc[k][i] += pj * v[i];
            }
        }
        __syncthreads();
    }
#pragma unroll
    for (int k = 0; k < AT_RPW; k++) {
        int r = warp + 4 * k;
        int t = t0 + r / G;
        if (t >= n) continue;
        float invL = l[k] > 0.0f ? 1.0f / l[k] : 0.0f;
        float* o = out + (u64)t * ostride + (kh * G + r % G) * hd;
#pragma unroll
        for (int i = 0; i < AT_HD / 32; i++) {
            int d = lane + 32 * i;
            if (d < hd) o[d] = acc[k][i] * invL;
        }
    }
}
#define ATT_TILE(NAME, KV)                                                                             \
    extern "C" __global__ void NAME(const float* q, int qstride, const KV* kc, const KV* vc, int n, int n_kv, \
                                    int hd, int G, const u32* positions, const u32* ends, const u32* rowidx, \
                                    const u32* tables, int tstride, int bs, int nlg, int lig, int window, \
                                    float scale, float softcap, float* out, int ostride) {             \
        attention_tile_impl<KV>(q, qstride, kc, vc, n, n_kv, hd, G, positions, ends, rowidx, tables,   \
                                tstride, bs, nlg, lig, window, scale, softcap, out, ostride);          \
    }

// One sequence's cached K and V for positions first..first+L-1 of layer slot
// `lig` (row rowidx[0] of the block tables) as f16, L x kvd each, for the GEMM
// attention. A sliding-window group releases the blocks its window has left
// (kiln-core kv.rs: their table entries are NO_BLOCK), so `first` is the first
// position the chunk's first query sees. grid-stride; block: 256.
// (From an f16 cache, `gather_kv_half_h`, the values are copied as they are.)
template <typename KV>
__device__ __forceinline__ void gather_kv_impl(const KV* __restrict__ kc, const KV* __restrict__ vc,
                                               const u32* rowidx, const u32* tables, int tstride, int bs,
                                               int nlg, int lig, int first, int L, int kvd,
                                               u16* __restrict__ kh, u16* __restrict__ vh) {
    PDL_ENTRY();
    const u32* table = tables + (u64)rowidx[0] * tstride;
    u64 total = (u64)L * kvd;
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (u64)gridDim.x * blockDim.x) {
        u64 p = first + i / kvd, e = i % kvd;
        u64 at = kv_row(table, p, bs, nlg, lig, kvd) + e;
        kh[i] = f2half(kv_ld(kc + at), 0);
        vh[i] = f2half(kv_ld(vc + at), 0);
    }
}
#define GATHER_KV(NAME, KV)                                                                            \
    extern "C" __global__ void NAME(const KV* __restrict__ kc, const KV* __restrict__ vc, const u32* rowidx, \
                                    const u32* tables, int tstride, int bs, int nlg, int lig, int first, \
                                    int L, int kvd, u16* __restrict__ kh, u16* __restrict__ vh) {      \
        gather_kv_impl<KV>(kc, vc, rowidx, tables, tstride, bs, nlg, lig, first, L, kvd, kh, vh);      \
    }

// Every attention kernel for K/V elements of type T (float or u16 for f16),
// their names suffixed S (empty for f32, _h for f16): one list for
// attention_f32.cu and attention_f16.cu, each its own module.
#define ATTENTION_KERNELS(S, T)                                    \
    QKV_POST(qkv_post##S, T)                                       \
    ATTENTION(attention_d2##S, attention_f2##S, 2, false, T, 1)    \
    ATTENTION(attention_d4##S, attention_f4##S, 4, false, T, 1)    \
    ATTENTION(attention_d8##S, attention_f8##S, 8, false, T, 1)    \
    ATTENTION(attention_cd4##S, attention_cf4##S, 4, true, T, 1)   \
    ATTENTION(attention_cd8##S, attention_cf8##S, 8, true, T, 1)   \
    ATTENTION_DEEP(attention_dd8##S, attention_fd8##S, 8, false, T) \
    ATTENTION_DEEP(attention_cdd8##S, attention_cfd8##S, 8, true, T) \
    ATTENTION(attention_dg2##S, attention_fg2##S, 2, false, T, 4)  \
    ATTENTION(attention_dg4##S, attention_fg4##S, 4, false, T, 4)  \
    ATTENTION_WIDE(attention_fw2##S, attention_flw2##S, T, 2, 32)  \
    ATTENTION_WIDE(attention_fw4##S, attention_flw4##S, T, 4, 16)  \
    ATTENTION_WIDE_F(attention_fw8##S, T, 8, 16)                   \
    ATTENTION_L2W(attention_fl2##S, 2, false, T, 1)                \
    ATTENTION_L2W(attention_fl4##S, 4, false, T, 1)                \
    ATTENTION_L2W(attention_cfl4##S, 4, true, T, 1)                \
    ATTENTION_L2W(attention_flg2##S, 2, false, T, 4)               \
    ATTENTION_L2W(attention_flg4##S, 4, false, T, 4)               \
    ATT_GQA(attention_g2##S, 2, T)                                 \
    ATT_GQA(attention_g4##S, 4, T)                                 \
    ATT_GQA(attention_g8##S, 8, T)                                 \
    ATT_TILE(attention_tile##S, T)                                 \
    GATHER_KV(gather_kv_half##S, T)
