"""Two `cuda_check --logits` outputs (raw little-endian f32, rows of VOCAB):
the largest |difference|, relative to the largest |logit|, and how many rows
keep their argmax. For changes that reorder arithmetic, where bit-identity
(`cmp`) cannot be the check. With BLOCKS, the rows are taken as that many
equal blocks (`--logits` writes four: prefill, decode, decode without
graphs, kiln-cpu) and each block is reported on its own line, with whether
it is bit-identical.

  python3 bench/cuda/logits_diff.py A.bin B.bin VOCAB [BLOCKS]
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


def report(a, b, vocab, lo, hi, label):
    worst = max(abs(a[i] - b[i]) for i in range(lo * vocab, hi * vocab))
    mag = max(abs(a[i]) for i in range(lo * vocab, hi * vocab))
    same = sum(argmax(a, r * vocab, (r + 1) * vocab) == argmax(b, r * vocab, (r + 1) * vocab) for r in range(lo, hi))
    bits = " (bit-identical)" if a[lo * vocab : hi * vocab] == b[lo * vocab : hi * vocab] else ""
    print(f"{label}max |diff| {worst:.3e} ({worst / mag:.2e} of max |logit| {mag:.3g}), argmax {same}/{hi - lo} rows{bits}")


def main():
    a, b, vocab = load(sys.argv[1]), load(sys.argv[2]), int(sys.argv[3])
    blocks = int(sys.argv[4]) if len(sys.argv) > 4 else 1
    if len(a) != len(b) or len(a) % vocab:
        sys.exit(f"lengths differ or are not rows of {vocab}: {len(a)} / {len(b)}")
    rows = len(a) // vocab
    if rows % blocks:
        sys.exit(f"{rows} rows are not {blocks} equal blocks")
    per = rows // blocks
    for k in range(blocks):
        report(a, b, vocab, k * per, (k + 1) * per, f"block {k}: " if blocks > 1 else "")


main()
