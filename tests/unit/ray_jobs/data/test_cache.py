"""A cache fill's phases: cut at the ledger's first and last batch, adding up to the fill's wall time."""

from __future__ import annotations

import pytest

from ray_jobs.data.cache import fill_times
from ray_jobs.data.quality import FillClock, QualityReport, RowLedger, StageSeconds


def test_a_fills_three_phases_add_up_to_its_wall_time_and_carry_the_busy_stages():
    ledger = RowLedger(max_frac=1.0)
    ledger.add_node("node-a", init_s=0.75)
    ledger.add_node("node-a", init_s=0.5)
    ledger.add_busy(StageSeconds(read=2.0))
    import time

    began = time.time() - 2.0  # the first task began 2 s before its batch reached the ledger
    for read_ts in (began - 2.5, began - 3.0):  # two reading tasks, whose marks arrive in any order
        ledger.reading(read_ts, handed_on=False)
        ledger.reading(read_ts + 1.5, handed_on=True)
    ledger.add(QualityReport(rows=10), StageSeconds(template=0.5, tokenize=3.0, pack=0.25), began_ts=began)
    ledger.add(QualityReport(rows=10), StageSeconds(template=0.5, tokenize=3.0, pack=0.25), began_ts=began + 1.0)
    clock = ledger.clock()
    assert clock.first_task_ts == began < clock.first_batch_ts <= clock.last_batch_ts
    started, ended = began - 4.0, clock.last_batch_ts + 1.5
    times = fill_times(clock, started, ended, workers=2)
    assert sum(times.phases().values()) == pytest.approx(ended - started)
    assert times.start_s == pytest.approx(4.0) and times.write_s == pytest.approx(1.5)
    assert times.first_batch_s == pytest.approx(clock.first_batch_ts - started), "the first task's rows are in the stream"
    assert (times.read_busy_s, times.template_busy_s, times.tokenize_busy_s, times.pack_busy_s) == (2.0, 1.0, 6.0, 0.5)
    assert 0 < times.actors_ready_s and times.actor_init_s == 0.75, "the slowest actor"
    assert times.first_read_s == pytest.approx(1.0) and times.first_block_s == pytest.approx(2.5), "the first reader"
    assert "first read at 1.0 s, its first rows at 2.5 s" in times.describe()
    assert "tokenize 6.0 s" in times.describe() and ledger.node_count() == 1


@pytest.mark.parametrize(
    "began,first,last", [(94.0, 95.0, 99.0), (101.0, 101.0, 112.0), (None, 103.0, 104.0), (None, None, None)]
)
def test_a_clock_off_by_a_little_or_no_batch_at_all_still_adds_up(began, first, last):
    times = fill_times(FillClock(began, first, last, StageSeconds()), started=100.0, ended=110.0, workers=1)
    assert min(times.phases().values()) >= 0 and times.start_s <= times.first_batch_s <= 10.0
    assert times.first_read_s == times.first_block_s == 0.0, "no reading task told the ledger"
    assert sum(times.phases().values()) == pytest.approx(10.0)
