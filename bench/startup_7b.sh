#!/usr/bin/env bash
# Time to first step of the 7B QLoRA preset on a running cluster (issue 12), cold then warm: a Ray head
# started once per code tree (`ray start`, as a service's cluster runs), then `rayft train --address auto`
# RUNS times for STEPS steps. The first run fills the dataset cache (cold data; the model is in the page
# cache, as it was just written); later ones hit it (warm). Prints each run's phase table side by side.
#
# TREES="base:.base new:." compares code trees in one call, each with its own Ray head (the workers import
# the tree on the raylet's PYTHONPATH): `git archive REV | tar -x -C .base` here, then carry ".base" too.
# With DUMPS=1, py-spy samples the Ray Train processes' and the driver's stacks every half second during
# the second run of the last tree ($OUT/startup_dumps.txt): where start-up and export go, frame by frame.
# IMPORTS=1 first writes `python3 -X importtime` of what a training worker imports ($OUT/importtime.txt).
# WARM="0 0 1 1": the warm pool per run (RAYFT_WARM_WORKERS, ray_jobs/warm/pool.py), one word per run (RUNS follows
# it). After a run with the pool on, the script waits until the pool holds a worker whose imports are done (not
# timed: a team's next run comes minutes later), so the next run with it on takes that worker.
# EARLY="1 0 1": RAYFT_EARLY_WORKER per run (the job's own worker started at its connect, ray_jobs/warm/early.py;
# "-" leaves it unset, the default: on for one-GPU jobs). FILL="1 1 0": 1 removes the dataset cache before that run,
# so it fills again while the node keeps its compiled kernels (a new dataset on a node that ran jobs before).
# NODE="1 1 0": 1 makes that run a new node's first job: Ray stops, the node's caches go (datasets, models, compiled
# kernels, torch's and Triton's own), Ray starts again. With RAYFT_KERNELS_URI set (ray_jobs/train/kernel_store.py), the
# cluster's kernel store stays, as it would on shared storage.
# SPY="0 0 1": 1 makes py-spy record the warm worker (the pool's idle one, which takes the job) through that run, 50 samples
# a second, idle threads too: $OUT/<run>.warm_worker.speedscope.json (each thread's samples in order; bench/spy_phases.py
# says where the main thread's time went, second by second). With no pool, it records the job's early worker from the moment
# its process takes that name (its imports, its base's load and its first step): $OUT/<run>.early_worker.speedscope.json.
# RUNS is the longest of WARM, EARLY, FILL, NODE and SPY.
#
# Device call (from the repo root, after ../shared/device/make-bundle.sh):
#   carry: [".gpu"]   command: DUMPS=1 bash bench/startup_7b.sh        (about 5 minutes)
#   warm workers:     command: WARM="0 0 1 1 1" bash bench/startup_7b.sh   (Ray Train cold and warm, the pool made
#                     and standing down, then two jobs on warm workers; about 8 minutes)
#   early worker:     command: EARLY="- 0 - -" FILL="1 1 1 0" bash bench/startup_7b.sh   (a fresh node; a new dataset
#                     through Ray Train and through the early worker; a cached one; about 6 minutes)
#   kernel store:     command: RAYFT_KERNELS_URI=/tmp/kernel-store NODE="1 1 1 1" EARLY="- - - 0" bash bench/startup_7b.sh
#                     (four new nodes: the first compiles and keeps its kernels, the next take them; about 8 minutes)
#   kept ahead:       the same with KEEP=1 NODE="1 1": the operator keeps the preset's kernels first (compile_ahead --keep),
#                     so even the cluster's first job takes them (about 5 minutes)
#   a warm worker's first step, profiled: WARM="0 1 1 1" SPY="0 0 0 1" STEPS=4 (about 6 minutes on an H100)
#   an early worker's start and first step, profiled: SPY="0 1 0" STEPS=4 (a new dataset, then two runs that hit it)
# The device tool brings back 8 files of $OUT, and a run writes 3: pack them, as
#   R=$OUT; export OUT=/tmp/bo; mkdir -p $OUT; WARM="0 1 1" bash bench/startup_7b.sh; tar -czf $R/out.tgz -C $OUT .
set -euo pipefail
source .gpu/env.sh
export RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 RAY_AUTH_MODE=disabled RAY_TRAIN_V2_ENABLED=1 RAY_worker_niceness=0
OUT=${OUT:-/tmp/bench-out}; mkdir -p "$OUT"
STEPS=${STEPS:-3}; RUNS=${RUNS:-3}; TREES=${TREES:-new:.}
read -r -a warm <<< "${WARM:-}"; read -r -a early <<< "${EARLY:-}"; read -r -a fill <<< "${FILL:-}"
read -r -a node <<< "${NODE:-}"; read -r -a spy <<< "${SPY:-}"
for words in ${#warm[@]} ${#early[@]} ${#fill[@]} ${#node[@]} ${#spy[@]}; do [ "$words" -gt 0 ] && [ "$words" -gt "${most:-0}" ] && most=$words; done
RUNS=${most:-$RUNS}
PRESET=${PRESET:-ray_jobs/presets/qlora_7b_1gpu.yaml}
sets=(); for kv in "$@"; do sets+=(--set "$kv"); done
root=$PWD
ray() { python3 -m ray.scripts.scripts "$@"; }
pyspy=$(find /tmp/site -name py-spy -type f | head -1)

PYTHONPATH=$root:$PYTHONPATH python3 bench/make_random_llama.py /tmp/llama-7b 2>&1 | tail -1
[ -f /tmp/chat.jsonl ] || PYTHONPATH=$root:$PYTHONPATH python3 bench/make_chat_data.py /tmp/chat.jsonl --rows "${ROWS:-20000}"
if [ "${IMPORTS:-}" = 1 ]; then
  probe="import ray.train.torch, transformers; from transformers import AutoModelForCausalLM, BitsAndBytesConfig; import peft, bitsandbytes, liger_kernel.transformers"
  python3 -c "$probe"  # once to write the bytecode caches
  python3 -X importtime -c "$probe" 2> "$OUT/importtime.txt"
  sort -t'|' -k2 -n -r "$OUT/importtime.txt" | head -40 > "$OUT/importtime_top.txt" || true  # head ends the pipe early
fi
export RAYFT_CACHE_DIR=/tmp/startup-cache; rm -rf "$RAYFT_CACHE_DIR"
trap 'python3 -m ray.scripts.scripts stop --force >/dev/null 2>&1 || true' EXIT

names=()
for entry in $TREES; do
  label=${entry%%:*}; tree=$(cd "${entry#*:}" && pwd)
  start_head() {
    ray stop --force >/dev/null 2>&1 || true
    (cd "$tree" && PYTHONPATH=$tree:$PYTHONPATH ray start --head --node-ip-address=127.0.0.1 --num-gpus=1 \
        --include-dashboard=false --disable-usage-stats >/dev/null)
  }
  start_head
  if [ "${KEEP:-}" = 1 ]; then  # the operator keeps the preset's kernels in RAYFT_KERNELS_URI before any job
    SECONDS=0
    ahead=ray_jobs.train.compile_ahead; [ -f "$tree/ray_jobs/compile_ahead.py" ] && ahead=ray_jobs.compile_ahead  # a tree before 2026-12-04's layout
    (cd "$tree" && PYTHONPATH=$tree:$PYTHONPATH python3 -m "$ahead" "$PRESET" --set model.path=/tmp/llama-7b \
      --set data.path=/tmp/chat.jsonl "${sets[@]}" --keep --address auto 2>&1 | tail -1 | tee -a "$OUT/startup.log")
    echo "kept ahead (python -m $ahead --keep) in ${SECONDS} s" | tee -a "$OUT/startup.log"
  fi
  for run in $(seq 1 "$RUNS"); do
    if [ "${node[$((run - 1))]:-0}" = 1 ] && { [ "$run" -gt 1 ] || [ "${KEEP:-}" = 1 ]; }; then  # a new node
      ray stop --force >/dev/null 2>&1 || true
      rm -rf "$RAYFT_CACHE_DIR" /tmp/torchinductor_* ~/.triton/cache "${TRITON_CACHE_DIR:-/nonexistent}"
      start_head
    fi
    name="startup-$label-$run"; names+=("$name")
    if [ "${DUMPS:-}" = 1 ] && [ "$run" = 2 ] && [ "$entry" = "${TREES##* }" ]; then
      ( set +e; while true; do
          for pid in $(pgrep -f "ray::(RayTrainWorker|TrainController|_RayTrainWorker)|rayft train"); do
            echo "== $(date +%s.%N) pid $pid $(ps -o args= -p "$pid" | cut -c1-60)"
            timeout 5 "$pyspy" dump --pid "$pid" 2>&1 | head -30
          done
          sleep 0.5
        done ) > "$OUT/startup_dumps.txt" 2>&1 &
      dumper=$!
    fi
    [ "${fill[$((run - 1))]:-0}" = 1 ] && rm -rf "$RAYFT_CACHE_DIR/datasets"
    if [ "${early[$((run - 1))]:--}" = - ]; then unset RAYFT_EARLY_WORKER; else export RAYFT_EARLY_WORKER=${early[$((run - 1))]}; fi
    if [ "${spy[$((run - 1))]:-0}" = 1 ]; then
      warm_pid=$(pgrep -f "ray::WarmWorker" | head -1 || true)
      if [ -n "$warm_pid" ]; then
        "$pyspy" record --pid "$warm_pid" --rate 50 --idle --format speedscope --duration 120 \
          --output "$OUT/$name.warm_worker.speedscope.json" > "$OUT/$name.pyspy.log" 2>&1 &
        recorder=$!
      else  # no pool: the job's own early worker (a WarmWorker too) starts at its connect; record it once it is there
        ( for _ in $(seq 1 1200); do
            early_pid=$(pgrep -f "ray::WarmWorker" | head -1 || true)
            [ -n "$early_pid" ] && exec "$pyspy" record --pid "$early_pid" --rate 50 --idle --format speedscope \
              --duration 120 --output "$OUT/$name.early_worker.speedscope.json"
            sleep 0.05
          done; echo "$name: no early worker to record" ) > "$OUT/$name.pyspy.log" 2>&1 &
        recorder=$!
      fi
    fi
    SECONDS=0
    (cd "$tree" && RAYFT_WARM_WORKERS=${warm[$((run - 1))]:-0} PYTHONPATH=$tree:$PYTHONPATH python3 -m rayft train "$PRESET" --address auto --overwrite \
      --set name="$name" --set model.path=/tmp/llama-7b --set data.path=/tmp/chat.jsonl --set output.dir=/tmp/runs \
      --set train.max_steps="$STEPS" --set train.log_every=1 --set train.eval_every=null \
      --set train.checkpoint_every="$STEPS" --set data.val_fraction=0 "${sets[@]}" > "$OUT/$name.log" 2>&1) || echo "$name FAILED"
    echo "$name: rayft train wall ${SECONDS} s" | tee -a "$OUT/startup.log"
    [ -n "${dumper:-}" ] && { kill "$dumper" 2>/dev/null || true; unset dumper; }
    # py-spy writes what it sampled when interrupted (or when its worker ends, as a lent one does after its job)
    [ -n "${recorder:-}" ] && { kill -INT "$recorder" 2>/dev/null || true; wait "$recorder" || true; unset recorder; }
    cp "/tmp/runs/$name/summary.json" "$OUT/$name.summary.json" 2>/dev/null || tail -30 "$OUT/$name.log"
    # Each step's own phases (data wait, forward + backward, optimizer...): what the first step's extra seconds are.
    cp "/tmp/runs/$name/metrics.jsonl" "$OUT/$name.metrics.jsonl" 2>/dev/null || true
    if [ "${warm[$((run - 1))]:-0}" != 0 ]; then
      SECONDS=0; PYTHONPATH=$tree:$PYTHONPATH python3 bench/warm_ready.py 2>&1 | tail -1 | tee -a "$OUT/startup.log"
      echo "$name: the pool's worker ready ${SECONDS} s after the run" | tee -a "$OUT/startup.log"
    fi
  done
done

PYTHONPATH=$root:$PYTHONPATH python3 - "$OUT" "${names[@]}" <<'PY' | tee -a "$OUT/startup.log"
import json, sys
from pathlib import Path
from rayft_contract.phases import Phase
out, names = Path(sys.argv[1]), sys.argv[2:]
summaries = [json.loads(p.read_text()) if p.exists() else {} for p in (out / f"{n}.summary.json" for n in names)]
width = max(9, *(len(n) - 7 for n in names)) + 1
print(f"{'phase':52s}" + "".join(f"{n.removeprefix('startup-'):>{width}s}" for n in names))
for phase in Phase:
    values = [s.get("timing", {}).get("phases", {}).get(phase.value, 0.0) for s in summaries]
    if any(abs(v) >= 0.05 for v in values):
        print(f"{phase.label[:52]:52s}" + "".join(f"{v:{width}.1f}" for v in values))
rows = {
    "wall time": [s.get("wall_time_s") or 0 for s in summaries],
    "time to first step": [s.get("time_to_first_step_s") or 0 for s in summaries],
}
for label, values in rows.items():
    print(f"{label:52s}" + "".join(f"{v:{width}.1f}" for v in values))
print(f"{'dataset cache':52s}" + "".join(f"{('hit' if s.get('caches', {}).get('dataset', {}).get('hit') else 'miss'):>{width}s}" for s in summaries))
print(f"{'worker':52s}" + "".join(f"{(s.get('worker') or 'none').split(':')[0].split(',')[0][:width - 1]:>{width}s}" for s in summaries))
PY
