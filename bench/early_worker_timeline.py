"""Where a job's early worker spends the time from its process's start to its steady steps, from a py-spy recording.

    python bench/early_worker_timeline.py RUN.early_worker.speedscope.json [--rate 50] [--out T.json] [--plot T.png]

``bench/startup_7b.sh`` with ``SPY`` records the job's early worker (``ray_jobs.warm.early``) from the moment its
process takes the actor's name. Each sample of the main thread is put in the first class whose test it meets, by the
frames on its stack: imports by the library that pulls them in (what the worker imports before any job,
``ray_jobs.warm.pool.WARM_IMPORTS``), the base's load, LoRA and FP8's set-up, and in the training steps the compiles
(dynamo and what it hands on) by what they compile (the block mask, FP8's row scaling, flex attention) apart from the
rest of the step.
Prints the seconds per class in order of first appearance; ``--plot`` draws them along the recording's time line.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def _import_of(names: list[str]) -> str:
    """The library an import sample is loading, by the first module-level frame below the worker's entry."""
    entry = "ray/_private/workers/default_worker.py"  # the worker process's own entry: every import is below it
    chain = " > ".join(n.split(":")[0] for n in names if n.endswith(":<module>") and entry not in n)
    for needle, label in (
        ("bitsandbytes/", "import: bitsandbytes (torch's inductor and dynamo under it)"),
        ("sklearn/", "import: scikit-learn (transformers' generation)"),
        ("torch/_dynamo/", "import: torch's dynamo (transformers' masking)"),
        ("transformers/", "import: transformers"),
        ("ray/", "import: Ray Train and Ray Data"),
        ("torch/", "import: torch"),
    ):
        if needle in chain:
            return label
    return "import: other"


def classify(names: list[str]) -> str:
    """One sample's class, from its stack's ``file:function`` names, outermost first."""
    joined = "\n".join(names)
    if "import_training_stack" in joined:
        return _import_of(names)
    if "load_pretrained" in joined:
        return "the base's load (read and quantize)"
    if "_forward_backward" in joined or "strategy.py:_Torch.backward" in joined or "_engine_run_backward" in joined:
        # A compile: dynamo converting a frame, inductor compiling a graph (a backward's comes at its first backward), or
        # a compiled graph read from the caches. A call of what is compiled runs through dynamo's eval_frame, AOTAutograd's
        # runtime wrappers and inductor's runtime: that stays the step's.
        if any(
            n in joined for n in ("convert_frame.py", "_inductor/compile_fx.py", "_inductor/codecache.py", "autograd_cache.py")
        ):
            for needle, label in (
                ("create_block_mask", "step: compile, flex attention's block mask"),
                ("fp8.py", "step: compile, FP8's row scaling"),
                ("flex_attention", "step: compile, flex attention"),
            ):
                if needle in joined:
                    return label
            return "step: compile, other"
        return "step: forward, backward, optimizer"
    if "apply_lora" in joined or "fp8.py" in joined:
        return "LoRA and FP8 set-up"
    if "WarmSession.wait" in joined:
        return "idle (waiting)"
    return "other"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("path", type=Path)
    parser.add_argument("--rate", type=float, default=50.0, help="what py-spy sampled at (samples a second)")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--plot", type=Path, default=None)
    args = parser.parse_args()
    data = json.loads(args.path.read_text())
    frames = data["shared"]["frames"]
    profile = next(p for p in data["profiles"] if "MainThread" in p["name"])
    labels = [classify([f"{frames[i]['file']}:{frames[i]['name']}" for i in stack]) for stack in profile["samples"]]
    totals: dict[str, float] = {}
    runs: list[tuple[str, float, float]] = []  # (class, start s, length s), consecutive samples merged
    for index, label in enumerate(labels):
        totals[label] = totals.get(label, 0.0) + 1 / args.rate
        if runs and runs[-1][0] == label:
            runs[-1] = (label, runs[-1][1], runs[-1][2] + 1 / args.rate)
        else:
            runs.append((label, index / args.rate, 1 / args.rate))
    print(f"{args.path.name}: {len(labels) / args.rate:.1f} s of the main thread at {args.rate:g} Hz")
    for label, seconds in totals.items():
        print(f"{seconds:6.2f} s  {label}")
    if args.out:
        args.out.write_text(json.dumps({"source": args.path.name, "rate": args.rate, "seconds": totals,
                                        "runs": [[label, round(start, 2), round(length, 2)] for label, start, length in runs]},
                                       indent=1) + "\n")  # fmt: skip
    if args.plot:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        order = list(totals)
        colors = plt.get_cmap("tab20")(range(len(order)))
        fig, ax = plt.subplots(figsize=(12, 0.42 * len(order) + 1.2))
        for row, label in enumerate(order):
            spans = [(start, length) for name, start, length in runs if name == label]
            ax.broken_barh(spans, (row - 0.4, 0.8), color=colors[row])
        ax.set_yticks(range(len(order)), [f"{label} ({totals[label]:.1f} s)" for label in order], fontsize=8)
        ax.invert_yaxis()
        ax.set_xlabel("seconds since the early worker's process took its name")
        ax.set_title(f"where the early worker's main thread was, {len(labels) / args.rate:.0f} s at {args.rate:g} Hz")
        ax.grid(axis="x", alpha=0.3)
        fig.tight_layout()
        fig.savefig(args.plot, dpi=110)
        print(f"plot: {args.plot}")


if __name__ == "__main__":
    main()
