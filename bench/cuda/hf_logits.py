"""Compare kiln's CUDA logits with HF transformers on the same HF folder (device machine).

  python3 hf_logits.py MODEL_DIR KILN_LOGITS.f32 IDS

KILN_LOGITS.f32 is what `cuda_check --logits MODEL_DIR IDS OUT` wrote: four blocks of
len(IDS) x vocab f32 (CUDA prefill in one batch, CUDA decode with 8-bit activations,
CUDA decode exact, CPU decode). transformers runs the folder's weights in float32
(bf16 weights widen exactly; TF32 off) and in bfloat16; every block is compared with
the float32 run. Prints one table and a JSON line.
"""
import json, sys

import numpy as np
import torch
from transformers import AutoModelForCausalLM

torch.backends.cuda.matmul.allow_tf32 = False
torch.backends.cudnn.allow_tf32 = False
model_dir, kiln_path, ids_s = sys.argv[1:4]
ids = [int(t) for t in ids_s.split(",")]


def hf_logits(dtype):
    m = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype, attn_implementation="eager").to("cuda").eval()
    with torch.inference_mode():
        out = m(torch.tensor([ids], device="cuda")).logits[0].float().cpu().numpy()
    del m
    torch.cuda.empty_cache()
    return out


ref = hf_logits(torch.float32)
bf16 = hf_logits(torch.bfloat16)
n, vocab = ref.shape
k = np.fromfile(kiln_path, dtype="<f4")
blocks = k.reshape(-1, n, vocab)
names = ["kiln CUDA prefill (one batch, cuBLAS bf16 GEMMs)", "kiln CUDA decode (8-bit x GEMVs for quantized; bf16 weights: f32 x)",
         "kiln CUDA decode, exact GEMVs", "kiln CPU decode"]
scale = float(np.abs(ref).max())
res = {"model_dir": model_dir, "tokens": n, "vocab": vocab, "max_abs_logit_hf_f32": scale, "rows": []}
print(f"| compared with transformers f32 ({n} tokens, max |logit| {scale:.3f}) | max abs | max abs / max |logit| | top-1 equal |")
print("|---|---|---|---|")
for name, b in [("transformers bf16", bf16)] + list(zip(names, blocks)):
    d = float(np.abs(b - ref).max())
    top = int((b.argmax(-1) == ref.argmax(-1)).sum())
    res["rows"].append({"what": name, "max_abs": d, "rel": d / scale, "top1_equal": top})
    print(f"| {name} | {d:.3e} | {d / scale:.2e} | {top}/{n} |")
print(json.dumps(res))
