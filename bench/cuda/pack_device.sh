#!/usr/bin/env bash
# Builds the checked-out tree and packs it for `run` (carry [".device"]), as
# bench/cuda/next_check.sh unpacks it: .device/kiln$SUFFIX.xz and
# .device/cuda_check$SUFFIX.xz (stripped), the kernels precompiled for sm_90 into
# .device/cache/*.xz (only modules not already there), a line in .device/BUILT_AT.
#   bash bench/cuda/pack_device.sh SUFFIX [timeline]
# SUFFIX: "" (the branch: kiln / cc on the device), _a (main), _p, _g, ... ;
# timeline: also the stamping build's cubins (KILN_CUDA_TIMELINE; ~3 min on 2 cores).
# NVRTC comes from the nvidia-cuda-nvrtc==13.0.88 wheel (../shared/GPU.md).
set -euo pipefail
SUFFIX=${1-}
cd "$(git rev-parse --show-toplevel)"
cargo build --release -p kiln-cli -p kiln-cuda --bins --example cuda_check 2>&1 | tail -1
lib=$(python3 -c 'import sys; sys.path.insert(0, "bench/cuda"); from kernel_regs import nvrtc_dir; print(nvrtc_dir())')
export LD_LIBRARY_PATH=$lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
cache=${KILN_PACK_CACHE:-/tmp/kiln-pack-cache}
mkdir -p "$cache" .device/cache
KILN_CUDA_CACHE=$cache ./target/release/examples/cuda_check --precompile sm_90 2>&1 | tail -1
if [ "${2-}" = timeline ]; then
  KILN_CUDA_TIMELINE=1 KILN_CUDA_CACHE=$cache ./target/release/examples/cuda_check --precompile sm_90 2>&1 | tail -1
fi
for f in "$cache"/*; do
  b=$(basename "$f")
  [ -e ".device/cache/$b.xz" ] || xz -c "$f" > ".device/cache/$b.xz"
done
tmp=$(mktemp -d)
strip -o "$tmp/kiln" target/release/kiln
strip -o "$tmp/cuda_check" target/release/examples/cuda_check
xz -c "$tmp/kiln" > ".device/kiln$SUFFIX.xz"
xz -c "$tmp/cuda_check" > ".device/cuda_check$SUFFIX.xz"
rm -rf "$tmp"
echo "${SUFFIX:-(branch)} = $(git rev-parse --short HEAD) $(git log -1 --format=%s | cut -c1-70)" >> .device/BUILT_AT
du -sh .device
