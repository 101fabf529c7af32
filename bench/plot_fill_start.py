"""Where a new job's fill start goes, task by task, from ``bench/fill_start.py``'s task events, fills side by side.

    .venv/bin/python bench/plot_fill_start.py      # a reading task per piece at once against two at a time
    .venv/bin/python bench/plot_fill_start.py bench/fill_prestart_h200.json:3 bench/fill_start_slow_host_h200.json:2 \
        --out bench/fill_start_hosts_h200.png      # the same fill on a faster and a slower H200 host

Each row is a kind of task: from its first task's creation, through the wait for a worker process (light), to the
first task running (dark) and its end. The tick on the reading task's row is where its function began: before it,
its process imported Ray Data. The dashed line is the first tokenizer task: the fill's start.
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
    parser.add_argument(
        "sources",
        nargs="*",
        default=[f"{ROOT / 'bench' / 'fill_start_readers_h200.json'}:3,4"],
        help="PATH:FILLS, a fill_start.py output and its 1-based fills to draw",
    )
    parser.add_argument("--out", default=str(ROOT / "bench" / "fill_start_tasks_h200.png"))
    args = parser.parse_args()
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    chosen = []
    for source in args.sources:
        path, numbers = source.rsplit(":", 1)
        fills = json.loads(Path(path).read_text())["fills"]
        chosen.extend((Path(path).stem, int(n), fills[int(n) - 1]) for n in numbers.split(","))
    figure, axes = plt.subplots(1, len(chosen), figsize=(6 * len(chosen), 3.2), sharex=True, sharey=True, squeeze=False)
    for ax, (name, number, fill) in zip(axes[0], chosen):
        rows = [(kind, label, fill["tasks"][kind]) for kind, label in KINDS.items() if kind in fill["tasks"]]
        began = _fill_began(fill)
        for y, (kind, _, t) in enumerate(rows):
            created, running = t["pending_args_avail"], t.get("running", t["pending_args_avail"])
            ax.barh(y, running - created, left=created, color="#c6dbef")
            ax.barh(y, t.get("finished", running) - running, left=running, color="#2171b5")
            if kind == "normal_task:MapBatches(read_pieces)":
                ax.plot([fill["fill"]["first_read_s"] + began] * 2, [y - 0.45, y + 0.45], color="#fdae6b", lw=3)
        ax.axvline(fill["fill"]["start_s"] + began, color="k", linestyle="--", linewidth=1)
        ax.set_yticks(range(len(rows)), [label for _, label, _ in rows])
        ax.invert_yaxis()
        bound = fill.get("actors_per_reader")  # None: the default
        reading = "" if bound is None else f"{bound} actors per reading task; " if bound else "a reading task per piece; "
        ax.set_title(f"{name}, fill {number}: {reading}start {fill['fill']['start_s']:.1f} s", fontsize=9)
        ax.set_xlabel("seconds from the fill's call (a new Ray job)")
    figure.tight_layout()
    figure.savefig(args.out, dpi=110)
    print(args.out)


def _fill_began(fill: dict) -> float:
    """When the fill's clock (``FillTimes``, from its own start) began on the task events' clock (from the driver's
    call to prepare, which lists the files first): the first tokenizer task's start on both."""
    first = fill["tasks"].get("actor_task:MapWorker(MapBatches(TokenizeAndPack)).submit")
    return first["running"] - fill["fill"]["start_s"] if first else 0.0


if __name__ == "__main__":
    main()
