#!/usr/bin/env bash
# Two versions of rayft's code on the 7B preset in one call on one GPU, in turns on the same data and caches: what a
# change did to the steps, with the host's drift between machines out of the comparison. `rayft train` of
# ray_jobs/presets/qlora_7b_1gpu.yaml (bench/qlora_7b.sh), five runs of STEPS steps:
#   cold               this tree (the caches filled: dataset, kernels, quantized base);
#   before-1, after-1, before-2, after-2   warm, in turns: BEFORE's tree, then this one.
# The GPU's clock, power and throttle reasons are sampled through all five ($OUT/smi.csv). Ends with bench/gc_steps.py's
# tables (each step's seconds, its thread's CPU, waits and preemptions, the allocator's calls, the GPU's clock and power)
# and bench/compare_runs.py's (tokens/s, slow steps, the loss at equal steps), in $OUT; the records in $OUT/runs.tgz.
#
# BEFORE: a directory with the earlier version's code, made from a commit before the call, for example
#   mkdir -p .ab-before && git archive REV ray_jobs rayft rayft_contract service bench/qlora_7b.sh \
#     bench/make_random_llama.py bench/make_chat_data.py bench/compare_profile.py | tar -x -C .ab-before
# (1.2 MB: the scripts a run of that tree calls, not bench/'s records, which the working tree carries already)
# (untracked, so the device's copy of the working tree carries it; remove it after the call). The tree, that copy and
# .gpu must stay under 64 MiB together: build the bundle without WITH_SERVICE (the service's wheels are 11 MB more).
# Device call (from the repo root, after GPU_EXTRA="pytest pluggy iniconfig" ../shared/device/make-bundle.sh):
#   carry: [".gpu"]   command: BEFORE=.ab-before bash bench/code_ab_7b.sh     (about 7.5 minutes on an H100 at STEPS=12)
# With a short cold run: STEPS=14 COLD_STEPS=3 (reckoned about 8 minutes for both pairs; DEADLINE under the call's limit).
# CHECK_ONLY=1 checks the spec, RUNS and that BEFORE holds a tree, and stops (no GPU needed). DEADLINE=S: see below.
# COLD_STEPS: the cold run's steps (STEPS unless set): it fills the caches, and its steps are not compared.
# RUNS: which runs, in order (default "cold before-1 after-1 before-2 after-2"; any cold, before-N, after-N). Without
# cold, a call goes on from an earlier one on the same warm machine: that call's caches and records are kept, and the
# tables cover this call's runs. The pair a DEADLINE left out: RUNS="before-2 after-2" BEFORE=.ab-before bash ...
set -euo pipefail
PRESET=${PRESET:-ray_jobs/presets/qlora_7b_1gpu.yaml}
BEFORE=$(cd "${BEFORE:?BEFORE: the directory of the earlier code, see the header}" && pwd)
[ -f "$BEFORE/bench/qlora_7b.sh" ] && [ -d "$BEFORE/ray_jobs" ] || { echo "BEFORE=$BEFORE holds no rayft tree"; exit 2; }
RUNS=${RUNS:-cold before-1 after-1 before-2 after-2}
runs=()
for name in $RUNS; do
  case $name in
    cold | after-*) runs+=("$name:.") ;;
    before-*) runs+=("$name:$BEFORE") ;;
    *) echo "RUNS: $name is none of cold, before-N, after-N" >&2; exit 2 ;;
  esac
done
CHECK_ONLY=1 PY="${PY:-python3}" PRESET="$PRESET" bash bench/qlora_7b.sh  # the spec, checked before anything is built
[ -z "${CHECK_ONLY:-}" ] || exit 0
OUT=${OUT:-/tmp/bench-out}; mkdir -p "$OUT"
export STEPS=${STEPS:-12} LOG_EVERY=1 RAYFT_CACHE_DIR=/tmp/ab-cache
case " $RUNS " in *" cold "*) rm -rf "$RAYFT_CACHE_DIR" /tmp/ab-records ;; esac  # without cold: an earlier call's, kept
ln -sfn "$PWD/.gpu" "$BEFORE/.gpu"  # the earlier tree's runs unpack the same bundle
source bench/smi_sampler.sh
start_smi "$OUT/smi.csv"
# DEADLINE: seconds from the script's start by which the runs must be over; a run that the last one's length says would
# end past it is not started, and the tables cover the runs that did (a device call's limit, kept).
done_runs=() last=0
for run in "${runs[@]}"; do
  name=${run%%:*} tree=${run#*:}
  if [ -n "${DEADLINE:-}" ] && (( SECONDS + last + 20 > DEADLINE )); then
    echo "== $name not run: ${SECONDS} s in, the last run took ${last} s, DEADLINE=${DEADLINE}" | tee -a "$OUT/ab.log"
    break
  fi
  started=$SECONDS
  echo "== $name ($tree)" | tee -a "$OUT/ab.log"
  rm -rf "/tmp/runs/ab-$name"
  steps=$STEPS; [ "$name" != cold ] || steps=${COLD_STEPS:-$STEPS}
  (cd "$tree" && STEPS=$steps RUN_NAME=ab-$name PRESET="$PRESET" OUT=/tmp/bench-runs/$name bash bench/qlora_7b.sh 2>&1) | tail -16 \
    | tee -a "$OUT/ab.log"
  mkdir -p "/tmp/ab-records/$name" && cp "/tmp/runs/ab-$name"/{summary.json,metrics.jsonl} "/tmp/ab-records/$name/"
  done_runs+=("$name") last=$((SECONDS - started))
done
kill "$smi_sampler"
tar czf "$OUT/runs.tgz" -C /tmp/ab-records .
named=(); for name in "${done_runs[@]}"; do named+=("$name=/tmp/ab-records/$name"); done
python3 bench/gc_steps.py "$OUT/steps.png" --smi "$OUT/smi.csv" "${named[@]}" | tee "$OUT/steps.md"
python3 bench/compare_runs.py "$OUT/runs.png" "${named[@]}" | tee "$OUT/runs.md"
