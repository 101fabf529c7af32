#!/usr/bin/env bash
# One H200 against two, in one call on one host, the same random-weight Llama-2-7B and 20k chat rows for every run
# (bench/qlora_7b.sh), every step reported. Two modes, one device call each (estimated at 6 minutes each at STEPS=16; the old three-run script's was 8):
#   ddp:  the 1-GPU preset, then the 2-GPU preset under DDP, both as shipped (FP8 on);
#   fsdp: the same two with quantization.fp8=false, the second under FSDP2 (QLoRA, NF4 stored as bf16). FSDP
#         shards the base that FP8 keeps whole, so the spec refuses the pair; its 1-GPU run is then the bf16 one,
#         so the ratio compares the same recipe.
# Each ends with bench/compare_runs.py's table (steady tokens/s, the ratio to one GPU, median step, the steps that
# ran 1.25x the median or longer, data wait, the loss at equal steps) and plot.
#
# Device call (kind nvidia-h200-x2, from the repo root, after ../shared/device/make-bundle.sh):
#   carry: [".gpu"]   command: bash bench/scaling_2gpu.sh ddp        (then: bash bench/scaling_2gpu.sh fsdp)
# Every run's spec is checked before the first builds anything: a pair the spec refuses costs seconds, not a GPU
# call. CHECK_ONLY=1 stops after that check (tests/unit/bench/test_scaling_2gpu.py runs it on CPU).
set -euo pipefail
mode=${1:-ddp}
one=ray_jobs/presets/qlora_7b_1gpu.yaml two=ray_jobs/presets/qlora_7b_2gpu_ddp.yaml
case "$mode" in  # NAME|PRESET|overrides (space-separated)
  ddp) runs=("gpu1|$one|" "gpu2-ddp|$two|") ;;
  fsdp) runs=("gpu1-bf16|$one|quantization.fp8=false" "gpu2-fsdp|$two|scaling.strategy=fsdp quantization.fp8=false") ;;
  *) echo "usage: bash bench/scaling_2gpu.sh ddp|fsdp" >&2; exit 2 ;;
esac

[ -n "${CHECK_ONLY:-}" ] || source .gpu/env.sh
export PYTHONPATH=$PWD:${PYTHONPATH:-}
PY=${PY:-python3}
for r in "${runs[@]}"; do
  IFS='|' read -r name preset sets <<<"$r"
  # shellcheck disable=SC2086  # the overrides split on spaces, as they are written above
  CHECK_ONLY=1 PY="$PY" PRESET="$preset" bash bench/qlora_7b.sh $sets || { echo "$name: its spec is refused (above)" >&2; exit 2; }
done
[ -z "${CHECK_ONLY:-}" ] || exit 0

OUT=${OUT:-/tmp/bench-out}; mkdir -p "$OUT"
export STEPS=${STEPS:-16} LOG_EVERY=1
pairs=()
for r in "${runs[@]}"; do
  IFS='|' read -r name preset sets <<<"$r"
  echo "== $name ($preset $sets)" | tee -a "$OUT/runs.log"
  rm -rf "/tmp/runs/$name"  # a summary left by an earlier call on this warm machine must not stand in for this run's
  # shellcheck disable=SC2086
  RUN_NAME="$name" PRESET="$preset" OUT="/tmp/bench-runs/$name" bash bench/qlora_7b.sh $sets 2>&1 | tail -22 \
    | tee -a "$OUT/runs.log" || echo "FAILED: $name" | tee -a "$OUT/runs.log"
  if [ -f "/tmp/runs/$name/summary.json" ]; then pairs+=("$name=/tmp/runs/$name"); fi
done
"$PY" bench/compare_runs.py "$OUT/scaling_2gpu_$mode.png" "${pairs[@]}" | tee "$OUT/compare_$mode.md"
tar -czf "$OUT/runs_$mode.tar.gz" -C /tmp/runs $(for p in "${pairs[@]}"; do echo "${p%%=*}/summary.json ${p%%=*}/metrics.jsonl"; done)
