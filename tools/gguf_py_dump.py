#!/usr/bin/env python3
"""Read a GGUF file with llama.cpp's gguf-py and print what it sees as JSON.

Used by crates/kiln-format/tests/gguf_roundtrip.rs to prove that files kiln's
GgufWriter produces are read by llama.cpp's own Python reader exactly as kiln
meant them. Requires `pip install gguf==0.19.0 numpy`.
"""
import json
import sys

import numpy as np
from gguf import GGUFReader, GGUFValueType


def field_value(f):
    t = f.types[0]
    if t == GGUFValueType.ARRAY:
        et = f.types[-1]
        if len(f.types) > 2:
            return {"nested": True, "len": len(f.data)}
        if et == GGUFValueType.STRING:
            return [bytes(f.parts[i]).decode("utf-8") for i in f.data]
        return [float(f.parts[i][0]) if et in (GGUFValueType.FLOAT32, GGUFValueType.FLOAT64) else int(f.parts[i][0]) for i in f.data]
    if t == GGUFValueType.STRING:
        return bytes(f.parts[f.data[0]]).decode("utf-8")
    v = f.parts[f.data[0]][0]
    if t == GGUFValueType.BOOL:
        return bool(v)
    if t in (GGUFValueType.FLOAT32, GGUFValueType.FLOAT64):
        return float(v)
    return int(v)


r = GGUFReader(sys.argv[1])
out = {"fields": {}, "tensors": []}
for name, f in r.fields.items():
    if name.startswith("GGUF."):
        continue
    out["fields"][name] = {"type": int(f.types[0]), "value": field_value(f)}
for t in r.tensors:
    out["tensors"].append({
        "name": t.name,
        "type": int(t.tensor_type),
        "ne": [int(x) for x in t.shape],
        "offset": int(t.data_offset),
        "sha": __import__("hashlib").sha256(np.ascontiguousarray(t.data).tobytes()).hexdigest(),
    })
print(json.dumps(out))
