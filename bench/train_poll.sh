#!/usr/bin/env bash
# Ray Train's poll interval on a running cluster, on this CPU machine: a Ray head started once (`ray start`, as
# a service's cluster runs), then the tiny preset through `rayft train --address auto` for 8 steps, reporting
# every step, with the controller polling every 2 s (Ray's default: what a driver on a running cluster got
# before ray_jobs.local_ray.train_settings) and every 0.25 s (rayft's), twice each after one warm-up run.
# Needs the tiny assets (`make demo` writes them to .rayft/tiny). Stops every Ray process on the machine.
#   bash bench/train_poll.sh        (about 4 minutes)
set -uo pipefail
cd "$(dirname "$0")/.."
export RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 RAY_AUTH_MODE=disabled RAY_worker_niceness=0 RAY_USAGE_STATS_ENABLED=0
RAY=".venv/bin/ray"
$RAY stop --force >/dev/null 2>&1
$RAY start --head --node-ip-address=127.0.0.1 --num-cpus=4 --include-dashboard=false --disable-usage-stats >/dev/null
for variant in warmup 2.0 0.25 2.0 0.25; do
  name="poll-$variant-$RANDOM"
  if [ $variant = warmup ]; then export -n RAY_TRAIN_HEALTH_CHECK_INTERVAL_S; unset RAY_TRAIN_HEALTH_CHECK_INTERVAL_S
  else export RAY_TRAIN_HEALTH_CHECK_INTERVAL_S=$variant; fi
  SECONDS=0
  .venv/bin/rayft train ray_jobs/presets/tiny_cpu.yaml --address auto --overwrite --set name=$name --set output.dir=/tmp/exp-runs \
    --set train.max_steps=8 --set train.log_every=1 --set train.eval_every=null --set train.checkpoint_every=8 --set data.val_fraction=0 > /tmp/$name.log 2>&1 || echo "$name FAILED"
  .venv/bin/python -c "
import json; s=json.load(open('/tmp/exp-runs/$name/summary.json')); p=s['timing']['phases']
print('$variant', 'wall %.1f ttfs %.1f' % (s['wall_time_s'], s['time_to_first_step_s']), ' '.join(f'{k}={v:.1f}' for k,v in p.items() if abs(v)>=0.1))"
done
$RAY stop --force >/dev/null 2>&1
