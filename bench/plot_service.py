"""A job through the service, as its team waits for it: one bar per run from CreateJob to SUCCEEDED, cut where the
team hears each thing (bench/service_submit.py's marks). One panel per call of bench/service_7b.sh.

    python bench/plot_service.py bench/service_7b_h100.json bench/service_7b_h100.png
"""

from __future__ import annotations

import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

SEGMENTS = (  # (label, from mark, to mark, colour)
    ("to the job's start: the service, Ray Jobs, the driver's start", "created", "phase:connect", "#9e9e9e"),
    ("the job's set-up: connect, model, data, trainer", "phase:connect", "phase:training", "#64b5f6"),
    ("the worker's set-up and first step", "phase:training", "first_step", "#ef6c00"),
    ("training, then the adapter's export", "first_step", "summary", "#66bb6a"),
    ("to SUCCEEDED: the driver's end, seen by the service", "summary", "end", "#ab47bc"),
)


def marks(run: dict) -> dict[str, float]:
    return {**run["marks"], "created": run["created_s"], "first_step": run["first_step_s"], "end": run["end_s"]}


def main(source: str, target: str) -> None:
    data = json.loads(open(source).read())
    calls = data["calls"]
    fig, axes = plt.subplots(len(calls), 1, figsize=(11, 1.1 + 0.55 * sum(len(c["runs"]) for c in calls)), squeeze=False)
    for ax, call in zip(axes[:, 0], calls, strict=True):
        labels = []
        for row, run in enumerate(call["runs"]):
            at = marks(run)
            for label, start, end, colour in SEGMENTS:
                if at.get(start) is not None and at.get(end) is not None:
                    ax.barh(row, at[end] - at[start], left=at[start], color=colour, label=label if row == 0 else None)
            ax.text(at["first_step"], row, f" {at['first_step']:.1f} s", va="center", ha="left", fontsize=8, color="white")
            ax.text(at["end"], row, f" {at['end']:.1f} s", va="center", ha="left", fontsize=8)
            summary = run.get("summary") or {}
            worker = (summary.get("worker") or "").split(":")[0]
            kept = summary.get("quantized_base") or ""
            base = "base read" if kept.startswith("read") else "base kept" if "then kept" in kept else ""
            labels.append(", ".join(w for w in (run["name"], worker, base) if w))
        ax.set_yticks(range(len(labels)), labels, fontsize=8)
        ax.invert_yaxis()
        ax.set_title(f"call {call['call']}: {call['about']}", fontsize=9, loc="left")
        ax.set_xlim(0, max(marks(r)["end"] for r in call["runs"]) * 1.12)
    axes[-1, 0].set_xlabel("seconds after CreateJob (the first step's and SUCCEEDED's times written)")
    fig.legend(*axes[0, 0].get_legend_handles_labels(), fontsize=7, loc="lower center", ncol=3)
    fig.suptitle(data["what"], fontsize=9)
    fig.tight_layout(rect=(0, 0.05, 1, 1))
    fig.savefig(target, dpi=110)


if __name__ == "__main__":
    main(*sys.argv[1:3])
