"""Set several runs of the same job side by side: speed, memory, start-up, and the loss at equal steps.

    python3 bench/compare_runs.py OUT.png none=/tmp/runs/a liger=/tmp/runs/b ...

Each RUN_DIR holds a finished run's ``summary.json`` and ``metrics.jsonl``. The first run is the
reference: every other run's loss is compared with it step by step (the runs must train the same rows
in the same order, so equal steps see equal data). Prints a Markdown table for ``bench/RESULTS.md`` and
draws the loss curves and steady tokens/s into OUT.png.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout, installed or not

from rayft_contract.records import JobSummary, Progress  # noqa: E402


@dataclasses.dataclass(frozen=True)
class Run:
    summary: JobSummary
    losses: dict[int, float]
    """Training loss by step (a resumed step replaces its first attempt)."""
    data_wait: float
    step_s: dict[int, float]
    """Each trained step's wall time."""

    def median_step_s(self) -> float:
        """The median over the steps after the first (the first is kernel selection and warm-up)."""
        import statistics

        times = [t for i, t in self.step_s.items() if i > 1]
        return statistics.median(times) if times else float("nan")

    def slow_steps(self, factor: float = 1.25) -> list[int]:
        """Steps after the first that ran ``factor`` times the median or longer: the periodic slow step."""
        median = self.median_step_s()
        return sorted(i for i, t in self.step_s.items() if i > 1 and t >= factor * median)


def load(run_dir: Path) -> Run:
    summary = JobSummary.from_dict(json.loads((run_dir / "summary.json").read_text()))
    losses, waits, step_s = {}, [], {}
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        event = json.loads(line)
        if event["kind"] != "progress":
            continue
        report = Progress.from_dict(event)
        if report.trained:
            losses[report.step] = report.loss
            if report.step_time_s is not None:
                step_s[report.step] = report.step_time_s
            if report.data_wait_frac is not None:
                waits.append(report.data_wait_frac)
    return Run(summary, losses, sum(waits) / max(len(waits), 1), step_s)


def table(runs: dict[str, Run]) -> str:
    ref_name, ref = next(iter(runs.items()))
    rows = [
        "| run | layout | micro-batch | kernels | steady tokens/s | vs first | median s/step | slow steps (>= 1.25x) "
        f"| MFU | peak GiB | first step s | data wait | max loss diff vs {ref_name} |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    base_tps = ref.summary.steady_tokens_per_s
    for name, run in runs.items():
        s = run.summary
        common = sorted(set(run.losses) & set(ref.losses))
        diff = max((abs(run.losses[i] / ref.losses[i] - 1) for i in common), default=float("nan"))
        rows.append(
            f"| {name} | {s.layout or '-'} | {s.micro_batch or '-'} | {s.kernels or '-'} "
            f"| {s.steady_tokens_per_s:,.0f} | {s.steady_tokens_per_s / base_tps:.2f}x "
            f"| {run.median_step_s():.2f} | {', '.join(map(str, run.slow_steps())) or 'none'} "
            f"| {'-' if s.mfu is None else f'{s.mfu:.1%}'} | {s.gpu_mem_peak_gb or 0:.1f} "
            f"| {s.time_to_first_step_s or 0:.1f} | {run.data_wait:.1%} | {diff:.2%} over {len(common)} steps |"
        )
    return "\n".join(rows)


def plot(runs: dict[str, Run], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_loss, ax_tps) = plt.subplots(1, 2, figsize=(11, 4))
    for name, run in runs.items():
        steps = sorted(run.losses)
        ax_loss.plot(steps, [run.losses[i] for i in steps], marker=".", label=name)
    ax_loss.set(xlabel="step", ylabel="training loss", title="loss at equal steps")
    ax_loss.legend()
    names = list(runs)
    ax_tps.barh(names, [runs[n].summary.steady_tokens_per_s for n in names])
    ax_tps.set(xlabel="steady tokens/s", title="throughput")
    ax_tps.invert_yaxis()
    fig.tight_layout()
    fig.savefig(out, dpi=110)


def main(argv: list[str]) -> None:
    out, pairs = Path(argv[0]), [a.split("=", 1) for a in argv[1:]]
    runs = {name: load(Path(path)) for name, path in pairs}
    print(table(runs))
    plot(runs, out)


if __name__ == "__main__":
    main(sys.argv[1:])
