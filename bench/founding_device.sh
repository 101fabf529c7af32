#!/usr/bin/env bash
# The founding story at size on the lent H200 host's 16 CPU cores (no GPU used): a multi-GB gzipped JSONL
# dataset in S3 (moto), a cold cache fill against one thread, then a warm start (bench/s3_data_bench.py founding).
# Device call (from the repo root, after ../shared/device/make-bundle.sh and bash bench/make_moto_bundle.sh):
#   carry: [".gpu", ".moto"]   command: bash bench/founding_device.sh          (about 6 minutes at 2M rows, 14 actors)
set -euo pipefail
source .gpu/env.sh
export PYTHONPATH=$PWD:$PYTHONPATH
OUT=${OUT:-/tmp/bench-out}; mkdir -p "$OUT"
if [ ! -f /tmp/moto-site/.unpacked ]; then
  mkdir -p /tmp/moto-site && tar -xJf .moto/moto-site.tar.xz -C /tmp/moto-site && touch /tmp/moto-site/.unpacked
fi
export MOTO_SITE=/tmp/moto-site
echo "CPUs: $(nproc)"
# CPU_SAMPLE=1: bench/cpu_by_process.py, as in data_device.sh: where the host's cores went, by role (moto's S3 server
# among them, which a real S3 would not take from the host), in $OUT/cpu_by_role.json.
if [ "${CPU_SAMPLE:-}" = 1 ]; then
  rm -f /tmp/cpu.jsonl; python3 bench/cpu_by_process.py sample /tmp/cpu.jsonl & sampler=$!
  trap 'kill $sampler 2>/dev/null; python3 bench/cpu_by_process.py summary /tmp/cpu.jsonl > "$OUT/cpu_by_role.json"' EXIT
fi
python3 -u bench/s3_data_bench.py founding --rows "${ROWS:-2000000}" --shards "${SHARDS:-32}" \
    --workers "${WORKERS:-14}" --sample-rows "${SAMPLE_ROWS:-40000}" 2>&1 \
  | grep --line-buffered -v "raylet\|WARNING\|core_worker.cc" | while IFS= read -r line; do echo "$(date +%T) $line"; done \
  | tee "$OUT/log.txt"
cp bench/out/s3_data_bench_founding.json "$OUT/" || true
for d in /tmp/ray-*/session_latest/logs/ray-data; do cp -r "$d" "$OUT/ray-data-logs" && break; done || true
cp bench/out/moto.log "$OUT/" 2>/dev/null || true
# What a tokenizer actor's constructor imports, alone and 12 at once (the fill's fixed cost on this host).
python3 - <<'PY' 2>&1 | tee -a "$OUT/log.txt"
import subprocess, sys, time
code = ("import time, sys; t = time.perf_counter(); from transformers import PreTrainedTokenizerFast; "
        "print(f'{time.perf_counter() - t:.2f}s torch={\"torch\" in sys.modules}')")
for n in (1, 12):
    t = time.perf_counter()
    procs = [subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True) for _ in range(n)]
    outs = [p.communicate()[0].strip() for p in procs]
    print(f"import PreTrainedTokenizerFast, {n} at once: {outs[:4]} wall {time.perf_counter() - t:.1f} s")
PY
