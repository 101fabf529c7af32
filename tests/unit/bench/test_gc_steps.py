"""bench/gc_steps.py places each step in time from its worker's records and sets the GPU's samples inside it beside
its seconds: how a slow step is told to be the host's or the GPU's."""

from __future__ import annotations

import json
import math

import pytest

from bench.gc_steps import gpu_during, read_smi, step_spans, step_table, steps_of, table


def step(n: int, wall: float, **more) -> dict:
    return {"step": n, "wall": wall, "phases": {}, "tokens": 1, "processed": 1, "samples": 1, "attn_ctx": 1} | more


@pytest.fixture
def run(tmp_path):
    """Three steps of 2, 3 and 2 s from t=100 on the worker's clock, the last in the closing report; a full
    collection in step 2."""
    lines = [
        {"kind": "progress", "step": 1, "setup": {"loop_start_ts": 100.0}, "step_timing": []},
        {"kind": "progress", "step": 2, "step_timing": [step(1, 2.0)]},
        {
            "kind": "progress",
            "step": 3,
            "step_timing": [
                step(
                    2,
                    3.0,
                    phases={"forward_backward": 2.6},
                    collector_s=0.4,
                    full_collections=1,
                    waits=7,
                    thread_cpu_s=2.9,
                    process_cpu_s=4.5,
                    host_busy=0.25,
                    device_allocs=3,
                )
            ],
        },
        {"kind": "timing", "step": 3, "step_timing": [step(3, 2.0)]},
    ]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    return tmp_path


def test_each_step_is_placed_after_the_ones_before_it_from_the_loops_start(run):
    steps = steps_of(run)
    assert [s.step for s in steps] == [1, 2, 3], "the closing report's step too"
    assert step_spans(run, steps) == {1: (100.0, 102.0), 2: (102.0, 105.0), 3: (105.0, 107.0)}


def test_a_step_gets_the_gpus_samples_inside_it_and_the_throttle_reasons_seen_there(run, tmp_path):
    smi = tmp_path / "smi.csv"
    smi.write_text(
        "NVIDIA-SMI has failed\n"  # a line that is not a sample is set aside, not read as one
        "101.0, 1900, 680.0, 60, 0x0000000000000004, 100\n"
        "103.0, 1960, 600.0, 61, 0x0000000000000004, 90\n"
        "104.0, 1940, 620.0, 61, 0x0000000000000000, 97\n"
    )
    samples, skipped = read_smi(str(smi))
    assert len(samples) == 3 and skipped == ["NVIDIA-SMI has failed"]
    spans = step_spans(run, steps_of(run))
    assert gpu_during(samples, spans[2]) == (1950.0, 610.0, "0x0000000000000004", 93.5)
    mhz, watts, reasons, busy = gpu_during(samples, spans[3])
    assert math.isnan(mhz) and math.isnan(watts) and math.isnan(busy) and reasons == "", "no sample inside it: nothing made up"


def test_samples_from_before_the_sampler_asked_for_utilization_read_with_it_unknown(run, tmp_path):
    smi = tmp_path / "smi.csv"
    smi.write_text("103.0, 1900, 680.0, 60, 0x0000000000000004\n104.0, 1960, 600.0, 61, 0x0000000000000000\n")
    samples, _ = read_smi(str(smi))
    mhz, watts, reasons, busy = gpu_during(samples, step_spans(run, steps_of(run))[2])
    assert (mhz, watts, reasons) == (1930.0, 640.0, "0x0000000000000004") and math.isnan(busy)


def test_the_tables_name_the_step_the_collector_ran_in_its_threads_waits_and_cpu_and_the_allocators_calls(run):
    runs = {"auto": steps_of(run)}
    assert "| auto | 3 | 2.50 | step 2: 3.00, 0.40 | 0.40 | 2 (0.40) |" in table(runs)
    assert "| auto | 2 | 3.00 | 2.60 | 0.400 | 7 | 0 | 2.90 | 4.50 | 25% | 3 | - | - | - |  |" in step_table(
        runs, {"auto": step_spans(run, runs["auto"])}, []
    )
