"""What people would rather see than read: a one-page PNG per run.

``report.png`` (the loss curves, tokens/s over time, and where the time went as one bar) is written into
the run directory at the end of the job, from the same records as the summary. TensorBoard scalars are
written as the job runs (``ray_jobs.observe.tracking``).
"""

from __future__ import annotations

from pathlib import Path

from rayft_contract.phases import Group, Phase
from rayft_contract.records import JobSummary, Progress

GROUP_COLORS = {
    Group.STARTUP: "#9e9e9e",
    Group.WARMUP: "#fdd835",
    Group.DATA_WAIT: "#e53935",
    Group.COMPUTE: "#43a047",
    Group.CHECKPOINT: "#fb8c00",
    Group.EVAL: "#8e24aa",
    Group.FINISH: "#546e7a",
    Group.OTHER: "#cfd8dc",
}
"""One colour per :class:`~rayft_contract.phases.Group`; each phase's group comes from the phase itself."""


def grouped_phases(phases: dict[str, float]) -> dict[Group, float]:
    """The phase table folded into the bar's few colours (its "other" is the table's "other")."""
    groups = dict.fromkeys(Group, 0.0)
    for name, seconds in phases.items():
        groups[Phase(name).group] += max(seconds, 0.0)
    return groups


def write_png(reports: list[Progress], summary: JobSummary, path: Path) -> None:
    """``reports``: rank 0's progress reports, the closing one included (its step records)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (loss_ax, speed_ax, bar_ax) = plt.subplots(3, 1, figsize=(9, 9), gridspec_kw={"height_ratios": [3, 3, 1.4]})
    train = [(r.step, r.loss) for r in reports if r.trained]
    evals = [(r.step, r.eval_loss) for r in reports if r.eval_loss is not None]
    if train:
        loss_ax.plot(*zip(*train), label="train loss")
    if evals:
        loss_ax.plot(*zip(*evals), "o-", label="eval loss")
    loss_ax.set(ylabel="loss", title=f"{summary.name}: {summary.verdict}"[:110])
    handles, labels = loss_ax.get_legend_handles_labels()
    accuracy = [(r.step, r.eval_token_accuracy) for r in reports if r.eval_token_accuracy is not None]
    if accuracy:  # on its own axis: a share, not a loss
        accuracy_ax = loss_ax.twinx()
        (line,) = accuracy_ax.plot(*zip(*accuracy), "s--", color="#43a047", label="eval token accuracy")
        accuracy_ax.set(ylabel="eval token accuracy", ylim=(0, 1))
        handles, labels = [*handles, line], [*labels, line.get_label()]
    loss_ax.legend(handles, labels)
    steps = [s for r in reports for s in r.step_timing]
    speed = [(s.step, s.tokens / max(s.training_wall, 1e-9)) for s in steps]
    if speed:
        speed_ax.plot(*zip(*speed), ".", color="#1e88e5", markersize=3)
    eff = summary.efficiency
    mfu = f", MFU {eff.mfu:.0%}" if eff.mfu is not None else ""
    speed_ax.set(
        xlabel="step",
        ylabel="trained tokens/s (per step)",
        yscale="log",
        title=f"steady {eff.tokens_per_s:,.0f} tokens/s{mfu}",
    )

    left = 0.0
    for group, seconds in grouped_phases(summary.timing.phases).items():
        if seconds <= 0:
            continue
        bar_ax.barh(0, seconds, left=left, color=GROUP_COLORS[group], label=f"{group} {seconds:.1f} s")
        left += seconds
    bar_ax.set(yticks=[], xlabel=f"seconds (wall {summary.wall_time_s:.1f} s)", title="where the time went")
    bar_ax.legend(ncol=4, fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.45))
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
