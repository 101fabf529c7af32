#!/usr/bin/env bash
# A change's GPU check on one lent GPU: the gpu tests, then the 7B preset for STEPS steps (30), set beside the
# reference run kept in bench/reference/qlora_7b_1gpu_h200 (2026-12-05, 21,504 steady tokens/s) by bench/compare_runs.py:
# steady tokens/s as a ratio, and the loss at steps 5-STEPS, which the same seed, data and order make equal up to
# the preset's 30 warm-up steps (the eighteenth session's run matched the seventh's to the digit).
#
# Device call (from the repo root, after ../shared/device/make-bundle.sh with GPU_EXTRA="pytest pluggy iniconfig"):
#   carry: [".gpu"]   command: bash bench/gpu_check.sh [all|tests|run]
# all (the default) fits one call on an H200 (about 7 minutes: tests 231 s, the run 160 s). On an H100 it does not:
# the tests took 305 s and a cold machine's set-up the rest of the 600 s (2026-12-05). There, call `tests`, then
# `STEPS=20 bash bench/gpu_check.sh run` on the still-warm machine (180 s).
# `kernels` (not part of `all`): 10 steps with torch.profiler over steps 6-8, then bench/kernel_shares.py's split of a
# step's GPU time by kind of kernel into $OUT/kernels.md and kernels.png (about 3 minutes on a warm machine). Its steps
# are not set beside the reference: the profiler slows the ones it records.
# No `timeout` around the tests: one that stops a test mid-run shows as an F (Ray's SIGTERM handler in the driver).
set -uo pipefail
what=${1:-all}
case "$what" in all|tests|run|kernels) ;; *) echo "usage: bash bench/gpu_check.sh [all|tests|run|kernels]" >&2; exit 2 ;; esac
OUT=${OUT:-/tmp/bench-out}; mkdir -p "$OUT"
if [ "$what" = kernels ]; then
  rm -rf /tmp/runs/kernels  # an earlier call's profile on this warm machine must not stand in for a failed run
  RUN_NAME=kernels STEPS=10 LOG_EVERY=1 PROFILE=6:8 bash bench/qlora_7b.sh 2>&1 | tail -14
  source .gpu/env.sh
  gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | tr -c 'A-Za-z0-9\n' _)
  python3 bench/kernel_shares.py "$OUT/kernels.png" "$gpu=/tmp/runs/kernels" | tee "$OUT/kernels.md"
  exit
fi
if [ "$what" != run ]; then
  (source .gpu/env.sh && PYTHONPATH=$PWD:${PYTHONPATH:-} python3 -m pytest tests/gpu -m gpu -q -p no:cacheprovider -p no:logging 2>&1 \
    | grep -v -E "raylet|core_worker" > "$OUT/gpu_tests.txt"; tail -15 "$OUT/gpu_tests.txt")
fi
[ "$what" != tests ] || exit 0
rm -rf /tmp/runs/qlora-7b-1gpu  # an earlier call's summary on this warm machine must not stand in for a failed run
STEPS=${STEPS:-30} bash bench/qlora_7b.sh 2>&1 | tail -8
source .gpu/env.sh
python3 bench/compare_runs.py "$OUT/against_reference.png" ref=bench/reference/qlora_7b_1gpu_h200 \
  now=/tmp/runs/qlora-7b-1gpu | tee "$OUT/against_reference.md"
