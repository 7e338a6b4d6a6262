# Shared by the CPU models of the repacked Q4_K / Q5_K layouts
# (q4kr_layout.py, q5kr_layout.py): ggml's scale/min unpacking, the kernels'
# header-word selection (k4_hsum in gemv.cu), and the check loop.
import random

def scale_min_k4(j, q):  # ggml get_scale_min_k4
    if j < 4:
        return q[j] & 63, q[j + 4] & 63
    return (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4), (q[j + 4] >> 4) | ((q[j] >> 6) << 4)

def header_scale_min(r, j):  # k4_hsum: unit j's scale and min from the header words
    w = lambda k: int.from_bytes(r[4 * k:4 * k + 4], 'little')
    sh = 8 * (j & 3)
    lo, mid, hi = w(1) >> sh, w(2) >> sh, w(3) >> sh
    if j < 4:
        return lo & 63, mid & 63
    return (hi & 15) | (((lo >> 6) & 3) << 4), ((hi >> 4) & 15) | (((mid >> 6) & 3) << 4)

def check(size, values, repack, unit_values):
    # 1000 random super-blocks of `size` bytes: every unit's (value, scale, min)
    # from the repacked bytes against ggml's decoding of the original.
    rng = random.Random(7)
    units = bad = 0
    for _ in range(1000):
        b = bytes(rng.randrange(256) for _ in range(size))
        ref, r = values(b), repack(b)
        assert r[:16] == b[:16]
        for j in range(8):
            vals = unit_values(r, j)
            sc, m = header_scale_min(r, j)
            units += 1
            if any((vals[i], sc, m) != ref[32 * j + i] for i in range(32)):
                bad += 1
    print("units", units, "mismatches", bad)
