"""A finished job's summary (``summary.json``): what it trained, how fast, where the time went, and why.

Built on the driver from the events it forwarded and the :class:`~ray_jobs.profile.JobProfile`; read by
the CLI, the service (``Job.summary_json``), ``report.png`` and TensorBoard.
"""

from __future__ import annotations

import time
from typing import Any

from ray_jobs.diagnosis import diagnose, verdict
from ray_jobs.profile import JobProfile
from rayft_contract.spec import FineTuneSpec


def summarize(spec: FineTuneSpec, history: list[dict[str, Any]], profile: JobProfile, adapter_dir: str) -> dict[str, Any]:
    progress = [e for e in history if e["kind"] == "progress"]
    trained = [e for e in progress if "loss" in e]
    evals = [e["eval_loss"] for e in progress if "eval_loss" in e]
    answered = [e for e in progress if e.get("eval_samples")]
    last = trained[-1] if trained else {}
    wall = time.time() - profile.start
    efficiency = profile.efficiency()
    findings = diagnose(profile, spec, wall)
    return {
        "name": spec.name,
        "steps": last.get("step", 0),
        "tokens": last.get("tokens", 0),
        "samples": last.get("samples", 0),
        "final_loss": last.get("loss"),
        "initial_eval_loss": evals[0] if evals else None,
        "eval_loss": evals[-1] if evals else None,
        "best_step": last.get("best_step"),
        "best_eval_loss": last.get("best_eval_loss"),
        "stopped_early": last.get("stopped_early"),
        "eval_samples": {
            "first_step": answered[0]["step"],
            "last_step": answered[-1]["step"],
            "first": answered[0]["eval_samples"],
            "last": answered[-1]["eval_samples"],
        }
        if answered
        else None,
        "wall_time_s": wall,
        "time_to_first_step_s": last.get("time_to_first_step_s"),
        "tokens_per_s": last.get("tokens", 0) / wall,
        "steady_tokens_per_s": efficiency["tokens_per_s"],
        "mfu": efficiency["mfu"],
        "gpu_mem_peak_gb": last.get("gpu_mem_peak_gb"),
        "layout": last.get("layout"),
        "quantized_layers": last.get("quantized_layers"),
        "kernels": last.get("kernels"),
        "micro_batch": last.get("micro_batch"),
        "restarts": sum(e["kind"] == "failure" for e in history),
        "reported_steps": [e["step"] for e in trained],
        "timing": {"phases": profile.breakdown(wall), "warmup_steps": profile.warmup_steps()},
        "efficiency": efficiency,
        "diagnosis": [f.to_dict() for f in findings],
        "bottleneck": findings[0].kind if findings else None,
        "verdict": verdict(findings),
        "adapter_dir": adapter_dir,
        "spec": spec.to_dict(),
    }
