#!/usr/bin/env bash
# Where a Ray Train worker's set-up goes, frame by frame: py-spy dumps of the Ray Train worker and controller every
# 0.3 s through one short run of the tiny preset (one worker, 3 steps), here on CPU. After `make demo` (its tiny
# assets in .rayft/tiny, or TINY=DIR). Writes $OUT/worker_setup_dumps.txt and the run's log; the run's phase table
# (its "worker setup" row) and metrics.jsonl's `setup` timestamps say when each part began.
#   bash bench/worker_setup_profile.sh          (about a minute on 2 cores)
set -euo pipefail
OUT=${OUT:-/tmp/bench-out}; mkdir -p "$OUT"
TINY=${TINY:-.rayft/tiny}
export RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 RAY_AUTH_MODE=disabled
( .venv/bin/rayft train ray_jobs/presets/tiny_cpu.yaml --overwrite --set model.path="$TINY/model" --set data.path="$TINY/train.jsonl" \
    --set output.dir=/tmp/worker-setup-runs --set train.max_steps=3 --set scaling.num_workers=1 > "$OUT/worker_setup_run.log" 2>&1 ) &
train=$!
while kill -0 "$train" 2>/dev/null; do
  for pid in $(pgrep -f "RayTrainWorker|ray::TrainController" || true); do
    echo "== $(date +%s.%N) pid $pid $(ps -o args= -p "$pid" | cut -c1-50)"
    timeout 5 .venv/bin/py-spy dump --pid "$pid" 2>&1 | head -400 || true
  done
  sleep 0.3
done > "$OUT/worker_setup_dumps.txt"
wait "$train"
grep -A30 "where the time went" "$OUT/worker_setup_run.log" | grep -E "worker|model load|first evaluation" || true
