#!/usr/bin/env python3
"""Generate the bit-exact dequantization vectors in tests/data/dequant/.

For every ggml type that gguf-py's `gguf.quants.dequantize` can decode, build a
few seeded random blocks (random quant bytes, adversarial but finite f16
scales: zero, negative zero, subnormal, tiny, huge, negative), run them through
gguf-py and store

    tests/data/dequant/<TYPE>.bin   the raw input bytes (whole blocks)
    tests/data/dequant/<TYPE>.f32   the expected outputs, little-endian f32

The Rust test crates/kiln-format/tests/dequant_gguf_py.rs compares kiln's
dequantization with these outputs bit for bit.

Types gguf-py cannot decode get vectors from a second, clearly labelled source:
  * Q8_K: a numpy transcription of ggml-quants.c `dequantize_row_q8_K`
    (`y = x.d * (float)x.qs[j]`); gguf-py 0.19 has no Q8_K class.
  * I8/I16/I32/I64/F64: numpy `astype(np.float32)` (the C conversion ggml uses).
Every file's source is listed in the generated README.md.

Usage (from the repository root):
    python3 tools/gen_dequant_vectors.py                 # rewrite tests/data/dequant
    python3 tools/gen_dequant_vectors.py --emit-grids    # print dequant/grids.rs to stdout

`--emit-grids` writes the i-quant lookup tables in ggml's layout (one u64 or
u32 per grid row, element j in byte j) decoded from gguf-py's packed grids; the
committed crates/kiln-format/src/dequant/grids.rs was made with
    python3 tools/gen_dequant_vectors.py --emit-grids > crates/kiln-format/src/dequant/grids.rs
    rustfmt --edition 2021 crates/kiln-format/src/dequant/grids.rs
"""

from __future__ import annotations

import argparse
import importlib.metadata
import sys
from pathlib import Path

import numpy as np
import gguf
from gguf import quants
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType as T

SEED = 0x6B696C6E  # "kiln"
ROOT = Path(__file__).resolve().parents[1]
OUT_DIR = ROOT / "tests" / "data" / "dequant"

# Byte offsets of the f16 scale fields inside one block, per type.
F16_FIELDS: dict[str, list[int]] = {
    "Q4_0": [0],
    "Q4_1": [0, 2],
    "Q5_0": [0],
    "Q5_1": [0, 2],
    "Q8_0": [0],
    "Q2_K": [80, 82],  # scales[16] qs[64] d dmin
    "Q3_K": [108],  # hmask[32] qs[64] scales[12] d
    "Q4_K": [0, 2],
    "Q5_K": [0, 2],
    "Q6_K": [208],  # ql[128] qh[64] scales[16] d
    "TQ1_0": [52],  # qs[48] qh[4] d
    "TQ2_0": [64],  # qs[64] d
    "IQ2_XXS": [0],
    "IQ2_XS": [0],
    "IQ2_S": [0],
    "IQ3_XXS": [0],
    "IQ3_S": [0],
    "IQ1_S": [0],
    "IQ4_NL": [0],
    "IQ4_XS": [0],
    "IQ1_M": [],  # d is split over the top nibbles of scales[8]; see fix_iq1_m
    "MXFP4": [],  # e8m0 exponent byte; see fix_mxfp4
}

# Blocks per type: more for the 32-element types so each file has >= 512 values.
def n_blocks_for(block_size: int) -> int:
    return 16 if block_size == 32 else 6


def adversarial_f16(rng: np.random.Generator, mode: str) -> int:
    """Bits of a finite f16 (never NaN/inf)."""
    if mode == "zero":
        return int(rng.choice([0x0000, 0x8000]))
    sign = 0x8000 if (mode == "negative" or rng.random() < 0.35) else 0
    r = rng.random()
    if r < 0.12:  # subnormal
        return sign | int(rng.integers(1, 0x400))
    if r < 0.20:  # extremes of the finite range
        return sign | int(rng.choice([0x7BFF, 0x0400, 0x3C00, 0x0001, 0x03FF, 0x7800]))
    if r < 0.25:
        return int(rng.choice([0x0000, 0x8000])) if mode != "negative" else 0x8000 | 0x3C00
    exp = int(rng.integers(1, 31))  # 1..30: normal
    return sign | (exp << 10) | int(rng.integers(0, 0x400))


def put_u16(block: np.ndarray, off: int, v: int) -> None:
    block[off] = v & 0xFF
    block[off + 1] = (v >> 8) & 0xFF


def fix_iq1_m(block: np.ndarray, rng: np.random.Generator, mode: str) -> None:
    # scales[8] at byte 48 as four u16; d = their top nibbles, lowest first.
    d = adversarial_f16(rng, mode)
    for i in range(4):
        off = 48 + 2 * i
        v = int(block[off]) | (int(block[off + 1]) << 8)
        v = (v & 0x0FFF) | (((d >> (4 * i)) & 0xF) << 12)
        put_u16(block, off, v)


def fix_mxfp4(block: np.ndarray, rng: np.random.Generator, i: int) -> None:
    # Every e8m0 byte is a finite scale in gguf-py/ggml (255 -> 2^127, 0 -> 2^-128).
    forced = [0, 1, 2, 127, 254, 255, 126, 3]
    block[0] = forced[i] if i < len(forced) else int(rng.integers(0, 256))


def block_mode(i: int) -> str:
    # block 2: zero scales, block 3: negative scales, the rest mixed.
    return {2: "zero", 3: "negative"}.get(i, "mixed")


def quant_blocks(name: str, rng: np.random.Generator) -> np.ndarray:
    qtype = T[name]
    block_size, type_size = GGML_QUANT_SIZES[qtype]
    n = n_blocks_for(block_size)
    blocks = rng.integers(0, 256, size=(n, type_size), dtype=np.uint8)
    # Extreme quant bytes in blocks 0 and 1 (scales are rewritten below).
    blocks[0, :] = 0x00
    blocks[1, :] = 0xFF
    for i in range(n):
        mode = block_mode(i)
        if name == "IQ1_M":
            fix_iq1_m(blocks[i], rng, mode)
        elif name == "MXFP4":
            fix_mxfp4(blocks[i], rng, i)
        for off in F16_FIELDS[name]:
            put_u16(blocks[i], off, adversarial_f16(rng, mode))
    return blocks.reshape(-1)


def f16_values(rng: np.random.Generator) -> np.ndarray:
    # Every inf/NaN pattern (signalling NaNs included), a sample of subnormals,
    # zeros, and random normals.
    special = np.arange(0x7C00, 0x8000, dtype=np.uint16)
    special = np.concatenate([special, special | 0x8000])
    sub = rng.integers(0, 0x400, size=256, dtype=np.uint16)
    sub = np.concatenate([sub, sub | 0x8000, np.array([0, 0x8000, 1, 0x3FF, 0x8001], dtype=np.uint16)])
    normal = rng.integers(0x0400, 0x7C00, size=1024, dtype=np.uint16) | (rng.integers(0, 2, 1024, dtype=np.uint16) << 15)
    return np.concatenate([special, sub, normal]).astype("<u2")


def bf16_values(rng: np.random.Generator) -> np.ndarray:
    special = np.array([0, 0x8000, 0x7F80, 0xFF80, 0x7FC0, 0xFFC0, 0x7F81, 0xFFFF, 0x0001, 0x807F, 0x7F7F, 0x3F80], dtype=np.uint16)
    return np.concatenate([special, rng.integers(0, 0x10000, size=2036, dtype=np.uint16)]).astype("<u2")


def f32_values(rng: np.random.Generator) -> np.ndarray:
    special = np.array([0, 0x80000000, 0x7F800000, 0xFF800000, 0x7FC00000, 0x7F800001, 0xFFFFFFFF, 1, 0x007FFFFF], dtype=np.uint32)
    return np.concatenate([special, rng.integers(0, 2**32, size=1015, dtype=np.uint32)]).astype("<u4")


def q8_k_blocks(rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Q8_K: {f32 d; i8 qs[256]; i16 bsums[16]} -> numpy transcription of ggml."""
    n = 6
    raw = rng.integers(0, 256, size=(n, 292), dtype=np.uint8)
    raw[0, 4:260] = 0x80  # qs = -128
    raw[1, 4:260] = 0x7F
    ds = [0.0, 1.0, -0.0, -3.5]
    for i in range(n):
        if i < len(ds):
            d = np.float32(ds[i])
        else:  # random finite f32 with a wide exponent range, subnormals included
            exp = int(rng.integers(0, 255))
            bits = (int(rng.integers(0, 2)) << 31) | (exp << 23) | int(rng.integers(0, 1 << 23))
            d = np.array([bits], dtype=np.uint32).view(np.float32)[0]
        raw[i, 0:4] = np.array([d], dtype="<f4").view(np.uint8)
    d = raw[:, 0:4].copy().view("<f4").astype(np.float32)  # (n, 1)
    qs = raw[:, 4:260].view(np.int8).astype(np.float32)
    out = (d * qs).astype(np.float32)  # ggml: y = x.d * x.qs[j], both f32
    return raw.reshape(-1), out.reshape(-1)


def int_values(name: str, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    if name == "I8":
        v = np.arange(-128, 128, dtype=np.int8)
    elif name == "I16":
        v = np.concatenate([np.array([-32768, 32767, 0, -1], dtype=np.int16), rng.integers(-32768, 32768, 508, dtype=np.int16)])
    elif name == "I32":
        edge = [-(2**31), 2**31 - 1, 0, -1, 2**24, 2**24 + 1, 2**24 + 3, -(2**24 + 1), 2**25 + 2, 2**25 + 6]
        v = np.concatenate([np.array(edge, dtype=np.int32), rng.integers(-(2**31), 2**31, 502, dtype=np.int32)])
    elif name == "I64":
        edge = [-(2**63), 2**63 - 1, 0, -1, 2**24 + 1, 2**53 + 1, 2**62 + 2**38, 2**62 + 2**38 + 1, -(2**40 + 2**16)]
        v = np.concatenate([np.array(edge, dtype=np.int64), rng.integers(-(2**63), 2**63 - 1, 503, dtype=np.int64, endpoint=True)])
    elif name == "F64":
        edge = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1e300, -1e300, 3.4028235677973366e38, 3.4028235e38 * 1.0000001,
                         1e-40, 1e-46, 1.401298464324817e-45, 7.006492321624085e-46, 1.0 + 2.0**-24, 1.0 + 2.0**-24 + 2.0**-52,
                         1.0 + 3 * 2.0**-24], dtype=np.float64)
        bits = (rng.integers(0, 2, 496, dtype=np.uint64) << np.uint64(63)) \
            | (rng.integers(1023 - 160, 1023 + 160, 496, dtype=np.uint64) << np.uint64(52)) \
            | rng.integers(0, 1 << 52, 496, dtype=np.uint64)
        v = np.concatenate([edge, bits.view(np.float64)])
    else:
        raise ValueError(name)
    le = v.astype(v.dtype.newbyteorder("<"))
    return le.view(np.uint8), v.astype(np.float32)


def gguf_py_dequant(name: str, raw: np.ndarray) -> np.ndarray:
    out = quants.dequantize(raw.view(np.uint8), T[name])
    assert out.dtype == np.float32, (name, out.dtype)
    return np.ascontiguousarray(out).reshape(-1)


def generate() -> None:
    rng = np.random.default_rng(SEED)
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    rows = []  # (type, source, bytes, values)

    def write(name: str, raw: np.ndarray, out: np.ndarray, source: str) -> None:
        raw = np.ascontiguousarray(raw).view(np.uint8).reshape(-1)
        out = np.ascontiguousarray(out, dtype=np.float32).reshape(-1)
        block_size, type_size = GGML_QUANT_SIZES[T[name]]
        assert raw.size % type_size == 0 and raw.size // type_size * block_size == out.size, name
        (OUT_DIR / f"{name}.bin").write_bytes(raw.tobytes())
        (OUT_DIR / f"{name}.f32").write_bytes(out.astype("<f4").tobytes())
        rows.append((name, source, raw.size, out.size))

    # Plain floats through gguf-py's dequantize (F32/F16 branches, BF16 class).
    for name, vals in [("F32", f32_values(rng)), ("F16", f16_values(rng)), ("BF16", bf16_values(rng))]:
        raw = vals.view(np.uint8)
        write(name, raw, gguf_py_dequant(name, raw), "gguf-py")

    gguf_quant = ["Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K",
                  "IQ4_NL", "IQ4_XS", "TQ1_0", "TQ2_0", "MXFP4", "IQ2_XXS", "IQ2_XS", "IQ2_S",
                  "IQ3_XXS", "IQ3_S", "IQ1_S", "IQ1_M"]
    for name in gguf_quant:
        raw = quant_blocks(name, rng)
        write(name, raw, gguf_py_dequant(name, raw), "gguf-py")

    raw, out = q8_k_blocks(rng)
    write("Q8_K", raw, out, "ggml-transcription")

    for name in ["I8", "I16", "I32", "I64", "F64"]:
        raw, out = int_values(name, rng)
        write(name, raw, out, "numpy-astype")

    write_readme(rows)


def write_readme(rows: list[tuple[str, str, int, int]]) -> None:
    gguf_version = importlib.metadata.version("gguf")
    total = sum(b + 4 * v for _, _, b, v in rows)
    lines = [
        "# Dequantization test vectors",
        "",
        "Expected outputs for kiln's reference dequantization",
        "(`crates/kiln-format/src/dequant/`), checked bit for bit by",
        "`crates/kiln-format/tests/dequant_gguf_py.rs`.",
        "",
        "For each type `<TYPE>`:",
        "",
        "- `<TYPE>.bin`: raw input, a whole number of ggml blocks, exactly as they lie in a GGUF tensor;",
        "- `<TYPE>.f32`: the expected output, one little-endian IEEE-754 f32 per element.",
        "",
        "## Provenance",
        "",
        f"- Generator: `tools/gen_dequant_vectors.py` (seed `{SEED:#x}`, numpy `default_rng`).",
        f"- gguf-py: PyPI `gguf` {gguf_version}, `gguf.quants.dequantize(raw_uint8_array, qtype)`.",
        f"- numpy: {np.__version__}; Python {sys.version.split()[0]}.",
        "- Regenerate from the repository root: `python3 tools/gen_dequant_vectors.py`",
        "  (needs `pip install gguf==" + gguf_version + " numpy`; the same versions give the same bytes).",
        "- Inputs: random quant bytes (block 0 all 0x00, block 1 all 0xFF apart from the scales), scales drawn",
        "  as finite f16 values of varied magnitude: zero and negative zero (block 2), negative (block 3),",
        "  subnormal, tiny, 65504, random normal. No NaN/inf scales, so outputs are comparable. The F16",
        "  file holds every f16 inf/NaN pattern (signalling NaNs included), BF16 and F32 some; they pass",
        "  through with their bits unchanged.",
        "- Check: `cargo test -p kiln-format --test dequant_gguf_py -- --nocapture` (prints the count per type).",
        "",
        "Sources (column `source`):",
        "",
        "- `gguf-py`: output of gguf-py's `dequantize`.",
        "- `ggml-transcription`: gguf-py 0.19 has no Q8_K decoder; the output is a numpy transcription",
        "  of ggml-quants.c `dequantize_row_q8_K` (`y[j] = x.d * x.qs[j]`, f32 `d`).",
        "- `numpy-astype`: plain integer / f64 tensors, converted with numpy `astype(np.float32)` (C casts,",
        "  round to nearest even), which is what ggml does; gguf-py has no decoder for these.",
        "",
        "| type | source | input bytes | values |",
        "|---|---|---:|---:|",
    ]
    for name, source, b, v in rows:
        lines.append(f"| {name} | {source} | {b} | {v} |")
    lines += [
        "",
        f"Total size: {total} bytes.",
        "",
        "Not covered: Q8_1 (ggml has no dequantizer for it, and its block is 36 bytes in ggml but 40 in",
        "gguf-py's size table), NVFP4 and Q1_0 (newer gguf-py types that kiln's type table does not know).",
        "",
        "## License",
        "",
        "Generated data, dedicated to the public domain (CC0 1.0). The generator is part of kiln.",
        "",
    ]
    (OUT_DIR / "README.md").write_text("\n".join(lines))


def emit_grids() -> None:
    out = sys.stdout
    w = out.write
    w("//! Lookup tables of the i-quants, in ggml's layout (ggml-common.h): one integer per\n")
    w("//! grid row, element `j` in byte `j` (little-endian).\n")
    w("//!\n")
    w(f"//! Generated by `python3 tools/gen_dequant_vectors.py --emit-grids` from gguf-py {importlib.metadata.version('gguf')}'s\n")
    w("//! packed grids (MIT, same values as ggml-common.h); do not edit by hand.\n\n")

    def table(name: str, cls, bits: int, signed: bool) -> None:
        cls.init_grid()
        g = cls.grid.reshape(cls.grid_shape).astype(np.int64)
        n, k = g.shape
        ty = "u64" if bits == 64 else "u32"
        w(f"pub(crate) static {name}: [{ty}; {n}] = [\n")
        per_line = 4 if bits == 64 else 6
        for r0 in range(0, n, per_line):
            vals = []
            for r in range(r0, min(n, r0 + per_line)):
                v = 0
                for j in range(k):
                    byte = int(g[r, j]) & 0xFF if signed else int(g[r, j])
                    assert 0 <= byte <= 255
                    v |= byte << (8 * j)
                vals.append(f"0x{v:0{bits // 4}x}")
            w("    " + ", ".join(vals) + ",\n")
        w("];\n\n")

    table("IQ2XXS_GRID", quants.IQ2_XXS, 64, False)
    table("IQ2XS_GRID", quants.IQ2_XS, 64, False)
    table("IQ2S_GRID", quants.IQ2_S, 64, False)
    table("IQ3XXS_GRID", quants.IQ3_XXS, 32, False)
    table("IQ3S_GRID", quants.IQ3_S, 32, False)
    table("IQ1S_GRID", quants.IQ1_S, 64, True)
    ks = np.frombuffer(quants.IQ2_XXS.ksigns, dtype=np.uint8)
    w("/// `ksigns_iq2xs`: 7 sign bits plus an even-parity 8th bit.\n")
    w("pub(crate) static KSIGNS_IQ2XS: [u8; 128] = [\n")
    for r0 in range(0, 128, 16):
        w("    " + ", ".join(str(int(x)) for x in ks[r0:r0 + 16]) + ",\n")
    w("];\n")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--emit-grids", action="store_true", help="print grids.rs to stdout instead")
    args = ap.parse_args()
    if args.emit_grids:
        emit_grids()
    else:
        # MXFP4 with e = 255 and F64 beyond f32's range overflow to inf on purpose.
        with np.errstate(over="ignore"):
            generate()


if __name__ == "__main__":
    main()
