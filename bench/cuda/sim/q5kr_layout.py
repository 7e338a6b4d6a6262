#!/usr/bin/env python3
# CPU model of the repacked Q5_K layout (quant.cu: repack_q5k, unit<T_Q5_KR>;
# gemv.cu: rload / rdot<T_Q5_KR>) checked against ggml's Q5_K decoding
# (dequantize_row_q5_K: value, sub-block scale and min of every value). No GPU:
#   python3 bench/cuda/sim/q5kr_layout.py   -> "units 8000 mismatches 0"
from k4_sim import check, scale_min_k4

def q5k_values(b):
    # (5-bit value, scale, min) of the 256 values, in ggml's order
    sc, qh, ql, out = b[4:16], b[16:48], b[48:176], []
    is_, u1, u2 = 0, 1, 2
    for p in range(4):
        q = ql[32 * p:32 * p + 32]
        s1, m1 = scale_min_k4(is_, sc); s2, m2 = scale_min_k4(is_ + 1, sc)
        out += [((q[l] & 15) + (16 if qh[l] & u1 else 0), s1, m1) for l in range(32)]
        out += [((q[l] >> 4) + (16 if qh[l] & u2 else 0), s2, m2) for l in range(32)]
        is_ += 2; u1 <<= 2; u2 <<= 2
    return out

def repack(b):  # repack_q5k on one super-block
    qh, qs, out = b[16:48], b[48:176], bytearray(b)
    for j in range(8):
        s, sh = qs[(j >> 1) * 32:], 4 * (j & 1)
        for i in range(16):
            out[16 + 16 * j + i] = ((s[i] >> sh) & 15) | (((s[i + 16] >> sh) & 15) << 4)
        hw = sum(((qh[v] >> j) & 1) << v for v in range(32))
        out[144 + 4 * j:148 + 4 * j] = hw.to_bytes(4, 'little')
    return bytes(out)

def spread4(h):
    return ((h & 1) << 4) | ((h & 2) << 11) | ((h & 4) << 18) | ((h & 8) << 25)

def rdot_unit(r, j):  # rload + rdot<T_Q5_KR>: the unit's 32 values
    a = [int.from_bytes(r[16 + 16 * j + 4 * i:20 + 16 * j + 4 * i], 'little') for i in range(4)]
    h = int.from_bytes(r[144 + 4 * j:148 + 4 * j], 'little')
    vals = [None] * 32
    for i in range(4):
        lo = (a[i] & 0x0f0f0f0f) | spread4(h >> (4 * i))
        hi = ((a[i] >> 4) & 0x0f0f0f0f) | spread4(h >> (16 + 4 * i))
        for k in range(4):
            vals[4 * i + k] = (lo >> (8 * k)) & 0xff
            vals[16 + 4 * i + k] = (hi >> (8 * k)) & 0xff
    return vals

check(176, q5k_values, repack, rdot_unit)
