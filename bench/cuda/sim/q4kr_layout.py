#!/usr/bin/env python3
# CPU model of the repacked Q4_K layout (quant.cu: repack_q4k, unit<T_Q4_KR>;
# gemv.cu: rload / rdot<T_Q4_KR>) checked against ggml's Q4_K decoding
# (dequantize_row_q4_K: value, sub-block scale and min of every value). No GPU:
#   python3 bench/cuda/sim/q4kr_layout.py   -> "units 8000 mismatches 0"
from k4_sim import check, scale_min_k4

def q4k_values(b):
    # (nibble, scale, min) of the 256 values, in ggml's order
    sc, qs, out, is_ = b[4:16], b[16:144], [], 0
    for p in range(4):
        q = qs[32 * p:32 * p + 32]
        s1, m1 = scale_min_k4(is_, sc); s2, m2 = scale_min_k4(is_ + 1, sc)
        out += [(q[l] & 15, s1, m1) for l in range(32)]
        out += [(q[l] >> 4, s2, m2) for l in range(32)]
        is_ += 2
    return out

def repack(b):  # repack_q4k on one super-block
    src, out = b[16:144], bytearray(b)
    for j in range(8):
        s, sh = src[(j >> 1) * 32:], 4 * (j & 1)
        for i in range(16):
            out[16 + 16 * j + i] = ((s[i] >> sh) & 15) | (((s[i + 16] >> sh) & 15) << 4)
    return bytes(out)

def rdot_unit(r, j):  # rload + rdot<T_Q4_KR>: the unit's 32 values
    a = r[16 + 16 * j:32 + 16 * j]
    vals = [a[i] & 15 for i in range(16)] + [a[i] >> 4 for i in range(16)]
    return vals

check(144, q4k_values, repack, rdot_unit)
