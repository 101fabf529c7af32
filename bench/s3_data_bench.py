"""The data path from gzipped JSONL shards in S3 (a local moto server): streaming ahead of the GPUs, and the
founding story (a cold fill against one thread, then a warm start that reads and tokenizes nothing).

    .venv/bin/python bench/s3_data_bench.py stream --rows 40000                 # about 2 minutes on 2 cores
    .venv/bin/python bench/s3_data_bench.py founding --rows 100000 --workers 1  # about 3 minutes on 2 cores
    bash bench/founding_device.sh   # the 16-core host: --rows 2000000 --shards 32 --workers 12 (bench/RESULTS.md)

The moto server runs as a process of its own (``python -m moto.server``), with ``MOTO_SITE`` (a directory
holding moto and its dependencies) on its path when set, and nothing of the bench's on it. So moto need not
share an interpreter's packages with Ray and transformers: on the device, whose image lacks moto, bundling it
into ``.gpu`` broke transformers' imports. ``bench/founding_device.sh`` carries it in ``.moto`` instead. The
bench itself talks to S3 through pyarrow, as the job does.

``stream``: ``data.cache`` off, so the tokenizers feed training as it runs. ``--gpus`` consumers take the
dataset's ``streaming_split`` as Ray Train's workers do, each in an actor of its own, and play a GPU that
trains ``--tokens-per-gpu`` real tokens a second: after each micro-batch they wait as long as that many
tokens would take. What the bench measures is the time each consumer then waits for its next micro-batch:
the job's data wait. The first batch is counted apart (the pipeline's start, as in the phase table).

``founding``: the same shards, ``data.cache`` on. The cold fill's wall time against one thread doing the same
template + tokenize + pack in the driver, measured over a sample (``--sample-rows``) and scaled to all the
rows, three times (before the fill, right after it, and after ``--rest`` seconds idle); then the same job's
data again, which must read 0 bytes and tokenize 0 rows.

Data: ``bench/make_chat_data.py --lexicon zipf`` rows, a 32k BPE trained on them (``bench/real_tokenizer.py``),
ChatML, 2,048-token packing. Writes ``bench/out/s3_data_bench_<mode>.json``.
"""

from __future__ import annotations

import argparse
import atexit
import dataclasses
import gzip
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

from rayft_contract.spec import FineTuneSpec  # noqa: E402

OUT = ROOT / "bench" / "out"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("mode", choices=("stream", "founding"))
    parser.add_argument("--rows", type=int, default=40000)
    parser.add_argument("--shards", type=int, default=8, help="gzipped JSONL files (each is read by one task)")
    parser.add_argument("--workers", type=int, default=1, help="tokenizer actors")
    parser.add_argument("--gpus", type=int, default=2, help="stream: consumers playing a GPU each")
    parser.add_argument("--tokens-per-gpu", type=float, default=20000.0, help="stream: real tokens a second each trains")
    parser.add_argument("--micro-batch", type=int, default=4, help="stream: packed rows per micro-batch")
    parser.add_argument("--seconds", type=float, default=60.0, help="stream: how long each consumer trains")
    parser.add_argument("--sample-rows", type=int, default=20000, help="founding: rows one thread is timed on")
    parser.add_argument("--rest", type=float, default=30.0, help="founding: idle seconds before the last one-thread line")
    args = parser.parse_args()
    OUT.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="rayft-s3-bench-"))
    atexit.register(shutil.rmtree, work, ignore_errors=True)  # the shards and their cache entries: GBs
    os.environ["RAYFT_CACHE_DIR"] = str(work / "cache")
    data, tokenizer = make_data(work, args.rows, args.shards)
    with moto_bucket() as fs:
        sent = upload(fs, data)
        print(f"{args.rows:,} rows in {args.shards} gzipped shards: {sent / 2**20:,.0f} MiB in s3://bench/data/", flush=True)
        spec = base_spec(tokenizer, work, args.workers)
        from ray_jobs.local_ray import quiet_ray_data, start_local_cluster

        start_local_cluster(num_cpus=max(args.workers + 1, os.cpu_count() or 2))
        quiet_ray_data()
        if args.mode == "stream":
            result = stream(spec, args)
        else:
            result = founding(spec, args, data)
    result.update(rows=args.rows, shards=args.shards, gz_bytes=sent, workers=args.workers, cpus=os.cpu_count())
    (OUT / f"s3_data_bench_{args.mode}.json").write_text(json.dumps(result, indent=2))
    print(json.dumps(result, indent=2))


def make_rows(work: Path, rows: int) -> tuple[Path, Path]:
    """``rows`` zipf chat rows in one JSONL file, and a 32k BPE trained on them."""
    jsonl = work / "chat.jsonl"
    jobs = ["--jobs", str(os.cpu_count() or 1)] if rows > 100_000 else []
    subprocess.run(
        [sys.executable, str(ROOT / "bench/make_chat_data.py"), str(jsonl), "--rows", str(rows), "--lexicon", "zipf", *jobs],
        check=True,
    )
    tokenizer = work / "tok32k"
    subprocess.run([sys.executable, str(ROOT / "bench/real_tokenizer.py"), str(tokenizer), "--data", str(jsonl)], check=True)
    return jsonl, tokenizer


def make_data(work: Path, rows: int, shards: int) -> tuple[list[Path], Path]:
    """``rows`` zipf chat rows cut into ``shards`` gzipped JSONL files, and a 32k BPE trained on them."""
    jsonl, tokenizer = make_rows(work, rows)
    plain = [work / f"part-{k:04d}.jsonl" for k in range(shards)]
    outs = [p.open("w") for p in plain]
    with jsonl.open() as src:
        for i, line in enumerate(src):
            outs[i * shards // rows if rows else 0].write(line)  # contiguous runs: shard k holds rows k*n/shards...
    for out in outs:
        out.close()
    jsonl.unlink()
    from concurrent.futures import ProcessPoolExecutor

    with ProcessPoolExecutor(min(shards, os.cpu_count() or 1)) as pool:  # gzip at its default level, a shard a core
        return list(pool.map(_gzip, plain)), tokenizer


def _gzip(path: Path) -> Path:
    out = path.with_name(path.name + ".gz")
    with path.open("rb") as src, gzip.open(out, "wb", compresslevel=6) as dst:
        while chunk := src.read(1 << 22):
            dst.write(chunk)
    path.unlink()
    return out


class moto_bucket:
    """A moto S3 server on loopback (a process of its own, see the module's docstring) with bucket ``bench``,
    and the ``AWS_*`` environment pointed at it (the Ray cluster, started after, inherits it). Yields the
    bench's pyarrow filesystem on it."""

    def __enter__(self):
        import socket

        import pyarrow.fs as pafs

        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        env = dict(os.environ)
        if os.environ.get("MOTO_SITE"):
            env["PYTHONPATH"] = os.environ["MOTO_SITE"]
        self.log = (OUT / "moto.log").open("w")
        self.server = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
            env=env,
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + 60
        while True:  # wait for it to listen
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if self.server.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"the moto server did not start: see {OUT / 'moto.log'}") from None
                time.sleep(0.2)
        os.environ.update(
            AWS_ENDPOINT_URL=f"http://127.0.0.1:{port}",
            AWS_ACCESS_KEY_ID="bench",
            AWS_SECRET_ACCESS_KEY="bench",
            AWS_REGION="us-east-1",
        )
        fs = pafs.S3FileSystem(
            endpoint_override=f"127.0.0.1:{port}",
            scheme="http",
            access_key="bench",
            secret_key="bench",
            region="us-east-1",
            allow_bucket_creation=True,
        )
        fs.create_dir("bench")
        return fs

    def __exit__(self, *exc):
        import ray

        ray.shutdown()
        self.server.terminate()
        self.server.wait(timeout=30)
        self.log.close()


def upload(fs, paths: list[Path]) -> int:
    import pyarrow.fs as pafs

    for p in paths:
        pafs.copy_files(str(p), f"bench/data/{p.name}", destination_filesystem=fs)
    return sum(p.stat().st_size for p in paths)


def base_spec(tokenizer: Path, work: Path, workers: int, data: str = "s3://bench/data/") -> FineTuneSpec:
    """The tiny CPU preset over ``data`` with the 32k BPE, 2,048-token packing and ``workers`` tokenizer actors."""
    spec = FineTuneSpec.load(ROOT / "ray_jobs/presets/tiny_cpu.yaml")
    return spec.replace(
        model=dataclasses.replace(spec.model, path=str(tokenizer)),
        data=dataclasses.replace(spec.data, path=data, max_seq_len=2048, val_fraction=0.0, tokenize_workers=workers),
        output=dataclasses.replace(spec.output, dir=str(work / "runs")),
    )


def stream(spec: FineTuneSpec, args: argparse.Namespace) -> dict:
    import ray

    from ray_jobs.data.cache import prepare

    spec = spec.replace(data=dataclasses.replace(spec.data, cache=False))
    started = time.perf_counter()
    prepared = prepare(spec)
    shards = prepared.datasets["train"].streaming_split(args.gpus, equal=True)
    gpu = ray.remote(num_cpus=0)(FakeGpu)  # a real trainer's CPUs are its own; these hold none of the tokenizers'
    consumers = [gpu.remote(args.tokens_per_gpu, args.micro_batch, spec.data.prefetch_batches) for _ in shards]
    runs = ray.get([c.train.remote(shard, args.seconds) for c, shard in zip(consumers, shards)])
    wall = time.perf_counter() - started
    for rank, r in enumerate(runs):
        print(
            f"GPU {rank}: {r['tokens_per_s']:,.0f} tokens/s, data wait {r['data_wait_frac']:.2%} after a first batch at "
            f"{r['first_batch_s']:.1f} s ({r['steps']} steps)"
        )
    return {
        "mode": "stream",
        "gpus": args.gpus,
        "tokens_per_gpu_target": args.tokens_per_gpu,
        "wall_s": wall,
        "consumers": runs,
        "data_wait_frac_max": max(r["data_wait_frac"] for r in runs),
    }


class FakeGpu:
    """One Ray Train worker's side of the data: its shard's micro-batches, with a GPU's step time between."""

    def __init__(self, tokens_per_s: float, micro_batch: int, prefetch: int):
        self.tokens_per_s, self.micro_batch, self.prefetch = tokens_per_s, micro_batch, prefetch

    def train(self, shard, seconds: float) -> dict:
        batches = shard.iter_batches(batch_size=self.micro_batch, batch_format="numpy", prefetch_batches=self.prefetch)
        start = trained_from = time.perf_counter()
        first = None
        waits, tokens, steps = [], 0, 0
        it = iter(batches)
        while True:
            asked = time.perf_counter()
            try:
                batch = next(it)
            except StopIteration:
                break
            got = time.perf_counter()
            if first is None:
                first, trained_from = got - start, got
            else:
                waits.append(got - asked)
            n = int(batch["num_tokens"].sum())
            time.sleep(n / self.tokens_per_s)  # the GPU's step: forward, backward, optimizer
            tokens += n if steps else 0
            steps += 1
            if got - trained_from >= seconds:
                break
        for _ in it:  # let the split finish so the other consumers are not held
            pass
        trained = time.perf_counter() - trained_from
        return {
            "steps": steps,
            "first_batch_s": first or 0.0,
            "tokens_per_s": tokens / trained if trained else 0.0,
            "data_wait_frac": sum(waits) / trained if trained else 0.0,
            "wait_p99_s": statistics.quantiles(waits, n=100)[-1] if len(waits) > 1 else 0.0,
        }


def founding(spec: FineTuneSpec, args: argparse.Namespace, data: list[Path]) -> dict:
    from ray_jobs.data.cache import prepare

    one = one_thread(spec, data, args.sample_rows)
    print(
        f"one thread in the driver: {one:,.0f} rows/s over {args.sample_rows:,} rows: {args.rows / one:,.0f} s for all",
        flush=True,
    )
    start = time.perf_counter()
    cold = prepare(spec)
    cold_s = time.perf_counter() - start
    print(f"cold fill, {args.workers} tokenizer actors: {cold_s:.1f} s ({cold.cache.describe()})", flush=True)
    if cold.cache.fill:
        print(f"  {cold.cache.fill.describe()}")
    # The one-thread line again, right after the fill and after --rest seconds idle: on the lent host one core's
    # rate moved 10-35% between runs minutes apart, lower right after all the cores were busy (bench/RESULTS.md).
    # The ratio is read against the median of the three; each is kept.
    again = one_thread(spec, data, args.sample_rows)
    print(f"one thread right after the fill: {again:,.0f} rows/s ({args.rows / again:,.0f} s for all)", flush=True)
    start = time.perf_counter()
    warm = prepare(spec)
    warm_s = time.perf_counter() - start
    print(f"warm: {warm_s:.1f} s ({warm.cache.describe()})")
    time.sleep(args.rest)
    rested = one_thread(spec, data, args.sample_rows)
    print(f"one thread after {args.rest:.0f} s idle: {rested:,.0f} rows/s ({args.rows / rested:,.0f} s for all)", flush=True)
    rates = [one, again, rested]
    median = statistics.median(rates)
    print(
        f"cold fill against one thread: {args.rows / median / cold_s:.1f}x by the median one-thread rate "
        f"({', '.join(f'{args.rows / r / cold_s:.1f}x' for r in rates)} against before, right after, rested)"
    )
    return {
        "mode": "founding",
        "one_thread_rows_per_s": one,
        "one_thread_after_rows_per_s": again,
        "one_thread_rested_rows_per_s": rested,
        "rest_s": args.rest,
        "one_thread_s_scaled": args.rows / median,
        "cold_s": cold_s,
        "cold_rows_tokenized": cold.cache.rows_tokenized,
        "cold_bytes": cold.cache.bytes_downloaded,
        "cold_fill": cold.cache.fill.to_dict() if cold.cache.fill else None,
        "x_one_thread": args.rows / median / cold_s,
        "x_one_thread_before_after_rested": [args.rows / r / cold_s for r in rates],
        "warm_s": warm_s,
        "warm_bytes": warm.cache.bytes_downloaded,
        "warm_rows_tokenized": warm.cache.rows_tokenized,
    }


def one_thread(spec: FineTuneSpec, data: list[Path], rows: int) -> float:
    """Rows a second of the anti-pattern: gunzip, template, tokenize and pack on one thread, in a process
    pinned to one core with one Rust tokenizer thread (as the founding story's team ran, and as a tokenizer
    actor runs)."""
    import multiprocessing

    with multiprocessing.get_context("spawn").Pool(1) as pool:
        return pool.apply(_one_thread, (spec, data, rows))


def _one_thread(spec: FineTuneSpec, data: list[Path], rows: int) -> float:
    os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
    os.environ["RAYON_NUM_THREADS"] = "1"
    from ray_jobs.data.packing import pack
    from ray_jobs.data.pipeline import TokenizeAndPack
    from ray_jobs.data.quality import QualityReport

    udf = TokenizeAndPack(spec.model.path, None, spec.data, "chat", ("train",), ledger=None)
    start, done, examples, report = time.perf_counter(), 0, [], QualityReport()
    for path in data:
        with gzip.open(path, "rt") as fh:
            for line in fh:
                examples.append(udf.encode(line, report))
                done += 1
                if len(examples) == spec.data.tokenize_batch_size:
                    pack(examples, spec.data.max_seq_len, udf.pad_id)
                    examples = []
                if done >= rows:
                    return done / (time.perf_counter() - start)
    pack(examples, spec.data.max_seq_len, udf.pad_id)
    return done / (time.perf_counter() - start)


if __name__ == "__main__":
    main()
