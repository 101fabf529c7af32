#!/usr/bin/env bash
# The 7B QLoRA preset through `rayft train` on one lent H200, end to end, nothing downloaded:
# a random-weight Llama-2-7B-shaped model built on the GPU, a 20k-row chat dataset with realistic
# lengths, then ray_jobs/presets/qlora_7b_1gpu.yaml for STEPS steps. Results land in $OUT.
#
# Device call (from the repo root, after ../shared/device/make-bundle.sh):
#   carry: [".gpu"]   command: bash bench/qlora_7b.sh            (about 5 minutes)
# Extra `rayft train --set` overrides can follow: bash bench/qlora_7b.sh train.micro_batch_size=4
# With the torch.profiler cross-check: PROFILE=21:30 STEPS=40 bash bench/qlora_7b.sh
# RUN_NAME names the run (/tmp/runs/RUN_NAME; default: the preset's name), LOG_EVERY its report interval.
# TRAIN_FLAGS go to `rayft train` as they are: TRAIN_FLAGS="--cap-gpu-memory 40" runs as a 40 GB GPU would.
# CHECK_ONLY=1 checks the spec and its overrides and stops (no GPU needed; PY names the Python, python3 by default).
set -euo pipefail
[ -n "${CHECK_ONLY:-}" ] || source .gpu/env.sh
export PYTHONPATH=$PWD:${PYTHONPATH:-}
PRESET=${PRESET:-ray_jobs/presets/qlora_7b_1gpu.yaml}
# The spec with its overrides, checked before the model and data are built: a refused one costs a second, not a call.
"${PY:-python3}" -c 'import sys; from rayft_contract.spec import FineTuneSpec; FineTuneSpec.load(sys.argv[1], sys.argv[2:])' "$PRESET" "$@"
[ -z "${CHECK_ONLY:-}" ] || exit 0
OUT=${OUT:-/tmp/bench-out}; mkdir -p "$OUT"
STEPS=${STEPS:-30}
sets=(); for kv in "$@"; do sets+=(--set "$kv"); done

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/train.log"
python3 -c "import sys, torch, transformers, peft, ray, bitsandbytes as b; print(sys.version.split()[0], 'torch', torch.__version__, 'transformers', transformers.__version__, 'peft', peft.__version__, 'ray', ray.__version__, 'bnb', b.__version__)" | tee -a "$OUT/train.log"
python3 bench/make_random_llama.py /tmp/llama-7b 2>&1 | tail -3
# PROFILE=A:B runs torch.profiler over steps A..B on rank 0 (ray_jobs/observe/torch_trace.py), an independent
# check of the job's own phase timing (bench/compare_profile.py).
export RAYFT_TORCH_PROFILE=${PROFILE:-}
[ -f /tmp/chat.jsonl ] || python3 bench/make_chat_data.py /tmp/chat.jsonl --rows "${ROWS:-20000}"

name=${RUN_NAME:-$(python3 -c "import yaml,sys; print(yaml.safe_load(open(sys.argv[1]))['name'])" "$PRESET")}
SECONDS=0
python3 -m rayft train "$PRESET" --overwrite \
  --set name="$name" --set model.path=/tmp/llama-7b --set data.path=/tmp/chat.jsonl --set output.dir=/tmp/runs \
  --set train.max_steps="$STEPS" --set train.log_every="${LOG_EVERY:-5}" --set train.eval_every=null \
  --set train.checkpoint_every="$STEPS" --set data.val_fraction=0 "${sets[@]}" ${TRAIN_FLAGS:-} 2>&1 | tee -a "$OUT/train.log"
echo "rayft train wall: ${SECONDS} s" | tee -a "$OUT/train.log"
cp "/tmp/runs/$name/summary.json" "/tmp/runs/$name/metrics.jsonl" "/tmp/runs/$name/report.png" "$OUT/"
if [ -n "${PROFILE:-}" ]; then
  cp "/tmp/runs/$name/torch_profile.json" "$OUT/"
  python3 bench/compare_profile.py "/tmp/runs/$name" | tee -a "$OUT/train.log"
fi
python3 - "$OUT/metrics.jsonl" <<'PY'
import json, sys
from rayft_contract.records import Progress
reports = [Progress.from_dict(e) for e in map(json.loads, open(sys.argv[1])) if e["kind"] == "progress"]
print("step  loss    tokens/s  step_s  data_wait  peak_GiB")
for r in (r for r in reports if r.trained):
    print(f"{r.step:4d}  {r.loss:.3f}  {r.tokens_per_s or 0:8.0f}  {r.step_time_s or 0:6.2f}  {r.data_wait_frac or 0:9.3f}  {r.gpu_mem_peak_gb or 0:7.1f}")
PY
