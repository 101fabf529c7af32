"""Where a new job's fill start goes, task by task: one fill with every piece's reading task at once against one
with two at a time (``ray_jobs.data.ACTORS_PER_READER``), from ``bench/fill_start.py``'s task events.

    .venv/bin/python bench/plot_fill_start.py [bench/fill_start_readers_h200.json] [--fills 3,4]

Each row is a kind of task: from its first task's creation, through the wait for a worker process (light), to the
first task running (dark) and its end. The dashed line is the first tokenizer task: the fill's start.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
KINDS = {  # the task kinds on a fill's start, in its order, and what to call them
    "actor_creation_task:RowLedger.__init__": "row ledger (actor)",
    "actor_creation_task:MapWorker(MapBatches(TokenizeAndPack)).__init__": "tokenizer actors (first)",
    "normal_task:MapBatches(read_pieces)": "reading task (first)",
    "normal_task:StreamingRepartition[num_rows_per_block=2048,strict=True]": "re-cut into tokenizer tasks",
    "actor_task:MapWorker(MapBatches(TokenizeAndPack)).submit": "first tokenizer task",
}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("path", nargs="?", default=str(ROOT / "bench" / "fill_start_readers_h200.json"))
    parser.add_argument("--fills", default="3,4", help="1-based fills to draw, side by side")
    parser.add_argument("--out", default=str(ROOT / "bench" / "fill_start_tasks_h200.png"))
    args = parser.parse_args()
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fills = json.loads(Path(args.path).read_text())["fills"]
    chosen = [int(f) for f in args.fills.split(",")]
    figure, axes = plt.subplots(1, len(chosen), figsize=(6 * len(chosen), 3.2), sharex=True, sharey=True, squeeze=False)
    for ax, number in zip(axes[0], chosen):
        fill = fills[number - 1]
        rows = [(label, fill["tasks"][kind]) for kind, label in KINDS.items() if kind in fill["tasks"]]
        for y, (_, t) in enumerate(rows):
            created, running = t["pending_args_avail"], t.get("running", t["pending_args_avail"])
            ax.barh(y, running - created, left=created, color="#c6dbef")
            ax.barh(y, t.get("finished", running) - running, left=running, color="#2171b5")
        ax.axvline(fill["fill"]["start_s"], color="k", linestyle="--", linewidth=1)
        ax.set_yticks(range(len(rows)), [label for label, _ in rows])
        ax.invert_yaxis()
        bound = fill.get("actors_per_reader")
        ax.set_title(
            f"fill {number}: {f'{bound} actors per reading task' if bound else 'a reading task per piece, all at once'}; "
            f"start {fill['fill']['start_s']:.1f} s",
            fontsize=9,
        )
        ax.set_xlabel("seconds from the fill's call (a new Ray job)")
    figure.tight_layout()
    figure.savefig(args.out, dpi=110)
    print(args.out)


if __name__ == "__main__":
    main()
