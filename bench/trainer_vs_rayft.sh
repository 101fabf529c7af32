#!/usr/bin/env bash
# Issue 12's comparison in one run on one GPU: the QLoRA recipe teams run today on transformers' Trainer, then rayft's
# 7B preset cold and warm, on the same random-weight Llama-2-7B and the same 20k chat rows of realistic lengths.
#   Trainer:     bench/trainer_recipe.py (NF4 by from_pretrained, prepare_model_for_kbit_training, gradient
#                checkpointing, micro-batch 4, tokenized as it loads, padded to the longest), TRAINER_STEPS steps;
#   rayft cold:  `rayft train` of ray_jobs/presets/qlora_7b_1gpu.yaml (bench/qlora_7b.sh) on an empty rayft cache:
#                the dataset tokenized and packed, the kernels compiled, the base quantized (a fresh node's first job);
#   rayft warm:  the same again: the dataset cache hits, the kernels and the quantized base are read.
# The model is built and written before the Trainer runs, so all three read it from the page cache.
# Ends with bench/compare_trainer.py's table (steady real tokens/s, the ratio to the Trainer, MFU, peak memory, data
# wait, padding, time to the first step, and from when rayft has trained more tokens) and its plot, in $OUT.
#
# Device call (kind nvidia-h200, from the repo root, after ../shared/device/make-bundle.sh):
#   carry: [".gpu"]   command: bash bench/trainer_vs_rayft.sh        (about 6.5 minutes on an H100 at these step counts,
#                     reckoned from its parts; measured whole there: 315 s with TRAINER_STEPS=10 STEPS=12)
# CHECK_ONLY=1 checks rayft's spec and stops (no GPU needed).
set -euo pipefail
PRESET=${PRESET:-ray_jobs/presets/qlora_7b_1gpu.yaml}
CHECK_ONLY=1 PY="${PY:-python3}" PRESET="$PRESET" bash bench/qlora_7b.sh  # the spec, checked before anything is built
[ -z "${CHECK_ONLY:-}" ] || exit 0
source .gpu/env.sh
export PYTHONPATH=$PWD:$PYTHONPATH
OUT=${OUT:-/tmp/bench-out}; mkdir -p "$OUT"
export STEPS=${STEPS:-20} LOG_EVERY=1

python3 bench/make_random_llama.py /tmp/llama-7b 2>&1 | tail -1
[ -f /tmp/chat.jsonl ] || python3 bench/make_chat_data.py /tmp/chat.jsonl --rows "${ROWS:-20000}"

echo "== Trainer recipe" | tee "$OUT/trainer_vs_rayft.log"
python3 bench/trainer_recipe.py /tmp/llama-7b /tmp/chat.jsonl "$OUT/trainer.json" --steps "${TRAINER_STEPS:-15}" 2>&1 \
  | tr '\r' '\n' | grep -v "it/s]" | tail -5 | tee -a "$OUT/trainer_vs_rayft.log" || true  # rayft's runs go on

export RAYFT_CACHE_DIR=/tmp/vs-cache  # the dataset cache, the compiled kernels and the quantized base all live here
rm -rf "$RAYFT_CACHE_DIR" /tmp/runs/rayft-cold /tmp/runs/rayft-warm
for run in cold warm; do
  echo "== rayft $run" | tee -a "$OUT/trainer_vs_rayft.log"
  RUN_NAME=rayft-$run PRESET="$PRESET" OUT=/tmp/bench-runs/$run bash bench/qlora_7b.sh 2>&1 | tail -8 \
    | tee -a "$OUT/trainer_vs_rayft.log"
done
for run in cold warm; do  # $OUT as bench/trainer_vs_rayft_h100/ keeps it: compare_trainer.py reads it back as it is
  mkdir -p "$OUT/$run" && cp /tmp/runs/rayft-$run/{summary.json,metrics.jsonl} "$OUT/$run/"
done
if [ -f "$OUT/trainer.json" ]; then
  python3 bench/compare_trainer.py "$OUT/trainer_vs_rayft.png" "$OUT/trainer.json" cold="$OUT/cold" warm="$OUT/warm" \
    | tee "$OUT/trainer_vs_rayft.md"
else  # the Trainer failed (its lines above): rayft's two runs side by side
  python3 bench/compare_runs.py "$OUT/rayft_cold_warm.png" cold="$OUT/cold" warm="$OUT/warm"
fi
