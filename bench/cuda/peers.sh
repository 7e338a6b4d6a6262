#!/usr/bin/env bash
# Device benchmark (issue 7): random-weight models of a named shape written by
# `kiln synth`, timed with kiln (CUDA) and with HF transformers (hf_peer.py) on
# the same HF folder, in one call. Prints one markdown table last.
#
#   bench/cuda/peers.sh KILN HF_PEER SHAPE TYPES [OUT_DIR]
#   e.g. bench/cuda/peers.sh /tmp/kiln bench/cuda/hf_peer.py Llama-3.2-1B q8_0,q4_0,q4_k
#   HF_PEER "-" skips transformers. BATCH=1,8,32,64,128 also runs `kiln bench --batch` on the HF folder (aggregate tok/s).
#
# kiln: `kiln bench --device cuda -p 2048 -n 256 -r 3` (llama-bench style: one warm-up,
# prefill of a 2048-token prompt from an empty cache, then 256 one-token decode steps,
# mean of 3). The floor is kiln bench's own: the weight bytes read per token (an untied
# embedding table: one row) plus the K/V at tg256's mean depth, over the device's copy rate
# (bytes read + written) that kiln bench measures at start.
set -euo pipefail
KILN=$1 PEER=$2 SHAPE=$3 TYPES=$4 DIR=${5:-/tmp/kiln-bench-$SHAPE}
mkdir -p "$DIR"
[ -f "$DIR/hf/config.json" ] || "$KILN" synth "$SHAPE" "$DIR" --types "$TYPES" >&2
T=$(dirname "$0")/table.py
rows=()
for m in "$DIR/hf" $(for t in ${TYPES//,/ }; do echo "$DIR/model-$t.gguf"; done); do
  [ -e "$m" ] || continue
  j=$("$KILN" bench "$m" --device cuda -p 2048 -n 256 -r 3 -o json 2>/dev/null || echo '[]')
  rows+=("$(python3 "$T" kiln "$(basename "$m")" "$j")")
done
batched=""
if [ -n "${BATCH:-}" ]; then
  batched=$("$KILN" bench "$DIR/hf" --device cuda --batch "$BATCH" -p 128 -n 128 -o json 2>/dev/null || echo '[]')
fi
peer='{}'
if [ "$PEER" != "-" ]; then  # "-": skip transformers (run hf_peer.py in another call)
  peer=$(timeout 400 python3 "$PEER" "$DIR/hf" --prompt 128 --new 256 --prefill 2048 2>/dev/null | tail -1 || echo '{}')
fi
echo "# $(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1), shape $SHAPE"
echo "| model | weights + K/V read/token | floor tok/s (copy rate) | kiln decode tok/s | % of floor | kiln prefill 2048 tok/s |"
echo "|---|---|---|---|---|---|"
printf '%s\n' "${rows[@]}"
[ "$peer" = "{}" ] || python3 "$T" peer "$peer"
if [ -n "$batched" ]; then
  echo
  echo "kiln bench --batch $BATCH (hf folder, 128-token prompts, 128 generated each):"
  python3 "$T" batch "$batched"
fi
