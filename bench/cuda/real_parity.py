"""Real-model parity on the device: kiln CUDA vs kiln CPU vs the transformers / llama.cpp
references in tests/data/fixtures/real/<model>/ (top-64 logits of rows 0-4, greedy ids).

  python3 real_parity.py CUDA_CHECK KILN MODEL.gguf FIXTURE_DIR

Row r = logits after the prompt and r tokens of llama.cpp's greedy continuation (teacher
forced), as in the fixtures. `cuda_check --logits` gives four blocks per case: CUDA prefill
in one batch, CUDA decode (default GEMVs), CUDA decode exact, CPU decode. Greedy: `kiln run
--temp 0 -n 32 --ignore-eos` on each device (decode steps sampled on the GPU).
"""
import glob, json, os, subprocess, sys

import numpy as np
from safetensors.numpy import load_file

cc, kiln, model, fdir = sys.argv[1:5]
names = ["CUDA prefill", "CUDA decode", "CUDA decode exact", "CPU decode"]
print("| case | " + " | ".join(f"{n}: max abs vs HF top-64" for n in names) + " | HF vs llama.cpp | greedy CUDA = CPU | CUDA = HF | CUDA = llama.cpp |")
print("|---" * (len(names) + 5) + "|")
worst = {n: 0.0 for n in names}
for jpath in sorted(glob.glob(os.path.join(fdir, "*.json"))):
    meta = json.load(open(jpath))
    if "llamacpp_prompt_ids" not in meta:
        continue
    arr = load_file(jpath[:-5] + ".safetensors")
    prompt = [int(v) for v in arr["llamacpp_prompt_ids"]]
    gen = [int(v) for v in arr["llamacpp_generated_ids"]]
    hf_gen = [int(v) for v in arr["hf_generated_ids"]]
    rows = arr["hf_top64_values"].shape[0]
    ids = prompt + gen[: rows - 1]
    out = "/tmp/real_logits.f32"
    subprocess.run([cc, "--logits", model, ",".join(map(str, ids)), out], check=True, capture_output=True)
    vocab = int(meta["n_vocab"])
    blocks = np.fromfile(out, dtype="<f4").reshape(4, len(ids), -1)
    hv, hi = arr["hf_top64_values"], arr["hf_top64_indices"].astype(np.int64)
    lv = arr["llamacpp_top64_values"]
    cells = []
    for b, n in zip(blocks, names):
        d = 0.0
        for r in range(rows):
            row = b[len(prompt) - 1 + r]
            d = max(d, float(np.abs(row[hi[r]] - hv[r]).max()))
        worst[n] = max(worst[n], d)
        cells.append(f"{d:.2e}")
    peer = float(np.abs(lv - hv).max())

    def greedy(dev):
        p = subprocess.run([kiln, "run", model, "--device", dev, "--prompt-ids", ",".join(map(str, prompt)), "-n", "32",
                            "--temp", "0", "--ignore-eos", "--json"], check=True, capture_output=True, text=True)
        return json.loads(p.stdout.strip().splitlines()[-1])["generated_ids"]

    gc, gp = greedy("cuda"), greedy("cpu")
    lead = lambda a, b: next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
    print(f"| {meta['key']} | " + " | ".join(cells) + f" | {peer:.2e} | {lead(gc, gp)}/32 | {lead(gc, hf_gen)}/32 | {lead(gc, gen)}/32 |")
print("worst: " + json.dumps(worst))
