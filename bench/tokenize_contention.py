"""Why a tokenizer actor beside 13 busy neighbours tokenizes a row 1.4x slower than one alone: the chip or the
batch. No Ray, no I/O: the same 32k-BPE work in N processes at once, each pinned to a core of its own.

    .venv/bin/python bench/tokenize_contention.py --procs 1,2 --rows 2048      # about a minute here
    bash bench/contention_device.sh                                          # the 16-core H200 host

Each process (spawned, so each loads its own tokenizer as an actor does) encodes the same templated chat rows
with ``encode_batch_fast`` in chunks of ``--chunks`` texts (a fill's actor task hands the tokenizer 2,048 rows,
about 8,000 texts, at once; the one-thread line of ``s3_data_bench.py founding`` encodes one row's 4 texts at a
time), and times a pure-Python loop that touches no memory beside it (the control). Every process starts at
a barrier, so all N run together. Per process: rows/s (the control: loops/s).

Read it so: if the control slows with N as much as the tokenizer does, a core is slower when its neighbours are
busy (the chip's clock under load, shared by every kind of work). If only the tokenizer slows, and less in small
chunks, the cause is memory the processes share (the last-level cache, DRAM), and smaller chunks are the lever.
Prints a table and writes ``bench/out/tokenize_contention.json``.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import pickle
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
CONTROL = "python loop"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--procs", default="1,8,14,16", help="processes at once, one run per count")
    parser.add_argument("--chunks", default="8192,256,4", help="texts per encode_batch_fast call")
    parser.add_argument("--rows", type=int, default=8192, help="rows each process encodes per chunk size")
    parser.add_argument("--repeats", type=int, default=2, help="the whole grid again, interleaved")
    parser.add_argument("--data-rows", type=int, default=100_000, help="rows the 32k BPE is trained on")
    args = parser.parse_args()
    procs = [int(p) for p in args.procs.split(",")]
    chunks = [int(c) for c in args.chunks.split(",")]
    cores = sorted(os.sched_getaffinity(0))
    if max(procs) > len(cores):
        sys.exit(f"--procs {max(procs)} is more than this machine's {len(cores)} cores")
    with tempfile.TemporaryDirectory(prefix="rayft-contention-") as tmp:
        texts_file, tok = prepare(Path(tmp), args.data_rows, args.rows)
        results: list[dict] = []
        ctx = multiprocessing.get_context("spawn")
        for repeat in range(args.repeats):
            for n in procs:
                barrier, results_q = ctx.Barrier(n), ctx.Queue()
                workers = [
                    ctx.Process(target=worker, args=(cores[i], str(tok), texts_file, chunks, barrier, results_q))
                    for i in range(n)
                ]
                for w in workers:
                    w.start()
                runs = [results_q.get() for _ in workers]
                for w in workers:
                    w.join()
                for what in [*chunks, CONTROL]:
                    rates = [r[str(what)] for r in runs]
                    results.append({"repeat": repeat, "procs": n, "work": str(what), "per_proc": statistics.median(rates)})
                print(
                    f"repeat {repeat}, {n:2d} processes: "
                    + ", ".join(
                        f"{r['work']}: {r['per_proc']:,.0f}" for r in results if r["procs"] == n and r["repeat"] == repeat
                    ),
                    flush=True,
                )
    report(results, procs, chunks)


def prepare(tmp: Path, data_rows: int, rows: int) -> tuple[str, Path]:
    """Zipf chat rows, a 32k BPE trained on them, and the first ``rows`` rows' ChatML segments (pickled)."""
    data, tok = tmp / "chat.jsonl", tmp / "tok32k"
    jobs = ["--jobs", str(os.cpu_count() or 1)]
    subprocess.run(
        [sys.executable, str(ROOT / "bench/make_chat_data.py"), str(data), "--rows", str(data_rows), "--lexicon", "zipf", *jobs],
        check=True,
    )
    subprocess.run([sys.executable, str(ROOT / "bench/real_tokenizer.py"), str(tok), "--data", str(data)], check=True)
    from ray_jobs.data.formats import Turn
    from ray_jobs.data.template import ChatEncoder, load_tokenizer

    encoder = ChatEncoder(load_tokenizer(str(tok)))
    with data.open() as fh:
        conversations = [json.loads(next(fh))["messages"] for _ in range(rows)]
    texts = [[text for text, _ in encoder.segments([Turn(m["role"], m["content"]) for m in c])] for c in conversations]
    texts_file = tmp / "texts.pkl"
    texts_file.write_bytes(pickle.dumps(texts))
    return str(texts_file), tok


def worker(core: int, tok: str, texts_file: str, chunks: list[int], barrier, results_q) -> None:
    os.sched_setaffinity(0, {core})
    os.environ["RAYON_NUM_THREADS"] = "1"
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    from ray_jobs.data.template import load_tokenizer

    rust = load_tokenizer(tok).backend_tokenizer
    rows = pickle.loads(Path(texts_file).read_bytes())  # this bench's own file, written by prepare()
    flat = [t for row in rows for t in row]
    rust.encode_batch_fast(flat[:512], add_special_tokens=False)  # warm: the first call builds caches
    out: dict[str, float] = {}
    for chunk in chunks:
        barrier.wait()  # each work starts together: the fastest process's next work waits for the slowest
        start = time.perf_counter()
        for i in range(0, len(flat), chunk):
            [e.ids for e in rust.encode_batch_fast(flat[i : i + chunk], add_special_tokens=False)]
        out[str(chunk)] = len(rows) / (time.perf_counter() - start)
    barrier.wait()
    start, total = time.perf_counter(), 0
    for i in range(3_000_000):
        total += i & 7
    out[CONTROL] = 3_000_000 / (time.perf_counter() - start)
    results_q.put(out)


def report(results: list[dict], procs: list[int], chunks: list[int]) -> None:
    works = [str(c) for c in chunks] + [CONTROL]
    alone = {w: statistics.median(r["per_proc"] for r in results if r["procs"] == 1 and r["work"] == w) for w in works}
    print("\nper process, as a share of one process alone (median of repeats):")
    print("processes | " + " | ".join(f"{w} texts" if w != CONTROL else w for w in works))
    for n in procs:
        row = [statistics.median(r["per_proc"] for r in results if r["procs"] == n and r["work"] == w) / alone[w] for w in works]
        print(f"{n:9d} | " + " | ".join(f"{x:.0%}" for x in row))
    out = ROOT / "bench/out"
    out.mkdir(parents=True, exist_ok=True)
    (out / "tokenize_contention.json").write_text(json.dumps({"alone": alone, "results": results}, indent=2))


if __name__ == "__main__":
    main()
