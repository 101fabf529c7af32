"""Name the bottleneck, and the fix, from a job's profile.

Each rule looks at one figure and fires past a threshold; the message says what was measured and
what to change, in the spec's own field names. The finding that costs the most time is the job's
bottleneck; a job with no finding is compute-bound, and says so without an alarm.

| kind              | fires when                                                        |
|-------------------|-------------------------------------------------------------------|
| `data_bound`      | waiting for data >= 10% of steady step time (its longest wait left out) |
| `slow_checkpoint` | periodic checkpoint saves >= 5% of the training loop's time       |
| `padding`         | padding >= 30% of the tokens the model ran on                     |
| `warmup`          | warm-up steps >= 2x slower than steady, costing >= 10% of training and >= 3% of wall time |
| `grad_checkpointing` | gradient checkpointing on with >= 40% of GPU memory unused     |
| `slow_eval`       | evaluation (the baseline included) >= 15% of the job's wall time  |

Each rule compares a run with itself, never with a fixed number of seconds, so the same healthy job
gets the same verdict on an idle GPU host and on a busy 2-core laptop:

- one data stall is a hiccup (a busy moment, a GC pause), not a pipeline that cannot keep up, so the
  longest wait is left out;
- the final save happens at any ``train.checkpoint_every``, so only the periodic saves, which that field
  controls, count, and they are weighed against the loop's time, not a start-up-dominated wall time;
- warm-up is judged against the run's own step-to-step noise (``ray_jobs.observe.profile``), and must cost a
  share of the job's wall time a user would notice: a tiny run trains for 2 s, so on 2 cores the first
  steps sharing the CPU with the workers' data reads (0.2 s in all, 2.4x slower) were "10% of
  training" while being 0.5% of the job.
"""

from __future__ import annotations

from ray_jobs.observe.profile import JobProfile
from rayft_contract.phases import Phase
from rayft_contract.records import Finding
from rayft_contract.spec import FineTuneSpec

DATA_WAIT_FRAC = 0.10
CHECKPOINT_FRAC = 0.05
PADDING_FRAC = 0.30
WARMUP_SLOWDOWN = 2.0
WARMUP_COST_FRAC = 0.10
WARMUP_WALL_FRAC = 0.03
FREE_MEMORY_FRAC = 0.40
EVAL_FRAC = 0.15
KINDS = ("data_bound", "slow_checkpoint", "padding", "warmup", "grad_checkpointing", "slow_eval")
"""Every kind of finding, in the order the rules run (the proto's ``Diagnosis.kind`` comment names them all)."""


def diagnose(profile: JobProfile, spec: FineTuneSpec, wall: float) -> list[Finding]:
    """The findings, most costly first (empty: no bottleneck beyond the GPU itself)."""
    if not profile.steps:
        return []
    rows = profile.breakdown(wall)
    eff = profile.efficiency()
    steady = profile.steady()
    step_wall = sum(s.wall for s in steady) or 1e-9
    findings = []

    waits = sorted(s.seconds(Phase.DATA_WAIT) for s in steady)
    wait = sum(waits[:-1])  # one stall is a hiccup, not a bottleneck
    if wait / step_wall >= DATA_WAIT_FRAC:
        fix = (
            f"raise data.tokenize_workers (now {spec.data.tokenize_workers}) or turn data.cache on, so tokenization runs once ahead of training"
            if not spec.data.cache
            else f"raise data.prefetch_batches (now {spec.data.prefetch_batches}) or give the trainers more CPUs (scaling.cpus_per_worker)"
        )
        findings.append(
            Finding("data_bound", f"data wait is {wait / step_wall:.0%} of step time: the GPU waits for batches; {fix}", wait)
        )

    # A save is the step's copy (checkpoint) and any later step's wait for its background write (checkpoint_wait).
    periodic = [s for s in profile.steps if s.step != profile.total_steps]
    saves = sum(s.seconds(Phase.CHECKPOINT) + s.seconds(Phase.CHECKPOINT_WAIT) for s in periodic)
    count = sum(1 for s in periodic if s.seconds(Phase.CHECKPOINT))
    loop_time = profile.training_time() or 1e-9
    if saves / loop_time >= CHECKPOINT_FRAC:
        findings.append(
            Finding(
                "slow_checkpoint",
                f"checkpoint saves take {saves / loop_time:.0%} of training time ({count} saves, {saves / max(count, 1):.1f} s each): "
                f"raise train.checkpoint_every (now {spec.train.checkpoint_every}) to save less often",
                saves,
            )
        )

    if eff.padding_frac >= PADDING_FRAC:
        fix = (
            "turn data.packing on to fill rows with whole examples"
            if not spec.data.packing
            else "lower data.max_seq_len toward your longest examples, or train.micro_batch_size"
        )
        cost = eff.padding_frac * step_wall
        findings.append(Finding("padding", f"{eff.padding_frac:.0%} of the tokens the model runs on are padding: {fix}", cost))

    k = profile.warmup_steps()
    slowdown = profile.warmup_slowdown()
    train_time = sum(s.wall for s in profile.steps)
    warmup_extra = rows["warmup_steps"] - k * eff.step_time_s if k else 0.0
    material = warmup_extra / train_time >= WARMUP_COST_FRAC and warmup_extra / wall >= WARMUP_WALL_FRAC
    if k and slowdown >= WARMUP_SLOWDOWN and material:
        findings.append(
            Finding(
                "warmup",
                f"the first {k} steps ran {slowdown:.1f}x slower than steady state (compile or warm-up), "
                f"{warmup_extra:.1f} s in all: tokens/s and MFU leave them out; judge speed on steady state, "
                "and run long enough that warm-up is a small share",
                warmup_extra,
            )
        )

    evals = rows["first_eval"] + sum(s.seconds(Phase.EVAL) for s in profile.steps)
    count = (rows["first_eval"] > 0) + sum(1 for s in profile.steps if s.seconds(Phase.EVAL))
    if evals / wall >= EVAL_FRAC:
        findings.append(
            Finding(
                "slow_eval",
                f"evaluation takes {evals / wall:.0%} of wall time ({count} passes, {evals / max(count, 1):.1f} s each): raise "
                f"train.eval_every (now {spec.train.eval_every}) or "
                + (
                    "use a smaller data.val_path set"
                    if spec.data.val_path
                    else f"lower data.val_fraction (now {spec.data.val_fraction})"
                ),
                evals,
            )
        )

    peak, total = eff.gpu_mem_peak_gb, eff.gpu_mem_total_gb
    shape = profile.facts.model_shape
    if shape and shape.gradient_checkpointing and peak and total and 1 - peak / total >= FREE_MEMORY_FRAC:
        findings.append(
            Finding(
                "grad_checkpointing",
                f"gradient checkpointing is on with {1 - peak / total:.0%} of GPU memory free: set "
                "train.gradient_checkpointing false for about 30% more speed",
                0.25 * step_wall,
            )
        )
    return sorted(findings, key=lambda f: -f.cost_s)


def verdict(findings: list[Finding]) -> str:
    """One line for the summary: the bottleneck, or that there is none."""
    if not findings:
        return "no bottleneck found: steps are compute-bound"
    return f"bottleneck: {findings[0].kind}: {findings[0].message}"
