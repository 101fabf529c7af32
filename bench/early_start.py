"""When a fresh job driver starts its early worker, and when the first step comes, code tree against code tree.

    git archive REV | tar -x -C /tmp/base
    .venv/bin/python bench/early_start.py --trees base:/tmp/base new:. [--rounds 4] [--out bench/early_start.json]

A one-worker job's early worker (``ray_jobs.warm.early``) imports the training stack and loads the base while the driver
prepares the data, and on a cached dataset the driver then waits for it: whatever the driver does before it starts the
worker is on the path to the first step. Each run here is ``rayft train`` in a fresh process, as every service job's
driver is (``bench/cpu_job_start.py`` runs its jobs in one process, whose imports are done after the first), on one
local cluster of 4 CPUs with the tiny preset on one worker and a cached dataset. The trees take turns, so a host that
slows down slows each alike. Per run: the early worker's process start after the driver's (the summary's
``process_start_ts`` against the moment ``rayft train`` was started) and the job's time to its first step.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def one_run(tree: Path, name: str, tiny: Path, address: str, runs: Path) -> dict:
    from rayft_contract.records import JobSummary, Progress

    started = time.time()
    command = [sys.executable, "-m", "rayft", "train", str(tree / "ray_jobs/presets/tiny_cpu.yaml"), "--address", address]
    command += [
        "--overwrite",
        "--set",
        f"name={name}",
        "--set",
        f"model.path={tiny}/model",
        "--set",
        f"data.path={tiny}/train.jsonl",
    ]
    for setting in (f"output.dir={runs}", "train.max_steps=3", "scaling.num_workers=1", "data.val_fraction=0",
                    "train.eval_every=null", "train.checkpoint_every=3"):  # fmt: skip
        command += ["--set", setting]
    env = dict(os.environ, PYTHONPATH=str(tree), RAYFT_EARLY_WORKER="1")
    done = subprocess.run(command, cwd=tree, env=env, capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"{name} failed:\n{done.stderr[-3000:]}")
    summary = JobSummary.from_dict(json.loads((runs / name / "summary.json").read_text()))
    events = map(json.loads, (runs / name / "metrics.jsonl").read_text().splitlines())
    reports = [Progress.from_dict(event) for event in events if event["kind"] == "progress"]
    setup = next(report.setup for report in reports if report.setup is not None)  # the worker's first report
    return {
        "worker_process_after_driver_s": round(setup.process_start_ts - started, 2),
        "first_step_s": round(summary.time_to_first_step_s, 2),
        "connect_s": round(summary.timing.phases["connect"], 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trees", nargs="+", required=True, help="label:path, e.g. base:/tmp/base new:.")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    trees = {label: Path(path).resolve() for label, path in (t.split(":", 1) for t in args.trees)}

    root = Path(tempfile.mkdtemp(prefix="rayft-early-start-"))
    os.environ["RAYFT_CACHE_DIR"] = str(root / "cache")
    from ray_jobs.local_ray import start_local_cluster, stop_local_cluster
    from ray_jobs.tiny import ensure_tiny_assets

    tiny = ensure_tiny_assets(root / "tiny", rows=2000)
    info = start_local_cluster(num_cpus=4, dashboard=False)
    rows: list[dict] = []
    try:
        first = next(iter(trees.values()))
        one_run(first, "fill", tiny, info["address"], root / "runs")  # fills the dataset cache; not counted
        for round_ in range(args.rounds):
            for label, tree in trees.items():
                row = {
                    "tree": label,
                    "round": round_ + 1,
                    **one_run(tree, f"{label}-{round_}", tiny, info["address"], root / "runs"),
                }
                print(json.dumps(row), flush=True)
                rows.append(row)
    finally:
        stop_local_cluster(info["temp_dir"], keep_logs=False)
        shutil.rmtree(root, ignore_errors=True)

    print(f"\n| tree ({os.cpu_count()} cores) | early worker's process after the driver's start, s | first step, s |")
    print("|---|---|---|")
    for label in trees:
        mine = [r for r in rows if r["tree"] == label]
        after = ", ".join(str(r["worker_process_after_driver_s"]) for r in mine)
        first = ", ".join(str(r["first_step_s"]) for r in mine)
        print(f"| {label} | {after} | {first} (median {statistics.median(r['first_step_s'] for r in mine):.2f}) |")
    if args.out:
        args.out.write_text(json.dumps({"cores": os.cpu_count(), "runs": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
