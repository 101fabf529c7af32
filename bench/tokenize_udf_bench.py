"""One tokenizer actor's work on one core, without Ray: the UDF against the bare ``encode_batch`` loop.

    .venv/bin/python bench/tokenize_udf_bench.py [--rows 8000] [--repeats 6]     # about 2 minutes here

Builds ``bench/make_chat_data.py --lexicon zipf`` rows and a 32k BPE (``bench/real_tokenizer.py``) in a temporary
directory, then times, interleaved and best of ``--repeats``, in a process pinned to one core with one Rust
thread: ``TokenizeAndPack`` on tasks of ``BATCHES_PER_TASK`` batches as it ships, the same with the cyclic
collector left on and with ``encode_batch`` (offsets computed) instead of ``encode_batch_fast``, and the bare
loop over the templated rows (templating not timed), the issue's per-core limit. It checks that every variant
packs the same rows. A noisy machine moves single runs by 30%: read the best-of column.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=8000)
    parser.add_argument("--repeats", type=int, default=6)
    args = parser.parse_args()
    os.sched_setaffinity(0, {max(os.sched_getaffinity(0))})
    os.environ["RAYON_NUM_THREADS"] = "1"
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    with tempfile.TemporaryDirectory(prefix="rayft-udf-bench-") as tmp:
        data, tok = Path(tmp, "chat.jsonl"), Path(tmp, "tok32k")
        subprocess.run(
            [sys.executable, str(ROOT / "bench/make_chat_data.py"), str(data), "--rows", str(args.rows), "--lexicon", "zipf"],
            check=True,
        )
        subprocess.run([sys.executable, str(ROOT / "bench/real_tokenizer.py"), str(tok), "--data", str(data)], check=True)
        run(data, tok, args.repeats)


def run(data: Path, tok: Path, repeats: int) -> None:
    import numpy as np
    import pyarrow as pa
    from transformers import AutoTokenizer

    import ray_jobs.data.pipeline as udf_module
    from rayft_contract.spec import FineTuneSpec

    spec = FineTuneSpec.load(ROOT / "ray_jobs/presets/tiny_cpu.yaml")
    cfg = dataclasses.replace(spec.data, path=str(data), max_seq_len=2048, val_fraction=0.0)
    udf = udf_module.TokenizeAndPack(str(tok), None, cfg, "chat", ("train",), ledger=None)
    lines = data.read_text().splitlines()
    n = len(lines)
    table = pa.table({"source": ["x"] * n, "file": [0] * n, "piece": [0] * n, "line": list(range(n)), "record": lines})
    task = cfg.tokenize_batch_size * udf_module.BATCHES_PER_TASK
    rust, paused = udf.encoder._rust, udf_module.collector_paused

    class WithOffsets:  # the Rust tokenizer without encode_batch_fast: ChatEncoder falls back to encode_batch
        def encode_batch(self, *a, **k):
            return rust.encode_batch(*a, **k)

    def udf_with(collector_off: bool, fast: bool):
        def go():
            udf_module.collector_paused = paused if collector_off else contextlib.nullcontext
            udf.encoder._rust = rust if fast else WithOffsets()
            return [udf(table.slice(i, task)) for i in range(0, n, task)]

        return go

    auto = AutoTokenizer.from_pretrained(str(tok))
    texts = [auto.apply_chat_template(json.loads(line)["messages"], tokenize=False) for line in lines]

    def bare(method: str):
        def go():
            for i in range(0, n, 1000):
                getattr(auto.backend_tokenizer, method)(texts[i : i + 1000], add_special_tokens=False)

        return go

    variants = {
        "UDF, as shipped": udf_with(True, True),
        "UDF, collector on": udf_with(False, True),
        "UDF, encode_batch": udf_with(True, False),
        "UDF, both (before)": udf_with(False, False),
        "bare encode_batch": bare("encode_batch"),
        "bare encode_batch_fast": bare("encode_batch_fast"),
    }
    shipped, before = udf_with(True, True)(), udf_with(False, False)()
    assert all(np.array_equal(a[c], b[c]) for a, b in zip(shipped, before) for c in a), "the variants packed different rows"
    best = {k: float("inf") for k in variants}
    for _ in range(repeats):
        for name, go in variants.items():
            start = time.perf_counter()
            go()
            best[name] = min(best[name], time.perf_counter() - start)
    limit = n / best["bare encode_batch"]
    for name, seconds in best.items():
        print(f"{name:24s} {n / seconds:8,.0f} rows/s  {n / seconds / limit:5.0%} of bare encode_batch")


if __name__ == "__main__":
    main()
