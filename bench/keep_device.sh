#!/usr/bin/env bash
# quantization.cache on one lent GPU, in one call (issue 12): what decides whether it goes on by default.
#   1. bench/service_7b.sh with no pool, RUNS jobs through the service, the option set per run in turn (EACH): run 1
#      fills the dataset cache with it off, run 2 quantizes and keeps its base (the write after its first step),
#      run 3 reads that base, run 4 quantizes with it off again. Does the write beside the job cost its steps
#      anything, and does the read bring the first step closer?
#   2. bench/load_base.py, one round with py-spy: where a read's seconds go against a quantization's, in a fresh
#      process each (its own limit, LOAD_S, so that part 1's figures come back whatever part 2 does).
# Each part's log goes to $OUT (service.log, service_runs.json, serve.log, and the script's whole output in
# service_ab.log; load_base.log).
#
# Device call (from the repo root, after WITH_SERVICE=1 GPU_EXTRA="pytest pluggy iniconfig py-spy"
# ../shared/device/make-bundle.sh):
#   carry: [".gpu"]   command: bash bench/keep_device.sh     (estimated at 8-9 minutes on an H100)
set -uo pipefail
OUT=${OUT:-/tmp/bench-out}; mkdir -p "$OUT"
WARM=0 RUNS=${RUNS:-4} STEPS=${STEPS:-8} EACH=${EACH:-quantization.cache=false,true,true,false} \
  bash bench/service_7b.sh > "$OUT/service_ab.log" 2>&1
grep -v -E "raylet|core_worker" "$OUT/service.log" | tail -60
source .gpu/env.sh
export PYTHONPATH=$PWD:$PYTHONPATH
timeout "${LOAD_S:-170}" python3 bench/load_base.py /tmp/llama-7b --rounds 1 --spy > "$OUT/load_base.log" 2>&1
tail -60 "$OUT/load_base.log"
