"""Seconds a step of each run through the service, one panel per call of bench/service_7b.sh: what a change beside
training (a write, a compile) costs the steps it runs beside. Same input as bench/plot_service.py.

    python bench/plot_step_times.py bench/keep_write_h100.json bench/keep_write_h100.png
"""

from __future__ import annotations

import json
import sys
import textwrap

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def label(run: dict) -> str:
    kept = (run.get("summary") or {}).get("quantized_base") or ""
    return f"{run['name']}: {kept}" if kept else run["name"]


def main(source: str, target: str) -> None:
    data = json.loads(open(source).read())
    calls = data["calls"]
    fig, axes = plt.subplots(1, len(calls), figsize=(6 * len(calls), 4.2), squeeze=False, sharey=True)
    for ax, call in zip(axes[0], calls, strict=True):
        for run in call["runs"]:
            seconds = run["step_s"][1:]  # the first report's is 0: no step had ended (service_submit.Run.step_s)
            writes = "then kept" in label(run)
            ax.plot(
                range(1, len(seconds) + 1),
                seconds,
                marker="o",
                linewidth=2.5 if writes else 1,
                label=textwrap.fill(label(run), 60),
            )
        ax.set_title(textwrap.fill(f"call {call['call']}: {call['about']}", 75), fontsize=8, loc="left")
        ax.set_xlabel("step (the last one's time is in the closing report, not plotted)")
        ax.legend(fontsize=7)
        ax.grid(alpha=0.3)
    axes[0, 0].set_ylabel("seconds a step")
    fig.suptitle(data["what"], fontsize=9)
    fig.tight_layout()
    fig.savefig(target, dpi=110)


if __name__ == "__main__":
    main(*sys.argv[1:3])
