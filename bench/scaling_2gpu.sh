#!/usr/bin/env bash
# One H200 against two, in one call on one host: the 7B preset on one GPU, then the 2-GPU preset under DDP and
# under FSDP2 (QLoRA, NF4 stored as bf16), the same random-weight Llama-2-7B and 20k chat rows for all three
# (bench/qlora_7b.sh), every step reported. Ends with bench/compare_runs.py's table (steady tokens/s, the
# ratio to one GPU, median step, the steps that ran 1.25x the median or longer, data wait, the loss at equal
# steps) and plot.
#
# Device call (kind nvidia-h200-x2, from the repo root, after ../shared/device/make-bundle.sh):
#   carry: [".gpu"]   command: bash bench/scaling_2gpu.sh          (about 8 minutes at STEPS=16)
set -euo pipefail
source .gpu/env.sh
export PYTHONPATH=$PWD:$PYTHONPATH
OUT=${OUT:-/tmp/bench-out}; mkdir -p "$OUT"
export STEPS=${STEPS:-16} LOG_EVERY=1
run() {  # NAME PRESET [--set overrides...]
  local name=$1 preset=$2; shift 2
  echo "== $name ($preset $*)" | tee -a "$OUT/runs.log"
  RUN_NAME="$name" PRESET="$preset" OUT="/tmp/bench-runs/$name" bash bench/qlora_7b.sh "$@" 2>&1 | tail -22 \
    | tee -a "$OUT/runs.log" || echo "FAILED: $name" | tee -a "$OUT/runs.log"
}
run gpu1 ray_jobs/presets/qlora_7b_1gpu.yaml
run gpu2-ddp ray_jobs/presets/qlora_7b_2gpu_ddp.yaml
run gpu2-fsdp ray_jobs/presets/qlora_7b_2gpu_ddp.yaml scaling.strategy=fsdp
pairs=(); for n in gpu1 gpu2-ddp gpu2-fsdp; do [ -f "/tmp/runs/$n/summary.json" ] && pairs+=("$n=/tmp/runs/$n"); done
python3 bench/compare_runs.py "$OUT/scaling_2gpu.png" "${pairs[@]}" | tee "$OUT/compare.md"
tar -czf "$OUT/runs.tar.gz" -C /tmp/runs $(cd /tmp/runs && ls -d gpu*/summary.json gpu*/metrics.jsonl 2>/dev/null)
