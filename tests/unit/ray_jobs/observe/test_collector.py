"""Python's garbage collector inside the steps: counted in each step's record, the start-up frozen out of its walks,
and everything handed back at the end (``ray_jobs.observe.collector``)."""

from __future__ import annotations

import gc
import weakref

import pytest

from ray_jobs.observe.collector import Collector
from ray_jobs.observe.metrics import StepMeter
from rayft.progress import _efficiency_rows
from rayft_contract.records import Efficiency, JobSummary, StepRecord


class Node:
    """An object in a reference cycle: only the cyclic collector frees it."""

    def __init__(self) -> None:
        self.me = self


def cycle() -> weakref.ref:
    """A cycle nobody refers to any more, and a weak reference that dies when the collector frees it."""
    return weakref.ref(Node())


@pytest.fixture
def no_automatic_collections():
    """Only the collections a test makes, so what each step counts is what the test caused."""
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def steps(meter: StepMeter) -> tuple[StepRecord, ...]:
    return meter.window()["step_timing"]


def test_a_full_collection_inside_a_step_is_counted_in_that_steps_record_alone(no_automatic_collections):
    meter = StepMeter(collector=Collector(freeze=False))
    try:
        meter.end_step(1, tokens=1, processed=1, samples=1, attn_ctx=1)
        gc.collect(0)
        gc.collect()
        gc.collect()
        meter.end_step(2, tokens=1, processed=1, samples=1, attn_ctx=1)
        meter.end_step(3, tokens=1, processed=1, samples=1, attn_ctx=1)
        first, second, third = steps(meter)
    finally:
        meter.close()
    assert (first.full_collections, first.collector_s) == (0, 0.0)
    assert second.full_collections == 2 and second.collector_s > 0
    assert (third.full_collections, third.collector_s) == (0, 0.0), "taken once: the next step starts from nothing"


def test_the_start_up_is_frozen_out_of_the_steps_collections_and_given_back_at_the_end(no_automatic_collections):
    kept = Node()  # the start-up: a model, say, alive when the steps begin
    before = weakref.ref(kept)
    collector = Collector(freeze=True)
    try:
        # a frozen object still dies when its last reference goes (another thread's, say): the count only shrinks
        assert 0 < gc.get_freeze_count() <= collector.froze
        del kept  # garbage now, but frozen: no collection during the steps walks it
        gc.collect()
        assert before() is not None
        during = cycle()
        gc.collect()
        assert during() is None, "cycles the steps make are still freed"
    finally:
        collector.close()
    assert gc.get_freeze_count() == 0 and collector.froze == 0
    assert before() is None, "the start-up's garbage is freed once the job ends (a warm worker runs the next one)"
    assert collector._observe not in gc.callbacks


def test_a_process_that_had_frozen_objects_of_its_own_keeps_them_frozen(no_automatic_collections):
    theirs = Node()
    gc.freeze()  # as a host process might have done before the job's steps
    try:
        mine = weakref.ref(theirs)
        del theirs
        collector = Collector(freeze=True)
        collector.close()
        assert gc.get_freeze_count() > 0
        gc.collect()
        assert mine() is not None, "unfreezing would have handed back what the process froze, not the job"
    finally:
        gc.unfreeze()


def test_the_freeze_first_frees_the_start_ups_own_garbage(no_automatic_collections):
    garbage = cycle()
    collector = Collector(freeze=True)
    try:
        assert garbage() is None, "a cycle frozen while garbage would be held until the job ends"
    finally:
        collector.close()


def test_RAYFT_GC_auto_leaves_pythons_collector_as_it_is_and_still_counts_it(monkeypatch, no_automatic_collections):
    monkeypatch.setenv("RAYFT_GC", "auto")
    collector = Collector.for_steps()
    try:
        assert collector.froze == gc.get_freeze_count() == 0
        gc.collect()
        assert collector.take()[1] == 1
    finally:
        collector.close()
    monkeypatch.delenv("RAYFT_GC")
    collector = Collector.for_steps()
    try:
        assert collector.froze > 0, "the default freezes"
    finally:
        collector.close()


def test_closing_the_meter_stops_the_count_and_thaws_the_start_up():
    meter = StepMeter(collector=Collector(freeze=True))
    callback = meter.collector._observe
    meter.close()
    assert callback not in gc.callbacks and gc.get_freeze_count() == 0
    StepMeter().close()  # a meter without a collector (before the steps) closes as well


def test_records_written_before_the_collector_was_counted_read_as_none_of_it():
    old = StepRecord.from_dict({"step": 3, "wall": 1.0, "phases": {}, "tokens": 1, "processed": 1, "samples": 1, "attn_ctx": 1})
    assert (old.collector_s, old.full_collections) == (0.0, 0)


def summary_with(collector_s: float) -> JobSummary:
    eff = Efficiency(steady_steps=10, step_time_s=2.0, collector_s=collector_s, full_collections=3)
    return JobSummary(name="job", efficiency=eff)


def test_the_summary_shows_the_collector_only_where_it_took_a_share_of_the_steps():
    assert not [row for row in _efficiency_rows(summary_with(0.19)) if "garbage" in row[0]]  # under 1% of 20 s
    (row,) = [row for row in _efficiency_rows(summary_with(0.4)) if "garbage" in row[0]]
    assert row[1] == "0.40 s inside the steps (2.0%), 3 full"
