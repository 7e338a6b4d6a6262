#!/usr/bin/env python3
"""Times llama.cpp (through llama-cpp-python) the way llama-bench does:
pp = one forward over N_PROMPT tokens on an empty context; tg = N_GEN
one-token forwards after a one-token warm-up. Prints llama-bench style JSON
records (avg_ts, stddev_ts, samples_ts) on stdout.

usage: llamacpp_bench.py MODEL -p 128 -n 64 -t 2 -r 5
"""
import argparse
import json
import os
import statistics
import sys
import time

import llama_cpp


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("-p", type=int, default=128)
    ap.add_argument("-n", type=int, default=64)
    ap.add_argument("-t", type=int, default=2)
    ap.add_argument("-r", type=int, default=5)
    a = ap.parse_args()
    llm = llama_cpp.Llama(
        model_path=a.model,
        n_ctx=a.p + a.n + 16,
        n_batch=max(a.p, 32),
        n_ubatch=max(a.p, 32),
        n_threads=a.t,
        n_threads_batch=a.t,
        verbose=False,
    )
    vocab = llm.n_vocab()
    # Same pseudo-random prompt as `kiln bench`.
    prompt = [(i * 7919 + 13) % vocab for i in range(a.p)]
    records = []
    for kind, n in (("pp", a.p), ("tg", a.n)):
        if n == 0:
            continue
        samples = []
        for rep in range(a.r + 1):  # first run is a warm-up, as llama-bench
            llm.reset()
            llm._ctx.kv_cache_clear() if hasattr(llm._ctx, "kv_cache_clear") else None
            if kind == "pp":
                t0 = time.perf_counter()
                llm.eval(prompt)
                dt = time.perf_counter() - t0
            else:
                llm.eval([prompt[0]])
                tok = prompt[1 % len(prompt)]
                t0 = time.perf_counter()
                for _ in range(n):
                    llm.eval([tok])
                dt = time.perf_counter() - t0
            if rep > 0:
                samples.append(n / dt)
        records.append(
            {
                "model_filename": a.model,
                "model_type": os.path.basename(a.model),
                "model_size": os.path.getsize(a.model),
                "n_threads": a.t,
                "n_prompt": a.p if kind == "pp" else 0,
                "n_gen": a.n if kind == "tg" else 0,
                "avg_ts": statistics.mean(samples),
                "stddev_ts": statistics.stdev(samples) if len(samples) > 1 else 0.0,
                "samples_ts": samples,
                "backend": "llama.cpp " + getattr(llama_cpp, "__version__", "?"),
            }
        )
    json.dump(records, sys.stdout)
    print()


if __name__ == "__main__":
    main()
