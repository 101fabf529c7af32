#!/usr/bin/env bash
# bench/tenant_bench.py on the lent H200 host's 16 cores: the server pinned to 2 of them, each client to one
# more, so the machine has room for the watch process and no client passes for the server's slowness.
# Device call (from the repo root, after ../shared/device/make-bundle.sh; WITH_SERVICE=1 not needed, no Ray):
#   carry: [".gpu"]   command: bash bench/tenant_device.sh        (about 6 minutes)
set -uo pipefail
source .gpu/env.sh
export PYTHONPATH=$PWD:$PYTHONPATH
OUT=${OUT:-/tmp/bench-out}; mkdir -p "$OUT"
echo "CPUs: $(nproc)"
for streams in ${STREAMS:-32 100}; do
  for mode in in-process watch-process; do
    flag=""; [ "$mode" = in-process ] && flag="--streams-in-process"
    label="${mode}_${streams}"
    echo "== $label"
    python3 -u bench/tenant_bench.py --calls ${CALLS:-1000} --server-cores ${SERVER_CORES:-2} --team-streams "$streams" \
        --label "$label" $flag 2>&1 | grep --line-buffered -v "^$" | tee -a "$OUT/log.txt"
    cp "bench/out/tenant_bench_$label.json" "$OUT/" || true
  done
done
