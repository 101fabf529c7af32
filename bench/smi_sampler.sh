# Sourced by the bench scripts that set a step's time beside the GPU's state (bench/gc_7b.sh, bench/host_7b.sh):
#   source bench/smi_sampler.sh; start_smi FILE     # then: kill "$smi_sampler" when the runs are over
# Samples the GPU's SM clock, power, temperature, active throttle reasons and utilization every 0.25 s, one line each:
# `epoch seconds, SM MHz, W, C, reasons, busy %` (what bench/gc_steps.py's --smi reads). Busy: nvidia-smi's share of
# its last sample period (1/6 s to 1 s) in which a kernel ran; under 100 in a step, the GPU sat idle in it. Stopped
# at the script's exit too.
start_smi() {
  local fields=timestamp,clocks.sm,power.draw,temperature.gpu,clocks_event_reasons.active,utilization.gpu
  # older drivers name the last field clocks_throttle_reasons
  nvidia-smi --query-gpu=$fields --format=csv,noheader,nounits > /dev/null 2>&1 || fields=${fields/clocks_event/clocks_throttle}
  ( while :; do echo "$(date +%s.%N), $(nvidia-smi --query-gpu=${fields#timestamp,} --format=csv,noheader,nounits)"; sleep 0.25
    done > "$1" ) &
  smi_sampler=$!
  trap 'kill $smi_sampler 2>/dev/null || true' EXIT
}
