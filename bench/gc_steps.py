"""Each step's seconds beside the seconds Python's garbage collector ran inside it, for runs of the same job with the
collector as Python leaves it (``RAYFT_GC=auto``) and with the job's start-up frozen (the default;
``ray_jobs.observe.collector``). Made by ``bench/gc_7b.sh``; reads the runs' ``metrics.jsonl``.

    python3 bench/gc_steps.py OUT.png cold-auto=DIR warm-freeze=DIR warm-auto=DIR ...

Prints one Markdown table (per run: median steady step, its slowest step and what the collector took there, the
collector's seconds and full collections over the steady steps) and draws each run's step times with the collector's
share of each step.
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout, installed or not

from rayft_contract.records import StepRecord  # noqa: E402


def steps_of(run_dir: Path) -> list[StepRecord]:
    """Every trained step's record, the first step (its compiles) left out; a resumed step replaces its first try."""
    steps: dict[int, StepRecord] = {}
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():  # the last step's is in the closing report
        steps.update((s.step, s) for s in map(StepRecord.from_dict, json.loads(line).get("step_timing", [])))
    return [steps[k] for k in sorted(steps) if k > 1]


def table(runs: dict[str, list[StepRecord]]) -> str:
    lines = [
        "| run | steps | median step s | slowest step (s, collector s) | collector s, steady steps | full collections |",
        "|---|---|---|---|---|---|",
    ]
    for name, steps in runs.items():
        slow = max(steps, key=lambda s: s.wall)
        lines.append(
            f"| {name} | {len(steps)} | {statistics.median(s.wall for s in steps):.2f} | step {slow.step}: {slow.wall:.2f}, "
            f"{slow.collector_s:.2f} | {sum(s.collector_s for s in steps):.2f} | {sum(s.full_collections for s in steps)} |"
        )
    return "\n".join(lines)


def plot(runs: dict[str, list[StepRecord]], target: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 4.5))
    for name, steps in runs.items():
        line = ax.plot([s.step for s in steps], [s.wall for s in steps], marker="o", ms=3, label=name)[0]
        ax.bar([s.step for s in steps], [s.collector_s for s in steps], color=line.get_color(), alpha=0.4, width=0.4)
    ax.set(xlabel="step", ylabel="seconds", title="Each step (lines) and the garbage collector's time inside it (bars)")
    ax.set_ylim(bottom=0)
    ax.legend()
    fig.tight_layout()
    fig.savefig(target, dpi=120)


def main(argv: list[str]) -> None:
    target, *named = argv
    runs = {name: steps_of(Path(path)) for name, path in (arg.split("=", 1) for arg in named)}
    print(table(runs))
    plot(runs, target)


if __name__ == "__main__":
    main(sys.argv[1:])
