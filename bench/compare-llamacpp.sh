#!/usr/bin/env bash
# kiln vs llama.cpp on the same GGUF, same machine, same thread count.
#
#   bench/compare-llamacpp.sh [MODEL.gguf ...]
#
# Defaults to the three test models in ~/.cache/kiln-test-models. Installs
# llama-cpp-python from PyPI into a venv (it builds llama.cpp for this CPU,
# ~8 min on 2 cores; the wheel is cached in $KILN_BENCH_CACHE, default
# ~/.cache/kiln-bench), builds kiln in release, then for each model runs
# ROUNDS rounds, each round one `kiln bench` and one llama.cpp run of REPS
# repetitions, alternating which goes first, and prints both engines'
# prompt (pp) and generation (tg) tok/s and the ratios.
#
# Environment: KILN (a kiln binary; default: build one), THREADS (2), P (128),
# N (64), REPS (3), ROUNDS (3),
# LLAMA_CPP_PYTHON_VERSION (0.3.36), SETUP_ONLY=1 (install and stop).
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
CACHE=${KILN_BENCH_CACHE:-$HOME/.cache/kiln-bench}
VENV=$CACHE/venv
WHEELS=$CACHE/wheels
VER=${LLAMA_CPP_PYTHON_VERSION:-0.3.36}
THREADS=${THREADS:-2}
P=${P:-128}
N=${N:-64}
REPS=${REPS:-3}
ROUNDS=${ROUNDS:-3}
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$ROOT/target}

mkdir -p "$CACHE" "$WHEELS"
if [ ! -x "$VENV/bin/python" ]; then
    python3 -m venv "$VENV"
fi
if ! "$VENV/bin/python" -c "import llama_cpp" 2>/dev/null; then
    if ! ls "$WHEELS"/llama_cpp_python-"$VER"-*.whl >/dev/null 2>&1; then
        echo "building llama-cpp-python $VER for this CPU (several minutes; cached in $WHEELS)" >&2
        "$VENV/bin/pip" install -q --upgrade pip wheel >&2
        CMAKE_ARGS="-DGGML_NATIVE=ON -DLLAMA_CURL=OFF -DLLAVA_BUILD=OFF" CMAKE_BUILD_PARALLEL_LEVEL=${BUILD_JOBS:-2} \
            "$VENV/bin/pip" wheel --no-deps -w "$WHEELS" "llama-cpp-python==$VER" >&2
    fi
    "$VENV/bin/pip" install -q "$WHEELS"/llama_cpp_python-"$VER"-*.whl >&2
fi
[ "${SETUP_ONLY:-0}" = 1 ] && exit 0

if [ -z "${KILN:-}" ]; then
    cargo build --release -q -p kiln-cli >&2
    KILN=$CARGO_TARGET_DIR/release/kiln
fi

if [ $# -eq 0 ]; then
    M=${KILN_MODELS:-$HOME/.cache/kiln-test-models}
    set -- "$M/SmolLM2-135M-Instruct.Q4_1.gguf" "$M/gemma-3-270m-q4_k_m.gguf" \
        "$M/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"
fi

OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT
echo "# $(date -u +%FT%TZ) $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(nproc) cores," \
    "threads $THREADS, pp$P tg$N, $ROUNDS rounds x $REPS reps, load before: $(cut -d' ' -f1-3 /proc/loadavg)"
for model in "$@"; do
    name=$(basename "$model")
    for r in $(seq 1 "$ROUNDS"); do
        run_kiln() { "$KILN" bench "$model" --device cpu -p "$P" -n "$N" -t "$THREADS" -r "$REPS" -o json >"$OUT/$name.kiln.$r.json"; }
        run_llama() { "$VENV/bin/python" "$ROOT/bench/llamacpp_bench.py" "$model" -p "$P" -n "$N" -t "$THREADS" -r "$REPS" >"$OUT/$name.llama.$r.json"; }
        if [ $((r % 2)) -eq 1 ]; then run_kiln; run_llama; else run_llama; run_kiln; fi
    done
done
"$VENV/bin/python" - "$OUT" "$@" <<'PY'
import glob, json, os, statistics, sys
out, models = sys.argv[1], sys.argv[2:]
print(f"{'model':44} {'test':6} {'kiln tok/s':>16} {'llama.cpp tok/s':>16} {'ratio':>6}")
for m in models:
    name = os.path.basename(m)
    for test in ("pp", "tg"):
        vals = {}
        for eng in ("kiln", "llama"):
            s = []
            for f in sorted(glob.glob(f"{out}/{name}.{eng}.*.json")):
                for rec in json.load(open(f)):
                    if (rec["n_prompt"] > 0) == (test == "pp"):
                        s += rec["samples_ts"]
            vals[eng] = s
        k, l = vals["kiln"], vals["llama"]
        if not k or not l:
            continue
        fmt = lambda s: f"{statistics.mean(s):8.1f} ± {statistics.stdev(s) if len(s) > 1 else 0:5.1f}"
        print(f"{name:44} {test:6} {fmt(k):>16} {fmt(l):>16} {statistics.mean(k) / statistics.mean(l):6.2f}")
PY
echo "# load after: $(cut -d' ' -f1-3 /proc/loadavg)"
