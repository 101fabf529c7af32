"""The typed records that cross process boundaries (rayft_contract.records): what one side writes, the other reads."""

from __future__ import annotations

import json

import pytest

from rayft_contract.data_records import Caches, DatasetCacheInfo, Fetched, FillTimes
from rayft_contract.records import (
    Efficiency,
    Finding,
    JobSummary,
    ModelShape,
    Progress,
    RunFacts,
    Sample,
    SamplesAt,
    SetupTimes,
    StepRecord,
    Timing,
)


def _wire(record):
    """What Ray, metrics.jsonl, summary.json and the service's store carry: JSON."""
    return json.loads(json.dumps(record.to_dict()))


def test_a_report_with_nested_records_comes_back_equal_after_json():
    step = StepRecord(3, 0.5, {"data_wait": 0.1, "forward_backward": 0.3}, 100, 128, 4, 900)
    report = Progress(
        step=3,
        total_steps=10,
        loss=1.5,
        facts=RunFacts(world_size=2, model_shape=ModelShape(10, 2, 2, 64), layout="ddp"),
        setup=SetupTimes(worker_start_ts=1.0, model_load_s=2.0),
        eval_samples=(Sample("hi", "hello", "hey"),),
        step_timing=(step,),
    )
    again = Progress.from_dict(_wire(report))
    assert again == report
    assert isinstance(again.facts.model_shape, ModelShape) and isinstance(again.step_timing[0], StepRecord)


def test_a_summary_comes_back_equal_after_json_with_every_nested_record_typed():
    sample = Sample("q", "a", "b")
    summary = JobSummary(
        name="tiny",
        steps=4,
        eval_samples=SamplesAt(0, 4, (sample,), (sample,)),
        timing=Timing({"connect": 1.0, "other": 0.5}, warmup_steps=1),
        efficiency=Efficiency(steady_steps=3, tokens_per_s=10.0, mfu=0.3),
        diagnosis=(Finding("padding", "40% padding", 1.2),),
        caches=Caches(DatasetCacheInfo(enabled=True, hit=True, key="k"), Fetched("/m", "local")),
        reported_steps=(2, 4),
    )
    again = JobSummary.from_dict(_wire(summary))
    assert again == summary
    assert again.caches.model.hit and again.diagnosis[0].cost_s == 1.2 and again.eval_samples.last[0].answer == "b"


def test_a_client_reads_a_summary_from_an_older_or_a_newer_job():
    older = {"name": "old", "steps": 3, "timing": {"phases": {"other": 1.0}}}  # written before most fields existed
    newer = {**older, "a_field_from_the_future": {"x": 1}, "efficiency": {"tokens_per_s": 5.0, "future": 1}}
    assert JobSummary.from_dict(older).efficiency == Efficiency() and JobSummary.from_dict(older).diagnosis == ()
    assert JobSummary.from_dict(newer).efficiency.tokens_per_s == 5.0


def test_a_record_missing_a_required_field_is_refused_by_name():
    with pytest.raises(TypeError, match="total_steps"):
        Progress.from_dict({"step": 1})


def test_a_failures_reason_is_the_first_line_of_what_caused_it_not_ray_trains_wrapper():
    from ray.exceptions import RayTaskError
    from ray.train import ControllerError, WorkerGroupError

    from rayft_contract.records import Failure

    workers = WorkerGroupError("[Rank 0 Error Snippet]: ...", {1: ValueError("rank 1's"), 0: RuntimeError("no module\nmore")})
    assert str(workers).splitlines()[0] == "Training failed due to worker errors:"  # what the job's message was
    assert Failure.reason_of(workers) == "rank 0: RuntimeError: no module"
    assert Failure.reason_of(ControllerError(KeyError("lost"))) == "KeyError: 'lost'"
    task = RayTaskError("WarmWorker.run", "Traceback (most recent call last): ...", ValueError("in the warm worker"))
    assert Failure.reason_of(task.as_instanceof_cause()) == "ValueError: in the warm worker"  # as ray.get raises it
    assert Failure.reason_of(ValueError("data.path: no such file\ndetails")) == "ValueError: data.path: no such file"
    assert Failure.reason_of(ValueError("x" * 2000), limit=20) == "ValueError: " + "x" * 8
    assert Failure.reason_of(MemoryError()) == "MemoryError", "an error without words still says its kind"
    assert Failure.reason_of(OSError("\n  \n")) == "OSError"


def test_a_fills_description_counts_its_tasks_and_actors_in_words_that_agree():
    one = FillTimes(start_s=1.0, stream_s=2.0, write_s=0.5, workers=1, readers_at_once=1).describe()
    many = FillTimes(start_s=1.0, stream_s=2.0, write_s=0.5, workers=14, readers_at_once=2).describe()
    assert "1 reading task at most at once" in one and "busy over 1 tokenizer actor:" in one
    assert "2 reading tasks at most at once" in many and "busy over 14 tokenizer actors:" in many
