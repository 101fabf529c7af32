"""What thinning long-ended jobs' progress costs the job store, and what it gives back.

    .venv/bin/python bench/store_retention.py [--jobs 20] [--reports 10000]      # about a minute on 2 cores

A SQLite job store (``service.store_sqlite``) in a temporary directory holds ``--jobs`` ended jobs of ``--reports``
progress events each, every event a progress report as the service stores it (the demo's own keys and sizes). Then
``EventRetention``'s pass thins them all (``JOBS_PER_PASS`` at a time), while another thread appends an event every
millisecond, as the reports of another team's running job would. It prints and writes to
``bench/out/store_retention.json``:

- the store's size before and after, and after new jobs' events filled the freed pages (SQLite reuses them; the
  file does not shrink);
- each job's thinning (several transactions of ``THIN_ROWS`` deletes, the lock handed on between): median and most;
- the other writer's append latency, idle and during the pass: median, p99, most.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from rayft_contract.states import JobState  # noqa: E402
from service.retention import KEEP_PROGRESS  # noqa: E402
from service.store import JobRecord  # noqa: E402
from service.store_sqlite import SqliteJobStore  # noqa: E402


def report(step: int, total: int) -> dict:
    """A progress event as the service stores it (``convert.event_from_proto`` of a job's report)."""
    return {
        "step": step,
        "total_steps": total,
        "epoch": 0,
        "loss": 2.628410577774048 - step * 1e-5,
        "learning_rate": 0.00212312251950283,
        "tokens_per_s": 23311.997289062878,
        "samples_per_s": 316.25783168361835,
        "eta_s": 2.766729903072701,
        "checkpoint": False,
    }


def ended_job(store: SqliteJobStore, job_id: str, reports: int) -> None:
    now = time.time()
    store.create(JobRecord(job_id, "team-old", JobState.QUEUED, {"name": job_id}, now, now))
    store.transition(job_id, JobState.STARTING)
    store.transition(job_id, JobState.RUNNING)
    for seq in range(1, reports + 1):
        store.append_report(job_id, seq, "progress", report(seq, reports))
    store.transition(job_id, JobState.SUCCEEDED)


def appends(store: SqliteJobStore, job_id: str, stop: threading.Event, seconds: list[float]) -> None:
    """Another team's running job: an event a millisecond, each append's latency kept."""
    while not stop.is_set():
        start = time.perf_counter()
        store.append_event(job_id, "progress", report(0, 1))
        seconds.append(time.perf_counter() - start)
        time.sleep(0.001)


def quantiles(seconds: list[float]) -> dict[str, float]:
    ordered = sorted(seconds)
    return {
        "n": len(ordered),
        "median_ms": 1000 * statistics.median(ordered),
        "p99_ms": 1000 * ordered[int(0.99 * (len(ordered) - 1))],
        "max_ms": 1000 * ordered[-1],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=20)
    parser.add_argument("--reports", type=int, default=10_000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="rayft-retention-") as scratch:
        path = Path(scratch) / "jobs.db"
        store = SqliteJobStore(path)
        started = time.perf_counter()
        for j in range(args.jobs):
            ended_job(store, f"ft-old-{j}", args.reports)
        filled_s = time.perf_counter() - started
        size_before = os.path.getsize(path)
        now = time.time()
        store.create(JobRecord("ft-live", "team-live", JobState.QUEUED, {"name": "live"}, now, now))

        idle: list[float] = []
        stop = threading.Event()
        writer = threading.Thread(target=appends, args=(store, "ft-live", stop, idle))
        writer.start()
        time.sleep(2.0)
        stop.set()
        writer.join()

        during: list[float] = []
        stop = threading.Event()
        writer = threading.Thread(target=appends, args=(store, "ft-live", stop, during))
        holds: list[float] = []
        writer.start()
        pass_started = time.perf_counter()
        while True:  # one job a call, to time each transaction: the pass's own loop, job by job
            start = time.perf_counter()
            jobs, _ = store.thin_events(time.time() + 1, KEEP_PROGRESS, jobs=1)
            if not jobs:
                break
            holds.append(time.perf_counter() - start)
        pass_s = time.perf_counter() - pass_started
        stop.set()
        writer.join()
        size_after = os.path.getsize(path)
        kept = sum(e.kind == "progress" for e in store.events("ft-old-0", limit=args.reports + 10))
        for j in range(args.jobs // 2):  # new jobs' events go into the freed pages
            ended_job(store, f"ft-new-{j}", args.reports)
        size_refilled = os.path.getsize(path)
        store.close()
    result = {
        "jobs": args.jobs,
        "reports_per_job": args.reports,
        "fill_s": round(filled_s, 1),
        "store_mb": {
            "before": round(size_before / 1e6, 1),
            "after_thinning": round(size_after / 1e6, 1),
            f"after_{args.jobs // 2}_new_jobs": round(size_refilled / 1e6, 1),
        },
        "progress_kept_per_job": kept,
        "seconds_per_job": {"median_ms": 1000 * statistics.median(holds), "max_ms": 1000 * max(holds)},
        "pass_s": round(pass_s, 2),
        "other_writer_append": {"idle": quantiles(idle), "during_pass": quantiles(during)},
        "cpus": os.cpu_count(),
    }
    print(json.dumps(result, indent=2))
    out = ROOT / "bench" / "out"
    out.mkdir(exist_ok=True)
    (out / "store_retention.json").write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
