#!/usr/bin/env bash
# The host's side of the 7B preset's slow steps (issue 12: the slow steps that are not the garbage collector's), in one
# call on one GPU: `rayft train` of ray_jobs/presets/qlora_7b_1gpu.yaml (bench/qlora_7b.sh) three times on the same data:
#   cold      the first run (the caches filled);
#   sampled   warm, its worker's every thread sampled with py-spy as often as a dump returns (bench/stack_sampler.py:
#             which thread ran, which held the GIL, and where), each sample stamped with the host's clock;
#   unsampled warm again, nothing attached: whether the sampler made slow steps of its own.
# Each step's record counts its thread's CPU seconds, waits and preemptions, the process's CPU, the host's load and the
# caching allocator's calls for GPU memory (rayft_contract.records.StepRecord); the GPU's clock, power and throttle
# reasons are sampled every 0.25 s through all three ($OUT/smi.csv). Ends with bench/gc_steps.py's tables (every step
# of the three, beside the GPU's samples) and bench/host_steps.py's (the sampled run: the slow steps against the
# rest), in $OUT; the records and samples in $OUT/runs.tgz (a call returns 8 files).
#
# Device call (from the repo root, after ../shared/device/make-bundle.sh and py-spy's wheel in .gpu:
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --platform manylinux2014_x86_64 py-spy -d .gpu):
#   carry: [".gpu"]   command: bash bench/host_7b.sh          (about 8 minutes on an H100 at STEPS=20)
# CHECK_ONLY=1 checks the spec and stops (no GPU needed).
set -euo pipefail
PRESET=${PRESET:-ray_jobs/presets/qlora_7b_1gpu.yaml}
CHECK_ONLY=1 PY="${PY:-python3}" PRESET="$PRESET" bash bench/qlora_7b.sh  # the spec, checked before anything is built
[ -z "${CHECK_ONLY:-}" ] || exit 0
OUT=${OUT:-/tmp/bench-out}; mkdir -p "$OUT"
export STEPS=${STEPS:-20} LOG_EVERY=1 RAYFT_CACHE_DIR=/tmp/host-cache
rm -rf "$RAYFT_CACHE_DIR" /tmp/host-records
source .gpu/env.sh  # py-spy's binary, unpacked under /tmp/site
source bench/smi_sampler.sh
start_smi "$OUT/smi.csv"
runs=(cold sampled unsampled)
for name in "${runs[@]}"; do
  echo "== $name" | tee -a "$OUT/host.log"
  rm -rf "/tmp/runs/host-$name"
  mkdir -p "/tmp/host-records/$name"
  spy=
  if [ "$name" = sampled ]; then
    python3 bench/stack_sampler.py "/tmp/host-records/$name/samples.jsonl.gz" --match '^ray::(WarmWorker|RayTrainWorker)' \
      --for 400 >> "$OUT/host.log" 2>&1 &
    spy=$!
  fi
  RUN_NAME=host-$name PRESET="$PRESET" OUT=/tmp/bench-runs/$name bash bench/qlora_7b.sh 2>&1 | tail -16 | tee -a "$OUT/host.log"
  if [ -n "$spy" ]; then kill "$spy" 2>/dev/null || true; wait "$spy" || true; fi
  cp "/tmp/runs/host-$name"/{summary.json,metrics.jsonl} "/tmp/host-records/$name/"
done
kill "$smi_sampler"
tar czf "$OUT/runs.tgz" -C /tmp/host-records .
named=(); for name in "${runs[@]}"; do named+=("$name=/tmp/host-records/$name"); done
python3 bench/gc_steps.py "$OUT/steps.png" --smi "$OUT/smi.csv" "${named[@]}" | tee "$OUT/steps.md"
python3 bench/compare_runs.py /tmp/host-runs.png "${named[@]}" | tee "$OUT/runs.md"  # 8 files come back: its plot stays
python3 bench/host_steps.py /tmp/host-records/sampled/samples.jsonl.gz /tmp/host-records/sampled --plot "$OUT/host_steps.png" \
  | tee "$OUT/host_steps.md"
