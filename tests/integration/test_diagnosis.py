"""Each injected bottleneck is named as the bottleneck; a healthy run raises no alarm; the phases add up.

Every test runs a real job (local Ray, the tiny model) with one slowdown injected through ``ray_jobs.chaos`` or the
data, then reads the diagnosis from the summary and the events. One worker, on its own worker started at the connect
(``ray_jobs.warm.early``, as a one-GPU job runs), unless a test says otherwise: the rules read the steps, whichever
process ran them, and such a job costs about half a Ray Train one on 2 cores (bench/cpu_job_start.py).
"""

from __future__ import annotations

import dataclasses
import json
import random
import time
from pathlib import Path

import pytest

from ray_jobs.chaos import NO_CHAOS, Chaos
from ray_jobs.run import run
from ray_jobs.tiny import WORDS

pytestmark = pytest.mark.integration


def profiled(spec, chaos=NO_CHAOS, steps=30, checkpoint_every=None, log_every=5, workers=1, **data):
    spec = spec.replace(
        scaling=dataclasses.replace(spec.scaling, num_workers=workers),
        data=dataclasses.replace(spec.data, val_fraction=0.0, **data),
        train=dataclasses.replace(
            spec.train, max_steps=steps, log_every=log_every, checkpoint_every=checkpoint_every or steps, eval_every=None
        ),
    )
    events = []
    t0 = time.time()
    result = run(spec, on_event=events.append, chaos=chaos)
    wall = time.time() - t0
    found = [e.data["kind"] for e in events if e.kind == "diagnosis"]
    return result.summary, found, wall


def kinds(summary):
    return [f.kind for f in summary.diagnosis]


@pytest.mark.parametrize(
    ("workers", "worker"), [(1, "early: the job's own"), (2, "Ray Train's")], ids=["early-worker", "ray-train"]
)
def test_healthy_run_raises_no_alarm_and_its_phases_add_up(ray_cluster, tiny_spec, workers, worker):
    """On both paths a job's worker takes: its own started at the connect, whose start overlaps the data's, and Ray
    Train's, whose launch follows it."""
    summary, events, wall = profiled(tiny_spec, workers=workers)
    assert summary.worker.startswith(worker), summary.worker
    assert kinds(summary) == [] and events == [], summary.diagnosis
    assert summary.verdict.startswith("no bottleneck")
    phases = summary.timing.phases
    named = sum(v for k, v in phases.items() if k != "other")
    assert abs(named - wall) / wall <= 0.02, (named, wall, phases)
    assert phases["forward_backward"] > 0 and phases["model_load"] > 0 and phases["worker_start"] > 0
    eff = summary.efficiency
    assert eff.tokens_per_s > 0 and 0 <= eff.padding_frac < 0.1 and eff.mfu is None  # no peak on CPU
    summary_dir = summary.adapter_dir.rsplit("/", 1)[0]
    assert Path(summary_dir, "report.png").stat().st_size > 10_000
    assert any(Path(summary_dir, "tensorboard").iterdir())


def test_slow_tokenizer_is_data_bound(ray_cluster, tiny_spec):
    # Strong enough to dominate on any machine: 0.4 s per 32 rows gave 16% data wait on an idle 2-core
    # machine and under 10% beside two CPU burners (training slows, a sleep does not); 1 s per 16 rows
    # gives 67% there.
    # A shuffle buffer smaller than the streamed data: with the default (4096 rows, more than this whole
    # dataset) the first step waits for every row and no later step waits, so there is no steady
    # data-bound state to diagnose.
    # The rows come in bursts: a step in about five waits (about 5 s here), the rest find their batch ready.
    # The rule leaves the longest wait out, so the steady steps must hold at least two such waits whatever
    # the timing: 10 steps held two, or one when the second fell just past the end (seen once in CI); 16 hold
    # three.
    chaos = Chaos(tokenize_delay_s=1.0)
    summary, events, _ = profiled(tiny_spec, chaos, steps=16, cache=False, tokenize_batch_size=16, shuffle_buffer_rows=8)
    assert kinds(summary) == ["data_bound"], summary.diagnosis
    assert "data.tokenize_workers" in summary.diagnosis[0].message
    assert events == ["data_bound"]
    assert summary.bottleneck == "data_bound"


def test_slow_checkpoints_are_named(ray_cluster, tiny_spec):
    # The write runs beside training (ray_jobs.train.checkpoint.Pending); a report every step waits for it at the
    # step after each save (checkpoint_wait), so a 1 s write stalls training unless that step takes 1 s.
    summary, events, _ = profiled(tiny_spec, Chaos(checkpoint_delay_s=1.0), steps=20, checkpoint_every=5, log_every=1)
    assert kinds(summary) == ["slow_checkpoint"], summary.diagnosis
    assert "3 saves" in summary.diagnosis[0].message, "steps 5, 10 and 15; the final save is not periodic"
    assert "train.checkpoint_every" in summary.diagnosis[0].message


def test_padding_heavy_data_without_packing(ray_cluster, tiny_spec, tmp_path):
    rng = random.Random(0)
    path = tmp_path / "uneven.jsonl"
    with path.open("w") as fh:
        for _ in range(600):
            n = 2 if rng.random() < 0.5 else 120
            answer = " ".join(rng.choice(WORDS) for _ in range(n))
            fh.write(
                json.dumps({"messages": [{"role": "user", "content": "go"}, {"role": "assistant", "content": answer}]}) + "\n"
            )
    summary, events, _ = profiled(tiny_spec, path=str(path), packing=False, max_seq_len=1024)
    # Unpacked rows of uneven length come in up to 8 shapes (trimmed to a multiple of 128), and a step that
    # meets a new shape runs slower the first time. How much slower depends on how busy the machine is: in a
    # fresh-clone CI run beside other work the warm-up rule fired too (1.1 s). So the test asserts the
    # injected cause, padding, as the bottleneck, and no finding that would be false here.
    assert kinds(summary)[0] == "padding" and set(kinds(summary)) <= {"padding", "warmup"}, summary.diagnosis
    assert summary.efficiency.padding_frac >= 0.3
    assert "data.packing" in summary.diagnosis[0].message


def test_slow_first_steps_are_warmup(ray_cluster, tiny_spec):
    summary, events, _ = profiled(tiny_spec, Chaos(slow_steps=8, slow_step_s=0.8), steps=30)
    assert kinds(summary) == ["warmup"], summary.diagnosis
    # The 8 injected steps are the warm-up. The steps after them are not injected: on 2 busy cores a 0.1 s step
    # can run twice the median, and then the warm-up reads 9 (seen once in a fresh-clone CI run) or 10 (seen with a
    # benchmark beside the suite). Those steps were slow, so counting them is right; how many there are depends on
    # the machine's load. The test asserts the injected cause (every injected step is in the warm-up, none of them in
    # steady state), not the speed of the steps after it; and that the count stopped at a fast step, before the
    # detector's cap of half the steps (15), so it does not swallow the run.
    warm = summary.timing.warmup_steps
    assert 8 <= warm < 15, warm
    assert f"first {warm} steps" in summary.diagnosis[0].message
    assert summary.efficiency.steady_steps == 30 - warm, "steady state leaves the warm-up out"
