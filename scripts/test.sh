#!/usr/bin/env bash
# kiln's whole test suite, the README's second quickstart command and what CI runs.
#  1. fetches the real test models into $KILN_MODELS (cached; ~900 MiB the first time),
#  2. makes a Python venv with the reference tools the tests call and NVRTC
#     for the CUDA kernels' compile test (cached),
#  3. runs every Rust test in the workspace. Tests that compare against a
#     reference fail (rather than skip) when it is missing: KILN_REQUIRE_REFS=1.
set -euo pipefail
cd "$(dirname "$0")/.."

export KILN_MODELS=${KILN_MODELS:-$HOME/.cache/kiln-test-models}
bash scripts/fetch-models.sh "$KILN_MODELS"

VENV=${KILN_PYENV:-$HOME/.cache/kiln-pyenv}
if ! "$VENV/bin/python" -c 'import gguf, numpy' 2>/dev/null; then
  echo "making reference venv in $VENV"
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install -q gguf==0.19.0 numpy
fi
export KILN_PYTHON="$VENV/bin/python"
export KILN_REQUIRE_REFS=1

# NVRTC from PyPI (no GPU needed), so that the CUDA kernels' compile is
# tested here too (kiln-cuda's no_device test; skipped without it).
nvrtc_dir() {
  "$VENV/bin/python" -c 'import glob, sysconfig
hits = glob.glob(sysconfig.get_paths()["purelib"] + "/nvidia/cu*/lib/libnvrtc.so.*")
print(hits[0].rsplit("/", 1)[0] if hits else "")'
}
if [ -z "$(nvrtc_dir)" ]; then
  "$VENV/bin/pip" install -q nvidia-cuda-nvrtc==13.0.88 || echo "NVRTC not installed: the kernel compile test will skip"
fi
NVRTC_DIR=$(nvrtc_dir)
if [ -n "$NVRTC_DIR" ]; then
  export LD_LIBRARY_PATH="$NVRTC_DIR${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi

cargo test --workspace "$@"
