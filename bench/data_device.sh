#!/usr/bin/env bash
# The data pipeline benchmark (bench/data_bench.py, throughput part) on the lent H200's 16 CPU cores.
# Device call (from the repo root, after ../shared/device/make-bundle.sh):
#   carry: [".gpu"]   command: bash bench/data_device.sh            (about 3 minutes)
#   the issue-14 table: ROWS=1000000 EXTRA="--real-tokenizer --small-rows 200000" bash bench/data_device.sh
#   actor tasks of 8 and 16 batches in turn: ROWS=1000000 WORKERS=14,14,14,14 EXTRA="--real-tokenizer --fill-only
#     --batches-per-task 8,16" bash bench/data_device.sh
#   14 actors against one in turn, each fill after 30 s idle (the host slows fill after fill without it):
#     CPU_SAMPLE=1 ROWS=1000000 WORKERS=14,1,14,1 EXTRA="--real-tokenizer --fill-only --small-rows 60000 --bare-procs 1
#     --rest 30" bash bench/data_device.sh      (about 9 minutes)
# CPU_SAMPLE=1: bench/cpu_by_process.py samples every process's CPU time and the cores' clock through the fills, and
#   writes where the host's cores went, by role, in each stretch with 1 or 8+ tokenizer actors busy ($OUT/cpu_by_role.json).
set -euo pipefail
source .gpu/env.sh
export PYTHONPATH=$PWD:$PYTHONPATH
OUT=${OUT:-/tmp/bench-out}; mkdir -p "$OUT"
echo "CPUs: $(nproc)"
if [ "${CPU_SAMPLE:-}" = 1 ]; then
  rm -f /tmp/cpu.jsonl; python3 bench/cpu_by_process.py sample /tmp/cpu.jsonl & sampler=$!
  trap 'kill $sampler 2>/dev/null; python3 bench/cpu_by_process.py summary /tmp/cpu.jsonl > "$OUT/cpu_by_role.json"' EXIT
fi
# -u and --line-buffered: a call cut off at its time limit still brings back what it measured ($OUT/log.txt).
python3 -u bench/data_bench.py --workers ${WORKERS:-1,2,4,8,14} --rows ${ROWS:-40000} --skip-start ${EXTRA:-} 2>&1 \
    | grep --line-buffered -v "raylet\|WARNING\|core_worker.cc" | while IFS= read -r line; do echo "$(date +%T) $line"; done \
    | tee "$OUT/log.txt"
cp bench/out/data_bench.json bench/out/data_bench.png "$OUT/"
# Ray Data's own log of each fill (operators, tasks, timings): where a slow fill spent its time.
for d in /tmp/ray-*/session_latest/logs/ray-data; do cp -r "$d" "$OUT/ray-data-logs" && break; done || true
