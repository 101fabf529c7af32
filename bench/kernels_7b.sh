#!/usr/bin/env bash
# The kernel lever on one lent H200: the 7B QLoRA preset (bench/qlora_7b.sh: random-weight Llama-2-7B,
# 20k chat rows of realistic lengths) with and without Liger's fused kernels, at equal data and steps,
# then bench/compare_runs.py's table (tokens/s, MFU, peak memory, time to first step, data wait, the
# loss difference at each step) and plot. First, if GPU_TESTS=1, the gpu-marked tests.
#
# Device call (from the repo root, after GPU_EXTRA="pytest pluggy iniconfig pytest-timeout" ../shared/device/make-bundle.sh):
#   carry: [".gpu"]   command: GPU_TESTS=1 bash bench/kernels_7b.sh none:8 liger:8      (about 8 minutes)
#   then, while the machine is warm:   bash bench/kernels_7b.sh liger:16                (about 3 minutes)
# Each argument is KERNELS:MICRO_BATCH[:LEVER...] (global batch stays the preset's 32, so every run trains the
# same rows per step). Levers: `compile` (model.compile=true), `fused` (lora.fused=true, the default now), `peft`
# (lora.fused=false, PEFT's own LoRA forward), `sdpa` (model.attn_implementation=sdpa, the attention before flex),
# `qcache` (quantization.cache=true: the first such run keeps the NF4 base in the node's cache, the next reads it; the
# preset's default since the thirty-third session), `noqcache` (quantization.cache=false: every load quantizes), `fp8`
# (quantization.fp8=true: the frozen base's matmuls in FP8, the preset's default since the seventh session), `bf16`
# (quantization.fp8=false: every matmul in bf16). `peft` turns FP8 off too: FP8 rides on lora.fused. Runs accumulate in /tmp/runs across calls on a warm
# machine; the table covers all of them. GPU_TESTS=1 runs every gpu test first; GPU_TESTS=WORD only those whose
# names hold WORD (pytest -k).
# The compile lever:   carry: [".gpu"]   command: GPU_TESTS=compiled bash bench/kernels_7b.sh liger:8:sdpa liger:8:sdpa:compile
# The LoRA lever:      carry: [".gpu"]   command: GPU_TESTS=fused bash bench/kernels_7b.sh liger:8:peft liger:8
#   (measured 2026-12-03 as `liger:8 liger:8:fused`, before lora.fused became the default)
# FP8 base matmuls (quantization.fp8):   carry: [".gpu"]   command: GPU_TESTS=fp8 bash bench/kernels_7b.sh liger:8:bf16 liger:8:fp8
#   (measured 2026-12-03 as `liger:8 liger:8:fp8`, when bf16 was the preset's default; the loss over 90 steps: one call per
#   run, `STEPS=90 bash bench/kernels_7b.sh liger:8:bf16`, then `... liger:8:fp8` on the same warm machine)
# The quantized base's cache (model load: quantize, keep, read):   carry: [".gpu"]
#   command: GPU_TESTS=quantized bash bench/kernels_7b.sh liger:8:noqcache liger:8:qcache liger:8:qcache:again
set -euo pipefail
source .gpu/env.sh
export PYTHONPATH=$PWD:$PYTHONPATH
OUT=${OUT:-/tmp/bench-out}; mkdir -p "$OUT"
export STEPS=${STEPS:-12} LOG_EVERY=1
export TORCH_LOGS=${TORCH_LOGS:-recompiles}  # each torch.compile recompile and its reason, in each run's train log
if [ -n "${GPU_TESTS:-}" ]; then
  only=(); [ "$GPU_TESTS" != 1 ] && only=(-k "$GPU_TESTS")
  python3 -m pytest tests/gpu -m gpu -q -p no:cacheprovider "${only[@]}" 2>&1 | tee "$OUT/gpu_tests.log" || true
fi
declare -A LEVERS=([compile]="model.compile=true" [fused]="lora.fused=true" [peft]="lora.fused=false quantization.fp8=false"
                   [sdpa]="model.attn_implementation=sdpa" [qcache]="quantization.cache=true" [noqcache]="quantization.cache=false"
                   [fp8]="quantization.fp8=true"
                   [bf16]="quantization.fp8=false" [again]="")
for variant in "$@"; do
  IFS=: read -r kern mb levers <<< "$variant"
  sets=(model.kernels="$kern" train.micro_batch_size="$mb"); suffix=""
  for lever in ${levers//:/ }; do
    [ -n "${LEVERS[$lever]+set}" ] || { echo "unknown lever $lever (compile, fused, peft, sdpa, qcache, noqcache, fp8, bf16, again)"; exit 2; }
    for kv in ${LEVERS[$lever]}; do sets+=("$kv"); done
    suffix+="-$lever"
  done
  echo "== $variant: ${sets[*]}" | tee -a "$OUT/runs.log"
  RUN_NAME="k-$kern-mb$mb$suffix" OUT="/tmp/bench-runs/$kern-$mb$suffix" bash bench/qlora_7b.sh "${sets[@]}" \
    2>&1 | tail -25 | tee -a "$OUT/runs.log" || echo "FAILED: $variant" | tee -a "$OUT/runs.log"
  cp "/tmp/bench-runs/$kern-$mb$suffix/train.log" "$OUT/train-$kern-$mb$suffix.log" 2>/dev/null || true
  # The workers' stderr stays in the run's Ray session logs (ray_jobs.local_ray: /tmp/ray-*), not in train.log.
  session=$(ls -dt /tmp/ray-*/session_2* 2>/dev/null | head -1)
  grep -h "Recompiling\|recompil" "$session"/logs/worker-*.err 2>/dev/null | head -40 > "$OUT/recompiles-$kern-$mb$suffix.log" || true
  echo "$variant: $(grep -c 'Recompiling' "$OUT/recompiles-$kern-$mb$suffix.log") recompiles (in $session)" | tee -a "$OUT/runs.log"
done
pairs=(); for d in /tmp/runs/k-none-* /tmp/runs/k-liger-*; do [ -f "$d/summary.json" ] && pairs+=("${d##*/k-}=$d"); done
python3 bench/compare_runs.py "$OUT/kernels_7b.png" "${pairs[@]}" | tee "$OUT/compare.md"
tar -czf "$OUT/runs.tar.gz" -C /tmp/runs $(cd /tmp/runs && ls -d k-*/summary.json k-*/metrics.jsonl k-*/report.png 2>/dev/null)
