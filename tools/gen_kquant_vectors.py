#!/usr/bin/env python3
"""Generate the bit-exact K-quant vectors in tests/data/quant/.

gguf-py has no K-quant quantizer, so the reference is ggml itself:
`ggml_quantize_chunk(type, src, dst, 0, nrows, 256, imatrix=NULL)` from the
`libggml-base.so` that ships in the llama-cpp-python wheel, called through
ctypes. Without an importance matrix ggml_quantize_chunk runs
`quantize_q{2..6}_K`, which call the reference quantizers
`quantize_row_q{2..6}_K_ref` (what llama-quantize does without --imatrix).

Writes

    tests/data/quant/kquant_input.f32   f32 input (little-endian), 256-value super-blocks
    tests/data/quant/<TYPE>.kquant.bin  ggml's bytes for that input (Q2_K .. Q6_K)

and the K-quant part of tests/data/quant/README.md is kept by hand.

Usage (from the repository root):
    python3 tools/gen_kquant_vectors.py [--lib PATH/libggml-base.so]
    python3 tools/gen_kquant_vectors.py --big N OUT_DIR   # N random weight-like blocks, not committed
    python3 tools/gen_kquant_vectors.py --llama-quantize IN.gguf OUT.gguf FTYPE
        # llama.cpp's own llama_model_quantize (libllama from the same wheel), no imatrix;
        # FTYPE is a llama_ftype number (15 = Q4_K_M) or name; to compare with `kiln quantize`
        # (add --pure for llama-quantize --pure: kiln's plain types)
    python3 tools/gen_kquant_vectors.py --mix-hashes OUT.txt LABEL[+pure]=IN.gguf ...
        # llama-quantize every mix (+pure: and every --pure K type) of each input; writes each
        # output tensor's type and sha256 (needs gguf-py importable, e.g. PYTHONPATH=<venv with gguf>)
(needs numpy and the llama-cpp-python wheel; default lib: the venv at
~/.cache/kiln-bench/venv).
"""

from __future__ import annotations

import argparse
import ctypes
import glob
import os
import sys
from pathlib import Path

import numpy as np

SEED = 0x6B716B31
ROOT = Path(__file__).resolve().parents[1]
OUT_DIR = ROOT / "tests" / "data" / "quant"
QK_K = 256
# ggml_type values and block sizes in bytes (ggml.h / ggml-common.h).
TYPES = {"Q2_K": (10, 84), "Q3_K": (11, 110), "Q4_K": (12, 144), "Q5_K": (13, 176), "Q6_K": (14, 210)}


def find_lib() -> str:
    pat = os.path.expanduser("~/.cache/kiln-bench/venv/lib/python3*/site-packages/llama_cpp/lib/libggml-base.so")
    hits = glob.glob(pat)
    if not hits:
        sys.exit(f"libggml-base.so not found ({pat}); pass --lib")
    return hits[0]


class Ggml:
    def __init__(self, path: str):
        self.lib = ctypes.CDLL(path)
        f = self.lib.ggml_quantize_chunk
        f.restype = ctypes.c_size_t
        f.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64,
                      ctypes.c_int64, ctypes.c_void_p]
        self.lib.ggml_quantize_requires_imatrix.restype = ctypes.c_bool
        self.lib.ggml_quantize_requires_imatrix.argtypes = [ctypes.c_int]

    def info(self) -> str:
        out = []
        for name in ("ggml_version", "ggml_commit"):
            try:
                fn = getattr(self.lib, name)
                fn.restype = ctypes.c_char_p
                out.append(f"{name}={fn().decode()}")
            except AttributeError:
                pass
        return ", ".join(out)

    def quantize(self, ty: str, x: np.ndarray) -> bytes:
        tid, bsize = TYPES[ty]
        assert not self.lib.ggml_quantize_requires_imatrix(tid)
        x = np.ascontiguousarray(x, dtype=np.float32)
        assert x.size % QK_K == 0
        nrows = x.size // QK_K
        dst = np.zeros(nrows * bsize, dtype=np.uint8)
        n = self.lib.ggml_quantize_chunk(tid, x.ctypes.data, dst.ctypes.data, 0, nrows, QK_K, None)
        assert n == dst.size, (ty, n, dst.size)
        return dst.tobytes()


def weight_like(rng: np.random.Generator, n_blocks: int) -> list[np.ndarray]:
    out = []
    f = np.float32
    for _ in range(n_blocks):
        kind = rng.integers(0, 4)
        if kind == 0:
            b = rng.standard_normal(QK_K) * rng.choice([0.005, 0.02, 0.1, 1.0])
        elif kind == 1:
            b = rng.laplace(0, 0.02, QK_K)  # heavy tails
        elif kind == 2:
            b = rng.standard_t(3, QK_K) * 0.02
        else:
            b = rng.uniform(-1, 1, QK_K) * rng.choice([0.01, 1.0])
        out.append(b.astype(f))
    return out


def blocks(rng: np.random.Generator) -> np.ndarray:
    """Finite f32 super-blocks of 256 values: edge cases, then weight-like ones."""
    f = np.float32
    out: list[np.ndarray] = []
    out.append(np.zeros(QK_K, f))
    out.append(np.full(QK_K, -0.0, f))
    for c in (0.75, -3.0, 1e-20, 65504.0):
        out.append(np.full(QK_K, c, f))  # constant blocks (max == min)
    # Sub-blocks of 16/32 with different regimes in one super-block: zero, constant, normal, tiny.
    b = rng.standard_normal(QK_K).astype(f)
    b[0:32] = 0
    b[64:80] = 0.5
    b[128:160] *= f(1e-6)
    out.append(b)
    b = np.zeros(QK_K, f)
    b[100] = 1.0  # one nonzero value
    out.append(b)
    b = np.zeros(QK_K, f)
    b[7] = -2.5
    out.append(b)
    # Outliers among small values.
    b = (rng.standard_normal(QK_K) * 1e-3).astype(f)
    b[20], b[200] = 10.0, -7.0
    out.append(b)
    b = (rng.standard_normal(QK_K) * 0.02).astype(f)
    b[rng.integers(0, QK_K, 4)] = f(0.5)
    out.append(b)
    # +/- ties for the largest magnitude (first wins in the max search).
    b = rng.standard_normal(QK_K).astype(f)
    b[3], b[9] = -4.0, 4.0
    b[130], b[140] = 4.0, -4.0
    out.append(b)
    # Ramps and exact grids (rounding ties after scaling).
    out.append(np.linspace(-1, 1, QK_K, dtype=f))
    out.append(np.linspace(0, 255, QK_K, dtype=f))
    out.append(((np.arange(QK_K) % 32) - 16).astype(f) * f(0.5))
    out.append(((np.arange(QK_K) % 16) - 8).astype(f) * f(0.25))
    out.append(np.tile(np.array([-1, 1], f), QK_K // 2))  # alternating signs
    # Magnitudes: f16 scale underflow (subnormal / zero) and overflow, f32 subnormals.
    for scale in [1e-30, 1e-8, 1e-6, 1e-5, 1e-4, 1e-3, 1e3, 1e4, 1e5, 3e5, 1e10, 1e20]:
        out.append((rng.standard_normal(QK_K) * scale).astype(f))
    out.append(rng.standard_normal(QK_K).astype(f) * f(1e-40))
    # One-sided blocks (min > 0 is clamped to 0; all-negative), offsets.
    out.append(np.abs(rng.standard_normal(QK_K)).astype(f) + f(2))
    out.append(-np.abs(rng.standard_normal(QK_K)).astype(f) - f(2))
    out.append(np.abs(rng.standard_normal(QK_K)).astype(f) * f(0.01))
    out.append(-np.abs(rng.standard_normal(QK_K)).astype(f) * f(0.01))
    out.append((rng.standard_normal(QK_K) * 0.01 + 1.0).astype(f))
    # Sparse blocks.
    b = rng.standard_normal(QK_K).astype(f)
    b[rng.random(QK_K) < 0.9] = 0
    out.append(b)
    # Mixed scales per 16/32-value sub-block.
    b = rng.standard_normal(QK_K).astype(f)
    b *= np.repeat(np.logspace(-4, 1, QK_K // 16).astype(f), 16)
    out.append(b)
    b = rng.standard_normal(QK_K).astype(f)
    b *= np.repeat(np.logspace(2, -3, QK_K // 32).astype(f), 32)
    out.append(b)
    out += weight_like(rng, 160)
    return np.concatenate(out).astype(f)


FTYPES = {"Q4_0": 2, "Q4_1": 3, "Q8_0": 7, "Q5_0": 8, "Q5_1": 9, "Q2_K": 10, "Q3_K_S": 11, "Q3_K_M": 12,
          "Q3_K_L": 13, "Q4_K_S": 14, "Q4_K_M": 15, "Q5_K_S": 16, "Q5_K_M": 17, "Q6_K": 18}


def llama_quantize(inp: str, out: str, ftype: str, pure: bool) -> None:
    """llama-quantize [--pure] IN OUT FTYPE through llama-cpp-python (no imatrix, 2 threads)."""
    import llama_cpp  # the wheel's libllama

    p = llama_cpp.llama_model_quantize_default_params()
    p.pure = pure
    p.ftype = FTYPES[ftype.upper()] if ftype.upper() in FTYPES else int(ftype)
    p.nthread = 2
    rc = llama_cpp.llama_model_quantize(inp.encode(), out.encode(), ctypes.byref(p))
    if rc != 0:
        sys.exit(f"llama_model_quantize failed: {rc}")


MIX_TARGETS = [("Q4_K_M", False), ("Q4_K_S", False), ("Q5_K_M", False), ("Q5_K_S", False), ("Q3_K_M", False),
               ("Q3_K_L", False), ("Q2_K", True), ("Q3_K_S", True), ("Q4_K_S", True), ("Q5_K_S", True),
               ("Q6_K", True)]
# kiln's name for each target: mixes by name, --pure files by their one type.
PURE_NAME = {"Q2_K": "q2_k", "Q3_K_S": "q3_k", "Q4_K_S": "q4_k", "Q5_K_S": "q5_k", "Q6_K": "q6_k"}


def mix_hashes(out: str, inputs: list[str]) -> None:
    """One line per quantized tensor: `input target name type sha256[:16]`.

    Inputs are `LABEL=IN.gguf` (the mixes) or `LABEL+pure=IN.gguf` (also the --pure K types).
    """
    import hashlib
    import tempfile

    from gguf import GGUFReader

    lines = [f"# llama-quantize (llama-cpp-python {llama_cpp_version()}, no imatrix) output tensors:",
             "# input target tensor type sha256[:16] (F32 tensors left out); tools/gen_kquant_vectors.py --mix-hashes"]
    with tempfile.TemporaryDirectory() as tmp:
        for spec in inputs:
            label, path = spec.split("=", 1)
            with_pure = label.endswith("+pure")
            label = label.removesuffix("+pure")
            for ftype, pure in MIX_TARGETS:
                if pure and not with_pure:
                    continue
                q = os.path.join(tmp, "q.gguf")
                llama_quantize(path, q, ftype, pure)
                target = PURE_NAME[ftype] if pure else ftype.lower()
                for t in GGUFReader(q).tensors:
                    if t.tensor_type.name != "F32":
                        h = hashlib.sha256(t.data.tobytes()).hexdigest()[:16]
                        lines.append(f"{label} {target} {t.name} {t.tensor_type.name} {h}")
    Path(out).write_text("\n".join(lines) + "\n")


def llama_cpp_version() -> str:
    import importlib.metadata
    return importlib.metadata.version("llama_cpp_python")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--lib", default=None)
    ap.add_argument("--big", nargs=2, metavar=("N_BLOCKS", "OUT_DIR"))
    ap.add_argument("--llama-quantize", nargs=3, metavar=("IN", "OUT", "FTYPE"))
    ap.add_argument("--pure", action="store_true", help="with --llama-quantize: one type for all (--pure)")
    ap.add_argument("--mix-hashes", nargs="+", metavar="OUT.json LABEL=IN.gguf")
    a = ap.parse_args()
    if a.mix_hashes:
        mix_hashes(a.mix_hashes[0], a.mix_hashes[1:])
        return
    if a.llama_quantize:
        llama_quantize(*a.llama_quantize, a.pure)
        return
    g = Ggml(a.lib or find_lib())
    print(g.info())
    if a.big:
        n, out = int(a.big[0]), Path(a.big[1])
        out.mkdir(parents=True, exist_ok=True)
        x = np.concatenate(weight_like(np.random.default_rng(SEED + 1), n))
        (out / "kquant_input.f32").write_bytes(x.astype("<f4").tobytes())
        for ty in TYPES:
            (out / f"{ty}.kquant.bin").write_bytes(g.quantize(ty, x))
        print(f"wrote {n} blocks to {out}")
        return
    x = blocks(np.random.default_rng(SEED))
    (OUT_DIR / "kquant_input.f32").write_bytes(x.astype("<f4").tobytes())
    with np.errstate(over="ignore"):
        for ty in TYPES:
            q = g.quantize(ty, x)
            (OUT_DIR / f"{ty}.kquant.bin").write_bytes(q)
            print(f"| {ty} | kquant_input.f32 | {x.size} | {len(q)} |")


if __name__ == "__main__":
    main()
