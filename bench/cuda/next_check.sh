#!/usr/bin/env bash
# Device verification and A/B of the cuda-next branch against main (written
# without a GPU in the fifth session; see crates/kiln-cuda/NOTES.md "Prepared
# without a device"). Build here first:
#   bash .device/build_cc.sh                      # branch cuda_check + cubin cache
#   kiln (branch) -> .device/kiln.xz; kiln and cuda_check from main -> .device/kiln_a.xz,
#   .device/cuda_check_a.xz, main's cubin precompiled into .device/cache too
# then one `run` per mode, carry [".device"]:
#   bash bench/cuda/next_check.sh verify   # fixtures x3 (default, global merge, 16 slices) + logits = main, bit for bit (bf16, Q4_0, Q4_K_M)
#   bash bench/cuda/next_check.sh micro1b  # Q6_K GEMV variants + 1B A/B (q8_0, q4_0, q4_k_m, bf16), twice
#   bash bench/cuda/next_check.sh ab8b     # 8B A/B (q4_k_m, q4_0, bf16)
set -u
MODE=${1:-verify}
mkdir -p "$OUT"
for b in cuda_check:cc cuda_check_a:cc_a kiln:kiln kiln_a:kiln_a; do
  [ -f .device/${b%%:*}.xz ] && xz -dc .device/${b%%:*}.xz > /tmp/${b##*:} && chmod +x /tmp/${b##*:}
done
export KILN_CUDA_CACHE=/tmp/kc; mkdir -p /tmp/kc; cp .device/cache/* /tmp/kc/
date -u +%T
case $MODE in
verify)
  ( /tmp/kiln synth Llama-3.2-1B /tmp/pb1 --types q4_0,q4_k_m > /dev/null 2>&1 ) &
  for v in "" KILN_CUDA_ATT_CLUSTER=0 KILN_CUDA_ATT_SPLIT=16; do
    f="$OUT/checks_${v:-default}.txt"
    env $v timeout 200 /tmp/cc --fixtures tests/data/fixtures > "$f" 2>&1; echo "[$v] rc $?"
    grep -E 'FAILURES|PASSED' "$f"; grep -E 'FAIL|differ' "$f" | head -5
  done
  grep -E '^\| Q6_K' "$OUT/checks_default.txt"
  wait; date -u +%T
  # Every change on the branch is meant to leave logits bit-identical.
  IDS=$(python3 -c "print(','.join(str(1000+7*i) for i in range(24)))")
  for t in hf q4_0 q4_k_m; do
    m=/tmp/pb1/model-$t.gguf; [ $t = hf ] && m=/tmp/pb1/hf
    /tmp/cc_a --logits $m "$IDS" /tmp/a_$t.bin 2>/dev/null
    /tmp/cc --logits $m "$IDS" /tmp/b_$t.bin 2>/dev/null
    KILN_CUDA_ATT_CLUSTER=0 /tmp/cc --logits $m "$IDS" /tmp/c_$t.bin 2>/dev/null
    n=$((3 * 24 * 128256 * 4))  # prefill, decode, exact decode
    cmp -n $n /tmp/a_$t.bin /tmp/b_$t.bin && echo "$t: branch = main, bit for bit"
    cmp -n $n /tmp/b_$t.bin /tmp/c_$t.bin && echo "$t: cluster merge = global merge, bit for bit"
  done ;;
micro1b)
  ( /tmp/kiln synth Llama-3.2-1B /tmp/pb1 --types q8_0,q4_0,q4_k_m > /dev/null 2>&1 ) &
  M=""; for k in mvq_q6_k mvq_q6_kr mvq2_q6_kr rd_rows; do M="$M 8b/q6_k/$k/8/256"; done
  for k in mvq_q6_k mvq_q6_kr mvq2_q6_kr rd_rows; do M="$M 1b/q6_k/$k/8/256"; done
  timeout 120 /tmp/cc --gemv-micro $M 2>&1 | tail -12
  wait; date -u +%T
  for b in kiln_a kiln kiln_a kiln; do echo "== $b"; bash bench/cuda/peers.sh /tmp/$b - Llama-3.2-1B q8_0,q4_0,q4_k_m /tmp/pb1 2>&1 | tail -4; done ;;
ab8b)
  /tmp/kiln synth Llama-3.1-8B /tmp/pb8 --types q4_k_m,q4_0 > /dev/null 2>&1; date -u +%T
  for b in kiln_a kiln kiln_a kiln; do echo "== $b"; bash bench/cuda/peers.sh /tmp/$b - Llama-3.1-8B q4_k_m,q4_0 /tmp/pb8 2>&1 | tail -3; done ;;
esac
date -u +%T
