"""Plot issue 14's fill scaling on the 16-core H200 host from ``bench/data_scaling_h200.json``.

    .venv/bin/python bench/plot_data_scaling.py     # writes bench/data_bench_h200_scaling.png

Left: a fill's rows/s (whole fill, and its stream alone) by tokenizer actors, beside the machine's own limit
for that many tokenizers (the bare ``encode_batch`` loop in N pinned processes at once). Right: how busy the
actors were during the stream: where it falls, the pipeline, not the tokenizers, set the pace.
"""

from __future__ import annotations

import json
from pathlib import Path

HERE = Path(__file__).resolve().parent


def main() -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    data = json.loads((HERE / "data_scaling_h200.json").read_text())
    fills = [f for f in data["fills"] if "batches_per_task" not in f]
    after = [f for f in data["fills"] if "batches_per_task" in f and not f.get("encode_fast")]
    latest = [f for f in data["fills"] if f.get("encode_fast") and f["block_mib"] == 16]
    bare = {int(n): v for n, v in data["bare_parallel"]["procs_rows_per_s"].items()}
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5))
    left.plot(list(bare), list(bare.values()), "s--", color="#a60", label="bare encode_batch, N pinned processes (the limit)")
    _fills(left, fills, "#36c", "#2a2", "Ray Data fill, whole (start to commit)", "the fill's stream alone")
    if after:
        _fills(
            left,
            after,
            "#c22",
            "#c22",
            "after: 8 tokenizer batches a task, 4 MiB blocks (call 5), whole fill",
            "after: its stream alone",
        )
        bare5 = {int(n): v for n, v in data["bare_parallel_call5"]["procs_rows_per_s"].items()}
        left.plot(list(bare5), list(bare5.values()), "s:", color="#c22", alpha=0.6, label="bare, call 5's host")
    if latest:
        _fills(
            left,
            latest,
            "#707",
            "#707",
            "latest: ids without offsets, collector paused, 16 MiB blocks (call 7), whole fill",
            "latest: its stream alone",
        )
    for f in fills + after + latest:
        left.annotate(
            f"{f['rows'] // 1000}k", (f["workers"], f["rows_per_s"]), textcoords="offset points", xytext=(4, -12), fontsize=7
        )
    left.set(
        xlabel="tokenizer actors (processes)",
        ylabel="rows/s",
        title="Fill throughput, 32k BPE, 16-core H200 host",
        ylim=(0, None),
    )
    left.legend(fontsize=8)
    busy = [f for f in fills + after + latest if f["busy_frac"] is not None]
    right.bar([f"{f['workers']}\n(call {f['call']})" for f in busy], [100 * f["busy_frac"] for f in busy], color="#36c")
    right.set(
        xlabel="tokenizer actors", ylabel="% of the stream spent tokenizing", title="How busy the actors were", ylim=(0, 100)
    )
    for i, f in enumerate(busy):
        right.text(i, 100 * f["busy_frac"] + 2, f"{f['busy_frac']:.0%}", ha="center")
    fig.tight_layout()
    fig.savefig(HERE / "data_bench_h200_scaling.png", dpi=110)


def _fills(ax, fills: list[dict], whole_color: str, stream_color: str, whole_label: str, stream_label: str) -> None:
    """Each fill's rows/s, whole (circles) and its stream alone (triangles, where measured)."""
    ax.plot([f["workers"] for f in fills], [f["rows_per_s"] for f in fills], "o", color=whole_color, label=whole_label)
    streamed = [f for f in fills if f["stream_rows_per_s"]]
    ax.plot(
        [f["workers"] for f in streamed], [f["stream_rows_per_s"] for f in streamed], "^", color=stream_color, label=stream_label
    )


if __name__ == "__main__":
    main()
