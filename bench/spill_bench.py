"""A dataset larger than the object store: memory stays bounded, and nothing is lost (issue 14).

    .venv/bin/python bench/spill_bench.py --rows 30000              # about 6 minutes on 2 cores
    .venv/bin/python bench/spill_bench.py --rows 30000 --block-mib 4 # the fill's blocks at 4 MiB (default 16)

The same cache fill (read, template, tokenize, pack, write) of ``bench/make_chat_data.py`` rows with the
tiny tokenizer, twice, each on a fresh local Ray cluster: first with an object store larger than the whole
tokenized entry, then with the smallest object store Ray allows (75 MiB), a fraction of the entry. For each
it reports the entry's size, the object store's peak use (sampled every 0.25 s), what Ray spilled to disk
and read back, the driver's peak memory, the rows read and tokenized, and a digest of every packed row in
the entry's order. Equal digests: the small store lost, repeated and reordered nothing.

With ``--consumer-rows-per-s N`` (on by default) a third run streams the same data (``data.cache: false``, as a job
that does not cache) through the small store into a consumer slower than the tokenizers: it takes the packed rows a
micro-batch at a time and waits as a GPU would that trains N rows a second. Every run's examples (cut from the packed
rows where the positions restart) are compared as a multiset: a stream's blocks reach the tokenizers in Ray Data's
order, not the data's, so the same examples can pack into other rows; none may be lost or repeated.

Writes ``bench/out/spill_bench_{block MiB}mib.json`` and prints the table.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from rayft_contract.spec import FineTuneSpec  # noqa: E402

OUT = ROOT / "bench" / "out"
MIB = 2**20


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=40000)
    parser.add_argument("--store-mb", type=int, default=75, help="the small object store (Ray's minimum: 75 MiB)")
    parser.add_argument("--big-store-mb", type=int, default=2048)
    parser.add_argument("--workers", type=int, default=1, help="tokenizer actors")
    parser.add_argument(
        "--consumer-rows-per-s", type=float, default=60.0, help="the slow consumer's packed rows a second (0: no stream run)"
    )
    parser.add_argument("--block-mib", type=int, default=0, help="the fill's block size (0: ray_jobs.data.sources.BLOCK_BYTES)")
    args = parser.parse_args()
    if args.block_mib:
        import ray_jobs.data.sources

        ray_jobs.data.sources.BLOCK_BYTES = args.block_mib * MIB  # read when each run's dataset is built
    OUT.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="rayft-spill-bench-") as work:
        run(args, Path(work))


def run(args: argparse.Namespace, work: Path) -> None:
    from ray_jobs.tiny import ensure_tiny_assets

    tiny = ensure_tiny_assets(work / "tiny", rows=2000)
    data = work / "chat.jsonl"
    subprocess.run([sys.executable, str(ROOT / "bench/make_chat_data.py"), str(data), "--rows", str(args.rows)], check=True)
    spec = FineTuneSpec.load(ROOT / "ray_jobs/presets/tiny_cpu.yaml")
    spec = spec.replace(
        model=dataclasses.replace(spec.model, path=str(tiny / "model")),
        data=dataclasses.replace(spec.data, path=str(data), max_seq_len=2048, val_fraction=0.0, tokenize_workers=args.workers),
    )
    from ray_jobs.data.sources import BLOCK_BYTES

    results = {
        "block_mib": BLOCK_BYTES / MIB,
        "rows": args.rows,
        "source_mib": data.stat().st_size / MIB,
        "cpus": os.cpu_count(),
        "fills": [],
    }
    for label, store_mb in (("large store", args.big_store_mb), ("small store", args.store_mb)):
        results["fills"].append(one_fill(spec, work / f"cache-{store_mb}", store_mb, label))
        print(json.dumps(results["fills"][-1]))
    if args.consumer_rows_per_s:
        results["fills"].append(one_stream(spec, args.store_mb, args.consumer_rows_per_s))
        results["fills"][-1]["same_examples_as_the_fill"] = (
            results["fills"][-1]["example_multiset"] == results["fills"][0]["example_multiset"]
        )
        print(json.dumps(results["fills"][-1]))
    (OUT / f"spill_bench_{BLOCK_BYTES // MIB}mib.json").write_text(json.dumps(results, indent=2))
    print_table(results)


def one_fill(spec: FineTuneSpec, cache_root: Path, store_mb: int, label: str) -> dict:
    import ray

    from ray_jobs.data.cache import prepare
    from ray_jobs.local_ray import quiet_ray_data, start_local_cluster

    start_local_cluster(num_cpus=os.cpu_count() or 2, object_store_memory=store_mb * MIB)
    quiet_ray_data()
    sampler = StoreSampler()
    sampler.start()
    spec = spec.replace(data=dataclasses.replace(spec.data, cache_uri=str(cache_root)))
    t0 = time.perf_counter()
    prepared = prepare(spec)
    seconds = time.perf_counter() - t0
    sampler.stop()
    files = prepared.order.files
    entry_bytes = sum(Path(f.path).stat().st_size for f in files)
    in_memory = sum(_arrow_bytes(f.path) for f in files)
    result = {
        "label": label,
        "object_store_mib": store_mb,
        "seconds": seconds,
        "rows_read": prepared.quality_report().rows,
        "rows_tokenized": prepared.cache.rows_tokenized,
        "packed_rows": prepared.order.rows,
        "entry_parquet_mib": entry_bytes / MIB,
        "entry_in_memory_mib": in_memory / MIB,
        **memory(sampler),
        "digest": digest(files),
        "example_multiset": example_multiset(_rows_of(f.path) for f in files),
    }
    ray.shutdown()
    return result


def one_stream(spec: FineTuneSpec, store_mb: int, rows_per_s: float, micro_batch: int = 4) -> dict:
    """The data streamed (no cache) into a consumer that takes ``rows_per_s`` packed rows a second."""
    import ray

    from ray_jobs.data.cache import prepare
    from ray_jobs.local_ray import quiet_ray_data, start_local_cluster

    start_local_cluster(num_cpus=os.cpu_count() or 2, object_store_memory=store_mb * MIB)
    quiet_ray_data()
    sampler = StoreSampler()
    sampler.start()
    spec = spec.replace(data=dataclasses.replace(spec.data, cache=False))
    t0 = time.perf_counter()
    prepared = prepare(spec)
    batches = []
    for batch in prepared.datasets["train"].iter_batches(batch_size=micro_batch, batch_format="pyarrow"):
        batches.append(batch)
        time.sleep(batch.num_rows / rows_per_s)  # the GPU's share of the time
    seconds = time.perf_counter() - t0
    sampler.stop()
    report = prepared.quality_report()
    result = {
        "label": f"small store, streamed to a consumer of {rows_per_s:.0f} rows/s",
        "object_store_mib": store_mb,
        "seconds": seconds,
        "rows_read": report.rows,
        "rows_tokenized": report.rows - sum(report.bad.values()),
        "packed_rows": sum(b.num_rows for b in batches),
        **memory(sampler),
        "example_multiset": example_multiset(batches),
    }
    ray.shutdown()
    return result


def memory(sampler: StoreSampler) -> dict[str, float]:
    """What a run held: the store's peak and what it spilled and read back, the driver's and Ray's peak RSS."""
    final = store_stats()
    return {
        "store_peak_mib": sampler.peak_mib,
        "spilled_mib": final.get("spilled_mib", 0.0),
        "restored_mib": final.get("restored_mib", 0.0),
        "driver_peak_rss_mib": sampler.peak_rss / MIB,
        "ray_processes_peak_rss_mib": sampler.peak_tree_rss / MIB,
    }


def _rows_of(path: str):
    import pyarrow.parquet as pq

    return pq.read_table(path)


def example_multiset(tables) -> str:
    """SHA-256 over the sorted digests of every packed example (its ids and labels, cut where the positions restart
    at 0): equal for the same examples in any order and any packing (a stream's blocks may reach the tokenizers in
    another order than a fill's, and then the same examples pack into other rows)."""
    examples = []
    for table in tables:
        ids, labels, positions, real = (
            table.column(c).to_pylist() for c in ("input_ids", "labels", "position_ids", "num_tokens")
        )
        for row_ids, row_labels, row_pos, n in zip(ids, labels, positions, real):
            starts = [i for i in range(n) if row_pos[i] == 0] + [n]
            for a, b in zip(starts, starts[1:]):
                examples.append(hashlib.sha256(repr((row_ids[a:b], row_labels[a:b])).encode()).hexdigest())
    return f"{len(examples)}:" + hashlib.sha256("".join(sorted(examples)).encode()).hexdigest()


def _arrow_bytes(path: str) -> int:
    import pyarrow.parquet as pq

    return pq.read_table(path).nbytes


def digest(files) -> str:
    """SHA-256 over every packed row's columns, file by file in the entry's order."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    h = hashlib.sha256()
    for f in files:
        table = pq.read_table(f.path).combine_chunks()  # one chunk per column: the bytes depend on the rows alone
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, table.schema) as writer:
            writer.write_table(table)
        h.update(sink.getvalue().to_pybytes())
    return h.hexdigest()


STATS = {
    "used_mib": re.compile(r"Plasma memory usage (\d+) MiB"),
    "spilled_mib": re.compile(r"Spilled (\d+) MiB"),
    "restored_mib": re.compile(r"Restored (\d+) MiB"),
}


def store_stats() -> dict[str, float]:
    """What ``ray memory --stats-only`` prints, parsed (Ray has no public call that gives spilled bytes)."""
    from ray._private.internal_api import memory_summary

    text = memory_summary(stats_only=True)
    return {key: float(m.group(1)) for key, pattern in STATS.items() if (m := pattern.search(text))}


class StoreSampler:
    """The object store's use, the driver's RSS and all of Ray's processes' RSS, sampled every 0.25 s."""

    def __init__(self) -> None:
        self.peak_mib = 0.0
        self.peak_rss = 0
        self.peak_tree_rss = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        import psutil

        me = psutil.Process()
        while not self._stop.wait(0.25):
            self.peak_mib = max(self.peak_mib, store_stats().get("used_mib", 0.0))
            self.peak_rss = max(self.peak_rss, me.memory_info().rss)
            tree = 0
            for p in psutil.process_iter(["cmdline"]):
                try:
                    if any("ray" in part for part in (p.info["cmdline"] or [])[:2]):
                        tree += p.memory_info().rss
                except psutil.Error:  # a process that ended while we looked: not ours to count
                    pass
            self.peak_tree_rss = max(self.peak_tree_rss, tree)


def print_table(results: dict) -> None:
    rows = [
        ("object store (MiB)", "object_store_mib", "{:.0f}"),
        ("fill (s)", "seconds", "{:.1f}"),
        ("rows read", "rows_read", "{:,}"),
        ("rows tokenized", "rows_tokenized", "{:,}"),
        ("packed rows in the entry", "packed_rows", "{:,}"),
        ("entry in memory, Arrow (MiB)", "entry_in_memory_mib", "{:.0f}"),
        ("entry on disk, Parquet (MiB)", "entry_parquet_mib", "{:.0f}"),
        ("object store peak use (MiB)", "store_peak_mib", "{:.0f}"),
        ("spilled to disk (MiB)", "spilled_mib", "{:.0f}"),
        ("restored from disk (MiB)", "restored_mib", "{:.0f}"),
        ("driver peak RSS (MiB)", "driver_peak_rss_mib", "{:.0f}"),
        ("Ray's processes, peak RSS (MiB)", "ray_processes_peak_rss_mib", "{:.0f}"),
        ("digest of the packed rows", "digest", "{:.12}"),
        ("examples : digest of them, any order", "example_multiset", "{:.20}"),
    ]
    fills = results["fills"]
    print(f"{results['rows']:,} rows, {results['source_mib']:.0f} MiB of JSONL, {results['cpus']} CPUs")
    print(f"| | {' | '.join(f['label'] for f in fills)} |")
    print("|---|" + "---|" * len(fills))
    for label, key, fmt in rows:
        print(f"| {label} | " + " | ".join(fmt.format(f[key]) if f.get(key) is not None else "" for f in fills) + " |")
    same = len({f["digest"] for f in fills if "digest" in f}) == 1
    print("the fills: the same packed rows, in the same order" if same else "THE FILLS' ENTRIES DIFFER")
    same = len({f["example_multiset"] for f in fills}) == 1
    print("every run: the same examples, none lost or repeated" if same else "THE EXAMPLES DIFFER")


if __name__ == "__main__":
    main()
