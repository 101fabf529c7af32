"""bench/stack_sampler.py samples a worker's threads with py-spy, and bench/host_steps.py sets the samples beside the
job's steps: which thread held the GIL in the slow steps against the rest."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from bench.gc_steps import step_spans, steps_of
from bench.host_steps import read, slow_steps, step_rows, tables

SAMPLER = Path(__file__).resolve().parents[3] / "bench" / "stack_sampler.py"


def step(n: int, wall: float) -> dict:
    return {"step": n, "wall": wall, "phases": {"forward_backward": wall - 0.1}, "tokens": 1, "processed": 1, "samples": 1,
            "attn_ctx": 1}  # fmt: skip


def thread(name: str, active: bool, gil: bool, *frames: str) -> dict:
    return {"name": name, "active": active, "gil": gil} | ({"frames": list(frames)} if frames else {})


def loop_at(*inner: str, gil: bool = True) -> dict:
    return thread("MainThread", True, gil, *inner, "ray_jobs/train/loop.py:_Loop.step", "ray_jobs/train/loop.py:train")


@pytest.fixture
def job(tmp_path):
    """Four steps from t=100: 1.0, 1.0, 1.5 and 1.0 s, sampled every 0.1 s. In step 3 a reader thread holds the GIL
    for half a second while the step's thread waits for it; another process's samples are not the job's."""
    lines = [
        {"kind": "progress", "step": 1, "setup": {"loop_start_ts": 100.0}, "step_timing": [step(1, 1.0), step(2, 1.0)]},
        {"kind": "timing", "step": 4, "step_timing": [step(3, 1.5), step(4, 1.0)]},
    ]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    samples = []
    for i in range(45):
        t = 100.05 + i * 0.1
        held = 102.5 <= t < 103.0
        threads = [
            loop_at("torch/nn/modules/linear.py:Linear.forward", gil=not held),
            thread(
                "reader",
                held,
                held,
                *(["pyarrow/parquet/core.py:ParquetFile.read", "ray_jobs/data/order.py:_read"] if held else []),
            ),
            thread("PythonGCThread", False, False),
        ]
        samples.append({"t": t, "took": 0.03, "pid": 7, "threads": threads})
        samples.append({"t": t, "took": 0.03, "pid": 8, "threads": [thread("MainThread", True, True, "x.py:elsewhere")]})
    with gzip.open(tmp_path / "samples.jsonl.gz", "wt") as out:
        out.writelines(json.dumps(s) + "\n" for s in samples)
    return tmp_path


def test_the_slow_step_is_the_one_another_thread_held_the_gil_in_and_the_table_names_that_thread_and_where(job):
    steps = steps_of(job)
    rows = step_rows(read(job / "samples.jsonl.gz"), steps, step_spans(job, steps))
    assert [r["samples"] for r in rows] == [10, 10, 15, 10], "only the process whose thread ran the steps"
    slow = slow_steps(rows, 0.15)
    assert slow == {3}
    third = rows[2]
    assert third["other_gil"] == pytest.approx(5 / 15) and third["gil"] == pytest.approx(10 / 15)
    assert third["top_holder"] == "reader: pyarrow/parquet/core.py:ParquetFile.read in ray_jobs/data/order.py:_read"
    text = tables(rows, slow)
    assert "| 3 (slow) | 1.50 | 1.40 | 15 | 100% | 67% | 33% | reader:" in text
    assert "| reader: pyarrow/parquet/core.py:ParquetFile.read in ray_jobs/data/order.py:_read | 33.3% | 0.0% |" in text


def test_the_sampler_finds_the_worker_by_its_title_and_keeps_frames_only_of_threads_that_ran(tmp_path):
    """A real process under a title, as a Ray worker has (``ray::WarmWorker``), sampled through py-spy."""
    script = tmp_path / "worker.py"
    script.write_text(
        textwrap.dedent("""
        import threading, time

        class _Loop:
            def step(self):
                until = time.time() + 30
                while time.time() < until:
                    sum(range(1000))

        threading.Thread(target=time.sleep, args=(30,), name="sleeper", daemon=True).start()
        _Loop().step()
    """)
    )
    worker = subprocess.Popen(["bash", "-c", f'exec -a "rayft-sampled-{tmp_path.name}" "{sys.executable}" "{script}"'])
    out = tmp_path / "samples.jsonl.gz"
    try:
        done = subprocess.run(
            [sys.executable, str(SAMPLER), str(out), "--match", f"^rayft-sampled-{tmp_path.name}$", "--samples", "8"],
            capture_output=True, text=True, timeout=60, check=True,
        )  # fmt: skip
    finally:
        worker.kill()
        worker.wait()
    assert f"sampling [{worker.pid}]" in done.stdout, "found by its title, not the sampler's own command line"
    lines = [json.loads(line) for line in gzip.open(out, "rt")]
    assert lines and {line["pid"] for line in lines} == {worker.pid}
    stepping = [t for line in lines for t in line["threads"] if t["name"] == "MainThread"]
    assert any("worker.py:_Loop.step" in t.get("frames", []) for t in stepping)
    sleeping = [t for line in lines for t in line["threads"] if t["name"] == "sleeper"]
    assert sleeping and all("frames" not in t for t in sleeping if not (t["active"] or t["gil"]))
    samples = read(out)
    assert samples and all(s.loop["name"] == "MainThread" for s in samples), "the stepping thread told from the rest"
