#!/usr/bin/env bash
# Python's garbage collector in the 7B preset's steps (issue 12's slow steps), in one call on one GPU: `rayft train` of
# ray_jobs/presets/qlora_7b_1gpu.yaml (bench/qlora_7b.sh) four times on the same data, in turns:
#   cold-auto    the first run (the caches filled), the collector as Python leaves it (RAYFT_GC=auto);
#   warm-freeze  the job's start-up frozen out of the collector's walks (the default, ray_jobs/observe/collector.py);
#   warm-auto    as Python leaves it again;
#   warm-freeze  frozen again.
# Every run trains the same batches in the same order, so a step that is slow in every "auto" run and not in the
# "freeze" runs, with the collector's seconds inside it, is the collector's. The GPU's SM clock, power, temperature
# and throttle reasons are sampled every 0.25 s through all four ($OUT/smi.csv), to tell a slow step of the GPU's own
# from one of the host. Ends with bench/gc_steps.py's tables and plot and bench/compare_runs.py's (the loss at equal
# steps: the collector must not change it), in $OUT; the runs' records in $OUT/runs.tgz (a call returns 8 files).
#
# Device call (from the repo root, after ../shared/device/make-bundle.sh):
#   carry: [".gpu"]   command: bash bench/gc_7b.sh          (about 6.5 minutes on an H100 at STEPS=12)
# CHECK_ONLY=1 checks the spec and stops (no GPU needed).
set -euo pipefail
PRESET=${PRESET:-ray_jobs/presets/qlora_7b_1gpu.yaml}
CHECK_ONLY=1 PY="${PY:-python3}" PRESET="$PRESET" bash bench/qlora_7b.sh  # the spec, checked before anything is built
[ -z "${CHECK_ONLY:-}" ] || exit 0
OUT=${OUT:-/tmp/bench-out}; mkdir -p "$OUT"
export STEPS=${STEPS:-12} LOG_EVERY=1 RAYFT_CACHE_DIR=/tmp/gc-cache
rm -rf "$RAYFT_CACHE_DIR" /tmp/gc-records
runs=(cold-auto:auto warm-freeze:freeze warm-auto:auto warm-freeze-2:freeze)
source bench/smi_sampler.sh
start_smi "$OUT/smi.csv"
for run in "${runs[@]}"; do
  name=${run%%:*}
  echo "== $name" | tee -a "$OUT/gc.log"
  rm -rf "/tmp/runs/gc-$name"
  RAYFT_GC=${run##*:} RUN_NAME=gc-$name PRESET="$PRESET" OUT=/tmp/bench-runs/$name bash bench/qlora_7b.sh 2>&1 | tail -16 \
    | tee -a "$OUT/gc.log"
  mkdir -p "/tmp/gc-records/$name" && cp "/tmp/runs/gc-$name"/{summary.json,metrics.jsonl} "/tmp/gc-records/$name/"
done
kill "$smi_sampler"
tar czf "$OUT/runs.tgz" -C /tmp/gc-records .
named=(); for run in "${runs[@]}"; do named+=("${run%%:*}=/tmp/gc-records/${run%%:*}"); done
python3 bench/gc_steps.py "$OUT/gc_steps.png" --smi "$OUT/smi.csv" "${named[@]}" | tee "$OUT/gc_steps.md"
python3 bench/compare_runs.py "$OUT/gc_runs.png" "${named[@]}" | tee "$OUT/gc_runs.md"
