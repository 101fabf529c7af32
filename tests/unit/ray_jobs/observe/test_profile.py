"""The FLOPs formula, warm-up detection and the phase table, on records built by hand."""

from __future__ import annotations

import dataclasses
import json
import random

import pytest

from ray_jobs.observe.diagnosis import diagnose
from ray_jobs.observe.profile import JobProfile, model_shape, step_flops
from rayft_contract.records import JobSummary, ModelShape, Progress, SetupTimes, Timing


def step(wall=1.0, data_wait=0.0, tokens=1000, processed=1000, checkpoint=0.0):
    compute = wall - data_wait - checkpoint
    phases = {"data_wait": data_wait, "forward_backward": compute * 0.9, "optimizer": compute * 0.1, "checkpoint": checkpoint}
    return {"wall": wall, "phases": phases, "tokens": tokens, "processed": processed, "samples": 10, "attn_ctx": tokens * 100}


def profile_of(steps, peak=None, shape=None):
    p = JobProfile(start=0.0)
    steps = [{**s, "step": i + 1} for i, s in enumerate(steps)]
    facts = {"world_size": 2, "peak_flops": peak, "model_shape": shape}
    p.add(Progress.from_dict({"step": len(steps), "total_steps": len(steps), "step_timing": steps, "facts": facts}))
    return p


SHAPE = ModelShape(
    matmul_params=6_500_000_000,
    trainable_matmul_params=40_000_000,
    layers=32,
    attn_dim=4096,
    gradient_checkpointing=False,
)


def test_flops_formula_for_lora_on_a_frozen_base():
    model, hardware = step_flops(SHAPE, tokens=1, attn_ctx=512)
    assert model == 4 * 6.5e9 + 2 * 40e6 + 12 * 32 * 4096 * 512
    assert hardware == model
    recomputed = step_flops(dataclasses.replace(SHAPE, gradient_checkpointing=True), tokens=1, attn_ctx=512)
    assert recomputed[0] == model and recomputed[1] == model + 2 * 6.5e9 + 4 * 32 * 4096 * 512


def test_mfu_against_the_peak_of_every_gpu():
    steps = [step(wall=1.0, tokens=20_000) for _ in range(10)]
    eff = profile_of(steps, peak=989.4e12, shape=SHAPE).efficiency()
    expected = step_flops(SHAPE, 20_000, 20_000 * 100)[0] / 1.0 / (989.4e12 * 2)
    assert eff.mfu == pytest.approx(expected) and 0 < eff.mfu < 1
    assert eff.tokens_per_s == pytest.approx(20_000) and eff.tokens_per_s_per_worker == pytest.approx(10_000)
    assert profile_of(steps, peak=None, shape=SHAPE).efficiency().mfu is None


def test_model_shape_counts_leaf_matmuls_once(tiny_spec):
    import torch

    from ray_jobs.train.model import apply_lora, load_base
    from ray_jobs.train.strategy import Single

    model = apply_lora(load_base(tiny_spec, torch.device("cpu"), Single()), tiny_spec)
    shape = model_shape(model)
    base = load_base(tiny_spec, torch.device("cpu"), Single())
    linears = sum(m.in_features * m.out_features for m in base.modules() if isinstance(m, torch.nn.Linear))
    lora = sum(p.numel() for n, p in model.named_parameters() if "lora_" in n)
    assert shape.matmul_params == linears + lora
    assert shape.trainable_matmul_params >= lora  # modules_to_save also trains the LM head
    assert shape.layers == base.config.num_hidden_layers


def test_warmup_is_the_slow_prefix_and_steady_state_leaves_it_out():
    steps = [step(wall=5.0) for _ in range(6)] + [step(wall=1.0) for _ in range(30)]
    p = profile_of(steps)
    assert p.warmup_steps() == 6 and p.warmup_slowdown() == pytest.approx(5.0)
    assert p.efficiency().step_time_s == pytest.approx(1.0)
    assert [f.kind for f in diagnose(p, _spec(), wall=70.0)] == ["warmup"]


def test_a_warmup_too_small_to_notice_in_the_job_is_not_named():
    # A tiny CPU run: 3 steps 2.4x slower, 0.25 s lost, 12% of a 2 s training loop, 0.6% of a 40 s job.
    steps = [step(wall=0.24) for _ in range(3)] + [step(wall=0.1) for _ in range(20)]
    p = profile_of(steps)
    assert p.warmup_steps() == 3
    assert diagnose(p, _spec(), wall=40.0) == []
    assert [f.kind for f in diagnose(p, _spec(), wall=5.0)] == ["warmup"], "the same steps in a 5 s job are 5% of it"


def test_no_warmup_in_an_even_run_and_one_slow_checkpoint_is_not_warmup():
    steps = [step(wall=1.0) for _ in range(30)]
    steps[0] = step(wall=8.0, checkpoint=7.0)
    assert profile_of(steps).warmup_steps() == 0


def test_breakdown_adds_up_to_the_wall_time():
    p = profile_of([step(wall=1.0, data_wait=0.2) for _ in range(10)])
    p.driver = {"connect": 2.0, "export": 1.0}
    rows = p.breakdown(wall=20.0)
    assert sum(rows.values()) == pytest.approx(20.0)
    assert rows["data_wait"] == pytest.approx(0.2 * 9)  # the first step's wait is the first batch
    assert rows["first_batch"] == pytest.approx(0.2)


def _spec():
    from rayft_contract.spec import FineTuneSpec

    return FineTuneSpec.from_dict({"name": "t", "model": {"path": "m"}, "data": {"path": "d.jsonl"}})


def test_each_rule_fires_alone():
    spec = _spec()
    assert diagnose(profile_of([step() for _ in range(20)]), spec, wall=25.0) == []
    data_bound = [f.kind for f in diagnose(profile_of([step(wall=1.0, data_wait=0.4) for _ in range(20)]), spec, wall=25.0)]
    assert data_bound == ["data_bound"]
    padded = [f.kind for f in diagnose(profile_of([step(tokens=500, processed=1000) for _ in range(20)]), spec, wall=25.0)]
    assert padded == ["padding"]
    saves = [step() for _ in range(20)]
    saves[10] = step(wall=4.0, checkpoint=3.0)
    assert [f.kind for f in diagnose(profile_of(saves), spec, wall=28.0)] == ["slow_checkpoint"]


def test_slow_evaluation_is_named():
    steps = [step() for _ in range(20)]
    steps[9]["phases"]["eval"] = 3.0
    steps[9]["wall"] += 3.0
    p = profile_of(steps)
    p.setup = SetupTimes(worker_start_ts=0.0, first_eval_s=3.0)
    assert [f.kind for f in diagnose(p, _spec(), wall=30.0)] == ["slow_eval"]
    assert "2 passes" in diagnose(p, _spec(), wall=30.0)[0].message


def test_a_healthy_run_on_a_busy_machine_raises_no_alarm():
    """Steps that vary the way a loaded 2-core machine makes them vary (seen in the integration runs:
    early spikes, one long stall for data, a slow final save) are noise, judged against the run itself."""
    rng = random.Random(7)
    for trial in range(50):
        steps = [step(wall=0.1 * rng.uniform(0.7, 1.6)) for _ in range(30)]
        for at in rng.sample(range(1, 30), 4):  # busy moments anywhere, early ones included
            steps[at] = step(wall=0.1 * rng.uniform(1.5, 3.0))
        steps[0] = step(wall=12.0, data_wait=11.7)  # the first batch
        stall = rng.randrange(2, 29)
        steps[stall] = step(wall=1.1, data_wait=1.0)  # one stall for data
        steps[-1] = step(wall=2.6, checkpoint=2.5)  # the final save: made at any checkpoint_every
        findings = diagnose(profile_of(steps), _spec(), wall=60.0)
        assert findings == [], (trial, findings)


def test_only_periodic_checkpoint_saves_count_against_the_loop_time():
    spec = _spec()
    final_only = [step() for _ in range(20)] + [step(wall=6.0, checkpoint=5.0)]
    assert diagnose(profile_of(final_only), spec, wall=500.0) == []
    periodic = [step(wall=2.0, checkpoint=1.0) if i % 5 == 4 else step() for i in range(20)]
    (finding,) = diagnose(profile_of(periodic), spec, wall=500.0)  # start-up-heavy wall: still named
    assert finding.kind == "slow_checkpoint" and "3 saves" in finding.message, finding.message


def test_one_data_stall_is_not_data_bound_but_a_steady_wait_is():
    spec = _spec()
    one = [step() for _ in range(20)]
    one[8] = step(wall=5.0, data_wait=4.0)
    assert diagnose(profile_of(one), spec, wall=30.0) == []
    every_few = [step(wall=1.5, data_wait=0.5) if i % 3 == 0 else step() for i in range(20)]
    assert [f.kind for f in diagnose(profile_of(every_few), spec, wall=30.0)] == ["data_bound"]


def test_the_table_the_picture_and_the_cli_read_one_list_of_phases():
    from ray_jobs.observe.visuals import grouped_phases
    from rayft.progress import phase_table
    from rayft_contract.phases import Group, Phase

    p = profile_of([step(wall=1.0, data_wait=0.2, checkpoint=0.1) for _ in range(10)])
    p.driver = {"preflight": 0.5, "connect": 2.0, "trainer_setup": 1.0, "export": 1.0}
    p.setup = SetupTimes(worker_start_ts=10.0, model_load_s=3.0, loop_start_ts=14.0)
    p.fit_start = 9.0
    rows = p.breakdown(wall=40.0)
    assert list(rows) == [phase.value for phase in Phase], "every phase, in the enum's order"
    groups = grouped_phases(rows)
    assert sum(groups.values()) == pytest.approx(sum(max(v, 0.0) for v in rows.values()))
    assert groups[Group.OTHER] == pytest.approx(max(rows["other"], 0.0)), "the picture's other is the table's other"
    assert groups[Group.STARTUP] == pytest.approx(sum(rows[ph] for ph in Phase if ph.group is Group.STARTUP))
    labels = [row for row in phase_table(JobSummary("tiny", wall_time_s=40.0, timing=Timing(rows))).columns[0].cells]
    assert "trainer setup" in labels and "connect to Ray" in labels and "other" in labels


def test_a_step_record_survives_the_trip_from_worker_to_driver_and_refuses_unknown_phases():
    from rayft_contract.records import StepRecord

    record = StepRecord(7, 1.5, {"data_wait": 0.25, "forward_backward": 1.0, "eval": 0.1}, 900, 1000, 12, 90_000)
    again = StepRecord.from_dict(json.loads(json.dumps(record.to_dict())))  # what metrics.jsonl and Ray carry
    assert again == record and again.busy == pytest.approx(1.15) and again.training_wall == pytest.approx(1.4)
    with pytest.raises(ValueError, match="unknown phases"):
        StepRecord(1, 1.0, {"fwd": 1.0}, 1, 1, 1, 1)


def test_a_workers_start_is_split_at_its_process_launch_and_a_process_started_before_the_run_launched_in_no_time():
    p = profile_of([step() for _ in range(5)])
    p.fit_start = 100.0
    p.setup = SetupTimes(worker_start_ts=119.0, process_start_ts=104.0, model_load_s=3.0, loop_start_ts=125.0)
    rows = p.breakdown(wall=60.0)
    assert (rows["worker_launch"], rows["worker_start"]) == (4.0, 15.0)
    p.setup = SetupTimes(worker_start_ts=119.0, process_start_ts=50.0, loop_start_ts=125.0)  # Ray's pool had it
    rows = p.breakdown(wall=60.0)
    assert (rows["worker_launch"], rows["worker_start"]) == (0.0, 19.0)
    p.setup = SetupTimes(worker_start_ts=119.0, loop_start_ts=125.0)  # a worker that did not say
    assert p.breakdown(wall=60.0)["worker_start"] == 19.0


def test_the_collectors_time_counts_in_the_efficiency_from_the_steady_steps_only():
    first = {**step(wall=5.0), "collector_s": 3.0, "full_collections": 4}  # the first step: outside steady state
    steady = {**step(), "collector_s": 0.1, "full_collections": 1}
    eff = profile_of([first] + [steady] * 9).efficiency()
    assert eff.steady_steps >= 1
    assert eff.collector_s == pytest.approx(0.1 * eff.steady_steps)
    assert eff.full_collections == eff.steady_steps
