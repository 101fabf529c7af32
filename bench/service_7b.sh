#!/usr/bin/env bash
# The 7B QLoRA preset through the service on one lent GPU, as a team runs it (issue 12): a Ray head with its Jobs API
# (`ray start`, as the platform's cluster runs), `rayft serve` pointed at it with auth on, a path policy and the warm
# pool (RAYFT_WARM_WORKERS=1), a team's token, then bench/service_submit.py submits the preset RUNS times and follows
# each job's events: seconds from CreateJob to the job driver's start, to the first step's report, to SUCCEEDED,
# and the job's own phase table. Run 1 fills the dataset cache and runs on Ray Train (the pool is made after it);
# the later runs take the pool's warm worker, waited for between runs (not timed: a team's next run comes later).
# The issue's figures through the service (2026-11-30, one H200): 94 s to the first step, 187 s to SUCCEEDED, 12 steps.
#
# Device call (from the repo root; the service needs ray[default]'s dashboard packages and py-spy is not needed):
#   WITH_SERVICE=1 ../shared/device/make-bundle.sh      (once here; writes .gpu/)
#   carry: [".gpu"]   command: bash bench/service_7b.sh   (about 6 minutes on an H100)
# WARM=0 keeps no pool (every run on Ray Train); RUNS (3), STEPS (12); extra `--set` overrides follow as arguments.
# EACH="quantization.cache=true,false" sets one field per run in turn (run 1 true, run 2 false, run 3 true...): an A/B
# on one host, interleaved.
# TINY=1 checks the script here, on CPU: the tiny model and data (ray_jobs/tiny.py), the tiny preset on one worker.
set -euo pipefail
OUT=${OUT:-/tmp/bench-out}; mkdir -p "$OUT"
RUNS=${RUNS:-3}; STEPS=${STEPS:-12}
PY=python3
export RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 RAY_AUTH_MODE=disabled RAY_TRAIN_V2_ENABLED=1 RAY_worker_niceness=0
if [ "${TINY:-}" = 1 ]; then
  PY=.venv/bin/python
  export PYTHONPATH=$PWD RAYFT_CACHE_DIR=/tmp/service-bench-cache
  model=/tmp/service-bench-tiny/model data=/tmp/service-bench-tiny/train.jsonl resources="--num-cpus=4"
  PRESET=${PRESET:-ray_jobs/presets/tiny_cpu.yaml}; set -- scaling.num_workers=1 "$@"
  "$PY" -m ray_jobs.tiny /tmp/service-bench-tiny > /dev/null 2>&1
  echo "CPU: $(nproc) cores" | tee "$OUT/service.log"
else
  source .gpu/env.sh
  export PYTHONPATH=$PWD:$PYTHONPATH
  model=/tmp/llama-7b data=/tmp/chat.jsonl resources="--num-gpus=1"
  PRESET=${PRESET:-ray_jobs/presets/qlora_7b_1gpu.yaml}
  nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee "$OUT/service.log"
  "$PY" bench/make_random_llama.py $model 2>&1 | tail -1
  [ -f $data ] || "$PY" bench/make_chat_data.py $data --rows "${ROWS:-20000}"
fi
sets=(); for kv in "$@"; do sets+=(--set "$kv"); done
ray() { "$PY" -m ray.scripts.scripts "$@"; }

trap 'kill "${serve_pid:-0}" 2>/dev/null || true; ray stop --force >/dev/null 2>&1 || true' EXIT
ray stop --force >/dev/null 2>&1 || true
ray start --head --node-ip-address=127.0.0.1 $resources --include-dashboard=true --dashboard-host=127.0.0.1 \
  --disable-usage-stats >/dev/null
# A team may read the model and data the bench wrote, and writes under its own root (service/policy.py).
cat > /tmp/policy.yaml <<YAML
default:
  output_root: "/tmp/rayft-out/{team}"
  data: [$data]
  models: [$model]
YAML
export RAYFT_DATA_DIR=/tmp/rayft-service RAYFT_WARM_WORKERS=${WARM:-1}
rm -rf "$RAYFT_DATA_DIR"
RAYFT_TOKEN=$("$PY" -m rayft token create --team bench 2>/dev/null); export RAYFT_TOKEN  # the store, made here
"$PY" -m rayft serve --ray-address http://127.0.0.1:8265 --policy /tmp/policy.yaml > "$OUT/serve.log" 2>&1 &
serve_pid=$!
for _ in $(seq 90); do  # until the service answers a team's call (this one: not one left on the port from before)
  kill -0 $serve_pid 2>/dev/null || { echo "rayft serve exited:"; tail -20 "$OUT/serve.log"; exit 1; }
  "$PY" -c 'from rayft.client import Client; next(iter(Client().list()), None)' 2>/dev/null && break; sleep 1
done

wait_s=300; [ "${WARM:-1}" = 0 ] && wait_s=0  # no pool to wait for
"$PY" -u bench/service_submit.py "$PRESET" --runs "$RUNS" --warm-wait $wait_s --out "$OUT/service_runs.json" \
  --set model.path=$model --set data.path=$data --set train.max_steps="$STEPS" \
  --set train.log_every=1 --set train.eval_every=null --set train.checkpoint_every="$STEPS" --set data.val_fraction=0 \
  "${sets[@]}" ${EACH:+--each "$EACH"} 2>&1 | tee -a "$OUT/service.log" || { echo "FAILED: the serve log's tail:"; tail -40 "$OUT/serve.log"; }
# Ray's own times of each job (the driver's start and end; SUCCEEDED follows the end by up to the service's poll) and
# the last lines of each driver's log: what the time from the summary to SUCCEEDED is spent on.
"$PY" - "$OUT" <<'PY' | tee -a "$OUT/service.log"
import json, re, sys
from datetime import datetime
from ray.job_submission import JobSubmissionClient
client = JobSubmissionClient("http://127.0.0.1:8265")
runs = json.load(open(f"{sys.argv[1]}/service_runs.json"))
for run in runs:
    info = client.get_job_info(run["job_id"])
    at = run["submitted_at"]
    began, ended = (info.start_time or 0) / 1000 - at, (info.end_time or 0) / 1000 - at
    print(f"{run['name']}: Ray's job {began:.1f} s to {ended:.1f} s after CreateJob, {info.status}; the driver's log:")
    lines = client.get_job_logs(run["job_id"]).splitlines()
    for line in [*[line for line in lines if "claimed" in line], "...", *lines[-2:]]:
        stamp = re.match(r"(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+)", line)
        at_s = f"{datetime.strptime(stamp[1], '%Y-%m-%d %H:%M:%S,%f').timestamp() - at:6.1f} s " if stamp else " " * 9
        print(f"  {at_s}{line[:150]}")
PY
