#!/usr/bin/env bash
# Device verification and A/B of a branch against main, for changes written
# without a GPU (see crates/kiln-cuda/NOTES.md "Prepared without a device").
# Build here first (the binaries travel in .device/, untracked; bench/cuda/pack_device.sh
# SUFFIX builds the checkout and packs it so):
#   .device/kiln.xz, .device/cuda_check.xz      the branch (strip, xz)
#   .device/kiln_a.xz, .device/cuda_check_a.xz  main
#   .device/cache/                              both builds' cubins (cuda_check --precompile sm_90: one a kernel module)
# then one `run` per mode, carrying .device/cache and the mode's binaries only (the working
# tree with its carry must stay under 64 MiB; .device/BUILT_AT lists what is there):
#   bash bench/cuda/next_check.sh verify   # fixtures x3 (default, global merge, 16 slices) + logits = main, bit for bit
#   bash bench/cuda/next_check.sh micro    # Q5_K GEMV: plain vs repacked, 8B and 1B layer chains
#   bash bench/cuda/next_check.sh ab       # 1B and 8B, $AB_TYPES (default q4_0 hf), main vs branch alternated twice
#   bash bench/cuda/next_check.sh boundary # price of one kernel boundary: KILN_CUDA_BOUNDARY=1 vs 0 (1B Q4_0 / bf16)
#   bash bench/cuda/next_check.sh skip     # most that fusing kernels away could gain: KILN_CUDA_SKIP per kernel family
#   bash bench/cuda/next_check.sh fused    # CudaOptions::fuse_norm on vs off (KILN_CUDA_FUSE_NORM=0), 1B/8B $FUSED_TYPES (default q4_0 q4_k_m hf)
#   bash bench/cuda/next_check.sh targets  # the #7 table (kiln.xz): pp2048 / tg256 for 1B and 8B, $TARGET_TYPES; BATCH=1 batched rows
#   bash bench/cuda/next_check.sh knobs    # env-only: attention slices / global merge, fused GEMVs' blocks an SM (kiln.xz)
#   bash bench/cuda/next_check.sh longctx  # 32 slices (kiln_s32.xz, branch att-split32) vs 16 and main at tg2048 / tg256
#   bash bench/cuda/next_check.sh l2win    # kiln.xz vs kiln_a.xz (L2 windows vs before): fixtures, bits, tg256 A/B, bf16 #7 rows
#   bash bench/cuda/next_check.sh l2sweep  # env-only L2 window reaches ($L2_VARIANTS), 8B / 1B bf16, then their #7 rows
#   bash bench/cuda/next_check.sh l2batch  # the L2 windows on vs off in batched decode (8B bf16, 8 / 128 sequences)
#   bash bench/cuda/next_check.sh sync     # cuda_check --sync-micro (persistent-kernel barrier vs kernel boundary), then `targets`
#   bash bench/cuda/next_check.sh price    # each kernel family's in-place price (KILN_CUDA_TWICE), 1B / 8B bf16 and Q4_0 (kiln.xz)
#   bash bench/cuda/next_check.sh envab    # env / binary variants $EV on 1B / 8B $EV_TYPES, tg256 p16, alternated
#   bash bench/cuda/next_check.sh batchab  # the same in batched decode: S_TG at --batch $BATCHES, 8B $EV_TYPES
#   bash bench/cuda/next_check.sh tgprof   # ncu: a one-token decode step kernel by kernel, $PROF_BINS on $PROF_SHAPE $EV_TYPES
#   bash bench/cuda/next_check.sh stepprof # ncu: a batched decode step kernel by kernel (8B $EV_TYPES at --batch $BATCHES)
#   bash bench/cuda/next_check.sh invab    # batch invariance: k sequences together = alone (default / invariant), invariant S_TG by $MVQST
#   bash bench/cuda/next_check.sh tcland   # the f16 cache's tensor-core walk (kiln.xz) vs main (_a): fixtures, logits, depth rows
#   bash bench/cuda/next_check.sh pfctx    # branch att-pf (L2 prefetch in the grouped walk, TC from 2,048) vs main (_a): fixtures, bits, depth rows
#   bash bench/cuda/next_check.sh tcsplit  # the tensor-core walk (f16) by slice count 8 / 16 / 32 at 2,048 / 8,192 (kiln.xz)
#   bash bench/cuda/next_check.sh tcctx    # the tensor-core walk against the CUDA-core walk (f16) at 256-1,024 positions
#   bash bench/cuda/next_check.sh g2tc     # groups of 2 (Qwen3-0.6B) forced grouped at 2,048 / 8,192 (g2ctx: 256-1,024)
#   bash bench/cuda/next_check.sh kvf16    # f16 KV cache: fixtures, f32 logits = main, f32 vs f16 tg256 and tg at depth 8192
#   bash bench/cuda/next_check.sh cluctx   # the cluster merge always / never by depth, then the default (NOTES.md item 60)
#   bash bench/cuda/next_check.sh gqadepth # grouped decode attention: main vs branch, tg256 and after 256-8,192-token prompts
#   bash bench/cuda/next_check.sh wide     # the wide decode attention: fixtures, logits against main, tg256 by bound, timelines
#   bash bench/cuda/next_check.sh swgather # the sliding-window K/V gather in chunked prefill: fixtures, Gemma-3-1B after 1,500 ids
#   bash bench/cuda/next_check.sh att8     # head dim 256's split attention: 8 warps / 4 rows in flight / both vs main, by depth
#   bash bench/cuda/next_check.sh gbatch   # Gemma's batched decode at depth by attention build (S_TG by prompt and batch)
#   bash bench/cuda/next_check.sh tail     # the fused-norm GEMVs' last round in parts (kiln.xz) vs main (_a): fixtures, logits, tg256, stamps
#   bash bench/cuda/next_check.sh invf     # batch invariance with float weights / post-norm layers, main vs branch; invariant fixtures
#   bash bench/cuda/next_check.sh tgab     # tg256 of main (_a) and the branch alternated on $TG_SHAPES x $TG_TYPES
#   bash bench/cuda/next_check.sh q14d     # Qwen3-14B at depth beside the 8B: rows, slices, ncu of a step at 8,192
#   bash bench/cuda/next_check.sh tc8      # the tensor-core walk's 8-head blocks for groups of 5-8 (branch tc-g8b) vs main: fixtures, logits, Qwen3-14B depth rows
#   bash bench/cuda/next_check.sh nonc     # the GEMVs' weight streams without .nc (branch ldg-nonc) vs main: bits, #7 tg256 rows
#   bash bench/cuda/next_check.sh tcg8     # the tensor-core walk (f16) for groups past four (branch tc-g8): fixtures, Qwen3-14B logits and depth rows
#   bash bench/cuda/next_check.sh l2k      # Q5_K / Q3_K / Q2_K streams with .L2::128B (branch l2line-k) vs main; invariant f16 batches
#   bash bench/cuda/next_check.sh l2hint   # the GEMVs' weight loads with .L2::256B (kiln) / ::128B (kiln_b) vs main: bits, #7 tg256 rows
#   bash bench/cuda/next_check.sh glustamps # the float GLU forced on short rows (KILN_CUDA_MVFG_MIN=0) vs act_mul: tg256, 1B stamps
#   bash bench/cuda/next_check.sh short    # short-row streaming kernels (kiln.xz) vs main (_a) on $SR_SHAPES, $SR_TYPES: fixtures, bits, tg256
#   bash bench/cuda/next_check.sh flat     # a repacked layout (kiln.xz / cuda_check.xz) vs main (_a) on $FL_TYPES: fixtures, bits, tg256, batched ($FL_BINS, $FL_SMALL)
#   bash bench/cuda/next_check.sh peers    # bench/cuda/peers.sh (kiln.xz beside transformers) for $PEER_SHAPES, $PEER_TYPES
#   bash bench/cuda/next_check.sh gsplit   # Gemma-3-1B's decode attention slices forced ($GS_SPLITS), tg256 p16 / p512, stamps at $GS_TL
#   bash bench/cuda/next_check.sh timeline # stamps of single decode steps (kiln.xz + its timeline cubin), for bench/cuda/timeline.py
#   bash bench/cuda/next_check.sh attprof  # ncu: decode attention / QKV GEMV durations at step 10 and 1,000 (kiln.xz)
#   bash bench/cuda/next_check.sh plain    # branch vs main, Q4_0 with fuse_norm off and on: fixtures, logits bit for bit, tg256 alternated
#   bash bench/cuda/next_check.sh phases   # price of the O / down phases (KILN_CUDA_SKIP) on 8B / 1B Q4_0 / Q4_K_M, then --sync-micro
# The modes that A/B'd the eighth session's branches (ring, glu, fuseall, attrev) are in git
# history (945516c); the eleventh session's even / mvfn / attq A/Bs (items 45, 46, 49) were the
# `l2win` pattern with env variants; the twelfth session's `evict` and `tma` (items 50, 51) are in git
# history (37ef8f9), its other A/Bs were `envab`; the fourteenth's kvwin / kvclu / cluab (items 60-61) are in
# history at cca9d3b; the seventeenth's kvlayout (item 64a) is on branch kv-layout; split32 is
# on branch att-split32; w8 and the L2-window sweeps (l2pf, l2b-d, l2act, l2rule, l2att) are in
# history at 0e44e47 and on branch l2-ahead.
# The thirty-second session's branch checks (q23k, q3kr, q2kr, q3mmq, lb3; NOTES.md items 89-96)
# and their helpers cpu_distance / variants_same are in git history at e45f3fb; the
# thirty-third's q2mmq and kvab (items 98, 100, 101) at b1dbd3a, its q23review, onechunk and downrest
# on branches onechunk-r and down-rest; the thirty-fourth's q4pat (item 103: the Q4_0 access
# patterns and runs-of-32 kernels) at 3b4f541; the thirty-sixth's glu2 (item 107) at e2226b7.
# The thirty-eighth and thirty-ninth sessions' branch checks (w256, ppair, pcg, pfit, pwe, pdlcg,
# carve; NOTES.md items 110-112) and their helpers same_logits_say / tiny_vs_cpu are in git
# history at f5c526e. The fortieth's gclu (item 113, the cluster merge at head dim 256; `att8`
# with $A8 covers it) at 41473ec.
set -u
MODE=${1:-verify}
# A mode is a case label; a name used twice runs its first (older) body only, after the
# device has started: refuse such a name, and an unknown one, before unpacking anything.
n=$(grep -c "^${MODE})$" "$0")
[ "$n" = 1 ] || { echo "next_check.sh: mode '$MODE' is defined $n times"; exit 2; }
mkdir -p "$OUT"
# Every binary in .device: cuda_check[_X] -> /tmp/cc[_X], kiln[_X] -> /tmp/kiln[_X].
for f in .device/*.xz; do
  b=$(basename ${f%.xz}); b=${b/#cuda_check/cc}
  xz -dc $f > /tmp/$b && chmod +x /tmp/$b
done
# Cubins travel xz-compressed (the working tree's 64 MiB limit).
export KILN_CUDA_CACHE=/tmp/kc; mkdir -p /tmp/kc
for f in .device/cache/*; do case $f in *.xz) xz -dc $f > /tmp/kc/$(basename ${f%.xz}) ;; *) cp $f /tmp/kc/ ;; esac; done
TYPES=q4_0,q4_k_m,q5_k_m,q8_0
# The model of type $2 (hf: the HF folder) that `kiln synth` wrote into $1; the GGUF types of a
# type list ($@ without hf) as `kiln synth --types` takes them.
model_of() { if [ $2 = hf ]; then echo $1/hf; else echo $1/model-$2.gguf; fi; }
gguf_types() { echo "$@" | tr ' ' '\n' | grep -v '^hf$' | paste -sd, -; }
# `kiln bench` output piped in: the tg tok/s (tg_of), or pp and tg on one line (pptg_of).
# Table rows only (the footnote under the table mentions tg too).
tg_of() { grep -E '^\|.*tg' | awk -F'|' '{print $(NF-1)}'; }
pptg_of() { grep -E '^\|.*(pp|tg)' | awk -F'|' '{print $(NF-2), $(NF-1)}' | tr '\n' ' '; }
# `kiln bench --batch` piped in: "batch: S_TG" for each batch size.
stg_of() { grep -E '^\|' | tail -n +3 | awk -F'|' '{printf "%s:%s ", $4, $9}'; }
# Whether main's and the branch's cuda_check (cc_a, cc) give model $1 the same logits, bit for
# bit: prefill, decode and exact decode of 24 tokens (and kiln-cpu's: the whole files, any
# vocabulary; $2: the branch's cuda_check instead of cc).
IDS=$(python3 -c "print(','.join(str(1000+7*i) for i in range(24)))")
# Four of them, for the batch-invariance rows of `cuda_check --logits` (2-4 sequences together).
IDS4=${IDS%%,1028,*}
# A binary variant BIN[:VAR=v] ($1): the binary in $b, the environment in $e.
bin_env() { b=${1%%:*}; e=""; [ "$b" != "$1" ] && e=${1#*:}; }
same_logits() {
  rm -f /tmp/a.bin /tmp/b.bin  # a failed run must not compare the last files
  /tmp/cc_a --logits $1 "$IDS" /tmp/a.bin > /dev/null 2>&1; /tmp/${2:-cc} --logits $1 "$IDS" /tmp/b.bin > /dev/null 2>&1
  cmp /tmp/a.bin /tmp/b.bin
}
# The fixtures with cuda_check (the branch's: $2, default cc), $1 seconds at most (default
# 200): the summary and the first failures; the whole report in $OUT/checks.txt.
fixtures() {
  timeout ${1:-200} /tmp/${2:-cc} --fixtures tests/data/fixtures > $OUT/checks.txt 2>&1; echo "fixtures rc $?"
  grep -E 'FAILURES|PASSED' $OUT/checks.txt; grep -E 'FAIL|differ' $OUT/checks.txt | head -5
}
# One decode-at-depth row: model $1 (under /tmp) after $2 positions (`--batch 1 -p $2 -n 128`),
# environment $3 (VAR=v, comma-separated), bench arguments $4; $B picks the binary (kiln$B).
row() {
  echo "$1 p=$2 $3 ${4-} $(env ${3//,/ } /tmp/kiln${B-} bench /tmp/$1 --device cuda --batch 1 -p $2 -n 128 -r 1 ${4-} \
    2>&1 | stg_of)"
}
# ncu ARGS... on the isolated launches 641-... of kernel $k (graphs off) in a one-sequence decode
# after ${AD_P:-2048} positions of the 8B Q4_K_M model in /tmp/dp8 (the depth modes).
ncu_depth() {
  KILN_CUDA_GRAPHS=0 timeout 200 $NCU --clock-control none --kernel-name regex:"^$k\$" --launch-skip 640 "$@" \
    /tmp/kiln bench /tmp/dp8/model-q4_k_m.gguf --device cuda --batch 1 -p ${AD_P:-2048} -n 40 -r 1
}
# $NCU: Nsight Compute's command line, or the mode ends here without it.
need_ncu() {
  NCU=$(command -v ncu || ls /usr/local/cuda*/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
  [ -z "$NCU" ] && { echo "no ncu"; exit 0; }
}
# ncu's /tmp/ncu.csv summed by kernel and grid: launches, mean µs, share, DRAM read rate.
ncu_table() {
  python3 - <<'PY'
import csv, collections
hdr, agg = None, collections.defaultdict(lambda: [0, 0.0, 0.0])
for r in csv.reader(open('/tmp/ncu.csv')):
    if 'Kernel Name' in r: hdr = r; continue
    if not hdr or len(r) != len(hdr): continue
    d = dict(zip(hdr, r))
    try: v = float(d['Metric Value'].replace(',', ''))
    except ValueError: continue
    a = agg[(d['Kernel Name'].split('(')[0], d.get('Grid Size', ''))]
    if d['Metric Name'].startswith('gpu__time'): a[0] += 1; a[1] += v
    else: a[2] += v
tot = sum(a[1] for a in agg.values())
for (name, grid), (c, ns, b) in sorted(agg.items(), key=lambda x: -x[1][1])[:24]:
    print(f"{name:30s} {grid:14s} x{c:4d} {ns / 1e3 / max(c, 1):8.2f} us {100 * ns / max(tot, 1):5.1f}% {b / max(ns, 1):7.1f} GB/s")
print(f"total {tot / 1e3:.1f} us over {sum(a[0] for a in agg.values())} launches")
PY
}
date -u +%T
case $MODE in
verify)
  ( /tmp/kiln synth Llama-3.2-1B /tmp/pb1 --types $TYPES > /dev/null 2>&1 ) &
  # QUICK=1: the default settings only (changes away from the attention).
  VARIANTS=("" KILN_CUDA_ATT_CLUSTER=1 KILN_CUDA_ATT_SPLIT=16 ${VERIFY_MORE:-}); [ "${QUICK:-0}" = 1 ] && VARIANTS=("")
  for v in "${VARIANTS[@]}"; do
    f="$OUT/checks_${v:-default}.txt"; f=${f//=/_}
    env $v timeout 200 /tmp/cc --fixtures tests/data/fixtures > "$f" 2>&1; echo "[$v] rc $?"
    grep -E 'FAILURES|PASSED' "$f"; grep -E 'FAIL|differ' "$f" | head -5
  done
  grep -E '^\| Q5_K' "$OUT/checks_default.txt"
  wait; date -u +%T
  # Every change on the branch is meant to leave logits bit-identical.
  for t in hf ${TYPES//,/ }; do
    m=$(model_of /tmp/pb1 $t)
    same_logits $m && echo "$t: branch = main, bit for bit"
  done ;;
micro)
  M=""; for s in 8b 1b; do for k in mvq_q5_k mvq_q5_kr rd_rows; do M="$M $s/q5_k/$k/8/256"; done; done
  timeout 120 /tmp/cc --gemv-micro $M 2>&1 | tail -8 ;;
ab)
  AB=${AB_TYPES:-q4_0 hf}; G=$(gguf_types $AB)
  for S in Llama-3.2-1B Llama-3.1-8B; do
    D=/tmp/ab-$S; /tmp/kiln synth $S $D --types ${G:-q8_0} > /dev/null 2>&1; date -u +%T
    for r in 1 2; do for b in kiln_a kiln; do for t in $AB; do
      m=$(model_of $D $t)
      echo "$S $b $t $(/tmp/$b bench $m --device cuda -p 2048 -n 256 -r 3 2>&1 | pptg_of)"
    done; done; done
    rm -rf $D
  done ;;
boundary)
  # A step launches ~8 kernels a layer (+5): 133 for the 1B (ncu, sixth session). Price of one
  # boundary ~ (1/tok_s(BOUNDARY=1) - 1/tok_s(0)) / 133.
  /tmp/kiln synth Llama-3.2-1B /tmp/pb1 --types q4_0 > /dev/null 2>&1
  for r in 1 2; do for v in 0 1; do for m in model-q4_0.gguf hf; do
    echo "BOUNDARY=$v $m $(KILN_CUDA_BOUNDARY=$v /tmp/kiln bench /tmp/pb1/$m --device cuda -p 16 -n 256 -r 3 2>&1 | tg_of)"
  done; done; done ;;
fused)
  FT=${FUSED_TYPES:-q4_0 q4_k_m hf}; G=$(gguf_types $FT)
  for S in Llama-3.2-1B Llama-3.1-8B; do
    D=/tmp/fu-$S; /tmp/kiln synth $S $D --types ${G:-q8_0} > /dev/null 2>&1; date -u +%T
    for r in 1 2; do for v in 1 0; do for t in $FT; do
      m=$(model_of $D $t)
      echo "$S FUSE_NORM=$v $t $(KILN_CUDA_FUSE_NORM=$v /tmp/kiln bench $m --device cuda -p 16 -n 256 -r 3 2>&1 | tg_of)"
    done; done; done
    rm -rf $D
  done ;;
targets)
  # The #7 table with /tmp/kiln (kiln.xz): decode and prefill, `kiln bench -p 2048 -n 256 -r 3`,
  # 1B and 8B, $TARGET_TYPES (default hf q4_0 q4_k_m q8_0); BATCH=1 adds the README's batched
  # rows (8B bf16, 8 and 128 sequences of 128 + 128).
  TT=${TARGET_TYPES:-hf q4_0 q4_k_m q8_0}; G=$(gguf_types $TT)
  for S in Llama-3.2-1B Llama-3.1-8B; do
    D=/tmp/tg-$S; /tmp/kiln synth $S $D --types ${G:-q8_0} > /dev/null 2>&1; date -u +%T
    for t in $TT; do
      m=$(model_of $D $t)
      echo "$S $t $(/tmp/kiln bench $m --device cuda -p 2048 -n 256 -r 3 2>&1 | pptg_of)"
    done
    [ "${BATCH:-0}" = 1 ] && [ $S = Llama-3.1-8B ] && /tmp/kiln bench $D/hf --device cuda --batch 8,128 -p 128 -n 128 2>&1 | tail -4
    rm -rf $D
  done ;;
knobs)
  # Env-only settings of /tmp/kiln, tg256 p16, two rounds: the decode attention's slice count
  # (16 is the default for one sequence) and global merge, and the fused GEMVs' blocks an SM.
  /tmp/kiln synth Llama-3.2-1B /tmp/kn1 --types q4_0,q4_k_m > /dev/null 2>&1
  /tmp/kiln synth Llama-3.1-8B /tmp/kn8 --types q4_0 > /dev/null 2>&1; date -u +%T
  for r in 1 2; do
    for m in kn1/model-q4_0.gguf kn1/hf kn8/model-q4_0.gguf; do
      for v in X=1 KILN_CUDA_ATT_SPLIT=2 KILN_CUDA_ATT_SPLIT=4 KILN_CUDA_ATT_SPLIT=8 KILN_CUDA_ATT_CLUSTER=0; do
        echo "$m $v $(env $v /tmp/kiln bench /tmp/$m --device cuda -p 16 -n 256 -r 3 2>&1 | tg_of)"
      done
    done
    for v in X=1 KILN_CUDA_NORM_BLOCKS=1 KILN_CUDA_NORM_BLOCKS=2 KILN_CUDA_NORM_BLOCKS=3; do
      echo "kn1 q4_k_m $v $(env $v /tmp/kiln bench /tmp/kn1/model-q4_k_m.gguf --device cuda -p 16 -n 256 -r 3 2>&1 | tg_of)"
    done
  done ;;
plain)
  # NOTES.md item 73: the plain streaming kernel's form and block by row width (fuse_norm off;
  # the fused kernels are unchanged, so fused logits and speed must equal main's).
  fixtures
  for S in Llama-3.2-1B Llama-3.1-8B; do /tmp/kiln synth $S /tmp/pl-$S --types q4_0 > /dev/null 2>&1; done; date -u +%T
  for S in Llama-3.2-1B Llama-3.1-8B; do for v in 1 0; do
    KILN_CUDA_FUSE_NORM=$v same_logits /tmp/pl-$S/model-q4_0.gguf && echo "$S q4_0 fuse_norm=$v: branch = main, bit for bit"
  done; done
  for r in 1 2; do for S in Llama-3.1-8B Llama-3.2-1B; do for v in 0 1; do for b in kiln_a kiln; do
    echo "$S FUSE_NORM=$v $b $(KILN_CUDA_FUSE_NORM=$v /tmp/$b bench /tmp/pl-$S/model-q4_0.gguf --device cuda -p 16 -n 256 -r 2 2>&1 | tg_of)"
  done; done; done; done ;;
attprof)
  # Where tg2048's extra time goes (1B Q4_0 ~1,340 tok/s against ~1,800 at tg256): ncu kernel
  # durations (µs) of the 16 layers' decode attention, and of the QKV GEMV as a control, at
  # step 10 and step 1,000 of a tg1100 run (graphs off so ncu sees each launch).
  need_ncu
  /tmp/kiln synth Llama-3.2-1B /tmp/ap --types q4_0 > /dev/null 2>&1; date -u +%T
  for k in attention_f2 mvqsn4_q4_0r; do for step in 10 1000; do
    echo "$k step $step: $(KILN_CUDA_GRAPHS=0 $NCU --clock-control none --kernel-name regex:"^$k\$" \
      --launch-skip $((16 * step)) --launch-count 16 --metrics gpu__time_duration.sum --csv \
      /tmp/kiln bench /tmp/ap/model-q4_0.gguf --device cuda -p 16 -n 1100 -r 1 2>/dev/null \
      | grep "\"$k\"" | awk -F'","' '{print $NF}' | tr -d '"' | paste -sd' ')"
  done; done ;;
tgprof)
  # One-token decode kernel by kernel: ncu durations (isolated launches, graphs off) and DRAM
  # read rates of launches 2,000-2,800 (decode steps past the prefill) of $PROF_SHAPE (default
  # Llama-3.1-8B) $EV_TYPES (default q6_k), for each binary in $PROF_BINS (default kiln_a kiln).
  need_ncu
  S=${PROF_SHAPE:-Llama-3.1-8B}
  /tmp/kiln synth $S /tmp/tp --types $(gguf_types ${EV_TYPES:-q6_k}) > /dev/null 2>&1; date -u +%T
  for t in ${EV_TYPES:-q6_k}; do for b in ${PROF_BINS:-kiln_a kiln}; do
    echo "== $S $t $b"
    KILN_CUDA_GRAPHS=0 timeout 200 $NCU --clock-control none --launch-skip 2000 --launch-count 800 \
      --metrics gpu__time_duration.sum,dram__bytes_read.sum --csv \
      /tmp/$b bench $(model_of /tmp/tp $t) --device cuda -p 16 -n 100 -r 1 2>/dev/null > /tmp/ncu.csv
    ncu_table
  done; done ;;
stepprof)
  # A batched decode step kernel by kernel (NOTES.md item 75): ncu durations (isolated launches,
  # graphs off) and DRAM read rates of launches 3,000-3,800 (decode steps, past the prefill) of
  # 8B $EV_TYPES (default q4_0) at --batch $BATCHES (default 4 1), summed by kernel and grid.
  need_ncu
  T=$(gguf_types ${EV_TYPES:-q4_0})
  [ -d /tmp/v8 ] || /tmp/kiln synth Llama-3.1-8B /tmp/v8 --types "$T" > /dev/null 2>&1; date -u +%T
  for t in ${EV_TYPES:-q4_0}; do for B in ${BATCHES:-4 1}; do
    echo "== v8 $t batch $B"
    KILN_CUDA_GRAPHS=0 timeout 250 $NCU --clock-control none --launch-skip 3000 --launch-count 800 \
      --metrics gpu__time_duration.sum,dram__bytes_read.sum --csv \
      /tmp/kiln bench $(model_of /tmp/v8 $t) --device cuda --batch $B -p 128 -n 40 2>/dev/null > /tmp/ncu.csv
    ncu_table
  done; done ;;
l2win)
  # NOTES.md item 44 (branch l2-window): the decode attention (attention_fl* / cfl4) and act_mul
  # pull the next float GEMV's first 8 MiB into L2; every other kernel's SASS is main's. Branch (kiln.xz, cuda_check.xz) against main (kiln_a.xz,
  # cuda_check_a.xz): fixtures, logits bit-identical, tg256 p16 alternated twice, then the
  # #7 bench (-p 2048 -n 256 -r 3) for the bf16 rows.
  /tmp/kiln synth Llama-3.2-1B /tmp/w1 --types q4_0 > /dev/null 2>&1 &
  timeout 200 /tmp/cc --fixtures tests/data/fixtures > $OUT/checks.txt 2>&1
  echo "fixtures rc $?"; grep -E 'FAILURES|PASSED' $OUT/checks.txt; grep FAIL $OUT/checks.txt | head -3
  wait; /tmp/kiln synth Llama-3.1-8B /tmp/w8 --types q4_0,q8_0 > /dev/null 2>&1; date -u +%T
  for t in hf q4_0; do
    m=$(model_of /tmp/w1 $t)
    same_logits $m && echo "1B $t: branch = main, bit for bit"
  done
  for r in 1 2; do for m in w8/hf w1/hf w1/model-q4_0.gguf w8/model-q4_0.gguf w8/model-q8_0.gguf; do for b in kiln_a kiln; do
    echo "$m $b $(/tmp/$b bench /tmp/$m --device cuda -p 16 -n 256 -r 2 2>&1 | tg_of)"
  done; done; done
  for m in w8/hf w1/hf; do
    echo "$m #7: $(/tmp/kiln bench /tmp/$m --device cuda -p 2048 -n 256 -r 3 2>&1 | pptg_of)"
  done ;;
envab)
  # Env / binary variants ($EV: "binary:VAR=v+VAR=v[:--flag+...] ...", + between variables) on the 1B / 8B
  # shapes in $EV_TYPES (hf q4_0 ...), tg256 after a prompt of $EV_P (default 16), $EV_ROUNDS rounds
  # (default 2) alternated.
  # Models written once per machine (/tmp/v1, /tmp/v8).
  T=$(gguf_types ${EV_TYPES:-hf})
  [ -d /tmp/v1 ] || /tmp/kiln synth Llama-3.2-1B /tmp/v1 --types "$T" > /dev/null 2>&1
  [ -d /tmp/v8 ] || /tmp/kiln synth Llama-3.1-8B /tmp/v8 --types "$T" > /dev/null 2>&1; date -u +%T
  for r in $(seq ${EV_ROUNDS:-2}); do for t in ${EV_TYPES:-hf}; do for s in v8 v1; do
    m=$(model_of /tmp/$s $t)
    for v in $EV; do
      # binary:VARS[:ARGS], ARGS (bench flags) also joined by +.
      e=${v#*:}; a=""; case $e in *:*) a=${e#*:}; e=${e%%:*} ;; esac
      echo "$s $t $v $(env ${e//+/ } /tmp/${v%%:*} bench $m --device cuda -p ${EV_P:-16} -n 256 -r 2 ${a//+/ } 2>&1 | tg_of)"
    done
  done; done; done; date -u +%T ;;
batchab)
  # Env / binary variants ($EV as in envab) in batched decode: `--batch $BATCHES` (default
  # 2,4,8,16,32,64,128) -p 128 -n 128 on the 8B shape in $EV_TYPES (default q4_0), generated tok/s
  # (S_TG) per batch size, $EV_ROUNDS rounds (default 2) alternated (NOTES.md item 75).
  T=$(gguf_types ${EV_TYPES:-q4_0})
  [ -d /tmp/v8 ] || /tmp/kiln synth Llama-3.1-8B /tmp/v8 --types "$T" > /dev/null 2>&1; date -u +%T
  for r in $(seq ${EV_ROUNDS:-2}); do for t in ${EV_TYPES:-q4_0}; do
    m=$(model_of /tmp/v8 $t)
    for v in $EV; do
      e=${v#*:}; a=""; case $e in *:*) a=${e#*:}; e=${e%%:*} ;; esac
      echo "v8 $t $v $(env ${e//+/ } /tmp/${v%%:*} bench $m --device cuda --batch ${BATCHES:-2,4,8,16,32,64,128} -p 128 -n 128 ${a//+/ } 2>&1 \
        | stg_of)"
    done
  done; done; date -u +%T ;;
invab)
  # NOTES.md item 77: cuda_check --logits decodes the same ids as 2, 3 and 4 sequences together
  # and compares each row with the decode alone, in default and --batch-invariant runs; then
  # invariant S_TG at --batch $BATCHES (default 2,3,4,8) for each KILN_CUDA_MVQST in $MVQST
  # (default "0 4"), 8B $EV_TYPES (default q4_0).
  T=$(gguf_types ${EV_TYPES:-q4_0})
  [ -d /tmp/v8 ] || /tmp/kiln synth Llama-3.1-8B /tmp/v8 --types "$T" > /dev/null 2>&1; date -u +%T
  for t in ${EV_TYPES:-q4_0}; do
    m=$(model_of /tmp/v8 $t)
    echo "== v8 $t default"; /tmp/cc --logits $m "$IDS4" /tmp/inv.bin 2>/dev/null | tail -3
    echo "== v8 $t invariant"; KILN_CUDA_INVARIANT=1 /tmp/cc --logits $m "$IDS4" /tmp/inv.bin 2>/dev/null | tail -3
    for v in ${MVQST:-0 4}; do
      echo "v8 $t invariant MVQST=$v $(KILN_CUDA_INVARIANT=1 KILN_CUDA_MVQST=$v /tmp/kiln bench $m --device cuda \
        --batch ${BATCHES:-2,3,4,8} -p 128 -n 128 2>&1 | stg_of)"
    done
  done; date -u +%T ;;
l2sweep)
  # NOTES.md item 44: env-only settings of the L2 windows ($L2_VARIANTS; the attention's reach
  # KILN_CUDA_L2PF, act_mul's KILN_CUDA_L2PF_ACT), tg256 p16, 8B and 1B bf16, two rounds; then
  # the #7 bench (-p 2048 -n 256 -r 3) of both with the defaults.
  V=${L2_VARIANTS:-X=1 KILN_CUDA_L2PF=6M KILN_CUDA_L2PF=12M KILN_CUDA_L2PF_ACT=8M KILN_CUDA_L2PF_ACT=16M}
  /tmp/kiln synth Llama-3.2-1B /tmp/a1 --types "" > /dev/null 2>&1; /tmp/kiln synth Llama-3.1-8B /tmp/a8 --types "" > /dev/null 2>&1
  date -u +%T
  for r in 1 2; do for m in a8/hf a1/hf; do for v in $V; do
    echo "$m [$v] $(env $v /tmp/kiln bench /tmp/$m --device cuda -p 16 -n 256 -r 2 2>&1 | tg_of)"
  done; done; done
  for m in a8/hf a1/hf; do
    echo "$m #7: $(/tmp/kiln bench /tmp/$m --device cuda -p 2048 -n 256 -r 3 2>&1 | pptg_of)"
  done ;;
l2batch)
  # NOTES.md item 44: the L2 windows in batched decode (8B bf16, 8 and 128 sequences of 128 + 128,
  # the README's rows), defaults against KILN_CUDA_L2PF=0, twice.
  /tmp/kiln synth Llama-3.1-8B /tmp/a8 --types "" > /dev/null 2>&1; date -u +%T
  for r in 1 2; do for v in X=1 KILN_CUDA_L2PF=0; do
    echo "[$v]"; env $v /tmp/kiln bench /tmp/a8/hf --device cuda --batch 8,128 -p 128 -n 128 2>&1 | tail -3
  done; done ;;
longctx)
  # NOTES.md Next: do more slices pay at long contexts? kiln_s32 (branch att-split32: 32 slices
  # for one sequence, global merge) against itself at 16 and main (kiln.xz), tg2048 and tg256 p16,
  # 1B and 8B Q4_0, two rounds.
  xz -dc .device/kiln_s32.xz > /tmp/kiln_s32 && chmod +x /tmp/kiln_s32
  /tmp/kiln synth Llama-3.2-1B /tmp/lc1 --types q4_0 > /dev/null 2>&1
  /tmp/kiln synth Llama-3.1-8B /tmp/lc8 --types q4_0 > /dev/null 2>&1; date -u +%T
  for n in 2048 256; do for S in lc1 lc8; do for r in 1 2; do
    for v in "kiln" "kiln_s32" "kiln_s32 KILN_CUDA_ATT_SPLIT=16"; do
      set -- $v; b=$1; shift
      echo "$S tg$n $b $* $(env X=1 "$@" /tmp/$b bench /tmp/$S/model-q4_0.gguf --device cuda -p 16 -n $n -r 2 2>&1 | tg_of)"
    done
  done; done; done ;;
kvf16)
  # The f16 KV cache (-ctk f16 -ctv f16): fixtures (the f16 rows included), the default f32
  # cache's logits = main's bit for bit, then f32 against f16 at tg256 (p16) and at depth
  # (--batch 1: a -p prompt, then -n tokens), 1B and 8B, $KV_TYPES (default q4_0 hf).
  ( /tmp/kiln synth Llama-3.2-1B /tmp/kv1 --types q4_0 > /dev/null 2>&1 ) &
  timeout 240 /tmp/cc --fixtures tests/data/fixtures > $OUT/checks.txt 2>&1; echo "fixtures rc $?"
  grep -E 'FAILURES|PASSED' $OUT/checks.txt; grep -E 'FAIL|differ|f16 KV' $OUT/checks.txt | head -20
  wait; date -u +%T
  for t in hf q4_0; do same_logits $(model_of /tmp/kv1 $t) && echo "$t f32 KV: branch = main, bit for bit"; done
  /tmp/kiln synth Llama-3.1-8B /tmp/kv8 --types q4_0 > /dev/null 2>&1; date -u +%T
  for S in kv1 kv8; do for t in ${KV_TYPES:-q4_0 hf}; do m=$(model_of /tmp/$S $t)
    for kv in f32 f16; do
      echo "$S $t $kv tg256 $(/tmp/kiln bench $m --device cuda -ctk $kv -ctv $kv -p 16 -n 256 -r 3 2>&1 | tg_of)"
      echo "$S $t $kv depth ${DEPTH:-8192} $(/tmp/kiln bench $m --device cuda -ctk $kv -ctv $kv --batch 1 -p ${DEPTH:-8192} -n 256 2>&1 | grep -E '^\|' | tail -1)"
    done
  done; done ;;
cluctx)
  # NOTES.md item 60: where the cluster merge stops paying. Always (KILN_CUDA_ATT_CLUSTER=1)
  # against never (=0) after prompts of 256-1,024 (--batch 1, S_TG), 8B Q4_0 twice; then the
  # default (clusters below ATT_CLUSTER_CTX) at tg256 and depth 2,048 / 8,192, 8B Q4_0 and bf16.
  /tmp/kiln synth Llama-3.1-8B /tmp/c8 --types q4_0 > /dev/null 2>&1; date -u +%T
  m=/tmp/c8/model-q4_0.gguf
  for r in 1 2; do for d in 256 512 1024; do for v in KILN_CUDA_ATT_CLUSTER=1 KILN_CUDA_ATT_CLUSTER=0; do
    echo "8B q4_0 $v depth $d $(env $v /tmp/kiln bench $m --device cuda --batch 1 -p $d -n 256 2>&1 | grep -E '^\|' | tail -1 | awk -F'|' '{print $(NF-3)}')"
  done; done; done
  for t in q4_0 hf; do m=$(model_of /tmp/c8 $t)
    echo "8B $t default tg256 $(/tmp/kiln bench $m --device cuda -p 16 -n 256 -r 3 2>&1 | tg_of)"
    for d in 2048 8192; do
      echo "8B $t default depth $d $(/tmp/kiln bench $m --device cuda --batch 1 -p $d -n 256 2>&1 | grep -E '^\|' | tail -1 | awk -F'|' '{print $(NF-3)}')"
    done
  done ;;
gqadepth)
  # Where the grouped decode attention pays: $GD_BINS (default main, kiln_a, against the branch,
  # kiln), tg256 p16 and decode after $GD_DEPTHS-token prompts (--batch 1, S_TG), $GD_SIZES
  # (default q8 q1: 8B, 1B), $GD_TYPES (default q4_0), KV cache $GD_KV (default f32), $GD_ROUNDS
  # rounds (default 1). (The session's `gqa` mode, with a 32-slice variant, and `gqakv` are in
  # history at 9afc0d6.)
  KV="-ctk ${GD_KV:-f32} -ctv ${GD_KV:-f32}"; G=$(gguf_types ${GD_TYPES:-q4_0})
  for S in ${GD_SIZES:-q8 q1}; do
    /tmp/kiln synth $([ $S = q8 ] && echo Llama-3.1-8B || echo Llama-3.2-1B) /tmp/$S --types ${G:-q4_0} > /dev/null 2>&1
  done; date -u +%T
  for S in ${GD_SIZES:-q8 q1}; do for t in ${GD_TYPES:-q4_0}; do m=$(model_of /tmp/$S $t); for r in $(seq ${GD_ROUNDS:-1}); do for b in ${GD_BINS:-kiln_a kiln}; do
    echo "$S $t ${GD_KV:-f32} $b tg256 $(/tmp/$b bench $m --device cuda $KV -p 16 -n 256 -r 3 2>&1 | tg_of)"
    for d in ${GD_DEPTHS:-256 512 1024 2048 8192}; do
      echo "$S $t ${GD_KV:-f32} $b depth $d $(/tmp/$b bench $m --device cuda $KV --batch 1 -p $d -n 256 2>&1 | grep -E '^\|' | tail -1 | awk -F'|' '{print $(NF-3)}')"
    done
  done; done; done; done ;;
sync)
  # NOTES.md item 47: a grid-wide barrier inside one persistent kernel against a kernel boundary
  # under PDL (cuda_check --sync-micro), then the #7 table with kiln.xz (main + item 45).
  timeout 120 /tmp/cc --sync-micro 2>&1 | tail -12
  date -u +%T
  bash "$0" targets ;;
price)
  # NOTES.md item 48: every kernel family of a one-token step priced in place (KILN_CUDA_TWICE:
  # its launches run twice; outputs wrong, timing only), tg256 p16, 1B / 8B bf16 and Q4_0.
  /tmp/kiln synth Llama-3.2-1B /tmp/p1 --types q4_0 > /dev/null 2>&1
  /tmp/kiln synth Llama-3.1-8B /tmp/p8 --types q4_0 > /dev/null 2>&1; date -u +%T
  F=(none mvfn_bf16 mvfr_bf16 mvf_bf16 attention_fl2,attention_cfl4,attention_f2,attention_cf4 act_mul
     mvqsn4_q4_0r mvqsg4_q4_0r mvqsr4_q4_0r mvqsr8_q4_0r mvqs4_q4_0r,mvq_q6_kr,mvq_q8_0r,mvq_q6_k
     embed_bf16,embed_q4_0r,embed_q4_0,gather_norm argmax_rows)
  for m in p1/hf p8/hf p1/model-q4_0.gguf p8/model-q4_0.gguf; do for f in "${F[@]}" none; do
    case "$m:$f" in *hf:mvq*|*gguf:mv[f]*|*gguf:act_mul) continue ;; esac
    echo "$m twice=$f $(KILN_CUDA_TWICE=$f /tmp/kiln bench /tmp/$m --device cuda -p 16 -n 256 -r 2 2>&1 | tg_of)"
  done; done ;;
wide)
  # The wide decode attention (NOTES.md item 67; kiln_a / cc_a: main): fixtures (its rows
  # against the sliced kernels), 1B logits against main's (not bit for bit: another order of
  # sums), tg256 main / wide to 256 (default) / 512 / 128, timelines.
  /tmp/kiln synth Llama-3.2-1B /tmp/pb1 --types q4_0,q4_k_m,q8_0 > /dev/null 2>&1 &
  fixtures 300
  grep -E 'wide' $OUT/checks.txt | head -20
  wait; date -u +%T
  for t in hf q4_0; do
    m=$(model_of /tmp/pb1 $t)
    /tmp/cc_a --logits $m "$IDS" /tmp/a.bin 2>/dev/null; /tmp/cc --logits $m "$IDS" /tmp/b.bin 2>/dev/null
    echo "$t: $(python3 bench/cuda/logits_diff.py /tmp/a.bin /tmp/b.bin 128256)"
  done; date -u +%T
  VS=("kiln_a" "kiln" "kiln KILN_CUDA_ATT_WIDE_CTX=512" "kiln KILN_CUDA_ATT_WIDE_CTX=128")
  [ -n "${WIDE_VS:-}" ] && IFS=, read -ra VS <<< "$WIDE_VS"
  # tg256 of variant $1 ("binary VAR=v ...") on type $2.
  wide_tg() {
    local t=$2; set -- $1; local b=$1; shift
    echo "$b $* $t $(env "$@" /tmp/$b bench $(model_of /tmp/pb1 $t) --device cuda -p 16 -n 256 -r 3 2>&1 | tg_of)"
  }
  for r in 1 2; do for v in "${VS[@]}"; do for t in q4_0 hf; do wide_tg "$v" $t; done; done; done
  for v in "${VS[@]}"; do for t in q4_k_m q8_0; do wide_tg "$v" $t; done; done
  # Timelines (wide to 1,024, and off) at steps 40 and 200, Q4_0; bf16 at 40. $WIDE_VS and
  # $WIDE_TL: other variants / timelines, comma-separated ("kiln_a,kiln X=1"; "" for none).
  TLS=("1024 q4_0 40" "1024 q4_0 200" "0 q4_0 200" "1024 hf 40" "0 hf 40")
  [ -n "${WIDE_TL+x}" ] && IFS=, read -ra TLS <<< "$WIDE_TL"
  for c in "${TLS[@]}"; do
    set -- $c; f=$OUT/tl_w$1_$2_$3.tsv
    KILN_CUDA_ATT_WIDE_CTX=$1 KILN_CUDA_TIMELINE=$3 KILN_CUDA_TIMELINE_OUT=$f \
      /tmp/kiln bench $(model_of /tmp/pb1 $2) --device cuda -p 16 -n 256 -r 1 > /dev/null 2>&1
    echo "timeline wide<$1 $2 step $3"
    python3 bench/cuda/timeline.py $f --per-layer 5 --skip 1 --quiet 2>&1 | grep -E '^  [0-4]:|first arrival'
  done ;;
gsplit)
  # NOTES.md item 109: Gemma-3-1B's decode attention (head dim 256: the sliced kernel, slices
  # merged through global memory by the last block) with its slices forced
  # ($KILN_CUDA_ATT_SPLIT; default 16 at this grid), tg256 with -p 16 and -p 512 (both tg256
  # from an empty cache: kiln bench's tgN, as llama-bench's, does not follow the ppN, so the
  # two are a repeat, not a depth), q4_k_m and the bf16 folder, two rounds; then stamps of
  # step 40 at split $GS_TL.
  /tmp/kiln synth Gemma-3-1B /tmp/g1 --types q4_k_m > /dev/null 2>&1; date -u +%T
  for r in 1 2; do for m in model-q4_k_m.gguf hf; do for p in 16 512; do for sp in ${GS_SPLITS:-16 8 4 2 1}; do
    echo "$m p$p split=$sp $(KILN_CUDA_ATT_SPLIT=$sp /tmp/kiln bench /tmp/g1/$m --device cuda -p $p -n 256 -r 2 2>&1 | tg_of)"
  done; done; done; done
  for sp in ${GS_TL:-1}; do for m in model-q4_k_m.gguf hf; do
    KILN_CUDA_ATT_SPLIT=$sp KILN_CUDA_TIMELINE=40 KILN_CUDA_TIMELINE_OUT=$OUT/tl_g1_${m%%.*}_s$sp.tsv \
      /tmp/kiln bench /tmp/g1/$m --device cuda -p 16 -n 256 -r 1 2>&1 | tg_of | sed "s|^|$m split $sp stamped: |"
  done; done ;;
timeline)
  # Stamps of single decode steps (NOTES.md item 65; the cache needs the timeline cubin too:
  # KILN_CUDA_TIMELINE=1 cuda_check --precompile sm_90; bench/cuda/timeline.py lays them out):
  # $TL_MODELS at decode steps $TL_STEPS of `bench -p 16 -n $TL_N -r 1` (TL_N default 256; past
  # 256 for steps past the wide attention; counted from the first
  # replay, warm-up included: about s positions behind it) for each binary in $TL_BINS (default
  # kiln), files to $OUT (tl_BIN_MODEL_STEP.tsv); then the same models' tg256 with the plain
  # build beside it, for the stamps' overhead. $TL_SYNTH: the synth folders to make first
  # (SHAPE:DIR:TYPES, default Llama-3.2-1B:t1:q4_0).
  for sy in ${TL_SYNTH:-Llama-3.2-1B:t1:q4_0}; do
    IFS=: read -r S D T <<< "$sy"; /tmp/kiln synth $S /tmp/$D --types $T > /dev/null 2>&1
  done; date -u +%T
  for m in ${TL_MODELS:-t1/model-q4_0.gguf t1/hf}; do
    tag=$(echo $m | tr '/.' '__')
    for b in ${TL_BINS:-kiln}; do
      for st in ${TL_STEPS:-40 200}; do
        KILN_CUDA_TIMELINE=$st KILN_CUDA_TIMELINE_OUT=$OUT/tl_${b}_${tag}_$st.tsv \
          /tmp/$b bench /tmp/$m --device cuda -p 16 -n ${TL_N:-256} -r 1 2>&1 | tg_of | sed "s|^|$b $m step $st: tg |"
      done
      echo "$b $m plain $(/tmp/$b bench /tmp/$m --device cuda -p 16 -n 256 -r 2 2>&1 | tg_of)"
    done
  done ;;
depth)
  # Decode at depth (`--batch 1 -p P -n 128`: the prompt in the cache, then 128 steps; tg256
  # alone decodes from an empty cache) by prompt and K/V type; then Q8_0's small kernels
  # skipped (outputs wrong, timing only): add_norm, act_mul, both.
  /tmp/kiln synth Llama-3.1-8B /tmp/dp8 --types ${DP_TYPES8:-q4_k_m,q8_0} > /dev/null 2>&1
  /tmp/kiln synth Llama-3.2-1B /tmp/dp1 --types q4_k_m > /dev/null 2>&1; date -u +%T
  for m in ${DP_MODELS:-dp8/model-q4_k_m.gguf dp8/hf dp8/model-q8_0.gguf dp1/model-q4_k_m.gguf}; do
    for v in "16" "2048" "2048 -ctk f16 -ctv f16" "8192"; do set -- $v; p=$1; shift
      echo "$m p=$p $* $(/tmp/kiln bench /tmp/$m --device cuda --batch 1 -p $p -n 128 -r 1 "$@" 2>&1 | stg_of)"
    done
  done
  for sk in none add_norm act_mul add_norm,act_mul; do
    echo "q8_0 skip=$sk $(KILN_CUDA_SKIP=$sk /tmp/kiln bench /tmp/dp8/model-q8_0.gguf --device cuda -p 16 -n 256 -r 2 2>&1 | tg_of)"
  done; date -u +%T ;;
attdepth)
  # The decode attention at depth (`--batch 1 -p 2048 -n 128`): the knobs on main's kiln, then ncu
  # of the grouped kernel (graphs off, isolated launches) at ~2,070 positions: duration, DRAM,
  # warp states.
  [ -d /tmp/dp8 ] || /tmp/kiln synth Llama-3.1-8B /tmp/dp8 --types q4_k_m > /dev/null 2>&1
  [ -d /tmp/dp1 ] || /tmp/kiln synth Llama-3.2-1B /tmp/dp1 --types q4_k_m > /dev/null 2>&1; date -u +%T
  for m in dp8/model-q4_k_m.gguf dp1/model-q4_k_m.gguf; do
    for e in X=1 KILN_CUDA_ATT_SPLIT=8 KILN_CUDA_ATT_SPLIT=32 KILN_CUDA_ATT_GROUP=0 X=1; do
      echo "$m $e $(env $e /tmp/kiln bench /tmp/$m --device cuda --batch 1 -p ${AD_P:-2048} -n 128 -r 1 2>&1 | stg_of)"
    done
  done; date -u +%T
  need_ncu
  for k in ${AD_KERNELS:-attention_fg4}; do
    ncu_depth --launch-count 2 --section SpeedOfLight --section WarpStateStats --section Occupancy \
      --section LaunchStats --section MemoryWorkloadAnalysis 2>&1 | grep -vE '^ *-+ *$|^\s*$' | tail -120
  done; date -u +%T ;;
attstall)
  # The grouped decode attention's warp stalls at ~2,070 positions (ncu, isolated launches):
  # every smsp__warps_issue_stalled_*_per_warp_active.pct this ncu knows, plus instructions.
  need_ncu
  [ -d /tmp/dp8 ] || /tmp/kiln synth Llama-3.1-8B /tmp/dp8 --types q4_k_m > /dev/null 2>&1; date -u +%T
  M=$($NCU --query-metrics --chip gh100 2>/dev/null | awk '{print $1}' | grep -E '^smsp__warps_issue_stalled_[a-z_]+$' \
    | sed 's/$/_per_warp_active.pct/' | paste -sd,)
  echo "metrics: $(echo $M | tr ',' '\n' | wc -l)"
  for k in ${AD_KERNELS:-attention_fg4}; do
    ncu_depth --launch-count 4 --csv \
      --metrics gpu__time_duration.sum,smsp__inst_executed.sum,sm__cycles_active.avg,$M 2>/dev/null > /tmp/st.csv
    python3 - <<'PY'
import csv, collections
rows = [r for r in csv.reader(open('/tmp/st.csv')) if len(r) > 5]
hdr, agg = rows[0], collections.defaultdict(list)
for r in rows[1:]:
    d = dict(zip(hdr, r))
    try: agg[d['Metric Name']].append(float(d['Metric Value'].replace(',', '')))
    except ValueError: pass
for k, v in sorted(((k, v) for k, v in agg.items() if v), key=lambda kv: -sum(kv[1]) / len(kv[1])):
    m = sum(v) / len(v)
    if m > 0.05: print(f"{k:75s} {m:12.2f}")
PY
  done; date -u +%T ;;
attexp)
  # A decode-attention change (kiln / cc) against main (kiln_a / cc_a): fixtures, logits bit for
  # bit (every step grouped, then the default kernels), decode at depth (`--batch 1 -p 2048 -n
  # 128`) and tg256 from an empty cache, alternated, two rounds.
  /tmp/kiln synth Llama-3.1-8B /tmp/ae8 --types q4_k_m > /dev/null 2>&1
  /tmp/kiln synth Llama-3.2-1B /tmp/ae1 --types q4_k_m > /dev/null 2>&1; date -u +%T
  fixtures
  for m in ae8/model-q4_k_m.gguf ae8/hf ae1/model-q4_k_m.gguf ae1/hf; do
    KILN_CUDA_ATT_GROUP_CTX=0 KILN_CUDA_ATT_WIDE=0 same_logits /tmp/$m && echo "$m grouped: = main, bit for bit"
    same_logits /tmp/$m && echo "$m default: = main, bit for bit"
  done; date -u +%T
  for r in 1 2; do for m in ae8/model-q4_k_m.gguf ae8/hf ae1/model-q4_k_m.gguf ae1/hf; do for b in kiln_a kiln; do
    echo "$m $b depth $(/tmp/$b bench /tmp/$m --device cuda --batch 1 -p 2048 -n 128 -r 1 2>&1 | stg_of)" \
      "tg256 $(/tmp/$b bench /tmp/$m --device cuda -p 16 -n 256 -r 2 2>&1 | tg_of)"
  done; done; done; date -u +%T ;;
tcland)
  # The f16 cache's tensor-core walk as the default (branch att-tc-h; KILN_CUDA_ATT_TC=0 the
  # CUDA-core walk): fixtures (with the TensorCore layout rows), logits of TC against the
  # CUDA-core walk with every step grouped (exact block 2 the measure; f16 caches throughout,
  # sequences decoded together), then decode at depth beside main (B=_a), both caches.
  fixtures 260
  /tmp/kiln synth Qwen3-0.6B /tmp/tq --types q4_k_m > /dev/null 2>&1
  /tmp/kiln synth Llama-3.1-8B /tmp/dp8 --types q4_k_m > /dev/null 2>&1; date -u +%T
  export KILN_CUDA_ATT_GROUP_CTX=0 KILN_CUDA_ATT_WIDE=0
  for m in tq/hf tq/model-q4_k_m.gguf dp8/model-q4_k_m.gguf; do
    rm -f /tmp/a.bin /tmp/b.bin
    KILN_CHECK_KV=f16 KILN_CUDA_ATT_TC=0 timeout 120 /tmp/cc --logits /tmp/$m "$IDS" /tmp/a.bin 2>&1 | grep together | sed 's/^/  CUDA-core: /'
    KILN_CHECK_KV=f16 timeout 120 /tmp/cc --logits /tmp/$m "$IDS" /tmp/b.bin 2>&1 | grep together | sed 's/^/  tensor-core: /'
    V=$(( $(stat -c %s /tmp/a.bin) / 4 / 96 ))
    echo "$m f16: CUDA-core walk -> tensor-core walk"; python3 bench/cuda/logits_diff.py /tmp/a.bin /tmp/b.bin $V 4
  done
  unset KILN_CUDA_ATT_GROUP_CTX KILN_CUDA_ATT_WIDE; date -u +%T
  for m in dp8/model-q4_k_m.gguf dp8/hf; do for P in 2048 8192; do
    # Branch and main alternated, twice for 8B Q4_K_M ("-": the branch's kiln).
    for kv in f16 f32; do for b in ${AB-_a - _a -}; do [ $b = - ] && b=
      B=$b row $m $P X=$b "-ctk $kv -ctv $kv"
    done; done
  done; AB="_a -"; done
  for P in 16 2048; do for kv in f16 f32; do for b in _a ""; do
    B=$b row tq/model-q4_k_m.gguf $P X=$b "-ctk $kv -ctv $kv"
  done; done; done; date -u +%T ;;
g2tc)
  # Groups of 2 (Qwen3-0.6B: 16 / 8 heads, head dim 128) take the one-head blocks by default;
  # forced grouped from 512 positions (KILN_CUDA_ATT_GROUP_CTX=512), with the tensor-core walk
  # (f16) or the CUDA-core walk (f32, or f16 with KILN_CUDA_ATT_TC=0), at 2,048 and 8,192.
  /tmp/kiln synth Qwen3-0.6B /tmp/tq --types q4_k_m > /dev/null 2>&1; date -u +%T
  for m in tq/model-q4_k_m.gguf tq/hf; do for P in 2048 8192; do
    for e in X=1 KILN_CUDA_ATT_GROUP_CTX=512 KILN_CUDA_ATT_GROUP_CTX=512,KILN_CUDA_ATT_TC=0; do
      row $m $P $e "-ctk f16 -ctv f16"
    done
    for e in X=1 KILN_CUDA_ATT_GROUP_CTX=512; do row $m $P $e; done
  done; done; date -u +%T ;;
g2ctx)
  # Groups of 2 below 2,048: the one-head blocks (default) against grouped from the step's
  # first position (KILN_CUDA_ATT_GROUP_CTX=$P), Qwen3-0.6B at P = 256, 512, 1,024.
  /tmp/kiln synth Qwen3-0.6B /tmp/tq --types q4_k_m > /dev/null 2>&1; date -u +%T
  for m in tq/model-q4_k_m.gguf tq/hf; do for P in 256 512 1024; do
    for e in X=1 KILN_CUDA_ATT_GROUP_CTX=$P X=1 KILN_CUDA_ATT_GROUP_CTX=$P; do row $m $P $e; done
    for e in X=1 KILN_CUDA_ATT_GROUP_CTX=$P; do row $m $P $e "-ctk f16 -ctv f16"; done
  done; done; date -u +%T ;;
tcctx)
  # The tensor-core walk against the CUDA-core walk below 2,048 positions, f16 cache: 8B (group 4,
  # grouped by default) and Qwen3-0.6B (group 2, forced grouped from P) at P = 256, 512, 1,024.
  /tmp/kiln synth Qwen3-0.6B /tmp/tq --types q4_k_m > /dev/null 2>&1
  /tmp/kiln synth Llama-3.1-8B /tmp/dp8 --types q4_k_m > /dev/null 2>&1; date -u +%T
  for m in dp8/model-q4_k_m.gguf dp8/hf tq/model-q4_k_m.gguf tq/hf; do for P in 256 512 1024; do
    G=X=1; case $m in tq/*) G=KILN_CUDA_ATT_GROUP_CTX=$P ;; esac
    for v in 1 0; do row $m $P $G,KILN_CUDA_ATT_TC=$v "-ctk f16 -ctv f16"; done
  done; done; date -u +%T ;;
pfctx)
  # Branch att-pf (kiln.xz) against main (_a): the CUDA-core grouped walk's L2 prefetch ATT_PF
  # positions ahead, and the tensor-core walk only from ATT_TC_CTX (2,048; AttReach::Far).
  # Fixtures; logits with every step grouped bit for bit with main (f32 cache; f16 against main's
  # CUDA-core walk, KILN_CUDA_ATT_TC=0 there); then decode at depth alternated, both caches.
  fixtures 260
  /tmp/kiln synth Llama-3.1-8B /tmp/dp8 --types q4_k_m > /dev/null 2>&1
  /tmp/kiln synth Llama-3.2-1B /tmp/dp1 --types q4_k_m > /dev/null 2>&1
  /tmp/kiln synth Qwen3-0.6B /tmp/tq --types q4_k_m > /dev/null 2>&1; date -u +%T
  export KILN_CUDA_ATT_GROUP_CTX=0 KILN_CUDA_ATT_WIDE=0
  for m in tq/hf dp1/model-q4_k_m.gguf dp8/model-q4_k_m.gguf; do for kv in f32 f16; do
    rm -f /tmp/a.bin /tmp/b.bin
    KILN_CHECK_KV=$kv KILN_CUDA_ATT_TC=0 timeout 120 /tmp/cc_a --logits /tmp/$m "$IDS" /tmp/a.bin > /dev/null 2>&1
    KILN_CHECK_KV=$kv timeout 120 /tmp/cc --logits /tmp/$m "$IDS" /tmp/b.bin 2>&1 | grep together | sed "s|^|  $m $kv: |"
    cmp -s /tmp/a.bin /tmp/b.bin && echo "$m $kv: = main, bit for bit" || { echo "$m $kv: differs"; \
      python3 bench/cuda/logits_diff.py /tmp/a.bin /tmp/b.bin $(( $(stat -c %s /tmp/a.bin) / 4 / 96 )) 4; }
  done; done
  unset KILN_CUDA_ATT_GROUP_CTX KILN_CUDA_ATT_WIDE; date -u +%T
  ab() { for b in _a -; do [ $b = - ] && b=; B=$b row $1 $2 X=$b "${3-}"; done; }
  for P in 512 1024 2048 8192; do for kv in f32 f16; do ab dp8/model-q4_k_m.gguf $P "-ctk $kv -ctv $kv"; done; done
  for P in 2048 8192; do ab dp8/hf $P; ab dp1/model-q4_k_m.gguf $P; done
  for P in 1024 2048; do ab tq/model-q4_k_m.gguf $P "-ctk f16 -ctv f16"; done
  for P in 2048 8192; do ab dp8/model-q4_k_m.gguf $P; done; date -u +%T ;;
tcsplit)
  # The tensor-core walk's slices (f16 cache): at 2,048 positions 16 slices leave a block's
  # warps 8-15 idle (128 positions, tiles of 16); 8 slices fill them, 32 halve each warp's
  # tiles at 8,192. 8B Q4_K_M and bf16, KILN_CUDA_ATT_SPLIT 8 / 16 / 32, alternated twice.
  # $TS_ROUNDS (default 2) rounds over $TS_MODELS (default both).
  /tmp/kiln synth Llama-3.1-8B /tmp/dp8 --types q4_k_m > /dev/null 2>&1; date -u +%T
  for r in $(seq ${TS_ROUNDS:-2}); do for m in ${TS_MODELS:-dp8/model-q4_k_m.gguf dp8/hf}; do for P in 2048 8192; do
    for sp in 8 16 32; do row $m $P KILN_CUDA_ATT_SPLIT=$sp "-ctk f16 -ctv f16"; done
  done; done; done; date -u +%T ;;
skip)
  # Each family's launches skipped (outputs wrong, timing only): the ceiling of any fusion
  # that removes that family's kernels while the GEMVs stay as they are.
  AN=add_norm,add_norm_cl; AM=act_mul; QZ=quantize_q8
  AT=attention_d2,attention_d4,attention_d8,attention_cd4
  AT=$AT,attention_f2,attention_f4,attention_f8,attention_cf4
  for S in Llama-3.2-1B Llama-3.1-8B; do
    D=/tmp/sk-$S; /tmp/kiln synth $S $D --types q4_0 > /dev/null 2>&1; date -u +%T
    for m in model-q4_0.gguf hf; do for sk in none $AN $AM $QZ $AT $AN,$AM,$QZ,$AT none; do
      echo "$S $m skip=${sk:0:20} $(KILN_CUDA_SKIP=$sk /tmp/kiln bench $D/$m --device cuda -p 16 -n 256 -r 3 2>&1 | tg_of)"
    done; done
    rm -rf $D
  done ;;
phases)
  # NOTES.md "Next" (the 4-bit step's fixed costs on the H200): the most that removing the O
  # and the down phases could give (KILN_CUDA_SKIP of their residual kernels: outputs wrong,
  # timing only), 8B / 1B Q4_0 and Q4_K_M, tg256 p16; then the grid barrier against a kernel
  # boundary on this GPU (cuda_check --sync-micro, item 47's H100 table beside it).
  /tmp/kiln synth Llama-3.2-1B /tmp/ph1 --types q4_0,q4_k_m > /dev/null 2>&1
  /tmp/kiln synth Llama-3.1-8B /tmp/ph8 --types q4_0,q4_k_m > /dev/null 2>&1; date -u +%T
  # Q4_0: O is mvqsr4, down mvqsr8; Q4_K_M's O and down share mvqsr2_q4_kr / mvqsr4_q6_kr.
  ALL=mvqsr8_q4_0r,mvqsr4_q4_0r,mvqsr2_q4_kr,mvqsr4_q6_kr
  for r in 1 2; do for m in ph8/model-q4_0.gguf ph8/model-q4_k_m.gguf ph1/model-q4_0.gguf ph1/model-q4_k_m.gguf; do
    for sk in none mvqsr4_q4_0r mvqsr8_q4_0r $ALL; do
      echo "$m skip=${sk:0:28} $(KILN_CUDA_SKIP=$sk /tmp/kiln bench /tmp/$m --device cuda -p 16 -n 256 -r 3 2>&1 | tg_of)"
    done
  done; done
  timeout 120 /tmp/cc --sync-micro 2>&1 | tail -12 ;;
peers)
  # The issue's device benchmark: bench/cuda/peers.sh with kiln.xz and transformers
  # (hf_peer.py) on the same synth folders, $PEER_SHAPES (default Llama-3.2-1B), $PEER_TYPES
  # (default q8_0,q4_0,q4_k_m); each shape's table also in $OUT.
  for S in ${PEER_SHAPES:-Llama-3.2-1B}; do
    bash bench/cuda/peers.sh /tmp/kiln bench/cuda/hf_peer.py $S ${PEER_TYPES:-q8_0,q4_0,q4_k_m} /tmp/pe-$S 2>/dev/null | tee $OUT/peers-$S.md
    rm -rf /tmp/pe-$S; date -u +%T
  done ;;
swgather)
  # NOTES.md item 112: prefill's GEMM / flash attention under a sliding window gathers K/V from
  # the chunk's first query's window on (main 5bd74d1; before it the gather read released
  # blocks, NO_BLOCK, and Gemma 3 prompts past ~768 tokens at -b 256 failed with
  # CUBLAS_STATUS_EXECUTION_FAILED). kiln / cc: main at or after 5bd74d1; kiln_a (optional):
  # a build before it. Fixtures (the new "200 tokens in chunks of 64" row), then `kiln run`
  # on Gemma-3-1B after 1,500 prompt ids in chunks of 256 against one chunk of 2,048 (greedy
  # ids of the two), bf16 and q4_k_m.
  fixtures 240 cc
  grep -E 'chunks of 64' $OUT/checks.txt
  /tmp/kiln synth Gemma-3-1B /tmp/sw --types q4_k_m > /dev/null 2>&1; date -u +%T
  SWIDS=$(python3 -c "print(','.join(str(1000+7*i) for i in range(1500)))")
  for m in /tmp/sw/hf /tmp/sw/model-q4_k_m.gguf; do for b in $(ls /tmp/kiln /tmp/kiln_a 2>/dev/null); do for c in 256 2048; do
    timeout 120 $b run $m --device cuda --prompt-ids $SWIDS -b $c -n 32 --temp 0 --ignore-eos --json > /tmp/sw_$c.json 2>/tmp/sw_err.txt
    rc=$?  # before any command substitution, which would reset it
    echo "$(basename $m) $(basename $b) -b $c: rc $rc $(grep -i error /tmp/sw_err.txt | head -1 | cut -c1-120)"
  done
  python3 -c "
import json
a, b = (json.load(open(f'/tmp/sw_{c}.json'))['generated_ids'] for c in (256, 2048))
print('  greedy ids, chunks of 256 vs one chunk:', sum(x == y for x, y in zip(a, b)), 'of', len(b), 'equal')" 2>&1 | tail -1
  done; done; date -u +%T ;;
att8)
  # NOTES.md item 113: the split decode attention at head dim 256 (Gemma 3 past 256 positions)
  # with 8 warps a block (kiln_w / cc_w, branch att8w), 4 rows in flight a warp (kiln_p,
  # att8p), both (kiln / cc, att8wp), against main (kiln_a / cc_a). Fixtures (the wide rows
  # at head dim 256 compare against the sliced kernel), the logits of 300 ids (positions
  # 256-299 take the changed kernel; the warps' sums run in another order with 8 warps) against
  # main's and the CPU's, then S_TG at depths 16-4,096, two rounds alternated ($A8: the
  # binaries, each BIN[:VAR=v], default "kiln_a kiln_w kiln_p kiln"; $A8_DEPTHS the prompts;
  # A8_LOGITS=0 skips the logits).
  fixtures 240 cc
  grep -E 'head dim 256|deep' $OUT/checks.txt
  /tmp/kiln synth Gemma-3-1B /tmp/gc --types q4_k_m > /dev/null 2>&1; date -u +%T
  GIDS=$(python3 -c "print(','.join(str(1000+7*i) for i in range(300)))")
  [ "${A8_LOGITS:-1}" = 1 ] && for m in /tmp/gc/model-q4_k_m.gguf /tmp/gc/hf; do
    /tmp/cc_a --logits $m "$GIDS" /tmp/a.bin > /dev/null 2>&1; /tmp/cc --logits $m "$GIDS" /tmp/b.bin > /dev/null 2>&1
    python3 - $m <<'PY'
import sys, numpy as np
a = np.fromfile('/tmp/a.bin', np.float32).reshape(4, 300, -1); b = np.fromfile('/tmp/b.bin', np.float32).reshape(4, 300, -1)
mx = np.abs(a[3]).max()
for k, name in ((1, 'decode 8-bit'), (2, 'decode exact')):
    d = np.abs(a[k] - b[k]).max(); top = (a[k].argmax(-1) == b[k].argmax(-1)).sum()
    print(f"{sys.argv[1].split('/')[-1]} {name}: branch-main {d:.2e} ({d / mx:.1e} of max), argmax {top}/300; vs CPU main {np.abs(a[k] - a[3]).max():.2e} branch {np.abs(b[k] - b[3]).max():.2e}")
print(f"  prefill branch = main: {np.array_equal(a[0], b[0])}")
PY
  done; rm -f /tmp/a.bin /tmp/b.bin; date -u +%T
  for r in 1 2; do for m in /tmp/gc/model-q4_k_m.gguf /tmp/gc/hf; do
    for v in ${A8:-kiln_a kiln_w kiln_p kiln}; do
      bin_env $v
      echo "$(basename $m) $v $(env $e /tmp/$b bench $m --device cuda --batch 1 -p ${A8_DEPTHS:-16,256,1024,4096} -n 128 -r 2 2>&1 \
        | grep -E '^\|' | tail -n +3 | awk -F'|' '{printf "p%d:%s ", $2, $9}')"
    done
  done; done; date -u +%T ;;
gbatch)
  # NOTES.md item 113: Gemma-3-1B's batched decode at depth across the head-dim-256 attention
  # changes (blocks of 8 / 16 warps hold an SM alone, so a batch's slices may take more waves):
  # S_TG by prompt ($GB_P, default 256,2048) and batch ($GB_B, default 1,2,4,8,16), binaries
  # $GB_BINS (default kiln_c kiln_a kiln: 4 warps, 8 warps, main; each BIN[:VAR=v]), q4_k_m and
  # bf16, one round.
  /tmp/kiln synth Gemma-3-1B /tmp/gc --types q4_k_m > /dev/null 2>&1; date -u +%T
  for m in /tmp/gc/model-q4_k_m.gguf /tmp/gc/hf; do for v in ${GB_BINS:-kiln_c kiln_a kiln}; do
    bin_env $v
    echo "$(basename $m) $v $(env $e /tmp/$b bench $m --device cuda --batch ${GB_B:-1,2,4,8,16} -p ${GB_P:-256,2048} -n 64 -r 1 2>&1 \
      | grep -E '^\|' | tail -n +3 | awk -F'|' '{printf "p%d/b%d:%d ", $2, $4, $9}')"
  done; done; date -u +%T ;;
tail)
  # NOTES.md item 114: the fused-norm GEMVs' last round split over a block's warps (branch
  # tail-split, kiln / cc; the quantized halves of branch tail-split-q, not kept) against main
  # (kiln_a / cc_a): fixtures (their new rows: 6,144- and 5,120-row float QKV products;
  # tail-split-q's: the quantized ones at 4,096 columns), the 8B bf16 logits
  # against main's (largest difference over the largest |logit|: logits_diff.py's blocks
  # prefill, decode, decode without graphs, kiln-cpu), the quantized $TS_TYPES' bit for bit,
  # tg256 p16 alternated over $TS_ROUNDS (default 2) rounds (8B: hf and $TS_TYPES; 1B: $TS_1B),
  # then the branch's stamps at step 40 (8B $TS_TL, default q4_k_m).
  TT=${TS_TYPES:-q4_k_m q8_0}
  fixtures 240
  /tmp/kiln synth Llama-3.1-8B /tmp/ts8 --types $(gguf_types $TT) > /dev/null 2>&1
  /tmp/kiln synth Llama-3.2-1B /tmp/ts1 --types $(gguf_types ${TS_1B:-q4_k_m}) > /dev/null 2>&1; date -u +%T
  /tmp/cc_a --logits /tmp/ts8/hf "$IDS" /tmp/a.bin > /dev/null 2>&1; /tmp/cc --logits /tmp/ts8/hf "$IDS" /tmp/b.bin > /dev/null 2>&1
  echo "8B bf16 branch vs main:"; python3 bench/cuda/logits_diff.py /tmp/a.bin /tmp/b.bin 128256 4
  for t in $TT; do same_logits /tmp/ts8/model-$t.gguf && echo "8B $t: branch = main, bit for bit"; done; date -u +%T
  # Whether float weights keep batch invariance (the fused norm's deferred scale at one token):
  for b in cc_a cc; do echo "== 1B bf16 invariant, $b"; KILN_CUDA_INVARIANT=1 /tmp/$b --logits /tmp/ts1/hf "$IDS4" /tmp/inv.bin 2>/dev/null | tail -3; done
  for r in $(seq ${TS_ROUNDS:-2}); do
    for m in ts8/hf $(for t in $TT; do echo ts8/model-$t.gguf; done) $(for t in ${TS_1B:-q4_k_m}; do echo ts1/model-$t.gguf; done); do
      for b in kiln_a kiln; do echo "$m $b $(/tmp/$b bench /tmp/$m --device cuda -p 16 -n 256 -r 3 2>&1 | tg_of)"; done
    done
  done; date -u +%T
  KILN_CUDA_TIMELINE=40 KILN_CUDA_TIMELINE_OUT=$OUT/tl_kiln_t8_${TS_TL:-q4_k_m}_40.tsv \
    /tmp/kiln bench /tmp/ts8/model-${TS_TL:-q4_k_m}.gguf --device cuda -p 16 -n 256 -r 1 2>&1 | tg_of | sed "s|^|stamped: |" ;;
invf)
  # NOTES.md item 114: batch invariance where the fused norm rounds apart from add_norm (float
  # weights, post-norm layers), main (cc_a) against the branch (cc): 2-4 sequences decoded
  # together against alone, bit for bit, on 1B bf16 and Gemma-3-1B bf16 / Q4_K_M; the branch's
  # fixtures in invariant mode; invariant tg256 of both builds (its price).
  /tmp/kiln synth Llama-3.2-1B /tmp/iv1 --types "" > /dev/null 2>&1
  /tmp/kiln synth Gemma-3-1B /tmp/ivg --types q4_k_m > /dev/null 2>&1; date -u +%T
  for m in iv1/hf ivg/hf ivg/model-q4_k_m.gguf; do for b in cc_a cc; do
    echo "== $m $b"; KILN_CUDA_INVARIANT=1 /tmp/$b --logits /tmp/$m "$IDS4" /tmp/inv.bin 2>/dev/null | tail -3
  done; done; date -u +%T
  KILN_CUDA_INVARIANT=1 fixtures 300
  for m in iv1/hf ivg/hf ivg/model-q4_k_m.gguf; do for b in kiln_a kiln; do
    echo "$m invariant $b $(KILN_CUDA_INVARIANT=1 /tmp/$b bench /tmp/$m --device cuda -p 16 -n 256 -r 2 2>&1 | tg_of)"
  done; done; date -u +%T ;;
l2hint)
  # The GEMVs' weight streams with an L2 prefetch size (ld.global.nc ... .L2::256B on branch
  # l2hint: kiln / cc; .L2::128B on l2hint128: kiln_b / cc_b) against main (_a): logits bit for
  # bit, then the #7 tg256 rows alternated.
  for S in Llama-3.1-8B Llama-3.2-1B; do /tmp/kiln synth $S /tmp/tg-$S --types q8_0,q4_0,q4_k_m > /dev/null 2>&1; done
  date -u +%T
  for m in Llama-3.2-1B:hf Llama-3.2-1B:q4_k_m Llama-3.1-8B:q4_0 Llama-3.1-8B:q8_0; do
    S=${m%%:*}; t=${m#*:}
    for c in cc cc_b; do same_logits $(model_of /tmp/tg-$S $t) $c > /dev/null && echo "$m $c = main, bit for bit" || echo "$m $c DIFFERS"; done
  done; date -u +%T
  TG_SHAPES="Llama-3.1-8B Llama-3.2-1B" TG_TYPES="hf q8_0 q4_0 q4_k_m" TG_BINS="kiln_a kiln kiln_b" \
    bash $0 tgab ;;
q14d)
  # Qwen3-14B (40 / 8 heads: one 8-head tensor-core block a group since 30f951e) at depth beside
  # the 8B (groups of 4), f16 cache: rows from 16 to 8,192 positions, the f32 cache and slice
  # counts at 8,192; then ncu of a decode step at 8,192 (graphs off, isolated launches) of each,
  # summed by kernel: where the 14B's extra time at depth goes.
  [ -d /tmp/q14 ] || /tmp/kiln synth Qwen3-14B /tmp/q14 --types q4_k_m > /dev/null 2>&1
  [ -d /tmp/dp8 ] || /tmp/kiln synth Llama-3.1-8B /tmp/dp8 --types q4_k_m > /dev/null 2>&1; date -u +%T
  for P in 16 2048 8192; do for m in q14 dp8; do
    row $m/model-q4_k_m.gguf $P X=1 "-ctk f16 -ctv f16"
  done; done
  row q14/model-q4_k_m.gguf 8192 X=1
  for s in 8 32; do row q14/model-q4_k_m.gguf 8192 KILN_CUDA_ATT_SPLIT=$s "-ctk f16 -ctv f16"; done; date -u +%T
  need_ncu
  for m in q14 dp8; do
    echo "== $m Q4_K_M f16 cache, a decode step after 8,192 positions"
    KILN_CUDA_GRAPHS=0 timeout 200 $NCU --clock-control none --launch-skip 3000 --launch-count ${Q14_LAUNCHES:-600} \
      --metrics gpu__time_duration.sum,dram__bytes_read.sum --csv \
      /tmp/kiln bench /tmp/$m/model-q4_k_m.gguf --device cuda --batch 1 -p 8192 -n 40 -r 1 -ctk f16 -ctv f16 2>/dev/null > /tmp/ncu.csv
    ncu_table
  done; date -u +%T ;;
tc8)
  # Branch tc-g8b (kiln / cc): the tensor-core walk's blocks of 8 heads, one a group of 5-8,
  # against main (_a: two blocks of 4 a group, each walking the group's K / V). Fixtures (the
  # TensorCore rows at 28 / 4 and 40 / 8 heads take the 8-head blocks); 8B (groups of 4) bit for
  # bit with main; Qwen3-14B logits, every step grouped, TC from position 0, branch and main
  # each against the CUDA-core walk; then depth rows alternated, f16 cache.
  fixtures 260; grep -E "tensor-core walk" $OUT/checks.txt
  /tmp/kiln synth Llama-3.1-8B /tmp/dp8 --types q4_k_m > /dev/null 2>&1
  /tmp/kiln synth Qwen3-14B /tmp/q14 --types q4_k_m > /dev/null 2>&1; date -u +%T
  KILN_CHECK_KV=f16 same_logits /tmp/dp8/model-q4_k_m.gguf > /dev/null && echo "8B f16 = main, bit for bit" || echo "8B f16 DIFFERS"
  export KILN_CUDA_ATT_GROUP_CTX=0 KILN_CUDA_ATT_WIDE=0 KILN_CHECK_KV=f16
  rm -f /tmp/a.bin /tmp/b.bin /tmp/c.bin
  KILN_CUDA_ATT_TC=0 timeout 150 /tmp/cc --logits /tmp/q14/model-q4_k_m.gguf "$IDS" /tmp/a.bin > /dev/null 2>&1
  KILN_CUDA_ATT_TC_CTX=0 timeout 150 /tmp/cc --logits /tmp/q14/model-q4_k_m.gguf "$IDS" /tmp/b.bin > /dev/null 2>&1
  KILN_CUDA_ATT_TC_CTX=0 timeout 150 /tmp/cc_a --logits /tmp/q14/model-q4_k_m.gguf "$IDS" /tmp/c.bin > /dev/null 2>&1
  V=$(( $(stat -c %s /tmp/a.bin) / 4 / 96 ))
  echo "Qwen3-14B f16, 8-head TC blocks against the CUDA-core walk:"; python3 bench/cuda/logits_diff.py /tmp/a.bin /tmp/b.bin $V 4
  echo "Qwen3-14B f16, main's 4-head TC blocks against the CUDA-core walk:"; python3 bench/cuda/logits_diff.py /tmp/a.bin /tmp/c.bin $V 4
  unset KILN_CUDA_ATT_GROUP_CTX KILN_CUDA_ATT_WIDE KILN_CHECK_KV; date -u +%T
  for r in 1 2; do for P in 2048 8192; do for b in _a ""; do
    B=$b row q14/model-q4_k_m.gguf $P X=$b "-ctk f16 -ctv f16"
  done; done; done
  for b in _a ""; do B=$b row dp8/model-q4_k_m.gguf 8192 X=$b "-ctk f16 -ctv f16"; done; date -u +%T ;;
nonc)
  # Branch ldg-nonc (kiln / cc): the GEMVs' weight streams without .nc (LDG.E.NA.128, the LSU
  # path, not the read-only one) against main (_a): logits bit for bit, the #7 tg256 rows.
  for S in Llama-3.1-8B Llama-3.2-1B; do /tmp/kiln synth $S /tmp/tg-$S --types q8_0,q4_0,q4_k_m > /dev/null 2>&1; done
  for m in Llama-3.2-1B:hf Llama-3.1-8B:q4_k_m; do
    S=${m%%:*}; t=${m#*:}
    same_logits $(model_of /tmp/tg-$S $t) > /dev/null && echo "$m = main, bit for bit" || echo "$m DIFFERS"
  done; date -u +%T
  TG_SHAPES="Llama-3.1-8B Llama-3.2-1B" TG_TYPES="hf q8_0 q4_0 q4_k_m" bash $0 tgab ;;
tcg8)
  # Branch tc-g8 (kiln / cc): the f16 cache's tensor-core walk for groups past four query heads
  # a KV head (every block of a group stores the own row its tiles read back). Fixtures (new
  # TensorCore rows: 28 / 4 and 40 / 8 heads); 8B (groups of 4) bit for bit with main (_a);
  # Qwen3-14B (40 / 8) logits, every step grouped, TC from position 0 against the CUDA-core
  # walk; then its depth rows, TC against KILN_CUDA_ATT_TC=0, and the f32 cache.
  fixtures 260; grep -E "tensor-core walk" $OUT/checks.txt
  /tmp/kiln synth Llama-3.1-8B /tmp/dp8 --types q4_k_m > /dev/null 2>&1
  /tmp/kiln synth Qwen3-14B /tmp/q14 --types q4_k_m > /dev/null 2>&1; date -u +%T
  KILN_CHECK_KV=f16 same_logits /tmp/dp8/model-q4_k_m.gguf > /dev/null && echo "8B f16 = main, bit for bit" || echo "8B f16 DIFFERS"
  for m in q14/model-q4_k_m.gguf; do
    rm -f /tmp/a.bin /tmp/b.bin
    KILN_CUDA_ATT_GROUP_CTX=0 KILN_CUDA_ATT_WIDE=0 KILN_CHECK_KV=f16 KILN_CUDA_ATT_TC=0 timeout 150 /tmp/cc --logits /tmp/$m "$IDS" /tmp/a.bin > /dev/null 2>&1
    KILN_CUDA_ATT_GROUP_CTX=0 KILN_CUDA_ATT_WIDE=0 KILN_CHECK_KV=f16 KILN_CUDA_ATT_TC_CTX=0 timeout 150 /tmp/cc --logits /tmp/$m "$IDS" /tmp/b.bin 2>&1 | grep together | head -1
    echo "$m f16, TC against CUDA-core:"; python3 bench/cuda/logits_diff.py /tmp/a.bin /tmp/b.bin $(( $(stat -c %s /tmp/a.bin) / 4 / 96 )) 4
  done; date -u +%T
  for P in 2048 8192; do for e in X=1 KILN_CUDA_ATT_TC=0; do row q14/model-q4_k_m.gguf $P $e "-ctk f16 -ctv f16"; done; done
  row q14/model-q4_k_m.gguf 8192 X=1
  for b in _a ""; do B=$b row dp8/model-q4_k_m.gguf 8192 X=$b "-ctk f16 -ctv f16"; done; date -u +%T ;;
l2k)
  # Branch l2line-k (kiln / cc): Q5_K, Q3_K and Q2_K weight streams with .L2::128B too, against
  # main (_a, Q4_K / Q6_K only): logits bit for bit, then tg256 of Q5_K_M, Q3_K_M, Q2_K
  # alternated; first the f16 cache's batch invariance in invariant mode (KILN_CUDA_INVARIANT=1,
  # 2-4 sequences together against alone; NOTES.md item 117), both caches.
  for S in Llama-3.1-8B Llama-3.2-1B; do /tmp/kiln synth $S /tmp/tg-$S --types q5_k_m,q3_k_m,q2_k,q4_k_m > /dev/null 2>&1; done
  date -u +%T
  for m in tg-Llama-3.2-1B/hf tg-Llama-3.2-1B/model-q4_k_m.gguf; do for kv in f32 f16; do
    KILN_CUDA_INVARIANT=1 KILN_CHECK_KV=$kv timeout 120 /tmp/cc_a --logits /tmp/$m "$IDS" /tmp/a.bin 2>&1 | grep together | sed "s|^|  invariant $m $kv: |"
  done; done; date -u +%T
  for t in q5_k_m q3_k_m q2_k; do for S in Llama-3.2-1B Llama-3.1-8B; do
    same_logits $(model_of /tmp/tg-$S $t) > /dev/null && echo "$S $t = main, bit for bit" || echo "$S $t DIFFERS"
  done; done; date -u +%T
  TG_SHAPES="Llama-3.1-8B Llama-3.2-1B" TG_TYPES="q5_k_m q3_k_m q2_k" bash $0 tgab ;;
tgab)
  # tg256 p16 of $TG_BINS (default kiln_a (main) and kiln (the branch)) alternated, $TG_ROUNDS
  # rounds (default 2), on $TG_SHAPES (default: the float shapes a fused-norm change reaches) in
  # $TG_TYPES (default hf).
  SH=${TG_SHAPES:-Gemma-3-1B Qwen3-0.6B SmolLM2-360M Llama-3.2-1B}; TT=${TG_TYPES:-hf}
  for S in $SH; do
    have=1; for t in $TT; do [ -e $(model_of /tmp/tg-$S $t) ] || have=0; done
    [ $have = 1 ] || /tmp/kiln synth $S /tmp/tg-$S --types "$(gguf_types $TT)" > /dev/null 2>&1
  done; date -u +%T
  for r in $(seq ${TG_ROUNDS:-2}); do for S in $SH; do for t in $TT; do for b in ${TG_BINS:-kiln_a kiln}; do
    echo "$S $t $b $(/tmp/$b bench $(model_of /tmp/tg-$S $t) --device cuda -p 16 -n 256 -r 2 2>&1 | tg_of)"
  done; done; done; done; date -u +%T ;;
glustamps)
  # NOTES.md item 114 "Next": why the float GLU kernel (mvfg_*) loses on short rows: tg256 of
  # 1B / Qwen3-0.6B bf16 with it forced (KILN_CUDA_MVFG_MIN=0) against the default (act_mul),
  # two rounds, then the stamps of both at step 40 on the 1B (kiln.xz with its timeline
  # cubin: pack_device.sh "" timeline), for timeline.py.
  for S in Llama-3.2-1B Qwen3-0.6B; do /tmp/kiln synth $S /tmp/gs-$S --types "" > /dev/null 2>&1; done; date -u +%T
  for r in 1 2; do for S in Llama-3.2-1B Qwen3-0.6B; do for v in 8192 0; do
    echo "$S bf16 mvfg_min=$v $(KILN_CUDA_MVFG_MIN=$v /tmp/kiln bench /tmp/gs-$S/hf --device cuda -p 16 -n 256 -r 2 2>&1 | tg_of)"
  done; done; done; date -u +%T
  for v in 8192 0; do
    KILN_CUDA_MVFG_MIN=$v KILN_CUDA_TIMELINE=40 KILN_CUDA_TIMELINE_OUT=$OUT/tl_1b_mvfg$v.tsv \
      /tmp/kiln bench /tmp/gs-Llama-3.2-1B/hf --device cuda -p 16 -n 256 -r 1 2>&1 | tg_of | sed "s|^|mvfg_min=$v stamped: |"
  done ;;
short)
  # NOTES.md item 109: the streaming kernels' short-row versions (R rows a chunk, branch
  # short-rows) against main on the shapes whose rows are short ($SR_SHAPES; Q5_0 there is
  # llama.cpp's fallback for rows that are not whole super-blocks), types $SR_TYPES:
  # fixtures (SR_FIX=0 skips them), logits bit for bit with fuse_norm on and off, tg256
  # alternated, two rounds.
  SR=${SR_TYPES:-q4_k_m q5_0}; SRS=${SR_SHAPES:-SmolLM2-135M SmolLM2-360M Gemma-3-1B}
  if [ "${SR_FIX:-1}" = 1 ]; then
    fixtures
  fi
  for S in $SRS; do /tmp/kiln synth $S /tmp/sr-$S --types $(gguf_types $SR) > /dev/null 2>&1; done; date -u +%T
  # SR_BITS=0: no logits comparison; $SR_ROUNDS: tg256 rounds (default 2).
  [ "${SR_BITS:-1}" = 1 ] && for t in $SR; do for S in $SRS; do for v in 1 0; do
    KILN_CUDA_FUSE_NORM=$v same_logits /tmp/sr-$S/model-$t.gguf && echo "$S $t fuse_norm=$v: branch = main, bit for bit"
  done; done; done; date -u +%T
  # $SR_VARIANTS: the branch's KILN_CUDA_SHORT_ROWS settings beside main (default: its own).
  for r in $(seq ${SR_ROUNDS:-2}); do for t in $SR; do for S in $SRS; do
    echo "$S $t main $(/tmp/kiln_a bench /tmp/sr-$S/model-$t.gguf --device cuda -p 16 -n 256 -r 2 2>&1 | tg_of)"
    for v in ${SR_VARIANTS:-default}; do
      [ $v = default ] && e="" || e="KILN_CUDA_SHORT_ROWS=$v"
      echo "$S $t short=$v $(env $e /tmp/kiln bench /tmp/sr-$S/model-$t.gguf --device cuda -p 16 -n 256 -r 2 2>&1 | tg_of)"
    done
  done; done; done; date -u +%T ;;
flat)
  # NOTES.md items 103-106: a repacked layout change that keeps the arithmetic (Q4_0 and Q6_K
  # flat, Q6_K runs of 4; Q8_0 flat was measured and lost) against main, on the types in
  # $FL_TYPES (default q4_0). Fixtures; logits bit for bit against main on four shapes and
  # $FL_SMALL's (SmolLM2-135M's 576 and Gemma-3-1B's 1152 columns are padded rows), fuse_norm
  # on and off; tg256 and batched steps alternated over the binaries $FL_BINS (default kiln_a
  # kiln: main, branch; the 8B and 1B steps over $FL_BIG_BINS, default the same); FL_FIX=0 skips
  # the fixtures.
  FL=${FL_TYPES:-q4_0}; BINS=${FL_BINS:-kiln_a kiln}
  SMALL=${FL_SMALL:-SmolLM2-135M Gemma-3-1B}
  # FL_FIX=0: no fixtures (a change whose logits are compared with main's, bit for bit).
  if [ "${FL_FIX:-1}" = 1 ]; then
    fixtures
  fi
  SHAPES=$(echo Llama-3.2-1B Llama-3.1-8B $SMALL | tr ' ' '\n' | awk '!s[$0]++')
  for S in $SHAPES; do /tmp/kiln synth $S /tmp/fl-$S --types $(gguf_types $FL) > /dev/null 2>&1; done; date -u +%T
  for t in $FL; do for S in $SHAPES; do for v in 1 0; do
    KILN_CUDA_FUSE_NORM=$v same_logits /tmp/fl-$S/model-$t.gguf && echo "$S $t fuse_norm=$v: branch = main, bit for bit"
  done; done; done; date -u +%T
  for r in 1 2; do for t in $FL; do for S in Llama-3.1-8B Llama-3.2-1B; do for b in ${FL_BIG_BINS:-$BINS}; do
    echo "$S $t $b $(/tmp/$b bench /tmp/fl-$S/model-$t.gguf --device cuda -p 512 -n 256 -r 2 2>&1 | pptg_of)"
  done; done; done; done
  for r in 1 2; do for t in $FL; do for S in $SMALL; do for b in $BINS; do
    echo "$S $t $b $(/tmp/$b bench /tmp/fl-$S/model-$t.gguf --device cuda -p 16 -n 256 -r 2 2>&1 | tg_of)"
  done; done; done; done
  for t in $FL; do for b in $BINS; do
    echo "Gemma-3-1B $t fuse_norm=0 $b $(KILN_CUDA_FUSE_NORM=0 /tmp/$b bench /tmp/fl-Gemma-3-1B/model-$t.gguf --device cuda -p 16 -n 256 -r 2 2>&1 | tg_of)"
  done; done
  # $FL_BATCHED: more types for the batched steps only (their 8B model made here).
  for t in ${FL_BATCHED:-}; do /tmp/kiln synth Llama-3.1-8B /tmp/fl-Llama-3.1-8B --types $t > /dev/null 2>&1; done
  for t in $FL ${FL_BATCHED:-}; do for b in ${FL_BIG_BINS:-$BINS}; do
    echo "8B $t batched $b $(/tmp/$b bench /tmp/fl-Llama-3.1-8B/model-$t.gguf --device cuda --batch 8,64 -p 128 -n 128 2>&1 \
      | stg_of)"
  done; done; date -u +%T ;;
esac
date -u +%T
