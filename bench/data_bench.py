"""Tokenize once, start fast: the data pipeline's throughput and a job's cold versus warm start.

    .venv/bin/python bench/data_bench.py                          # about 4 minutes on 2 cores
    python3 bench/data_bench.py --workers 1,2,4,8,12 --rows 40000   # a bigger machine (the H200 host)
    python3 bench/data_bench.py --skip-start --real-tokenizer --workers 1,2,4,8,14 \
        --rows 1000000 --small-rows 200000     # the issue's table: 1M rows, a 32k BPE (bench/data_device.sh)

1. Tokenization + packing throughput (rows/s, tokens/s) of one dataset fill (``ray_jobs.data.cache.prepare``
   on an empty cache) as Ray Data's tokenizer actors grow, against the anti-pattern it replaces:
   the same work on one thread in the driver. Data: ``bench/make_chat_data.py`` rows (realistic
   lengths), the tiny tokenizer (a fast Rust BPE, like production tokenizers).
2. Cold versus warm start of the same job, data (gzipped JSONL) and model both in S3 (a local moto
   server): time to the first step, bytes downloaded and rows tokenized, read from each job's summary.
   (``--skip-start`` skips this part.)
3. After each fill, one shuffled epoch read back through ``ray_jobs.data.order`` as a trainer reads it
   (``epoch_read_s``, ``packed_rows``): the cost of the per-epoch order.

``--real-tokenizer``: the rows use ``make_chat_data.py --lexicon zipf`` and a 32k-vocabulary BPE trained on
them (``bench/real_tokenizer.py``) replaces the tiny one, and the table gets the per-core limit beside it:
a bare ``tokenizers`` ``encode_batch`` loop over the same templated rows, pinned to one core.
``--small-rows``: fewer rows for the fills with at most 4 actors (their rate is steady long before 1M).

Writes ``bench/out/data_bench.json`` and ``bench/out/data_bench.png``.
"""

from __future__ import annotations

import argparse
import atexit
import dataclasses
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from rayft_contract.spec import FineTuneSpec  # noqa: E402

OUT = ROOT / "bench" / "out"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--workers", default="1,2", help="tokenizer actor counts to try")
    parser.add_argument("--rows", type=int, default=10000)
    parser.add_argument("--skip-start", action="store_true", help="only the throughput part")
    parser.add_argument("--real-tokenizer", action="store_true", help="a 32k BPE on Zipf-word rows, and the bare-tokenizer line")
    parser.add_argument("--small-rows", type=int, default=0, help="rows for fills of at most 4 actors (0: --rows)")
    parser.add_argument("--fill-only", action="store_true", help="time the fills alone (no tokenize-only pass, no epoch read)")
    parser.add_argument("--bare-procs", default="", help="process counts for the parallel bare line (default: --workers over 1)")
    parser.add_argument(
        "--block-mib",
        default="",
        help="after the table, every --workers fill again with each of these fill block sizes (MiB)",
    )
    parser.add_argument(
        "--batches-per-task",
        default="",
        help="tokenizer batches an actor task takes in each fill, in turn over --workers (8,16: the first fill 8, the "
        "next 16, ...); default ray_jobs.data.pipeline.BATCHES_PER_TASK",
    )
    parser.add_argument(
        "--rest",
        type=float,
        default=0.0,
        help="idle seconds before each fill, so that every fill starts from a rested host (one core ran 10-35%% "
        "slower right after an all-core fill on the lent host, and back after 30 s idle)",
    )
    args = parser.parse_args()
    workers = [int(w) for w in args.workers.split(",")]
    per_task = [int(b) for b in args.batches_per_task.split(",") if b]
    OUT.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="rayft-data-bench-"))
    atexit.register(shutil.rmtree, work, ignore_errors=True)  # a million rows and their cache entries: GBs
    os.environ["RAYFT_CACHE_DIR"] = str(work / "cache")

    from ray_jobs.tiny import ensure_tiny_assets

    tiny = ensure_tiny_assets(work / "tiny", rows=2000)
    data = work / "chat.jsonl"
    lexicon = ["--lexicon", "zipf"] if args.real_tokenizer else []
    jobs = ["--jobs", str(os.cpu_count() or 1)] if args.rows > 100_000 else []  # 1M rows on one core: about 5 minutes
    generate = [sys.executable, str(ROOT / "bench/make_chat_data.py"), str(data), "--rows", str(args.rows), *lexicon, *jobs]
    subprocess.run(generate, check=True)
    print(f"{args.rows:,} rows of chat data written")
    tokenizer = tiny / "model"
    if args.real_tokenizer:
        tokenizer = work / "tok32k"
        subprocess.run([sys.executable, str(ROOT / "bench/real_tokenizer.py"), str(tokenizer), "--data", str(data)], check=True)
    small = work / "chat-small.jsonl"
    if args.small_rows and args.small_rows < args.rows:
        with data.open() as src, small.open("w") as dst:
            dst.writelines(line for _, line in zip(range(args.small_rows), src))
    spec = FineTuneSpec.load(ROOT / "ray_jobs/presets/tiny_cpu.yaml")
    spec = spec.replace(
        model=dataclasses.replace(spec.model, path=str(tokenizer)),
        data=dataclasses.replace(spec.data, path=str(data), max_seq_len=2048, val_fraction=0.0),
        output=dataclasses.replace(spec.output, dir=str(work / "runs")),
    )
    results: dict = {
        "rows": args.rows,
        "small_rows": args.small_rows or args.rows,
        "cpus": os.cpu_count(),
        "tokenizer": "32k BPE (Zipf words)" if args.real_tokenizer else "tiny 320-token BPE",
        "throughput": [],
        "start": None,
    }

    results["one_thread"] = one_thread(spec)
    print(f"one thread in the driver: {results['one_thread']['rows_per_s']:,.0f} rows/s")
    if args.real_tokenizer:
        results["bare"] = bare_tokenizer(str(tokenizer), str(data), min(args.rows, 30_000))
        print(
            f"bare encode_batch on one core: {results['bare']['rows_per_s']:,.0f} rows/s (the per-core limit); "
            f"encode_batch_fast: {results['bare']['fast_rows_per_s']:,.0f}"
        )
        results["bare_parallel"] = []
        procs = [int(n) for n in args.bare_procs.split(",")] if args.bare_procs else workers
        for n in sorted({n for n in procs if n > 1}):
            results["bare_parallel"].append(bare_in_parallel(str(tokenizer), str(data), min(args.rows, 15_000), n))
            b = results["bare_parallel"][-1]
            print(
                f"bare encode_batch in {b['procs']} processes at once: {b['rows_per_s']:,.0f} rows/s "
                f"({b['rows_per_s'] / results['bare']['rows_per_s']:.1f}x one core; the machine's limit for that many)"
            )

    from ray_jobs.local_ray import start_local_cluster

    start_local_cluster(num_cpus=max(max(workers) + 1, os.cpu_count() or 2))
    from ray_jobs.local_ray import quiet_ray_data

    quiet_ray_data()
    from ray_jobs.data import cache as dataset_cache

    for i, w in enumerate(workers):  # a count may repeat (--workers 1,14,1,14): each fill is cold, in a cache of its own
        subset = spec
        if w <= 4 and small.exists():
            subset = spec.replace(data=dataclasses.replace(spec.data, path=str(small)))
        if per_task:
            dataset_cache.BATCHES_PER_TASK = per_task[i % len(per_task)]  # read when the fill is built
        time.sleep(args.rest)
        results["throughput"].append(fill(subset, w, work / f"cache-{i}-w{w}", fill_only=args.fill_only))
        r = results["throughput"][-1]
        r["batches_per_task"] = dataset_cache.BATCHES_PER_TASK
        r["rest_s"] = args.rest
        r["x_one_actor"] = r["rows_per_s"] / results["throughput"][0]["rows_per_s"]
        versus = f"; {r['rows_per_s'] / w / results['bare']['rows_per_s']:.0%} of bare per actor" if "bare" in results else ""
        print(
            f"{w:3d} tokenizer actors ({r['batches_per_task']} batches a task): {r['rows_per_s']:8,.0f} rows/s  {r['tokens_per_s']:10,.0f} tokens/s  "
            f"{r['x_one_actor']:.1f}x the first ({r['rows']:,} rows in {r['seconds']:.1f} s"
            + (f"; without the Parquet write {r['tokenize_only_s']:.1f} s" if "tokenize_only_s" in r else "")
            + f"{versus})"
        )
        if r.get("fill"):
            from rayft_contract.data_records import FillTimes

            print(f"      fill: {FillTimes.from_dict(r['fill']).describe()}")
    results["block_sizes"] = []
    for mib in [int(m) for m in args.block_mib.split(",") if m]:
        import ray_jobs.data.reading

        ray_jobs.data.reading.BLOCK_BYTES = mib * 2**20  # read when the fill's dataset is built
        for w in workers:
            subset = spec
            if w <= 4 and small.exists():
                subset = spec.replace(data=dataclasses.replace(spec.data, path=str(small)))
            r = fill(subset, w, work / f"cache-w{w}-b{mib}", fill_only=args.fill_only)
            results["block_sizes"].append({**r, "block_mib": mib})
            print(
                f"{w:3d} tokenizer actors, {mib} MiB blocks: {r['rows_per_s']:8,.0f} rows/s ({r['rows']:,} rows in {r['seconds']:.1f} s)"
            )
            if r.get("fill"):
                from rayft_contract.data_records import FillTimes

                print(f"      fill: {FillTimes.from_dict(r['fill']).describe()}")
    if not args.skip_start:
        results["start"] = cold_and_warm(spec, tiny, data, work)
    (OUT / "data_bench.json").write_text(json.dumps(results, indent=2))
    plot(results)


def bare_tokenizer(tokenizer: str, data: str, rows: int) -> dict:
    """The per-core limit: ``encode_batch`` over the templated rows, 1,000 at a time, in a process pinned to
    one core with one Rust thread (templating, done first, is not timed)."""
    import multiprocessing

    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(1) as pool:
        return pool.apply(_bare_in_one_core, (tokenizer, data, rows))


def bare_in_parallel(tokenizer: str, data: str, rows: int, procs: int) -> dict:
    """The machine's limit for ``procs`` tokenizers at once: the bare loop in ``procs`` processes, each pinned
    to a core of its own, timed together (a barrier starts them). On a host whose cores are hyperthreads
    (two per physical core) this is well under ``procs`` times one core, and no actor pool can beat it."""
    import multiprocessing

    ctx = multiprocessing.get_context("spawn")
    cpus = sorted(os.sched_getaffinity(0))[:procs]
    barrier, results = ctx.Barrier(len(cpus)), ctx.Queue()
    workers = [ctx.Process(target=_bare_worker, args=(tokenizer, data, rows, cpu, barrier, results)) for cpu in cpus]
    for w in workers:
        w.start()
    done = [results.get() for _ in workers]
    for w in workers:
        w.join()
    return {
        "procs": len(cpus),
        "rows": sum(d["rows"] for d in done),
        "rows_per_s": sum(d["rows_per_s"] for d in done),
        "tokens_per_s": sum(d["tokens_per_s"] for d in done),
    }


def _bare_worker(tokenizer: str, data: str, rows: int, cpu: int, barrier, results) -> None:
    results.put(_bare_in_one_core(tokenizer, data, rows, cpu, barrier))


def _bare_in_one_core(tokenizer: str, data: str, rows: int, cpu: int | None = None, barrier=None) -> dict:
    os.sched_setaffinity(0, {min(os.sched_getaffinity(0)) if cpu is None else cpu})
    os.environ["RAYON_NUM_THREADS"] = "1"
    from itertools import islice

    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tokenizer)
    with open(data) as fh:
        texts = [tok.apply_chat_template(json.loads(line)["messages"], tokenize=False) for line in islice(fh, rows)]
    fast = tok.backend_tokenizer
    if barrier is not None:
        barrier.wait()
    start, tokens = time.perf_counter(), 0
    for i in range(0, len(texts), 1000):
        tokens += sum(len(e.ids) for e in fast.encode_batch(texts[i : i + 1000], add_special_tokens=False))
    seconds = time.perf_counter() - start
    # The actors call encode_batch_fast (no offsets): its bare rate too, so a share of bare is read both ways.
    fast_start = time.perf_counter()
    for i in range(0, len(texts), 1000):
        fast.encode_batch_fast(texts[i : i + 1000], add_special_tokens=False)
    fast_rate = len(texts) / (time.perf_counter() - fast_start)
    return {
        "rows": len(texts),
        "seconds": seconds,
        "rows_per_s": len(texts) / seconds,
        "tokens_per_s": tokens / seconds,
        "fast_rows_per_s": fast_rate,
    }


def one_thread(spec: FineTuneSpec) -> dict:
    """The anti-pattern: template, tokenize and pack on the driver's one thread."""
    from ray_jobs.data.packing import pack
    from ray_jobs.data.pipeline import TokenizeAndPack
    from ray_jobs.data.quality import QualityReport

    udf = TokenizeAndPack(spec.model.path, None, spec.data, "chat", ("train",), ledger=None)
    with open(spec.data.path) as fh:  # its rate is steady long before 30k rows
        lines = [line for _, line in zip(range(30_000), fh)]
    start = time.perf_counter()
    report, examples, tokens = QualityReport(), [], 0
    for line in lines:
        examples.append(udf.encode(line, report))
        if len(examples) == spec.data.tokenize_batch_size:
            tokens += int(pack(examples, spec.data.max_seq_len, udf.pad_id)["num_tokens"].sum())
            examples = []
    tokens += int(pack(examples, spec.data.max_seq_len, udf.pad_id)["num_tokens"].sum())
    seconds = time.perf_counter() - start
    return {"workers": 0, "seconds": seconds, "rows_per_s": len(lines) / seconds, "tokens_per_s": tokens / seconds}


def fill(spec: FineTuneSpec, workers: int, cache_root: Path, fill_only: bool = False) -> dict:
    """One cold fill of the dataset cache: read, tokenize and pack everything, write Parquet.

    Also times the same pipeline without the write (``tokenize_only_s``: read, tokenize and pack
    into the object store), to show what the Parquet write and the entry's bookkeeping add.
    """
    from ray_jobs.data.cache import prepare
    from ray_jobs.data.pipeline import new_ledger, tokenize
    from ray_jobs.data.preflight import data_inputs

    spec = spec.replace(data=dataclasses.replace(spec.data, tokenize_workers=workers, cache_uri=str(cache_root)))
    start = time.perf_counter()
    prepared = prepare(spec)
    seconds = time.perf_counter() - start
    rows = prepared.cache.rows_tokenized
    start = time.perf_counter()  # one shuffled epoch read back the way a trainer reads it
    tokens = prepared.order.dataset(0, world=1, micro_batch_size=1).sum("num_tokens")
    result = {
        "workers": workers,
        "rows": rows,
        "seconds": seconds,
        "rows_per_s": rows / seconds,
        "tokens_per_s": tokens / seconds,
        "packed_rows": prepared.order.rows,
        "fill": prepared.cache.fill.to_dict() if prepared.cache.fill else None,
    }
    if prepared.cache.fill and prepared.cache.fill.stream_s:  # the rate once the stream runs: no start-up, no tail
        result["stream_rows_per_s"] = rows / prepared.cache.fill.stream_s
    if fill_only:
        return result
    result["epoch_read_s"] = time.perf_counter() - start
    start = time.perf_counter()
    inputs = data_inputs(spec)  # listed with sizes, so a large file is read in ranges as in a job
    tokenize(spec.data, inputs, spec.model.path, None, ("train",), new_ledger(spec.data, fail_early=False)).materialize()
    result["tokenize_only_s"] = time.perf_counter() - start
    return result


def cold_and_warm(spec: FineTuneSpec, tiny: Path, data: Path, work: Path) -> dict:
    """The same job twice, data and model in S3: what the second start saves."""
    import gzip

    import ray
    from s3_data_bench import moto_bucket  # bench/ is this script's directory, first on sys.path

    from ray_jobs.run import run

    runs = {}
    with moto_bucket() as s3:
        s3.put_object(Bucket="bench", Key="data/chat.jsonl.gz", Body=gzip.compress(data.read_bytes()))
        for f in (tiny / "model").iterdir():
            s3.upload_file(str(f), "bench", f"model/{f.name}")
        ray.shutdown()  # a fresh cluster that inherits the S3 settings, like a job on a new node
        spec = spec.replace(
            model=dataclasses.replace(spec.model, path="s3://bench/model"),
            data=dataclasses.replace(spec.data, path="s3://bench/data/", tokenize_workers=max(1, (os.cpu_count() or 2) - 1)),
            train=dataclasses.replace(spec.train, max_steps=5, log_every=5, checkpoint_every=5, eval_every=None),
        )
        for label in ("cold", "warm"):
            summary = run(spec.replace(name=f"start-{label}")).summary
            d, m = summary.caches.dataset, summary.caches.model
            runs[label] = {
                "time_to_first_step_s": summary.time_to_first_step_s,
                "wall_time_s": summary.wall_time_s,
                "bytes_downloaded": d.bytes_downloaded + m.bytes_downloaded,
                "rows_tokenized": d.rows_tokenized,
                "data_prepare_s": d.seconds,
            }
            print(label, runs[label])
    return runs


def plot(results: dict) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = 2 if results["start"] else 1
    fig, axes = plt.subplots(1, panels, figsize=(6 * panels, 4))
    axes = axes if panels > 1 else [axes]
    t = results["throughput"]
    axes[0].plot([r["workers"] for r in t], [r["tokens_per_s"] / 1e3 for r in t], "o-", label="Ray Data actors (cache fill)")
    axes[0].axhline(results["one_thread"]["tokens_per_s"] / 1e3, color="gray", ls="--", label="one thread in the driver")
    if results.get("bare"):
        bare = results["bare"]["tokens_per_s"] / 1e3
        axes[0].plot(
            [r["workers"] for r in t], [bare * r["workers"] for r in t], ":", color="#888", label="bare encode_batch x actors"
        )
        par = [(1, results["bare"]["tokens_per_s"])] + [(b["procs"], b["tokens_per_s"]) for b in results.get("bare_parallel", [])]
        if len(par) > 1:
            label = "bare encode_batch, N processes at once"
            axes[0].plot([n for n, _ in par], [v / 1e3 for _, v in par], "s--", color="#a60", label=label)
    axes[0].set(
        xlabel="tokenizer actors",
        ylabel="thousand tokens/s",
        title=f"Tokenize + pack, {results['rows']:,} rows, {results['cpus']} CPUs, {results['tokenizer']}",
    )
    axes[0].set_ylim(bottom=0)
    axes[0].legend()
    if results["start"]:
        s = results["start"]
        axes[1].bar(
            ["cold", "warm"], [s["cold"]["time_to_first_step_s"], s["warm"]["time_to_first_step_s"]], color=["#c44", "#4a4"]
        )
        for i, k in enumerate(("cold", "warm")):
            text = f"{s[k]['bytes_downloaded'] / 2**20:.1f} MiB down\n{s[k]['rows_tokenized']:,} rows tokenized"
            axes[1].text(i, s[k]["time_to_first_step_s"], text, ha="center", va="bottom")
        top = max(s["cold"]["time_to_first_step_s"], s["warm"]["time_to_first_step_s"])
        axes[1].set(ylabel="seconds to first step", title="Same job twice (data + model in S3)", ylim=(0, 1.3 * top))
    fig.tight_layout()
    fig.savefig(OUT / "data_bench.png", dpi=110)


if __name__ == "__main__":
    main()
