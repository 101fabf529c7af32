"""Issue 14's scaling target from interleaved fills: ``python bench/plot_interleaved.py [RUNS.json] [OUT.png]``.

``RUNS.json`` as ``bench/data_interleaved_h200.json`` holds it (the default): cold fills of 1 and 14 tokenizer actors
in turn, in one call. Left: each fill's rows/s per actor, in the order they ran, beside the bare loop on one core.
The one-actor line moves between fills minutes apart, with no CPU stolen. Right: each 14-actor fill against each
one-actor fill of the call, with the 10x target: what the ratio reads depends on which one-actor fill it is read
against.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def main(source: Path, target: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    data = json.loads(source.read_text())
    fills = data["fills"]
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.3))
    order = [f"{i + 1}: {f['actors']} actor{'s' if f['actors'] > 1 else ''}" for i, f in enumerate(fills)]
    per_actor = [f["rows_per_s"] / f["actors"] for f in fills]
    left.bar(order, per_actor, color=["#1f77b4" if f["actors"] == 1 else "#ff7f0e" for f in fills])
    left.axhline(data["bare_encode_batch_rows_per_s"], color="grey", linestyle="--", linewidth=1)
    bare = data["bare_encode_batch_rows_per_s"]
    left.text(len(fills) - 0.6, bare * 1.09, f"bare encode_batch, one core: {bare:,}", color="grey", fontsize=8, ha="right")
    for x, (value, f) in enumerate(zip(per_actor, fills)):
        left.text(x, value + 15, f"{value:,.0f}\n{f['cores_by_role']['tokenizer actor']:.1f} cores", ha="center", fontsize=8)
    left.set_ylabel("rows/s per tokenizer actor")
    left.set_title("each fill, in the order it ran", fontsize=10)
    left.set_ylim(0, max(per_actor + [data["bare_encode_batch_rows_per_s"]]) * 1.25)

    ones = [(i, f) for i, f in enumerate(fills) if f["actors"] == 1]
    many = [(i, f) for i, f in enumerate(fills) if f["actors"] > 1]
    for i, f in many:
        ratios = [f["rows_per_s"] / one["rows_per_s"] for _, one in ones]
        right.plot([f"against fill {j + 1}" for j, _ in ones], ratios, "o-", label=f"fill {i + 1}: {f['actors']} actors")
    right.axhline(10, color="grey", linestyle="--", linewidth=1)
    right.text(0, 10.05, "target 10x", color="grey", fontsize=8)
    right.set_ylabel("rows/s against one actor's")
    right.set_title("14 actors against each one-actor fill of the call", fontsize=10)
    right.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(target, dpi=120)


if __name__ == "__main__":
    main(
        Path(sys.argv[1]) if len(sys.argv) > 1 else HERE / "data_interleaved_h200.json",
        Path(sys.argv[2]) if len(sys.argv) > 2 else HERE / "data_interleaved_h200.png",
    )
