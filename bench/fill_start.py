"""A cache fill's fixed cost in a new Ray job on a running cluster: the case of every service job.

    .venv/bin/python bench/fill_start.py --rows 5000 --workers 1 --runs 2     # 2 cores, about a minute
    python3 bench/fill_start.py --rows 200000 --workers 14 --runs 3   # the H200 host (device call, carry: [".gpu"]):
      source .gpu/env.sh && PYTHONPATH=$PWD python3 -u bench/fill_start.py ...     about 90 s

A job's tasks run only in worker processes of its own, so a new job starts processes for its tokenizer actors and for
its reading, re-cut and writing tasks. ``bench/data_bench.py`` runs every fill in one driver (one job), where only the
first fill pays for those. Here one cluster stays up and each fill runs in a driver process of its own that joins it
(a new job, as the service's Ray Jobs do), ``--runs`` times. Each fill is cold (a cache of its own) on the same rows (``--real-tokenizer``'s
Zipf rows and 32k BPE). Prints each fill's start (``FillTimes``) and writes ``--out`` (``bench/out/fill_start.json``), with the
``RAY_worker*`` settings the cluster started with.
"""

from __future__ import annotations

import argparse
import atexit
import dataclasses
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

OUT = ROOT / "bench" / "out"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=5000)
    parser.add_argument("--workers", type=int, default=1, help="tokenizer actors")
    parser.add_argument("--runs", type=int, default=2, help="fills, each in a new job")
    parser.add_argument("--out", default=str(OUT / "fill_start.json"))
    parser.add_argument("--one", nargs=2, metavar=("ADDRESS", "SPEC"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(one_fill(*args.one)))
        return

    work = Path(tempfile.mkdtemp(prefix="rayft-fill-start-"))
    atexit.register(shutil.rmtree, work, ignore_errors=True)  # the rows and a cache entry per fill
    data, tokenizer = work / "chat.jsonl", work / "tok32k"
    jobs = ["--jobs", str(os.cpu_count() or 1)]
    subprocess.run(
        [sys.executable, str(ROOT / "bench/make_chat_data.py"), str(data), "--rows", str(args.rows), "--lexicon", "zipf", *jobs],
        check=True,
    )
    subprocess.run([sys.executable, str(ROOT / "bench/real_tokenizer.py"), str(tokenizer), "--data", str(data)], check=True)
    from rayft_contract.spec import FineTuneSpec

    spec = FineTuneSpec.load(ROOT / "ray_jobs/presets/tiny_cpu.yaml")
    spec = spec.replace(
        model=dataclasses.replace(spec.model, path=str(tokenizer)),
        data=dataclasses.replace(spec.data, path=str(data), max_seq_len=2048, val_fraction=0.0, tokenize_workers=args.workers),
        output=dataclasses.replace(spec.output, dir=str(work / "runs")),
    )
    from ray_jobs.local_ray import start_local_cluster

    address = start_local_cluster(num_cpus=max(args.workers + 1, os.cpu_count() or 2))["gcs_address"]
    from rayft_contract.records import FillTimes

    fills: list[dict] = []
    for run in range(args.runs):
        cold = spec.replace(data=dataclasses.replace(spec.data, cache_uri=str(work / f"cache-{run}")))
        spec_file = work / f"spec-{run}.json"
        spec_file.write_text(json.dumps(cold.to_dict()))
        done = subprocess.run(
            [sys.executable, __file__, "--one", address, str(spec_file)], check=True, capture_output=True, text=True
        )
        fills.append(json.loads(done.stdout.strip().splitlines()[-1]))
        print(f"fill {run + 1}: {FillTimes.from_dict(fills[-1]['fill']).describe()}", flush=True)
    starts = [f["fill"]["start_s"] for f in fills]
    print(f"the fill's start in a new job: {', '.join(f'{s:.1f}' for s in starts)} s (median {statistics.median(starts):.1f})")
    settings = {k: v for k, v in os.environ.items() if k.startswith("RAY_worker")}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    result = {"rows": args.rows, "workers": args.workers, "cpus": os.cpu_count(), "ray_settings": settings, "fills": fills}
    Path(args.out).write_text(json.dumps(result, indent=2))


def one_fill(address: str, spec_file: str) -> dict:
    """One cold fill in this process: a driver of its own, so a new job on the running cluster."""
    import ray

    from ray_jobs import dataset_cache
    from ray_jobs.local_ray import quiet_ray_data
    from rayft_contract.spec import FineTuneSpec

    os.environ["RAYFT_CACHE_DIR"] = str(Path(spec_file).parent / "model-cache")
    ray.init(address=address, log_to_driver=False)
    quiet_ray_data()
    prepared = dataset_cache.prepare(FineTuneSpec.from_dict(json.loads(Path(spec_file).read_text())))
    assert prepared.cache.fill is not None, "the fill was a cache hit: each run needs a cache of its own"
    return {"rows": prepared.cache.rows_tokenized, "fill": prepared.cache.fill.to_dict()}


if __name__ == "__main__":
    main()
