"""How many actor tasks a second Ray Data runs when the tasks do nothing: the limit under a cache fill.

    .venv/bin/python bench/ray_data_task_cap.py --rows 200000 --batch-rows 256     # about 1 minute on 2 cores

The fill's read (``ray_jobs.data.reading.read_records`` over one gzipped JSONL file), its strict re-cut into
``--batch-rows`` blocks (``--no-repartition`` leaves it out), then an actor pool of ``--actors`` whose UDF returns
at once. On this 2-core machine it ran 39-46 tasks a second at 256 rows a task with or without the re-cut (10,000-
11,800 rows/s), 16 at 1,024 rows and 11 at 2,048 (22,700 rows/s, where the one reading task sets the pace); a 12-actor fill on the 16-core H200 host was held to the same 40 tasks a second
(``bench/RESULTS.md``), which is why a fill's task takes ``ray_jobs.data.pipeline.BATCHES_PER_TASK`` batches.
"""

from __future__ import annotations

import argparse
import gzip
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


class Nothing:
    def __call__(self, batch):
        return {"rows": [batch.num_rows]}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--batch-rows", type=int, default=256)
    parser.add_argument("--actors", type=int, default=2)
    parser.add_argument("--no-repartition", action="store_true")
    args = parser.parse_args()
    import pyarrow.fs as pafs
    import ray.data

    from ray_jobs.data.reading import read_records
    from ray_jobs.data.sources import Files
    from ray_jobs.local_ray import quiet_ray_data, start_local_cluster

    with tempfile.TemporaryDirectory(prefix="rayft-task-cap-") as work:
        plain, path = Path(work, "chat.jsonl"), Path(work, "chat.jsonl.gz")
        subprocess.run([sys.executable, str(ROOT / "bench/make_chat_data.py"), str(plain), "--rows", str(args.rows)], check=True)
        with plain.open("rb") as src, gzip.open(path, "wb", compresslevel=1) as dst:
            dst.write(src.read())
        start_local_cluster(num_cpus=max(args.actors + 2, 4))
        quiet_ray_data()
        ds = read_records(Files(pafs.LocalFileSystem(), [str(path)], (os.path.getsize(path),)), str(path))
        if not args.no_repartition:
            ds = ds.repartition(target_num_rows_per_block=args.batch_rows, strict=True)
        ds = ds.map_batches(
            Nothing,
            batch_format="pyarrow",
            batch_size=args.batch_rows,
            compute=ray.data.ActorPoolStrategy(size=args.actors),
            num_cpus=0.5,
        )
        started, rows, tasks = time.perf_counter(), 0, 0
        for batch in ds.iter_batches(batch_size=None, batch_format="pyarrow"):
            rows += sum(batch.column("rows").to_pylist())
            tasks += batch.num_rows
        seconds = time.perf_counter() - started
        print(
            f"{rows:,} rows in {tasks:,} tasks of {args.batch_rows} rows, {args.actors} actors: {seconds:.1f} s, {tasks / seconds:.0f} tasks/s"
        )
        ray.shutdown()


if __name__ == "__main__":
    main()
