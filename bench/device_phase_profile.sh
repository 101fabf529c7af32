#!/usr/bin/env bash
# One device call for the profiling issue: the 7B QLoRA job with torch.profiler over a window
# (bench/qlora_7b.sh + bench/compare_profile.py), then the data pipeline benchmark on 16 cores.
#   carry: [".gpu"]   command: bash bench/device_phase_profile.sh        (about 8 minutes)
set -uo pipefail
export PYTHONUNBUFFERED=1
STEPS=${STEPS:-24} PROFILE=${PROFILE:-15:18} bash bench/qlora_7b.sh 2>&1 | grep -v "raylet\|WARNING\|core_worker" | tail -60
ROWS=${ROWS:-20000} WORKERS=${WORKERS:-1,4,8,14} bash bench/data_device.sh 2>&1 | tail -8
