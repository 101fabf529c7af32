"""The Trainer recipe against rayft's jobs on the same data: the table issue 12 asks for, and its plot.

    python3 bench/compare_trainer.py OUT.png TRAINER.json cold=/tmp/runs/a warm=/tmp/runs/b

TRAINER.json is ``bench/trainer_recipe.py``'s record; each NAME=RUN_DIR a finished rayft run (its ``summary.json``).
Every figure is steady state by each side's own warm-up rule, counts real (non-padding) tokens, and takes MFU from
the same formula (``ray_jobs.observe.profile``). Prints a Markdown table for ``bench/RESULTS.md``; draws steady
tokens/s and the time to the first step side by side into OUT.png.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout, installed or not

from bench.trainer_recipe import TrainerRun  # noqa: E402
from rayft_contract.phases import Phase  # noqa: E402
from rayft_contract.records import JobSummary  # noqa: E402


@dataclasses.dataclass(frozen=True)
class Row:
    name: str
    recipe: str
    tokens_per_s: float
    mfu: float | None
    peak_gb: float | None
    data_wait: float
    padding: float
    first_step_s: float | None


def trainer_row(run: TrainerRun) -> Row:
    return Row(
        "Trainer", run.recipe, run.steady_tokens_per_s, run.mfu, run.gpu_mem_peak_gb, run.data_wait_frac, run.padding_frac,
        run.time_to_first_step_s,
    )  # fmt: skip


def rayft_row(name: str, run_dir: Path) -> Row:
    s = JobSummary.from_dict(json.loads((run_dir / "summary.json").read_text()))
    eff = s.efficiency
    steady_wall = eff.step_time_s * eff.steady_steps
    data_wait = s.timing.phases.get(Phase.DATA_WAIT.value, 0.0) / steady_wall if steady_wall else 0.0
    recipe = f"rayft {s.name}: micro-batch {s.micro_batch or '-'}; {s.kernels or 'no kernels'}; {s.attention or '-'}"
    return Row(f"rayft {name}", recipe, s.steady_tokens_per_s, s.mfu, s.gpu_mem_peak_gb, data_wait, eff.padding_frac,
               s.time_to_first_step_s)  # fmt: skip


def ahead_from(base: Row, run: Row) -> float | None:
    """Seconds from the start after which ``run`` has trained more tokens than ``base``: each trains at its steady rate
    from its first step on (the first step's own tokens and the warm-up's slower steps are left out on both sides).
    0 if it is ahead from the start; None if it never catches up."""
    if base.first_step_s is None or run.first_step_s is None:
        return None
    if run.first_step_s <= base.first_step_s and run.tokens_per_s >= base.tokens_per_s:
        return 0.0
    if run.tokens_per_s <= base.tokens_per_s:
        return None
    # run.tps * (t - run.first) = base.tps * (t - base.first)
    return (run.tokens_per_s * run.first_step_s - base.tokens_per_s * base.first_step_s) / (run.tokens_per_s - base.tokens_per_s)


def table(rows: list[Row]) -> str:
    base = rows[0].tokens_per_s or float("nan")
    lines = [
        "| run | steady tokens/s | vs Trainer | MFU | peak GiB | data wait | padding | first step s | ahead of the Trainer from |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        if r is rows[0] or r.first_step_s is None or rows[0].first_step_s is None:
            ahead = "-"  # the reference itself, or a run that never reached a step
        else:
            ahead = f"{t:.0f} s" if (t := ahead_from(rows[0], r)) is not None else "never"
        lines.append(
            f"| {r.name} | {r.tokens_per_s:,.0f} | {r.tokens_per_s / base:.1f}x | {'-' if r.mfu is None else f'{r.mfu:.1%}'} "
            f"| {'-' if r.peak_gb is None else f'{r.peak_gb:.1f}'} | {r.data_wait:.1%} | {r.padding:.1%} "
            f"| {'-' if r.first_step_s is None else f'{r.first_step_s:.1f}'} | {ahead} |"
        )
    return "\n".join(lines + ["", *(f"- {r.name}: {r.recipe}" for r in rows)])


def plot(rows: list[Row], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_tps, ax_first, ax_tokens) = plt.subplots(1, 3, figsize=(15, 3.4))
    names = [r.name for r in rows]
    ax_tps.barh(names, [r.tokens_per_s for r in rows], color=["grey"] + ["tab:blue"] * (len(rows) - 1))
    for i, r in enumerate(rows):
        ax_tps.annotate(f"{r.tokens_per_s / rows[0].tokens_per_s:.1f}x", (r.tokens_per_s, i), xytext=(3, 0),
                        textcoords="offset points", va="center")  # fmt: skip
    ax_tps.set(xlabel="steady real tokens/s", title="throughput on the same data")
    ax_tps.margins(x=0.12)  # room for the ratios
    ax_first.barh(names, [r.first_step_s or 0 for r in rows], color=["grey"] + ["tab:orange"] * (len(rows) - 1))
    ax_first.set(xlabel="seconds", title="time to the first step")
    for ax in (ax_tps, ax_first):
        ax.invert_yaxis()
    # Tokens trained against time from the start, each at its steady rate from its first step (as ahead_from reckons)
    started = [r for r in rows if r.first_step_s is not None]
    end = 2 * max((ahead_from(rows[0], r) or 0.0 for r in started[1:]), default=0.0) or 2 * max(r.first_step_s for r in started)
    for r, color in zip(started, ["grey", "tab:blue", "tab:green", "tab:red", "tab:purple"]):
        ax_tokens.plot([0, r.first_step_s, end], [0, 0, r.tokens_per_s * (end - r.first_step_s) / 1e6], color=color, label=r.name)
    ax_tokens.set(xlabel="seconds from the start", ylabel="million tokens", title="tokens trained (steady rates)")
    ax_tokens.legend()
    fig.tight_layout()
    fig.savefig(out, dpi=110)


def main(argv: list[str]) -> None:
    out, trainer, pairs = Path(argv[0]), Path(argv[1]), [a.split("=", 1) for a in argv[2:]]
    rows = [trainer_row(TrainerRun.from_json(trainer.read_text()))]
    rows += [rayft_row(name, Path(path)) for name, path in pairs]
    print(table(rows))
    plot(rows, out)


if __name__ == "__main__":
    main(sys.argv[1:])
