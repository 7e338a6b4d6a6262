#!/usr/bin/env python3
# CPU model of the repacked Q6_K layout (runs of 4 super-blocks, 832 bytes:
# their 32 units' low nibbles, then high bit pairs, then two scales each; the
# row's d's after its runs) (quant.cu: repack_q6k, unit<T_Q6_KR>; gemv.cu:
# rdot<T_Q6_KR>) checked against ggml's Q6_K decoding for rows of 1-65
# super-blocks, in place (whole runs of 8) or padded. No GPU needed:
#   python3 bench/cuda/sim/q6kr_layout.py   -> "units 1400 mismatches 0"
import random, struct
def q6k_values(b):
    # ggml dequantize_row_q6_K, integer part: (q - 32) and scale index per value
    ql, qh, sc = b[0:128], b[128:192], b[192:208]
    out = []
    for n in range(2):
        vals = [None]*128
        for l in range(32):
            isc = l // 16
            q1 = ((ql[64*n + l] & 15) | (((qh[32*n + l] >> 0) & 3) << 4)) - 32
            q2 = ((ql[64*n + l + 32] & 15) | (((qh[32*n + l] >> 2) & 3) << 4)) - 32
            q3 = ((ql[64*n + l] >> 4) | (((qh[32*n + l] >> 4) & 3) << 4)) - 32
            q4 = ((ql[64*n + l + 32] >> 4) | (((qh[32*n + l] >> 6) & 3) << 4)) - 32
            s = lambda k: struct.unpack('b', bytes([sc[8*n + isc + k]]))[0]
            vals[l] = (q1, s(0)); vals[l+32] = (q2, s(2)); vals[l+64] = (q3, s(4)); vals[l+96] = (q4, s(6))
        out += vals
    return out, b[208:210]
RUN = 832
def row_bytes(nsb): return -(-(840 * -(-nsb // 4)) // 16) * 16
def dp(sb, nsb): return RUN * ((nsb + 3) >> 2) + 2*sb
# A unit's fields in its run: low nibbles, high bit pairs, scales.
def lo(u): return RUN*(u >> 5) + 16*(u & 31)
def hi(u): return RUN*(u >> 5) + 512 + 8*(u & 31)
def sc(u): return RUN*(u >> 5) + 768 + 2*(u & 31)
def repack(row, nsb):
    inp = bytes(row); out = bytearray(row_bytes(nsb))
    for t in range(nsb*8):
        sb, j = t >> 3, t & 7; half, jj = j >> 2, j & 3
        b = inp[sb*210:(sb+1)*210]
        ql = b[half*64 + (jj&1)*32:][:32]; qh = b[128 + half*32:][:32]
        q6 = [((ql[i] >> (4*(jj>>1))) & 15) | (((qh[i] >> (2*jj)) & 3) << 4) for i in range(32)]
        for i in range(16): out[lo(t) + i] = (q6[i] & 15) | ((q6[i+16] & 15) << 4)
        hb = [0]*8
        for v in range(32):
            k, bb = v >> 2, v & 3
            hb[4*(k>>2) + bb] |= (q6[v] >> 4) << (2*(k&3))
        for i in range(8): out[hi(t) + i] = hb[i]
        out[sc(t)] = b[192 + 2*j]; out[sc(t) + 1] = b[193 + 2*j]
    for sb in range(nsb):
        o = dp(sb, nsb); out[o:o+2] = inp[sb*210 + 208: sb*210 + 210]
    return out
u32 = lambda bs, o: struct.unpack_from('<I', bs, o)[0]
def unit_r(row, u, nsb):
    # unit<T_Q6_KR>: (q - 32, scale) per value, and d bytes
    sb = u >> 3
    l = [u32(row, lo(u) + 4*k) for k in range(4)]
    hw2 = [u32(row, hi(u)), u32(row, hi(u) + 4)]
    vals = []
    for h in range(2):
        s = struct.unpack('b', bytes([row[sc(u) + h]]))[0]
        hw = hw2[h]
        for i in range(16):
            q = ((l[i >> 2] >> (8*(i&3) + 4*h)) & 15) | (((hw >> (8*(i&3) + 2*(i>>2))) & 3) << 4)
            vals.append((q - 32, s))
    d = bytes(row[dp(sb, nsb):][:2])
    return vals, d
def sb8(x): return x - 256 if x > 127 else x
def dp4a(a, b, c):
    return c + sum(sb8((a >> (8*i)) & 255) * sb8((b >> (8*i)) & 255) for i in range(4))
def vsub4(a, b): return sum((((a >> (8*i)) - (b >> (8*i))) & 255) << (8*i) for i in range(4))
def rdot_r(row, u, nsb, xv):
    l = [u32(row, lo(u) + 4*k) for k in range(4)]
    h0, h1 = u32(row, hi(u)), u32(row, hi(u) + 4)
    scw = struct.unpack_from('<H', row, sc(u))[0]
    s0 = s1 = 0
    for k in range(4):
        a = (l[k] & 0x0f0f0f0f) | (((h0 >> (2*k)) & 0x03030303) << 4)
        b = ((l[k] >> 4) & 0x0f0f0f0f) | (((h1 >> (2*k)) & 0x03030303) << 4)
        s0 = dp4a(vsub4(a, 0x20202020), xv[k], s0); s1 = dp4a(vsub4(b, 0x20202020), xv[4+k], s1)
    return sb8(scw & 255) * s0 + sb8(scw >> 8) * s1
random.seed(1); bad = 0; n = 0
for nsb in [1, 3, 6, 8, 9, 27, 56, 65]:
    assert nsb % 8 or row_bytes(nsb) == 210 * nsb  # in place: the file's bytes
    row = bytearray(random.getrandbits(8) for _ in range(nsb*210))
    rp = repack(row, nsb)
    for sb in range(nsb):
        vals, d = q6k_values(row[sb*210:(sb+1)*210])
        for j in range(8):
            u = sb*8 + j
            rv, rd = unit_r(rp, u, nsb)
            n += 1
            if rv != vals[32*j:32*j+32] or rd != d: bad += 1
            x = [random.randint(-127, 127) for _ in range(32)]
            xv = [sum((x[4*k+i] & 255) << (8*i) for i in range(4)) for k in range(8)]
            want = sum(q * s * xx for (q, s), xx in zip(vals[32*j:32*j+32], x))
            if rdot_r(rp, u, nsb, xv) != want: bad += 1
print("units", n, "mismatches", bad)
