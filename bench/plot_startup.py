"""Where each run's time to its first step went, as stacked bars: ``python bench/plot_startup.py RUNS.json OUT.png``.

``RUNS.json`` as ``bench/warm_workers_h200.json`` holds it: a ``runs`` list, each with ``run`` (its label) and
``phases_s`` (the phase table's labels, in seconds) and ``time_to_first_step_s``."""

from __future__ import annotations

import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

BEFORE_THE_FIRST_STEP = {  # the phase table's rows that come before the first step, and how the plot names them
    "connect to Ray": "connect",
    "cache fill: start (tokenizer actors, first reads)": "cache fill",
    "cache fill: read, template, tokenize, pack": "cache fill",
    "cache fill: write the entry": "cache fill",
    "trainer setup": "trainer setup",
    "trackers start (TensorBoard, MLflow, W&B): the wait": "trackers (wait)",
    "worker launch (controller, placement, worker process": "worker launch",
    "worker start (imports, process group)": "worker start (imports)",
    "model load": "model load",
    "waiting for the kernels compiled ahead": "wait for kernels compiled ahead",
    "worker setup": "worker setup",
    "warm-up steps": "first step",
}


def part_of(label: str) -> str | None:
    """The plot's name for a phase-table label; older files hold labels cut to 52 characters, newer ones whole."""
    return next((part for key, part in BEFORE_THE_FIRST_STEP.items() if label.startswith(key)), None)


def main(source: str, target: str) -> None:
    runs = json.load(open(source))["runs"]
    parts = list(dict.fromkeys(BEFORE_THE_FIRST_STEP.values()))
    widest = max(len(r["run"]) for r in runs)
    fig, ax = plt.subplots(figsize=(9 + 0.07 * widest, 0.6 * len(runs) + 2.4))
    labels = [r["run"] for r in runs]
    left = [0.0] * len(runs)
    for part in parts:
        widths = [sum(v for k, v in r["phases_s"].items() if part_of(k) == part) for r in runs]
        ax.barh(labels, widths, left=left, label=part)
        left = [a + b for a, b in zip(left, widths)]
    for y, (total, run) in enumerate(zip(left, runs)):
        ax.text(total + 0.5, y, f"{run['time_to_first_step_s']:.1f} s", va="center")
    for target_s, name in ((10, "warm aim 10 s"), (20, "warm target 20 s"), (45, "cold target 45 s")):
        ax.axvline(target_s, color="grey", linestyle="--", linewidth=1)
        ax.text(target_s + 0.3, -0.6, name, color="grey", fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("seconds to the first step (phases before it)")
    ax.legend(fontsize=8, ncol=3, loc="upper center", bbox_to_anchor=(0.5, -0.18))
    fig.tight_layout()
    fig.savefig(target, dpi=120)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
