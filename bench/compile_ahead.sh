#!/usr/bin/env bash
# What a one-layer copy's first step, run ahead in a process of its own, saves the job's first step on a node whose
# compile cache is empty (issue 12's cold start; ray_jobs/train/compile_ahead.py). The 7B preset's layers, 2 of them (the
# kernels are keyed by one layer's shapes and the micro-batch, not by the layer count), random weights:
#   fresh:  the base's own first steps on an empty cache (what a fresh node's job does today);
#   ahead:  the one-layer copy's first step on an empty cache, then the base's first steps on what it left;
#   again:  the base's first steps once more on the same cache (the floor: nothing left to compile).
# Each is a new process with its own inductor and Triton caches. Prints one JSON line per process (AheadReport) with its
# wall time, and writes them to $OUT/compile_ahead.jsonl.
# Device call (from the repo root, after ../shared/device/make-bundle.sh):
#   carry: [".gpu"]   command: bash bench/compile_ahead.sh          (about 3 minutes)
set -euo pipefail
source .gpu/env.sh
export PYTHONPATH=$PWD:$PYTHONPATH
OUT=${OUT:-/tmp/bench-out}; mkdir -p "$OUT"
PRESET=${PRESET:-ray_jobs/presets/qlora_7b_1gpu.yaml}
python3 bench/make_random_llama.py /tmp/llama-2l --layers 2 2>&1 | tail -1
python3 - "$PRESET" <<'PY'
import json, sys
from rayft_contract.spec import FineTuneSpec
spec = FineTuneSpec.load(sys.argv[1], ["model.path=/tmp/llama-2l", "data.path=/tmp/unused.jsonl"])
open("/tmp/ahead-spec.json", "w").write(json.dumps(spec.to_dict()))
PY
run() {  # run SCENARIO LABEL [ARGS...]: one process on the scenario's own caches
  local scenario=$1 label=$2; shift 2
  local began; began=$(date +%s.%N)
  RAYFT_CACHE_DIR=/tmp/ahead-$scenario TRITON_CACHE_DIR=/tmp/ahead-$scenario/triton \
    python3 -m ray_jobs.train.compile_ahead /tmp/ahead-spec.json "$@" 2> "$OUT/$scenario-$label.err" | tail -1 > /tmp/line.json
  python3 - "$scenario" "$label" "$began" <<'PY' | tee -a "$OUT/compile_ahead.jsonl"
import json, sys, time
line = json.loads(open("/tmp/line.json").read())
print(json.dumps({"scenario": sys.argv[1], "process": sys.argv[2], "wall_s": round(time.time() - float(sys.argv[3]), 1), **line}))
PY
}
rm -rf /tmp/ahead-fresh /tmp/ahead-ahead
nvidia-smi --query-gpu=name,memory.used --format=csv,noheader
run fresh base --whole --steps 3
run ahead copy
run ahead base --whole --steps 3
run ahead again --whole --steps 3
python3 - "$OUT/compile_ahead.jsonl" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
print(f"{'scenario':8} {'process':6} {'wall s':>7} {'load s':>7} {'step 1 s':>9} {'step 2 s':>9} {'hits':>5} {'misses':>6}")
for r in rows:
    s = r["step_s"] + [None]
    print(f"{r['scenario']:8} {r['process']:6} {r['wall_s']:7.1f} {r['load_s']:7.1f} {s[0]:9.2f} {(s[1] or 0):9.2f} {r['cache_hits']:5} {r['cache_misses']:6}")
PY
