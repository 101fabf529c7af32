"""A finished job's summary (``summary.json``): what it trained, how fast, where the time went, and why.

Built on the driver from the reports it forwarded and the :class:`~ray_jobs.observe.profile.JobProfile`, as a
:class:`~rayft_contract.records.JobSummary`; read by the CLI, the service (``Job.summary_json``),
``report.png`` and the trackers.
"""

from __future__ import annotations

import time

from ray_jobs.observe.diagnosis import diagnose, verdict
from ray_jobs.observe.profile import JobProfile
from ray_jobs.train.model import serving_notes
from rayft_contract.data_records import Caches, DataQuality
from rayft_contract.records import JobSummary, Progress, SamplesAt, Timing
from rayft_contract.spec import FineTuneSpec


def summarize(
    spec: FineTuneSpec,
    reports: list[Progress],
    restarts: int,
    profile: JobProfile,
    adapter_dir: str,
    caches: Caches,
    quality: DataQuality,
) -> JobSummary:
    """``reports``: rank 0's progress reports in order (a resumed run repeats the steps after its checkpoint)."""
    trained = [r for r in reports if r.trained]
    evals = [r.eval_loss for r in reports if r.eval_loss is not None]
    accuracies = [r.eval_token_accuracy for r in reports if r.eval_token_accuracy is not None]
    answered = [r for r in reports if r.eval_samples]
    last = trained[-1] if trained else Progress(0, 0)
    facts = last.facts
    wall = time.time() - profile.start
    efficiency = profile.efficiency()
    findings = diagnose(profile, spec, wall)
    return JobSummary(
        name=spec.name,
        steps=last.step,
        tokens=last.tokens,
        samples=last.samples,
        final_loss=last.loss,
        initial_eval_loss=evals[0] if evals else None,
        eval_loss=evals[-1] if evals else None,
        initial_eval_token_accuracy=accuracies[0] if accuracies else None,
        eval_token_accuracy=accuracies[-1] if accuracies else None,
        best_step=last.best_step,
        adapter_step=(last.best_step or last.step) if spec.output.adapter == "best" else last.step,
        best_eval_loss=last.best_eval_loss,
        stopped_early=last.stopped_early,
        eval_samples=SamplesAt(answered[0].step, answered[-1].step, answered[0].eval_samples, answered[-1].eval_samples)
        if answered
        else None,
        wall_time_s=wall,
        time_to_first_step_s=last.time_to_first_step_s,
        tokens_per_s=last.tokens / wall,
        steady_tokens_per_s=efficiency.tokens_per_s,
        mfu=efficiency.mfu,
        gpu_mem_peak_gb=last.gpu_mem_peak_gb,
        layout=facts.layout if facts else None,
        quantized_layers=facts.quantized_layers if facts else None,
        kernels=facts.kernels if facts else None,
        attention=facts.attention or None if facts else None,
        quantized_base=facts.quantized_base or None if facts else None,
        micro_batch=facts.micro_batch if facts else None,
        worker=facts.worker or None if facts else None,
        restarts=restarts,
        reported_steps=tuple(r.step for r in trained),
        timing=Timing(profile.breakdown(wall), profile.warmup_steps()),
        efficiency=efficiency,
        diagnosis=tuple(findings),
        bottleneck=findings[0].kind if findings else None,
        verdict=verdict(findings),
        adapter_dir=adapter_dir,
        adapter_notes=serving_notes(spec.lora),
        caches=caches,
        data_quality=quality,
        spec=spec.to_dict(),
    )
