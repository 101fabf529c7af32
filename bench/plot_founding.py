"""The founding story's calls side by side, and why a ratio to one thread moves between them.

    .venv/bin/python bench/plot_founding.py      # reads bench/founding_h200.json, bench/tokenize_contention_h200.json

Left: each call's cold fill of 2M rows against the one-thread line scaled to the same rows (every time it was
taken: before the fill, right after it, after a rest), and the 8x line. Right: one process's rate while N
processes run at once, pinned, as a share of one alone (``bench/tokenize_contention.py``): the 32k BPE in
large and small chunks, and a pure-Python loop. Writes ``bench/founding_h200.png``.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

BENCH = Path(__file__).resolve().parent


def main() -> None:
    founding = json.loads((BENCH / "founding_h200.json").read_text())["runs"]
    contention = json.loads((BENCH / "tokenize_contention_h200.json").read_text())
    fig, (left, right) = plt.subplots(1, 2, figsize=(13, 4.8))
    for x, run in enumerate(founding.values()):
        rates = [
            run[k] for k in ("one_thread_rows_per_s", "one_thread_after_rows_per_s", "one_thread_rested_rows_per_s") if k in run
        ]
        one_thread = [run["rows"] / r for r in rates]
        left.bar(x - 0.2, run["cold_s"], 0.4, color="#1f77b4", label="cold fill" if x == 0 else None)
        left.bar(x + 0.2, statistics.median(one_thread) / 8, 0.4, color="#bbb", label="one thread / 8" if x == 0 else None)
        left.scatter([x + 0.2] * len(one_thread), [s / 8 for s in one_thread], color="k", s=12, zorder=3)
        ratios = [s / run["cold_s"] for s in one_thread]
        spread = f"{min(ratios):.1f}x" if len(ratios) == 1 else f"{min(ratios):.1f}-{max(ratios):.1f}x"
        left.annotate(spread, (x, max(run["cold_s"], max(one_thread) / 8) + 4), ha="center")
    left.set_xticks(range(len(founding)), [n.replace(", ", "\n", 1) for n in founding], fontsize=8)
    left.set_ylabel("seconds")
    left.set_ylim(0, left.get_ylim()[1] * 1.1)
    left.set_title("2M chat rows from gzipped S3 shards: cold fill vs one thread (dots: each time it was taken)")
    left.title.set_fontsize(9)
    left.legend(fontsize=8)
    results, alone = contention["results"], contention["alone"]
    for work in alone:
        procs = sorted({r["procs"] for r in results})
        share = [
            statistics.median(r["per_proc"] for r in results if r["procs"] == n and r["work"] == work) / alone[work]
            for n in procs
        ]
        right.plot(procs, share, "o-", label=work if work == "python loop" else f"tokenizer, {work} texts a call")
    right.axhline(1.0, color="#888", lw=0.8)
    right.set_xlabel("processes at once, one per core (16 cores)")
    right.set_ylabel("one process's rate / alone")
    right.set_title("A core under load: the tokenizer's large batches hold up; Python slows")
    right.title.set_fontsize(9)
    right.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(BENCH / "founding_h200.png", dpi=110)


if __name__ == "__main__":
    main()
