"""A cache fill's fixed cost in a new Ray job on a running cluster: the case of every service job.

    .venv/bin/python bench/fill_start.py --rows 5000 --workers 1 --runs 2     # 2 cores, about a minute
    python3 bench/fill_start.py --rows 200000 --workers 14 --runs 3   # the H200 host (device call, carry: [".gpu"]):
      source .gpu/env.sh && export PYTHONPATH=$PWD:$PYTHONPATH && python3 -u bench/fill_start.py ...     about 90 s

A job's tasks run only in worker processes of its own, so a new job starts processes for its tokenizer actors and for
its reading, re-cut and writing tasks. ``bench/data_bench.py`` runs every fill in one driver (one job), where only the
first fill pays for those. Here one cluster stays up and each fill runs in a driver process of its own that joins it
(a new job, as the service's Ray Jobs do), ``--runs`` times. Each fill is cold (a cache of its own) on the same rows
(``--real-tokenizer``'s Zipf rows and 32k BPE). Prints each fill's rate, start (``FillTimes``) and the worker
processes it started, and writes ``--out`` (``bench/out/fill_start.json``) with the ``RAY_worker*`` settings.

``--soft-limits=-1,16``: each fill on a new cluster, started with each ``RAY_num_workers_soft_limit`` in turn (how
many idle workers Ray keeps, ``ray_jobs.local_ray``; -1 is Ray's own, the free CPUs), with how many workers Ray killed
for being idle:
    python3 -u bench/fill_start.py --rows 600000 --workers 14 --runs 2 --soft-limits=-1,16 --rest 20  # H200 host, ~6 min
"""

from __future__ import annotations

import argparse
import atexit
import dataclasses
import itertools
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

OUT = ROOT / "bench" / "out"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=5000)
    parser.add_argument("--workers", type=int, default=1, help="tokenizer actors")
    parser.add_argument("--runs", type=int, default=2, help="fills, each in a new job")
    parser.add_argument(
        "--soft-limits",
        default="",
        help="RAY_num_workers_soft_limit values (-1: Ray's own, the free CPUs): each fill then runs on a new cluster "
        "started with each value in turn, --runs times",
    )
    parser.add_argument(
        "--actors-per-reader",
        default="",
        help="ray_jobs.data.pipeline.ACTORS_PER_READER values, in turn (0: no bound on the reading tasks at once)",
    )
    parser.add_argument(
        "--rest", type=float, default=0.0, help="idle seconds before each fill, so that every fill starts from a rested host"
    )
    parser.add_argument("--out", default=str(OUT / "fill_start.json"))
    parser.add_argument("--one", nargs=3, metavar=("ADDRESS", "SPEC", "ACTORS_PER_READER"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(one_fill(*args.one)))
        return

    work = Path(tempfile.mkdtemp(prefix="rayft-fill-start-"))
    atexit.register(shutil.rmtree, work, ignore_errors=True)  # the rows and a cache entry per fill
    from s3_data_bench import base_spec, make_rows  # bench/ is this script's directory, first on sys.path

    data, tokenizer = make_rows(work, args.rows)
    spec = base_spec(tokenizer, work, args.workers, data=str(data))
    import ray

    from ray_jobs.local_ray import start_local_cluster
    from rayft_contract.data_records import FillTimes

    limits = [int(v) for v in args.soft_limits.split(",") if v] or [None]
    per_reader = [int(v) for v in args.actors_per_reader.split(",") if v] or [-1]  # -1: the default
    fills: list[dict] = []
    address = None
    for _ in range(args.runs):
        for limit, reading in itertools.product(limits, per_reader):
            if address is None or limit is not None:  # --soft-limits: a new cluster for each fill
                ray.shutdown()
                if limit is not None:
                    os.environ["RAY_num_workers_soft_limit"] = str(limit)
                address = start_local_cluster(num_cpus=max(args.workers + 1, os.cpu_count() or 2))["gcs_address"]
            time.sleep(args.rest)  # after the new cluster's start: the host rests, not the cluster's start-up
            before = worker_logs()
            cold = spec.replace(data=dataclasses.replace(spec.data, cache_uri=str(work / f"cache-{len(fills)}")))
            spec_file = work / f"spec-{len(fills)}.json"
            spec_file.write_text(json.dumps(cold.to_dict()))
            done = subprocess.run(
                [sys.executable, __file__, "--one", address, str(spec_file), str(reading)], capture_output=True, text=True
            )
            if done.returncode:
                sys.exit(f"the fill's driver failed ({done.returncode}):\n{done.stderr[-4000:]}")
            after = worker_logs()
            started, killed = len(after) - len(before), sum(killed_idle(log) for log in after)
            measured = json.loads(done.stdout.strip().splitlines()[-1])
            fills.append(
                {
                    **measured,
                    "rest_s": args.rest,
                    "soft_limit": limit,
                    "actors_per_reader": None if reading < 0 else reading,
                    "workers_started": started,
                    "workers_killed_idle_so_far": killed,
                }
            )
            fill = fills[-1]["fill"]
            print(
                f"fill {len(fills)}{'' if limit is None else f' (soft limit {limit})'}"
                f"{'' if reading < 0 else f' ({reading} actors per reader)' if reading else ' (no bound on reading tasks)'}: "
                f"{fills[-1]['rows'] / (fill['start_s'] + fill['stream_s'] + fill['write_s']):,.0f} rows/s, "
                f"{started} worker processes started ({killed} killed idle in the cluster so far); "
                f"{FillTimes.from_dict(fill).describe()}",
                flush=True,
            )
    starts = [f["fill"]["start_s"] for f in fills]
    print(f"the fill's start in a new job: {', '.join(f'{s:.1f}' for s in starts)} s (median {statistics.median(starts):.1f})")
    settings = {k: v for k, v in os.environ.items() if k.startswith(("RAY_worker", "RAY_num_workers"))}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    result = {"rows": args.rows, "workers": args.workers, "cpus": os.cpu_count(), "ray_settings": settings, "fills": fills}
    Path(args.out).write_text(json.dumps(result, indent=2))


def worker_logs() -> list[Path]:
    """One log per worker process this cluster started: Ray writes ``python-core-worker-<id>_<pid>.log``."""
    import ray

    session = Path(ray._private.worker._global_node.get_session_dir_path())  # no public call names it
    return sorted((session / "logs").glob("python-core-worker-*.log"))


def killed_idle(log: Path) -> bool:
    """Whether Ray ended this worker for being idle (its own words in the worker's log)."""
    return "idle for a long time" in log.read_text(errors="replace")


def one_fill(address: str, spec_file: str, actors_per_reader: str) -> dict:
    """One cold fill in this process: a driver of its own, so a new job on the running cluster."""
    import ray

    from ray_jobs.data import cache as dataset_cache
    from ray_jobs.data import pipeline as data
    from ray_jobs.local_ray import quiet_ray_data
    from rayft_contract.spec import FineTuneSpec

    os.environ["RAYFT_CACHE_DIR"] = str(Path(spec_file).parent / "model-cache")
    ray.init(address=address, log_to_driver=False)
    quiet_ray_data()
    if int(actors_per_reader) >= 0:
        data.ACTORS_PER_READER = int(actors_per_reader) or None
    began = time.time()
    prepared = dataset_cache.prepare(FineTuneSpec.from_dict(json.loads(Path(spec_file).read_text())))
    assert prepared.cache.fill is not None, "the fill was a cache hit: each run needs a cache of its own"
    return {"rows": prepared.cache.rows_tokenized, "fill": prepared.cache.fill.to_dict(), "tasks": first_tasks(began)}


def first_tasks(began: float) -> dict[str, dict[str, float]]:
    """For each kind of task this job ran (reading, re-cut, the tokenizer actors' start, writing): its count, and
    its first task's times from ``began`` (this driver's call to prepare) in each state it passed: created
    (``pending_args_avail``), waiting for a node and a worker, given a worker (``submitted_to_worker``), running.
    Where a slow start waits: for a worker process, or for the task before it. Read from the GCS's task events
    (``ray.timeline``'s source), since the state API needs the dashboard, which these clusters run without."""
    import ray
    from ray._private.state import state  # no public call gives task events without the dashboard
    from ray.core.generated import common_pb2

    job = ray.get_runtime_context().get_job_id()
    first: dict[str, dict[str, float]] = {}
    for event in state._get_all_task_events():
        info = event.task_info
        if info.job_id.hex() != job or not info.name:
            continue
        times = {common_pb2.TaskStatus.Name(k).lower(): v / 1e9 - began for k, v in event.state_updates.state_ts_ns.items()}
        if "pending_args_avail" not in times:
            continue  # a later update of a task whose first is in another event
        key = f"{common_pb2.TaskType.Name(info.type).lower()}:{info.name}"
        count = first.get(key, {}).get("count", 0) + 1
        if key not in first or times["pending_args_avail"] < first[key]["pending_args_avail"]:
            first[key] = times
        first[key]["count"] = count
    return dict(sorted(first.items(), key=lambda kv: kv[1]["pending_args_avail"]))


if __name__ == "__main__":
    main()
