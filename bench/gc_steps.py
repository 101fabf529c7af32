"""Each step's seconds beside the seconds Python's garbage collector ran inside it, for runs of the same job with the
collector as Python leaves it (``RAYFT_GC=auto``) and with the job's start-up frozen (the default;
``ray_jobs.observe.collector``). Made by ``bench/gc_7b.sh``; reads the runs' ``metrics.jsonl``.

    python3 bench/gc_steps.py OUT.png [--smi SMI.csv] cold-auto=DIR warm-freeze=DIR warm-auto=DIR ...

Prints two Markdown tables: per run (median steady step, its slowest step and what the collector took there, the
collector's seconds and full collections), and per step (its seconds, the collector's, how often the thread that ran
it waited and was preempted, its process's CPU seconds and how busy the host was: ``StepRecord.waits``,
``preemptions``, ``process_cpu_s``, ``host_busy``). Draws each run's step times with the collector's
share of each step. ``--smi``: the GPU's clock, power and temperature sampled during the runs (``bench/gc_7b.sh``
writes it: ``epoch seconds, SM MHz, W, C, throttle reasons`` a line); each step's mean SM clock and power are then
set beside its seconds (a step is placed in time from its worker's ``loop_start_ts`` and the walls before it), in the
second table and a second panel: whether a slow step is the host's or the GPU's.
"""

from __future__ import annotations

import itertools
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout, installed or not

from rayft_contract.phases import Phase  # noqa: E402
from rayft_contract.records import StepRecord  # noqa: E402


def steps_of(run_dir: Path) -> list[StepRecord]:
    """Every trained step's record; a resumed step replaces its first try."""
    steps: dict[int, StepRecord] = {}
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():  # the last step's is in the closing report
        steps.update((s.step, s) for s in map(StepRecord.from_dict, json.loads(line).get("step_timing", [])))
    return [steps[k] for k in sorted(steps)]


def step_spans(run_dir: Path, steps: list[StepRecord]) -> dict[int, tuple[float, float]]:
    """Each of ``steps`` (:func:`steps_of`'s, in order) as (start, end) on the worker's clock: the loop's start plus the
    walls of the steps before it."""
    events = map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines())
    start = next((t for e in events if (t := (e.get("setup") or {}).get("loop_start_ts"))), None)
    if start is None:
        return {}
    ends = itertools.accumulate((s.wall for s in steps), initial=start)
    return {s.step: (begin, begin + s.wall) for s, begin in zip(steps, ends)}


def gpu_during(samples: list[tuple[float, ...]], span: tuple[float, float]) -> tuple[float, float, str, float]:
    """Mean SM clock (MHz) and power (W) of the samples inside ``span``, the throttle reasons seen there, and the mean
    of nvidia-smi's utilization (% of its sample period with a kernel running; NaN where the samples lack it)."""
    inside = [x for x in samples if span[0] <= x[0] <= span[1]]
    if not inside:
        return float("nan"), float("nan"), "", float("nan")
    reasons = sorted({x[4] for x in inside if x[4] not in ("0x0000000000000000", "")})
    mean = statistics.mean
    return mean(x[1] for x in inside), mean(x[2] for x in inside), " ".join(reasons), mean(x[5] for x in inside)


def read_smi(path: str) -> tuple[list[tuple], list[str]]:
    """The samples, and the lines that are not one: (time, MHz, W, C, throttle reasons, busy %), the busy share NaN in
    files sampled before ``bench/smi_sampler.sh`` asked for it."""
    rows, skipped = [], []
    for line in Path(path).read_text().splitlines():
        parts = [p.strip() for p in line.split(",")]
        try:
            reasons = parts[4] if len(parts) > 4 else ""
            busy = float(parts[5]) if len(parts) > 5 else float("nan")
            rows.append((float(parts[0]), float(parts[1]), float(parts[2]), float(parts[3]), reasons, busy))
        except (ValueError, IndexError):  # nvidia-smi's own error lines, a sample cut by the end of a run
            skipped.append(line)
    return rows, skipped


def step_table(runs: dict[str, list[StepRecord]], spans: dict[str, dict], samples: list[tuple]) -> str:
    """Every step: its seconds, forward and backward's (the GPU's clock), the collector's, how often its thread waited and
    was preempted, that thread's and its process's CPU seconds, how busy the host was, the allocator's calls for GPU
    memory, and (``--smi``) the GPU's mean clock, power and utilization and the throttle reasons seen in it."""
    lines = [
        "| run | step | s | fwd+bwd s | collector s | thread waited | preempted | thread CPU s | process CPU s | host busy "
        "| cudaMalloc | SM MHz | W | GPU busy | throttle reasons |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, steps in runs.items():
        for s in steps:
            mhz, watts, reasons, busy = (
                gpu_during(samples, spans[name][s.step]) if s.step in spans[name] else (float("nan"),) * 2 + ("", float("nan"))
            )
            gpu = f"{mhz:.0f} | {watts:.0f} | {busy:.0f}%" if samples else "- | - | -"
            lines.append(
                f"| {name} | {s.step} | {s.wall:.2f} | {s.seconds(Phase.FORWARD_BACKWARD):.2f} | {s.collector_s:.3f} | "
                f"{s.waits} | {s.preemptions} | {s.thread_cpu_s:.2f} | {s.process_cpu_s:.2f} | {s.host_busy:.0%} | "
                f"{s.device_allocs} | {gpu} | {reasons} |"
            )
    return "\n".join(lines)


def table(runs: dict[str, list[StepRecord]]) -> str:
    """Steps 2 on (the first compiles) for the median and the slowest; the full collections of every step."""
    lines = [
        "| run | steps | median step s, from step 2 | slowest (s, collector s) | collector s, from step 2 | full collections: step (s) |",
        "|---|---|---|---|---|---|",
    ]
    for name, steps in runs.items():
        later = [s for s in steps if s.step > 1]
        slow = max(later, key=lambda s: s.wall)
        full = ", ".join(f"{s.step} ({s.collector_s:.2f})" for s in steps if s.full_collections) or "none"
        lines.append(
            f"| {name} | {len(steps)} | {statistics.median(s.wall for s in later):.2f} | step {slow.step}: {slow.wall:.2f}, "
            f"{slow.collector_s:.2f} | {sum(s.collector_s for s in later):.2f} | {full} |"
        )
    return "\n".join(lines)


def plot(runs: dict[str, list[StepRecord]], target: str, spans: dict[str, dict], samples: list[tuple]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2 if samples else 1, 1, figsize=(9, 8 if samples else 4.5), squeeze=False, sharex=True)
    ax = axes[0][0]
    for name, all_steps in runs.items():
        steps = [s for s in all_steps if s.step > 1]  # the first, with its compiles, would flatten the rest
        line = ax.plot([s.step for s in steps], [s.wall for s in steps], marker="o", ms=3, label=name)[0]
        ax.bar([s.step for s in steps], [s.collector_s for s in steps], color=line.get_color(), alpha=0.4, width=0.4)
        if samples:
            shown = [s for s in steps if s.step in spans[name]]
            mhz = [gpu_during(samples, spans[name][s.step])[0] for s in shown]
            axes[1][0].plot([s.step for s in shown], mhz, marker="o", ms=3, color=line.get_color(), label=name)
    ax.set(ylabel="seconds", title="Each step (lines) and the garbage collector's time inside it (bars)")
    ax.set_ylim(bottom=0)
    ax.legend()
    if samples:
        axes[1][0].set(ylabel="mean SM clock in the step, MHz", title="The GPU's clock in each step (nvidia-smi)")
    axes[-1][0].set_xlabel("step")
    fig.tight_layout()
    fig.savefig(target, dpi=120)


def main(argv: list[str]) -> None:
    target, *named = argv
    samples: list[tuple] = []
    skipped: list[str] = []
    if named and named[0] == "--smi":
        (samples, skipped), named = read_smi(named[1]), named[2:]
    runs = {name: steps_of(Path(path)) for name, path in (arg.split("=", 1) for arg in named)}
    spans = {name: step_spans(Path(path), runs[name]) for name, path in (arg.split("=", 1) for arg in named)}
    print(table(runs))
    print()
    print(step_table(runs, spans, samples))
    if skipped:
        print(f"({len(skipped)} lines of the GPU's samples not read, the first: {skipped[0][:100]!r})")
    plot(runs, target, spans, samples)


if __name__ == "__main__":
    main(sys.argv[1:])
