#!/usr/bin/env bash
# A new job's fill start on the lent H200 host's 16 CPU cores (no GPU used), beside what one worker process's imports
# cost on that host alone and 16 at once: does the start follow the host's import speed? One call samples one host.
# Device call (from the repo root, after ../shared/device/make-bundle.sh):
#   carry: [".gpu"]   command: bash bench/fill_start_device.sh          (about 4 minutes)
# Then, here: .venv/bin/python bench/plot_fill_start.py PATH:FILLS ...   (PATH: a call's fill_start.json, copied to bench/)
set -euo pipefail
source .gpu/env.sh
export PYTHONPATH=$PWD:$PYTHONPATH
OUT=${OUT:-/tmp/bench-out}; mkdir -p "$OUT"
echo "CPUs: $(nproc); $(grep -m1 'model name' /proc/cpuinfo)" | tee "$OUT/host.txt"
python3 -u bench/import_contention.py --procs 1,16 --runs 2 --out "$OUT/import_contention.json"
python3 -u bench/fill_start.py --rows "${ROWS:-200000}" --workers 14 --runs "${RUNS:-3}" --rest 10 \
  --out "$OUT/fill_start.json" 2>&1 | grep -v '^\s*$' | tail -"$(( ${RUNS:-3} + 2 ))"
