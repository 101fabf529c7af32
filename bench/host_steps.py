"""What the host did in each step of a job, from bench/stack_sampler.py's samples of its worker: whether the thread
that runs the steps was running, whether it held the GIL or another thread did (which, doing what), and where the
step's thread was, in the slow steps against the rest.

    python3 bench/host_steps.py SAMPLES.jsonl.gz RUN_DIR [--slow 0.15] [--plot OUT.png]

A step is placed in time from its worker's ``loop_start_ts`` and the walls before it (``bench/gc_steps.py``); the
samples carry the same host's clock. Slow: a step from step 2 on that ran ``--slow`` seconds past the median of those
steps. Prints three Markdown tables: each step (its seconds, forward and backward's, the samples in it, the share of
them with the step's thread running, holding the GIL, and with another thread holding it, and that thread's top
place), then where the step's thread was and which other threads held the GIL, in the slow steps against the rest.
"""

from __future__ import annotations

import argparse
import collections
import gzip
import json
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout, installed or not

from bench.gc_steps import step_spans, steps_of  # noqa: E402
from rayft_contract.phases import Phase  # noqa: E402

LOOP_FRAMES = ("_Loop.step", "_Loop.tail")
"""Frames only the thread that runs the steps has (``ray_jobs.train.loop``)."""


@dataclass(frozen=True)
class Sample:
    t: float
    loop: dict | None
    """The step's thread, as the sampler kept it; ``None``: not in this dump (it had not started or had ended)."""
    others: list[dict]


def read(path: Path) -> list[Sample]:
    """The samples of the process whose thread ran the steps, that thread apart from the rest."""
    lines = [json.loads(line) for line in gzip.open(path, "rt")]
    loop_of: dict[int, str] = {}  # pid -> the name of its thread that ran the steps
    for line in lines:
        for thread in line["threads"]:
            if any(f.endswith(LOOP_FRAMES) for f in thread.get("frames", ())):
                loop_of.setdefault(line["pid"], thread["name"])
    samples = []
    for line in lines:
        if (name := loop_of.get(line["pid"])) is None:
            continue
        loop = next((t for t in line["threads"] if t["name"] == name), None)
        samples.append(Sample(line["t"], loop, [t for t in line["threads"] if t["name"] != name]))
    return samples


def place(frames: list[str]) -> str:
    """Where a thread was: its innermost frame, and the innermost one of the job's own code if that is another."""
    if not frames:
        return "(no frames)"
    ours = next((f for f in frames if f.startswith(("ray_jobs/", "rayft"))), None)
    return frames[0] if ours in (None, frames[0]) else f"{frames[0]} in {ours}"


def holder(sample: Sample) -> str | None:
    """The thread other than the step's that held the GIL in this sample, and where: ``None`` if none did."""
    held = next((t for t in sample.others if t["gil"]), None)
    return None if held is None else f"{held['name']}: {place(held.get('frames', []))}"


def step_rows(samples: list[Sample], steps: list, spans: dict) -> list[dict]:
    rows = []
    for s in steps:
        if s.step not in spans:
            continue
        begin, end = spans[s.step]
        inside = [x for x in samples if begin <= x.t < end and x.loop is not None]
        n = len(inside) or 1
        holders = collections.Counter(h for x in inside if (h := holder(x)))
        rows.append(
            {
                "step": s.step,
                "s": s.wall,
                "fwd_bwd": s.seconds(Phase.FORWARD_BACKWARD),
                "samples": len(inside),
                "running": sum(x.loop["active"] for x in inside) / n,
                "gil": sum(x.loop["gil"] for x in inside) / n,
                "other_gil": sum(holders.values()) / n,
                "top_holder": holders.most_common(1)[0][0] if holders else "",
                "inside": inside,
            }
        )
    return rows


def slow_steps(rows: list[dict], margin: float) -> set[int]:
    later = [r for r in rows if r["step"] > 1]
    if not later:
        return set()
    median = statistics.median(r["s"] for r in later)
    return {r["step"] for r in later if r["s"] > median + margin}


def shares(rows: list[dict], of) -> collections.Counter:
    """Over the samples of ``rows``: the share of each place ``of(sample)`` names."""
    counts = collections.Counter(p for r in rows for x in r["inside"] if (p := of(x)))
    total = sum(len(r["inside"]) for r in rows) or 1
    return collections.Counter({k: v / total for k, v in counts.items()})


def tables(rows: list[dict], slow: set[int], top: int = 12) -> str:
    out = [
        "| step | s | fwd+bwd s | samples | step's thread running | holding the GIL | another thread holding it | "
        "its top place |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        mark = " (slow)" if r["step"] in slow else ""
        out.append(
            f"| {r['step']}{mark} | {r['s']:.2f} | {r['fwd_bwd']:.2f} | {r['samples']} | {r['running']:.0%} | {r['gil']:.0%} | "
            f"{r['other_gil']:.0%} | {r['top_holder']} |"
        )
    steady = [r for r in rows if r["step"] > 1]
    groups = {"slow": [r for r in steady if r["step"] in slow], "the rest": [r for r in steady if r["step"] not in slow]}
    for title, of in (
        ("where the step's thread was", lambda x: place(x.loop.get("frames", [])) if x.loop.get("frames") else "(idle)"),
        ("another thread holding the GIL", holder),
    ):
        by = {name: shares(group, of) for name, group in groups.items()}
        keys = sorted(set(by["slow"]) | set(by["the rest"]), key=lambda k: (-abs(by["slow"][k] - by["the rest"][k]), k))[:top]
        out += ["", f"| {title}, steps from 2 | slow steps ({len(groups['slow'])}) | the rest ({len(groups['the rest'])}) |"]
        out.append("|---|---|---|")
        out += [f"| {k} | {by['slow'][k]:.1%} | {by['the rest'][k]:.1%} |" for k in keys]
    return "\n".join(out)


def plot(rows: list[dict], slow: set[int], target: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = [r["step"] for r in rows]
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(10, 7), sharex=True)
    top.bar(steps, [r["s"] for r in rows], color=["tab:red" if s in slow else "tab:blue" for s in steps])
    top.set(ylabel="seconds", title="Each step (red: slow, past the median of the steps from 2)")
    for key, label in (
        ("running", "the step's thread running"),
        ("gil", "it holding the GIL"),
        ("other_gil", "another thread holding the GIL"),
    ):
        bottom.plot(steps, [r[key] for r in rows], marker="o", ms=3, label=label)
    bottom.set(xlabel="step", ylabel="share of the step's samples", ylim=(0, 1.05))
    bottom.legend()
    fig.tight_layout()
    fig.savefig(target, dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("samples", type=Path)
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--slow", type=float, default=0.15, help="seconds past the median step that make a step slow")
    parser.add_argument("--plot", type=Path, default=None)
    args = parser.parse_args()
    steps = steps_of(args.run_dir)
    rows = step_rows(read(args.samples), steps, step_spans(args.run_dir, steps))
    slow = slow_steps(rows, args.slow)
    print(tables(rows, slow))
    if args.plot:
        plot(rows, slow, args.plot)


if __name__ == "__main__":
    main()
