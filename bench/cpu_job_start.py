"""A tiny CPU job's start, three ways, on one local cluster: Ray Train with 2 workers (the tiny preset), Ray Train
with 1, and 1 worker started at the connect (``ray_jobs.warm.early``, the default for one-worker jobs where the
cluster holds the worker and the fill at once).

What it is for: the CPU tests run about 35 whole jobs, and on 2 cores each one's start (Ray Train's controller,
placement group and worker process; the worker's imports; the model load, one after the other) was most of the
suite's 40 minutes. Every run reads the same cached dataset (a first run, not counted, fills it), so the rows differ
by the worker's path alone. The rounds interleave the ways, so a host that slows down slows each alike.

    .venv/bin/python bench/cpu_job_start.py [--rounds 2] [--cpus 4] [--out bench/cpu_job_start.json]

``--cpus 4``: the test session's cluster (tests/conftest.py), over-subscribed on a 2-core machine.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

WAYS = {  # name: (num_workers, RAYFT_EARLY_WORKER)
    "Ray Train, 2 workers": (2, ""),
    "Ray Train, 1 worker": (1, "0"),
    "early worker, 1 worker": (1, ""),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--cpus", type=int, default=4)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()

    root = Path(tempfile.mkdtemp(prefix="rayft-cpu-start-"))
    os.environ["RAYFT_CACHE_DIR"] = str(root / "cache")
    from ray_jobs.local_ray import start_local_cluster, stop_local_cluster
    from ray_jobs.tiny import ensure_tiny_assets
    from rayft_contract.spec import FineTuneSpec

    tiny = ensure_tiny_assets(root / "tiny", rows=2000)
    info = start_local_cluster(num_cpus=args.cpus, dashboard=True)
    try:
        from ray_jobs.run import run

        base = FineTuneSpec.load(Path(__file__).resolve().parents[1] / "ray_jobs/presets/tiny_cpu.yaml")
        base = base.replace(
            model=dataclasses.replace(base.model, path=str(tiny / "model")),
            data=dataclasses.replace(base.data, path=str(tiny / "train.jsonl"), val_fraction=0.0),
            train=dataclasses.replace(base.train, max_steps=args.steps, checkpoint_every=args.steps, eval_every=None),
        )
        runs: list[dict] = []
        plan = [("fill the dataset cache (not counted)", 2, "")] + [
            (name, *way) for _ in range(args.rounds) for name, way in WAYS.items()
        ]
        for i, (name, workers, early) in enumerate(plan):
            os.environ["RAYFT_EARLY_WORKER"] = early
            spec = base.replace(
                name=f"start-{i}",
                scaling=dataclasses.replace(base.scaling, num_workers=workers),
                output=dataclasses.replace(base.output, dir=str(root / "runs")),
            )
            print(f"[{i + 1}/{len(plan)}] {name} ...", flush=True)
            t0 = time.time()
            summary = run(spec).summary
            row = {
                "way": name,
                "wall_s": round(time.time() - t0, 1),
                "first_step_s": round(summary.time_to_first_step_s, 1),
                "worker": summary.worker,
                "phases": {k: round(v, 1) for k, v in summary.timing.phases.items() if v >= 0.1},
            }
            print(f"    first step at {row['first_step_s']} s, wall {row['wall_s']} s; {row['worker']}", flush=True)
            if i:
                runs.append(row)
    finally:
        stop_local_cluster(info["temp_dir"], keep_logs=False)
        shutil.rmtree(root, ignore_errors=True)

    print(f"\n| way ({args.cpus} CPUs in Ray, {os.cpu_count()} cores) | first step, s | wall, s |")
    print("|---|---|---|")
    for name in WAYS:
        mine = [r for r in runs if r["way"] == name]
        first = ", ".join(str(r["first_step_s"]) for r in mine)
        print(
            f"| {name} | {first} (median {statistics.median(r['first_step_s'] for r in mine):.1f}) | "
            f"{statistics.median(r['wall_s'] for r in mine):.1f} |"
        )
    if args.out:
        args.out.write_text(json.dumps({"cpus": args.cpus, "cores": os.cpu_count(), "runs": runs}, indent=1) + "\n")


if __name__ == "__main__":
    main()
