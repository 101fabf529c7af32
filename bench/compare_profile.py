"""Set a job's own phase timing beside torch.profiler's view of the same steps.

    python3 bench/compare_profile.py RUN_DIR        # needs RAYFT_TORCH_PROFILE=A:B during the run

Compares, over the profiled window: (1) the steps' wall time from the job's step records with the
profiler's span from the window's first GPU kernel to its last, and (2) the job's GPU phases
(host-to-device, forward/backward, optimizer; CUDA events) with the time GPU kernels ran.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout, like the other bench scripts
from rayft_contract.phases import Phase  # noqa: E402
from rayft_contract.records import StepRecord  # noqa: E402


def main(run_dir: Path) -> dict:
    prof = json.loads((run_dir / "torch_profile.json").read_text())
    window = range(prof["first_step"], prof["last_step"] + 1)
    steps = {}
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        for s in map(StepRecord.from_dict, json.loads(line).get("step_timing", [])):
            steps[s.step] = s  # a resumed step replaces its first attempt
    ours = [steps[i] for i in window if i in steps]
    our_wall = sum(s.wall - s.seconds(Phase.PROFILER) for s in ours)
    our_gpu = sum(s.seconds(p) for s in ours for p in (Phase.H2D, Phase.FORWARD_BACKWARD, Phase.OPTIMIZER))
    out = {
        "steps": len(ours),
        "window_s": {"rayft (step records)": our_wall, "torch.profiler (first to last kernel)": prof["kernel_span_s"]},
        "gpu_busy_s": {
            "rayft (CUDA events: h2d + forward/backward + optimizer)": our_gpu,
            "torch.profiler (kernel time)": prof["kernel_busy_s"],
        },
        "window_diff": our_wall / prof["kernel_span_s"] - 1,
        "gpu_diff": our_gpu / prof["kernel_busy_s"] - 1,
    }
    print(json.dumps(out, indent=2))
    return out


if __name__ == "__main__":
    main(Path(sys.argv[1]))
