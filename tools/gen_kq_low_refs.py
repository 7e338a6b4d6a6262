"""Q2_K, Q3_K and Q3_K_M variants of the tiny llama_kq fixture, with llama.cpp's and
transformers' logits, into tests/data/kq_low/ (the shared fixtures have no 2- or 3-bit
k-quant model).

Every file is made by independent tools, none by kiln:
  quantize  llama.cpp's quantizer (llama-cpp-python 0.3.36, `llama_model_quantize`) from
            the fixture's Q6_K GGUF (allow_requantize; Q2_K and Q3_K pure as the shared
            fixtures' single types, Q3_K_M llama.cpp's own mix)
  llamacpp  llama.cpp's logits for every position of the fixture's input_ids, and its 16
            greedy ids after prompt_ids (the shared fixtures' convention)
  hf        transformers' logits in float64 over each GGUF's dequantized weights (its GGUF
            loader, gguf-py's dequantization), written beside llama.cpp's

  python3 tools/gen_kq_low_refs.py quantize   # an environment with llama-cpp-python
  python3 tools/gen_kq_low_refs.py llamacpp   # the same
  python3 tools/gen_kq_low_refs.py hf         # an environment with torch + transformers + gguf
"""

import ctypes
import json
import os
import sys

import numpy as np

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
SRC = os.path.join(ROOT, "tests/data/fixtures/tiny/llama_kq")
OUT = os.path.join(ROOT, "tests/data/kq_low")
# Output name, llama.cpp ftype name, pure.
TYPES = [("q2_k", "LLAMA_FTYPE_MOSTLY_Q2_K", True),
         ("q3_k", "LLAMA_FTYPE_MOSTLY_Q3_K_M", True),
         ("q3_k_m", "LLAMA_FTYPE_MOSTLY_Q3_K_M", False)]
VOCAB = 512


def manifest():
    with open(os.path.join(SRC, "manifest.json")) as f:
        return json.load(f)


def gguf(t):
    return os.path.join(OUT, "gguf", f"llama_kq-{t}.gguf")


def quantize():
    import llama_cpp

    os.makedirs(os.path.join(OUT, "gguf"), exist_ok=True)
    src = os.path.join(SRC, "gguf/llama_kq-q6_k.gguf")
    for t, ftype, pure in TYPES:
        p = llama_cpp.llama_model_quantize_default_params()
        # Pure Q3_K: the Q3_K_M ftype with every tensor forced to its base type.
        p.ftype = getattr(llama_cpp, ftype)
        p.allow_requantize = True
        p.pure = pure
        rc = llama_cpp.llama_model_quantize(src.encode(), gguf(t).encode(), ctypes.byref(p))
        assert rc == 0, (t, rc)
        print("wrote", gguf(t))


def ref_path(t):
    return os.path.join(OUT, f"ref_llamacpp_{t}.safetensors")


def llamacpp():
    from llama_cpp import Llama
    from safetensors.numpy import save_file

    m = manifest()
    ids, prompt = m["input_ids"], m["prompt_ids"]
    for t, _, _ in TYPES:
        llm = Llama(gguf(t), n_ctx=64, logits_all=True, n_threads=2, verbose=False)
        llm.eval(ids)
        logits = np.array(llm.scores[: len(ids)], dtype=np.float32)
        llm.reset()
        llm.eval(prompt)
        gen = []
        for _ in range(16):
            tok = int(np.argmax(llm.scores[llm.n_tokens - 1]))
            gen.append(tok)
            llm.eval([tok])
        save_file(
            {
                "input_ids": np.array(ids, dtype=np.int64),
                "prompt_ids": np.array(prompt, dtype=np.int64),
                "generated_ids": np.array(gen, dtype=np.int64),
                "logits": logits,
            },
            ref_path(t),
        )
        print(t, "llama.cpp greedy", gen)
    import llama_cpp

    with open(os.path.join(OUT, "manifest.json"), "w") as f:
        json.dump({"source": "tests/data/fixtures/tiny/llama_kq (gguf/llama_kq-q6_k.gguf, manifest.json's ids)",
                   "versions": {"llama_cpp_python": llama_cpp.__version__}}, f, indent=1)


def hf():
    import torch
    from safetensors.numpy import load_file, save_file
    from transformers import AutoModelForCausalLM, GgufConfig

    summary = {}
    for t, _, _ in TYPES:
        # Dequantized to float64 weights and plain Linear layers (not the packed kernels).
        model = AutoModelForCausalLM.from_pretrained(
            os.path.join(OUT, "gguf"), gguf_file=os.path.basename(gguf(t)), dtype=torch.float64,
            quantization_config=GgufConfig(dequantize=True)).eval()
        assert {p.dtype for p in model.parameters()} == {torch.float64}
        r = load_file(ref_path(t))
        with torch.no_grad():
            out = model(torch.tensor([r["input_ids"].tolist()])).logits[0]
        r["logits_hf_dequant_f64"] = out.to(torch.float32).numpy()
        save_file(r, ref_path(t))
        d = float(np.abs(r["logits_hf_dequant_f64"] - r["logits"]).max())
        summary[t] = {"maxabs_hf_dequant_vs_llamacpp": d,
                      "llamacpp_generated_ids": r["generated_ids"].tolist()}
        print(t, "llama.cpp vs transformers f64 over the dequantized weights:", d)
    path = os.path.join(OUT, "manifest.json")
    with open(path) as f:
        m = json.load(f)
    m["versions"].update({"torch": torch.__version__,
                          "transformers": __import__("transformers").__version__,
                          "gguf": __import__("importlib.metadata").metadata.version("gguf")})
    m["types"] = summary
    with open(path, "w") as f:
        json.dump(m, f, indent=1)


if __name__ == "__main__":
    {"quantize": quantize, "llamacpp": llamacpp, "hf": hf}[sys.argv[1]]()
