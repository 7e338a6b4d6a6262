#!/usr/bin/env python3
"""Generate the bit-exact quantization vectors in tests/data/quant/.

For every type kiln quantizes to and gguf-py's `gguf.quants.quantize` can
produce (F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1), build seeded f32 inputs
with awkward blocks and store

    tests/data/quant/input.f32     the f32 input (little-endian), shared by all types
    tests/data/quant/<TYPE>.bin    gguf-py's quantized bytes of that input

The Rust test crates/kiln-format/tests/quantize_gguf_py.rs quantizes the same
input with kiln and compares the bytes.

Usage (from the repository root):  python3 tools/gen_quant_vectors.py
(needs `pip install gguf==0.19.0 numpy`).
"""

from __future__ import annotations

import importlib.metadata
import sys
from pathlib import Path

import numpy as np
from gguf import quants
from gguf.constants import GGMLQuantizationType as T

SEED = 0x6B696C6E + 1
ROOT = Path(__file__).resolve().parents[1]
OUT_DIR = ROOT / "tests" / "data" / "quant"
TYPES = ["F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1"]
QK = 32


def blocks(rng: np.random.Generator) -> np.ndarray:
    """Finite f32 blocks of 32 values (no NaN: numpy's float->uint8 cast of NaN is platform-defined)."""
    out: list[np.ndarray] = []
    f = np.float32
    out.append(np.zeros(QK, f))  # all zero
    out.append(np.full(QK, -0.0, f))  # negative zeros
    out.append(np.full(QK, 0.75, f))  # constant (max == min)
    out.append(np.full(QK, -3.0, f))
    b = rng.standard_normal(QK).astype(f)
    b[5], b[17] = 4.0, -4.0  # +/- tie for the largest magnitude: first wins
    out.append(b)
    b = rng.standard_normal(QK).astype(f)
    b[3], b[9] = -4.0, 4.0
    out.append(b)
    # Values landing on .5 after scaling (rounding ties) for each scale rule.
    out.append((np.arange(QK, dtype=f) - 16) * f(0.5))
    out.append((np.arange(QK, dtype=f) - 15.5) * f(127 / 15.5 / 127))
    out.append(np.linspace(-1, 1, QK, dtype=f))
    out.append(np.linspace(0, 31, QK, dtype=f))
    # One outlier, the rest tiny.
    b = (rng.standard_normal(QK) * 1e-3).astype(f)
    b[20] = 10.0
    out.append(b)
    # Tiny magnitudes (f16 scales underflow to subnormal / zero) and huge ones (f16 overflow).
    for scale in [1e-8, 1e-5, 1e-3, 1e3, 1e5, 3e5, 1e30]:
        out.append((rng.standard_normal(QK) * scale).astype(f))
    out.append(rng.standard_normal(QK).astype(f) * f(1e-40))  # f32 subnormals
    # All-positive and all-negative blocks (Q4_1/Q5_1 min/max), one-sided ranges.
    out.append(np.abs(rng.standard_normal(QK)).astype(f) + f(2))
    out.append(-np.abs(rng.standard_normal(QK)).astype(f) - f(2))
    # Plenty of ordinary weight-like blocks.
    for _ in range(96):
        out.append((rng.standard_normal(QK) * rng.choice([0.02, 0.1, 1.0])).astype(f))
    for _ in range(32):
        out.append(rng.uniform(-1, 1, QK).astype(f))
    return np.concatenate(out)


def float_extras(rng: np.random.Generator) -> np.ndarray:
    """Extra values for F16/BF16 only: specials, rounding ties, overflow, subnormals."""
    special = np.array([0x7F800000, 0xFF800000, 0x7FC00000, 0xFFC00000, 0x7F800001, 0xFF812345, 0x7FBFFFFF,
                        0x00000001, 0x80000001, 0x007FFFFF, 0x33000000, 0x33000001, 0x387FC000, 0x477FF000,
                        0x477FEFFF, 0x477FF001, 0x7F7FFFFF, 0xFF7FFFFF, 0x3F808000, 0x3F818000, 0x3F808001,
                        0x7F7F8000, 0x7F7FC000], dtype=np.uint32)
    rnd = rng.integers(0, 2**32, size=QK * 32 - special.size, dtype=np.uint32)
    return np.concatenate([special, rnd]).view(np.float32)


def main() -> None:
    rng = np.random.default_rng(SEED)
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    x = blocks(rng)
    extras = float_extras(rng)
    (OUT_DIR / "input.f32").write_bytes(x.astype("<f4").tobytes())
    (OUT_DIR / "floats.f32").write_bytes(extras.astype("<f4").tobytes())
    rows = []
    with np.errstate(over="ignore", invalid="ignore"):
        for name in TYPES:
            q = quants.quantize(x.reshape(-1, QK), T[name])
            raw = np.ascontiguousarray(q).view(np.uint8).reshape(-1)
            (OUT_DIR / f"{name}.bin").write_bytes(raw.tobytes())
            rows.append((name, "input.f32", x.size, raw.size))
            if name in ("F16", "BF16"):
                q = quants.quantize(extras.reshape(-1, QK), T[name])
                raw = np.ascontiguousarray(q).view(np.uint8).reshape(-1)
                (OUT_DIR / f"{name}.floats.bin").write_bytes(raw.tobytes())
                rows.append((name, "floats.f32", extras.size, raw.size))
    v = importlib.metadata.version("gguf")
    lines = [
        "# Quantization test vectors",
        "",
        "Expected output of kiln's quantizers (`crates/kiln-format/src/quantize/`), checked byte for byte by",
        "`crates/kiln-format/tests/quantize_gguf_py.rs`: the legacy and float types against gguf-py, the",
        "K-quants against ggml itself (see \"K-quants\" below).",
        "",
        "- `input.f32`: little-endian f32 input, 32-value blocks: zeros, negative zeros, constants, +/- ties",
        "  for the largest magnitude, rounding ties, outliers, tiny / huge / subnormal magnitudes (f16 scale",
        "  underflow and overflow), one-sided blocks, and ordinary weight-like blocks. No NaN/inf (numpy's",
        "  float -> uint8 cast of those is platform-defined).",
        "- `floats.f32`: extra input for F16/BF16 only: inf, NaN (quiet, signalling, payloads), subnormals,",
        "  rounding ties and the overflow boundary.",
        "- `<TYPE>.bin`: `gguf.quants.quantize(input.reshape(-1, 32), TYPE)` as raw bytes;",
        "  `<TYPE>.floats.bin`: the same for `floats.f32`.",
        "",
        "## Provenance",
        "",
        f"- Generator: `tools/gen_quant_vectors.py` (seed `{SEED:#x}`, numpy `default_rng`).",
        f"- gguf-py: PyPI `gguf` {v}; numpy {np.__version__}; Python {sys.version.split()[0]}.",
        f"- Regenerate from the repository root: `python3 tools/gen_quant_vectors.py` (`pip install gguf=={v} numpy`).",
        "",
        "| type | input | values | bytes |",
        "|---|---|---:|---:|",
    ]
    for name, inp, n, b in rows:
        lines.append(f"| {name} | {inp} | {n} | {b} |")
    # The K-quant section (tools/gen_kquant_vectors.py) and the license are kept as they are.
    readme = OUT_DIR / "README.md"
    old = readme.read_text() if readme.exists() else ""
    tail = old[old.index("## K-quants"):] if "## K-quants" in old else (
        "## License\n\nGenerated data, dedicated to the public domain (CC0 1.0).\n")
    lines += ["", tail]
    readme.write_text("\n".join(lines))


if __name__ == "__main__":
    main()
