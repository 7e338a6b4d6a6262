"""Two `cuda_check --logits` outputs (raw little-endian f32, rows of VOCAB):
the largest |difference|, relative to the largest |logit|, and how many rows
keep their argmax. For changes that reorder arithmetic, where bit-identity
(`cmp`) cannot be the check.

  python3 bench/cuda/logits_diff.py A.bin B.bin VOCAB
"""

import sys
from array import array


def load(path):
    a = array("f")
    with open(path, "rb") as f:
        a.frombytes(f.read())
    return a


def argmax(v, lo, hi):
    best = lo
    for i in range(lo, hi):
        if v[i] > v[best]:
            best = i
    return best


def main():
    a, b, vocab = load(sys.argv[1]), load(sys.argv[2]), int(sys.argv[3])
    if len(a) != len(b) or len(a) % vocab:
        sys.exit(f"lengths differ or are not rows of {vocab}: {len(a)} / {len(b)}")
    rows = len(a) // vocab
    worst = max(abs(x - y) for x, y in zip(a, b))
    mag = max(abs(x) for x in a)
    same = sum(argmax(a, r * vocab, (r + 1) * vocab) == argmax(b, r * vocab, (r + 1) * vocab) for r in range(rows))
    print(f"max |diff| {worst:.3e} ({worst / mag:.2e} of max |logit| {mag:.3g}), argmax {same}/{rows} rows")


main()
