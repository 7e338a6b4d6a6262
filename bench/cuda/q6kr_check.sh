#!/usr/bin/env bash
# Device check + A/B for the repacked Q6_K branch (one `run` call, ~7 min):
# correctness (cuda_check --fixtures: repacked = plain bit for bit for Q6_K at
# 2304 / 4608 / 16640 columns), the Q6_K GEMV variants in the micro, then
# kiln at HEAD of main (kiln_a) against this branch (kiln) on the 1B shape.
# Build here first: bash .device/build_cc.sh; the kiln binary as .device/kiln.xz,
# main's as .device/kiln_a.xz. Run with carry [".device"].
set -u
mkdir -p "$OUT"
for b in cuda_check:cc kiln:kiln kiln_a:kiln_a; do xz -dc .device/${b%%:*}.xz > /tmp/${b##*:}; chmod +x /tmp/${b##*:}; done
export KILN_CUDA_CACHE=/tmp/kc; mkdir -p /tmp/kc; cp .device/cache/* /tmp/kc/
date -u +%T
( /tmp/kiln synth Llama-3.2-1B /tmp/pb1 --types q8_0,q4_0,q4_k_m > /dev/null 2>&1 ) &
timeout 300 /tmp/cc --fixtures tests/data/fixtures > "$OUT/checks.txt" 2>&1; echo "rc $?"
grep -E 'FAILURES|PASSED' "$OUT/checks.txt"; grep -E 'FAIL|differ' "$OUT/checks.txt" | head -8; grep -E '^\| Q6_K' "$OUT/checks.txt"
date -u +%T
M=""; for k in mvq_q6_k mvq_q6_kr mvqx2_q6_kr mvqx1_q6_kr mvqp_q6_kr rd_rows; do M="$M 8b/q6_k/$k/8/256"; done
for k in mvq_q6_k mvq_q6_kr mvqx2_q6_kr rd_rows; do M="$M 1b/q6_k/$k/8/256"; done
timeout 120 /tmp/cc --gemv-micro $M 2>&1 | tail -12
wait; date -u +%T
for b in kiln_a kiln kiln_a kiln; do echo "== $b"; bash bench/cuda/peers.sh /tmp/$b - Llama-3.2-1B q8_0,q4_0,q4_k_m /tmp/pb1 2>&1 | tail -4; done
date -u +%T
