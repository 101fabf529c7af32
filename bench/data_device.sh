#!/usr/bin/env bash
# The data pipeline benchmark (bench/data_bench.py, throughput part) on the lent H200's 16 CPU cores.
# Device call (from the repo root, after ../shared/device/make-bundle.sh):
#   carry: [".gpu"]   command: bash bench/data_device.sh            (about 3 minutes)
set -euo pipefail
source .gpu/env.sh
export PYTHONPATH=$PWD:$PYTHONPATH
OUT=${OUT:-/tmp/bench-out}; mkdir -p "$OUT"
echo "CPUs: $(nproc)"
python3 bench/data_bench.py --workers ${WORKERS:-1,2,4,8,14} --rows ${ROWS:-40000} --skip-start 2>&1 | grep -v "raylet\|WARNING" 
cp bench/out/data_bench.json bench/out/data_bench.png "$OUT/"
