#!/usr/bin/env bash
# bench/tokenize_contention.py on the lent H200 host's 16 CPU cores (no GPU used): does a tokenizer slow with busy
# neighbours because the chip does (its clock) or because of the memory the processes share (the batch's size)?
# Device call (from the repo root, after ../shared/device/make-bundle.sh):
#   carry: [".gpu"]   command: bash bench/contention_device.sh          (about 4 minutes)
set -euo pipefail
source .gpu/env.sh
export PYTHONPATH=$PWD:$PYTHONPATH
OUT=${OUT:-/tmp/bench-out}; mkdir -p "$OUT"
echo "CPUs: $(nproc); $(grep -m1 'model name' /proc/cpuinfo)"
python3 -u bench/tokenize_contention.py --procs "${PROCS:-1,8,14,16}" --chunks "${CHUNKS:-8192,256,4}" 2>&1 | tee "$OUT/log.txt"
cp bench/out/tokenize_contention.json "$OUT/"
