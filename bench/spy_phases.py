"""Where one thread's time went, window by window, from a py-spy speedscope recording (``bench/startup_7b.sh``, SPY=...).

    python bench/spy_phases.py RUN.warm_worker.speedscope.json [--thread MainThread] [--window 0.5] [--rate 50]

For each window of samples in order: the share of samples whose stack holds each of a few markers (a compile, Triton's
kernel load, a CUDA wait...), and the innermost frame of this project's code with the commonest leaf below it. py-spy's
speedscope file keeps samples in order but not their times, so a window is ``rate * window`` samples (``--rate``: what
py-spy sampled at)."""

from __future__ import annotations

import argparse
import collections
import json

MARKERS = {
    "dynamo": ("torch/_dynamo/convert_frame.py",),
    "inductor": ("torch/_inductor/",),
    "triton load": ("triton/compiler/", "triton/runtime/jit.py"),
    "liger": ("liger_kernel/",),
    "bnb": ("bitsandbytes/",),
    "backward": ("torch/autograd/graph.py", "torch/_tensor.py:backward"),
    "optimizer": ("torch/optim/",),
}


def label(frame: dict) -> str:
    return f"{frame['file']}:{frame['name']}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("path")
    parser.add_argument("--thread", default="MainThread")
    parser.add_argument("--window", type=float, default=0.5)
    parser.add_argument("--rate", type=float, default=50.0)
    args = parser.parse_args()
    data = json.loads(open(args.path).read())
    frames = data["shared"]["frames"]
    profile = next(p for p in data["profiles"] if args.thread in p["name"])
    per = max(1, round(args.rate * args.window))
    samples = profile["samples"]
    print(f"{profile['name']}: {len(samples)} samples, {len(samples) / args.rate:.1f} s at {args.rate:g} Hz")
    for start in range(0, len(samples), per):
        window = samples[start : start + per]
        shares = collections.Counter()
        ours, leaves = collections.Counter(), collections.Counter()
        for stack in window:
            names = [label(frames[i]) for i in stack]
            for marker, needles in MARKERS.items():
                if any(n in name for name in names for n in needles):
                    shares[marker] += 1
            mine = [name for name in names if "ray_jobs/" in name]
            ours[mine[-1].split("ray_jobs/")[-1] if mine else "(none of ours)"] += 1
            leaves[names[-1].rsplit("/", 1)[-1] if names else "(idle)"] += 1
        marks = " ".join(f"{m} {100 * c // len(window)}%" for m, c in shares.most_common())
        print(
            f"{start / args.rate:6.1f}s  {ours.most_common(1)[0][0][:60]:60s}  leaf {leaves.most_common(1)[0][0][:40]:40s}  {marks}"
        )


if __name__ == "__main__":
    main()
