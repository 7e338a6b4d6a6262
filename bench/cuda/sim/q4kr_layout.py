#!/usr/bin/env python3
# CPU model of the repacked Q4_K layout (quant.cu: repack_q4k, unit<T_Q4_KR>;
# gemv.cu: rload / rdot<T_Q4_KR>) checked against ggml's Q4_K decoding
# (dequantize_row_q4_K: value, sub-block scale and min of every value). No GPU:
#   python3 bench/cuda/sim/q4kr_layout.py   -> "units 8000 mismatches 0"
import random

def scale_min_k4(j, q):  # ggml get_scale_min_k4
    if j < 4:
        return q[j] & 63, q[j + 4] & 63
    return (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4), (q[j + 4] >> 4) | ((q[j] >> 6) << 4)

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

def rdot_unit(r, j):  # rload + rdot<T_Q4_KR>: the unit's 32 values, its scale and min
    a = r[16 + 16 * j:32 + 16 * j]
    vals = [a[i] & 15 for i in range(16)] + [a[i] >> 4 for i in range(16)]
    w = lambda k: int.from_bytes(r[4 * k:4 * k + 4], 'little')
    sh = 8 * (j & 3)
    lo, mid, hi = w(1) >> sh, w(2) >> sh, w(3) >> sh
    if j < 4:
        sc, m = lo & 63, mid & 63
    else:
        sc, m = (hi & 15) | (((lo >> 6) & 3) << 4), ((hi >> 4) & 15) | (((mid >> 6) & 3) << 4)
    return vals, sc, m

rng = random.Random(7)
units = bad = 0
for _ in range(1000):
    b = bytes(rng.randrange(256) for _ in range(144))
    ref, r = q4k_values(b), repack(b)
    assert r[:16] == b[:16]
    for j in range(8):
        vals, sc, m = rdot_unit(r, j)
        units += 1
        if any((vals[i], sc, m) != ref[32 * j + i] for i in range(32)):
            bad += 1
print("units", units, "mismatches", bad)
