"""The CLI's live view of a job: a progress bar with loss and tokens/s, then a summary table."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.progress import Progress as Bars
from rich.table import Table

from rayft_contract.events import Event
from rayft_contract.phases import Phase
from rayft_contract.records import Failure, Finding, JobPhase, JobSummary, Progress, SamplesAt, StateChange

PHASES = {
    "connect": "connecting to Ray",
    "model": "fetching the model",
    "data": "preparing data",
    "training": "starting workers",
    "export": "exporting adapter",
}


class ProgressView:
    """Callable event sink for ``ray_jobs.run.run``; use as a context manager."""

    def __init__(self, name: str, total_steps: int | None = None, console: Console | None = None):
        self.console = console or Console(stderr=True)
        self.progress = Bars(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[stats]}"),
            TimeElapsedColumn(),
            TimeRemainingColumn(),
            console=self.console,
            transient=False,
        )
        self.task = self.progress.add_task(name, total=total_steps, stats="")
        self.stats: dict[str, str] = {}

    def __enter__(self) -> ProgressView:
        self.progress.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.progress.stop()

    def __call__(self, event: Event) -> None:
        data = event.data
        if event.kind == "phase":
            phase = JobPhase.from_dict(data)
            self.stats["phase"] = PHASES.get(phase.phase, phase.phase)
            if phase.detail:
                self.console.print(f"[dim]{phase.detail}")
            if phase.total_steps is not None:
                self.progress.update(self.task, total=phase.total_steps)
        elif event.kind == "progress":
            report = Progress.from_dict(data)
            self.stats.pop("phase", None)
            if report.trained:
                self.stats["loss"] = f"loss {report.loss:.3f}"
                self.stats["tps"] = f"{_fmt(report.tokens_per_s, ',.0f')} tok/s"
            if report.eval_loss is not None:
                accuracy = (
                    f" ({report.eval_token_accuracy:.0%} of tokens right)" if report.eval_token_accuracy is not None else ""
                )
                self.stats["eval"] = f"eval {report.eval_loss:.3f}{accuracy}"
            self.progress.update(self.task, completed=report.step, total=report.total_steps or None)
        elif event.kind == "state":
            change = StateChange.from_dict(data)
            self.stats["phase"] = change.state.lower() + (f": {change.message}" if change.message else "")
        elif event.kind == "diagnosis":
            finding = Finding.from_dict(data)
            self.console.print(f"[yellow]diagnosis ({finding.kind}): {finding.message}")
        elif event.kind == "failure" and (failure := Failure.from_dict(data)).job_error is not None:
            self.console.print(f"[red]job failed: {failure.job_error}")
        elif event.kind == "failure":
            errors = "; ".join(f"rank {r}: {e}" for r, e in Failure.from_dict(data).errors.items())
            self.console.print(f"[yellow]worker failure ({errors}); restarting from the last checkpoint")
        self.progress.update(self.task, stats="  ".join(self.stats.values()))

    def print_summary(self, summary: JobSummary) -> None:
        table = Table(title=f"rayft: {summary.name} finished", show_header=False)
        rows = [
            ("steps", f"{summary.steps:,}"),
            ("trained tokens", f"{summary.tokens:,}"),
            ("train loss (last)", _fmt(summary.final_loss)),
            ("eval loss (start -> end)", f"{_fmt(summary.initial_eval_loss)} -> {_fmt(summary.eval_loss)}"),
            *_accuracy_rows(summary),
            ("wall time", f"{summary.wall_time_s:.1f} s"),
            ("time to first step", f"{_fmt(summary.time_to_first_step_s, '.1f')} s"),
            ("tokens/s (steady state)", _fmt(summary.steady_tokens_per_s, ",.0f")),
            *_efficiency_rows(summary),
            *_best_rows(summary),
            ("worker restarts", str(summary.restarts)),
            *_cache_rows(summary),
            ("adapter", summary.adapter_dir),
            *(("serving", note) for note in summary.adapter_notes),
        ]
        if summary.gpu_mem_peak_gb is not None:
            rows.insert(7, ("peak GPU memory", f"{summary.gpu_mem_peak_gb:.1f} GiB"))
        for key, value in rows:
            table.add_row(key, value)
        console = Console()
        console.print(table)
        if summary.eval_samples:
            console.print(samples_table(summary.eval_samples))
        if summary.timing.phases:
            console.print(phase_table(summary))
            console.print(("[yellow]" if summary.diagnosis else "[green]") + summary.verdict)
            for finding in summary.diagnosis[1:]:
                console.print(f"[yellow]also {finding.kind}: {finding.message}")


def samples_table(samples: SamplesAt) -> Table:
    """Held-out prompts, their references, and the model's answers at the first and the last evaluation."""
    table = Table(title="what the model answers (held-out prompts)")
    table.add_column("prompt", max_width=40)
    table.add_column("reference", max_width=30)
    table.add_column(f"step {samples.first_step}", max_width=30)
    table.add_column(f"step {samples.last_step}", max_width=30)
    for first, last in zip(samples.first, samples.last):
        table.add_row(first.prompt[-120:], first.reference, first.answer, last.answer)
    return table


def phase_table(summary: JobSummary) -> Table:
    """Where the time went: every phase, its seconds and share of the wall time."""
    wall = summary.wall_time_s
    table = Table(title="where the time went", show_footer=True)
    table.add_column("phase", footer="wall time")
    table.add_column("seconds", justify="right", footer=f"{wall:.1f}")
    table.add_column("share", justify="right", footer="100%")
    for name, seconds in summary.timing.phases.items():
        if abs(seconds) >= 0.05 or name == "other":
            label = _warmup_label(summary) if name == Phase.WARMUP_STEPS else Phase(name).label
            table.add_row(label, f"{seconds:.1f}", f"{seconds / wall:.1%}")
    return table


def _warmup_label(summary: JobSummary) -> str:
    warm = summary.timing.warmup_steps
    return f"warm-up ({warm} slow steps)" if warm else "first step (outside steady state)"


COLLECTOR_FRAC = 0.01
"""The collector's share of the steady steps from which the summary shows it: below, it is not where the time went."""


def _efficiency_rows(summary: JobSummary) -> list[tuple[str, str]]:
    eff = summary.efficiency
    if not eff.steady_steps:
        return []
    rows = [("samples/s (steady state)", f"{eff.samples_per_s:,.1f}"), ("padding", f"{eff.padding_frac:.1%} of tokens")]
    if eff.mfu is not None:
        rows.insert(0, ("MFU (HFU)", f"{eff.mfu:.1%} ({_fmt(eff.hfu, '.1%')})"))
    if summary.kernels:
        rows.append(("kernels", summary.kernels))
    if summary.attention:
        rows.append(("attention", summary.attention))
    if summary.micro_batch:
        rows.append(("micro-batch", summary.micro_batch))
    if eff.collector_s >= COLLECTOR_FRAC * eff.step_time_s * eff.steady_steps:  # ray_jobs.observe.collector
        share = eff.collector_s / (eff.step_time_s * eff.steady_steps)
        rows.append(
            ("Python's garbage collector", f"{eff.collector_s:.2f} s inside the steps ({share:.1%}), {eff.full_collections} full")
        )
    return rows


def _accuracy_rows(summary: JobSummary) -> list[tuple[str, str]]:
    if summary.eval_token_accuracy is None:
        return []
    start = f"{summary.initial_eval_token_accuracy:.1%}" if summary.initial_eval_token_accuracy is not None else "-"
    return [("eval token accuracy (start -> end)", f"{start} -> {summary.eval_token_accuracy:.1%}")]


def _best_rows(summary: JobSummary) -> list[tuple[str, str]]:
    if not summary.best_step or summary.best_eval_loss is None:
        return []
    why = f"; {summary.stopped_early}" if summary.stopped_early else ""
    best = f"eval loss {summary.best_eval_loss:.4f}"
    if summary.adapter_step == summary.best_step:
        return [("adapter from", f"step {summary.best_step}, the best evaluation ({best}){why}")]
    return [
        (
            "adapter from",
            f"step {summary.adapter_step}, the last (output.adapter: last); best: step {summary.best_step}, {best}{why}",
        )
    ]


def _cache_rows(summary: JobSummary) -> list[tuple[str, str]]:
    rows = []
    if dataset := summary.caches.dataset:
        state = "off" if not dataset.enabled else "hit" if dataset.hit else "miss"
        rows.append(
            ("dataset cache", f"{state}: {dataset.bytes_downloaded:,} bytes read, {dataset.rows_tokenized or 0:,} rows tokenized")
        )
        if dataset.fill is not None:
            rows.append(("cache fill", dataset.fill.describe()))
    if model := summary.caches.model:
        identity = f" ({model.identity})" if model.identity else ""
        rows.append(("model", f"{model.source}: {model.bytes_downloaded:,} bytes downloaded{identity}"))
    if summary.quantized_base:
        rows.append(("quantized base", summary.quantized_base))
    if summary.worker:
        rows.append(("worker", summary.worker))
    if quality := summary.data_quality:
        kinds = ", ".join(f"{n} {k}" for k, n in quality.bad_by_kind.items()) or "none"
        rows.append(("bad rows skipped", f"{quality.bad_rows:,} of {quality.rows:,} ({kinds}); {quality.truncated:,} truncated"))
    return rows


def _fmt(value: float | None, spec: str = ".4f") -> str:
    return "-" if value is None else format(value, spec)
