// The load-time repacking kernels: each rewrites a matrix into the
// repacked layout quant.cu describes for its type.

// A block per row (grid-stride over rows): Q6_K rows of nsb super-blocks
// (nsb <= Q6KR_MAX_SB) at src, rows of src_rb bytes, into repacked Q6_K
// at dst, rows of dst_rb bytes (16-byte aligned). In place (src == dst, the
// file's rows) when nsb % 8 == 0: then the layout takes the file's bytes
// and rows start on 16 bytes; otherwise into rows padded to 16 bytes.
extern "C" __global__ void repack_q6k(const u8* src, u8* dst, int rows, int nsb, u64 src_rb, u64 dst_rb) {
    PDL_ENTRY();
    __shared__ u16 s[Q6KR_MAX_SB * 105];
    const u8* in = (const u8*)s;
    for (int r = blockIdx.x; r < rows; r += gridDim.x) {
        const u16* from = (const u16*)(src + (u64)r * src_rb);
        u8* row = dst + (u64)r * dst_rb;
        for (int i = threadIdx.x; i < nsb * 105; i += blockDim.x) s[i] = from[i];
        __syncthreads();
        for (int t = threadIdx.x; t < nsb * 8; t += blockDim.x) {
            int sb = t >> 3, j = t & 7, half = j >> 2, jj = j & 3;
            const u8* b = in + sb * 210;
            const u8* ql = b + half * 64 + (jj & 1) * 32;
            const u8* qh = b + 128 + half * 32;
            u8 q6[32];
            for (int i = 0; i < 32; i++) q6[i] = ((ql[i] >> (4 * (jj >> 1))) & 15) | (((qh[i] >> (2 * jj)) & 3) << 4);
            u8 *lo = (u8*)q6kr_lo(row, t), *hi = (u8*)q6kr_hi(row, t), *sc = (u8*)q6kr_sc(row, t);
            for (int i = 0; i < 16; i++) lo[i] = (q6[i] & 15) | ((q6[i + 16] & 15) << 4);
            u8 hb[8] = {0, 0, 0, 0, 0, 0, 0, 0};
            for (int v = 0; v < 32; v++) {
                int k = v >> 2, bb = v & 3;
                hb[4 * (k >> 2) + bb] |= (u8)((q6[v] >> 4) << (2 * (k & 3)));
            }
            for (int i = 0; i < 8; i++) hi[i] = hb[i];
            sc[0] = b[192 + 2 * j];
            sc[1] = b[193 + 2 * j];
        }
        for (int sb = threadIdx.x; sb < nsb; sb += blockDim.x)
            *(u16*)q6kr_dp(row, sb, nsb) = s[sb * 105 + 104];
        __syncthreads();
    }
}

// In place, one thread per super-block (grid-stride over `nsb` of them,
// 16-byte aligned): Q4_K into repacked Q4_K.
extern "C" __global__ void repack_q4k(u8* W, u64 nsb) { PDL_ENTRY();
    for (u64 t = (u64)blockIdx.x * blockDim.x + threadIdx.x; t < nsb; t += (u64)gridDim.x * blockDim.x) {
        uint4* qs = (uint4*)(W + t * 144 + 16);
        union {
            uint4 v[8];
            u8 b[128];
        } in;
        for (int i = 0; i < 8; i++) in.v[i] = qs[i];
        for (int j = 0; j < 8; j++) {
            union {
                uint4 v;
                u8 b[16];
            } o;
            const u8* src = in.b + (j >> 1) * 32;
            int sh = 4 * (j & 1);
            for (int i = 0; i < 16; i++) o.b[i] = (u8)(((src[i] >> sh) & 15) | (((src[i + 16] >> sh) & 15) << 4));
            qs[j] = o.v;
        }
    }
}

// A unit's 32 2-bit values (bytes qs[0..32] shifted right by `shift`) as
// repacked Q3_K / Q2_K keep them, written to o[0], o[1]: value 4k + i at
// byte i, bits 2 (k / 2), of o[0] for even k and of o[1] for odd k.
__device__ __forceinline__ void pack2_words(const u8* qs, int shift, u32* o) {
    u32 w[2] = {0, 0};
    for (int l = 0; l < 32; l++) {
        int k = l >> 2, i = l & 3;
        w[k & 1] |= (u32)((qs[l] >> shift) & 3) << (8 * i + 2 * (k >> 1));
    }
    o[0] = w[0];
    o[1] = w[1];
}

// Out of place, one thread per run of 4 super-blocks of a row (grid-stride):
// `rows` Q2_K rows of `nsb` super-blocks at src into rows of whole runs of 4
// at dst, the layout quant.cu describes at T_Q2_KR (super-blocks past `nsb`
// zeros).
extern "C" __global__ void repack_q2k(const u8* src, u8* dst, int rows, int nsb) {
    PDL_ENTRY();
    int runs = (nsb + 3) >> 2;
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < (u64)rows * runs;
         i += (u64)gridDim.x * blockDim.x) {
        u64 r = i / runs;
        int k = (int)(i % runs);
        u32* o = (u32*)(dst + i * 336);
        for (int s = 0; s < 4; s++) {
            bool in = 4 * k + s < nsb;
            const u8* b = src + (r * nsb + 4 * k + s) * 84;
            for (int j = 0; j < 8; j++) {
                u32* w = o + 2 * (8 * s + j);
                if (in)
                    pack2_words(b + 16 + (j >> 2) * 32, 2 * (j & 3), w);
                else
                    w[0] = w[1] = 0;
            }
            // Scales (bytes 256 + 16 s ..) and d / dmin (320 + 4 s), as words.
            for (int c = 0; c < 4; c++) o[64 + 4 * s + c] = in ? ld_u32_a2(b + 4 * c) : 0u;
            o[80 + s] = in ? ld_u32_a2(b + 80) : 0u;
        }
    }
}

// Out of place, one thread per super-block (grid-stride over `nsb` of them):
// Q3_K's 110-byte super-blocks at src into repacked Q3_K's 112 at dst
// (16-byte aligned), the layout quant.cu describes at T_Q3_KR.
extern "C" __global__ void repack_q3k(const u8* src, u8* dst, u64 nsb) { PDL_ENTRY();
    for (u64 t = (u64)blockIdx.x * blockDim.x + threadIdx.x; t < nsb; t += (u64)gridDim.x * blockDim.x) {
        const u8* b = src + t * 110;
        u32* o = (u32*)(dst + t * 112);
        const u8* hm = b;
        u32 lo0 = 0, lo1 = 0, hi = 0;
        for (int k = 0; k < 16; k++) {
            u32 sc = (u32)q3k_scale(b + 96, k);
            if (k < 8)
                lo0 |= (sc & 15) << (4 * k);
            else
                lo1 |= (sc & 15) << (4 * (k - 8));
            hi |= (sc >> 4) << (2 * k);
        }
        o[0] = lo0;
        o[1] = lo1;
        o[2] = hi;
        o[3] = ld_u16(b + 108);
        for (int j = 0; j < 8; j++) {
            pack2_words(b + 32 + (j >> 2) * 32, 2 * (j & 3), o + 4 + 2 * j);
            u32 h = 0;
            for (int l = 0; l < 32; l++) h |= (u32)((hm[l] >> j) & 1) << (8 * (l & 3) + (l >> 2));
            o[20 + j] = h;
        }
    }
}

// In place, one thread per super-block (grid-stride over `nsb` of them,
// 16-byte aligned): Q5_K into repacked Q5_K.
extern "C" __global__ void repack_q5k(u8* W, u64 nsb) { PDL_ENTRY();
    for (u64 t = (u64)blockIdx.x * blockDim.x + threadIdx.x; t < nsb; t += (u64)gridDim.x * blockDim.x) {
        uint4* p = (uint4*)(W + t * 176 + 16);
        union {
            uint4 v[10];
            u8 b[160];  // qh[32], qs[128]
        } in;
        for (int i = 0; i < 10; i++) in.v[i] = p[i];
        for (int j = 0; j < 8; j++) {
            union {
                uint4 v;
                u8 b[16];
            } o;
            const u8* src = in.b + 32 + (j >> 1) * 32;
            int sh = 4 * (j & 1);
            for (int i = 0; i < 16; i++) o.b[i] = (u8)(((src[i] >> sh) & 15) | (((src[i + 16] >> sh) & 15) << 4));
            p[j] = o.v;
        }
        u32 hw[8];
        for (int j = 0; j < 8; j++) {
            hw[j] = 0;
            for (int v = 0; v < 32; v++) hw[j] |= (u32)((in.b[v] >> j) & 1) << v;
        }
        p[8] = make_uint4(hw[0], hw[1], hw[2], hw[3]);
        p[9] = make_uint4(hw[4], hw[5], hw[6], hw[7]);
    }
}

// Out of place, one thread per run of 8 blocks of a row: `rows` rows of
// `blocks` blocks of 2 + hb + qb bytes (f16 scale, hb bytes of a second
// field, qb quant bytes, as in the file) from src into rows of `dst_row`
// bytes of whole runs (quant arrays, second fields, scales), blocks past
// `blocks` zeros. grid-stride.
extern "C" __global__ void repack8_to(const u8* src, u8* dst, int rows, int blocks, int qb, int hb, u64 dst_row) {
    PDL_ENTRY();
    int runs = (blocks + 7) >> 3, bs = 2 + hb + qb;
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < (u64)rows * runs;
         i += (u64)gridDim.x * blockDim.x) {
        u64 r = i / runs;
        int k = (int)(i % runs);
        const u8* s = src + (r * blocks + 8 * k) * bs;
        u8* o = dst + r * dst_row + (u64)k * 8 * bs;
        for (int j = 0; j < 8; j++) {
            bool in = 8 * k + j < blocks;
            const u8* b = s + j * bs;
            for (int c = 0; c < qb; c++) o[j * qb + c] = in ? b[2 + hb + c] : 0;
            for (int c = 0; c < hb; c++) o[8 * qb + j * hb + c] = in ? b[2 + c] : 0;
            for (int c = 0; c < 2; c++) o[8 * (qb + hb) + 2 * j + c] = in ? b[c] : 0;
        }
    }
}

// A block per row (grid-stride over rows): Q4_0 rows of `units` blocks
// (units <= Q4F_MAX_UNITS) at src, rows of src_rb bytes, into repacked Q4_0
// (flat) at dst, rows of dst_rb bytes (16-byte aligned). The row is read
// into shared memory first, so src == dst (in place) is allowed.
extern "C" __global__ void repack_q4f(const u8* src, u8* dst, int rows, int units, u64 src_rb, u64 dst_rb) {
    PDL_ENTRY();
    __shared__ u16 s[Q4F_MAX_UNITS * 9];
    for (int r = blockIdx.x; r < rows; r += gridDim.x) {
        const u16* from = (const u16*)(src + (u64)r * src_rb);
        for (int i = threadIdx.x; i < units * 9; i += blockDim.x) s[i] = from[i];
        __syncthreads();
        u16* q = (u16*)(dst + (u64)r * dst_rb);
        for (int i = threadIdx.x; i < units * 8; i += blockDim.x) q[i] = s[(i >> 3) * 9 + 1 + (i & 7)];
        for (int u = threadIdx.x; u < units; u += blockDim.x) q[8 * units + u] = s[9 * u];
        __syncthreads();
    }
}

// In place, one thread per run of 8 blocks of qb + 2 bytes (f16 scale
// first, as in the file): the run becomes the 8 quant arrays, then the 8
// scales. grid-stride over `runs`; qb <= 32.
extern "C" __global__ void repack8(u8* W, u64 runs, int qb) { PDL_ENTRY();
    int hb = qb / 2 + 1;  // u16 per block
    for (u64 r = (u64)blockIdx.x * blockDim.x + threadIdx.x; r < runs; r += (u64)gridDim.x * blockDim.x) {
        u16* p = (u16*)(W + r * 16 * hb);
        u16 t[8 * 17];
        for (int i = 0; i < 8 * hb; i++) t[i] = p[i];
        for (int j = 0; j < 8; j++) {
            for (int k = 0; k < hb - 1; k++) p[j * (hb - 1) + k] = t[j * hb + 1 + k];
            p[8 * (hb - 1) + j] = t[j * hb];
        }
    }
}
