"""FP8's loss against bf16's, at equal steps and at equal time: ``python bench/plot_fp8_loss.py RUNS.json OUT.png``.

``RUNS.json`` as ``bench/fp8_loss_h200.json`` holds it: a ``runs`` list with ``run`` ("bf16", "fp8") and ``steps``
(``step``, ``loss``, ``step_time_s``). Prints what the RESULTS section quotes:

- the offset: FP8's loss minus bf16's, relative, averaged over thirds of the run, and at how many steps FP8 is higher;
- the noise it is judged against: how far bf16's loss moves from step to step around its own trend (the residual from
  a centred 5-step mean, from step 31 on, past the warm-up's fall), as one standard deviation;
- at equal training time: bf16's loss when FP8's last step ends.
"""

from __future__ import annotations

import json
import sys

import matplotlib
import numpy as np

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

SETTLED = 31
"""From this step on the loss has left the warm-up's steep fall (30 warm-up steps in the 7B preset)."""


def trend_noise(loss: np.ndarray) -> float:
    """One standard deviation of the loss around its centred 5-step mean: the batch-to-batch noise."""
    smooth = np.convolve(loss, np.ones(5) / 5, mode="valid")
    return float((loss[2:-2] - smooth).std())


def main(source: str, target: str) -> None:
    runs = {r["run"]: r for r in json.load(open(source))["runs"]}
    bf16, fp8 = runs["bf16"]["steps"], runs["fp8"]["steps"]
    steps = np.array([s["step"] for s in bf16])
    a, b = np.array([s["loss"] for s in bf16]), np.array([s["loss"] for s in fp8])
    ta, tb = (np.cumsum([s["step_time_s"] for s in r]) for r in (bf16, fp8))
    rel = (b - a) / a
    late = steps >= SETTLED
    noise = trend_noise(a[late]) / float(a[late].mean())
    thirds = np.array_split(np.arange(len(steps)), 3)
    for part in thirds:
        print(f"steps {steps[part[0]]}-{steps[part[-1]]}: FP8's loss {100 * rel[part].mean():+.2f}% against bf16's")
    print(f"FP8 higher at {int((rel[late] > 0).sum())} of {int(late.sum())} steps from step {SETTLED}")
    print(f"bf16's step-to-step noise from step {SETTLED}: {100 * noise:.2f}% (one standard deviation)")
    at = int(np.searchsorted(ta, tb[-1]))
    print(
        f"at equal time ({tb[-1]:.0f} s of steps): bf16 at step {steps[at]}, loss {a[at]:.3f}; FP8 at step {steps[-1]}, "
        f"loss {b[-1]:.3f}"
    )

    fig, axes = plt.subplots(1, 3, figsize=(16, 4.5))
    ax = axes[0]
    ax.plot(steps, a, label="bf16", lw=1.2)
    ax.plot(steps, b, label="fp8", lw=1.2)
    ax.set_yscale("log")
    ax.set(xlabel="step", ylabel="training loss", title="loss at equal steps")
    ax.legend()
    ax = axes[1]
    ax.axhspan(-100 * noise, 100 * noise, color="0.85", label="bf16's step-to-step noise (1 sd)")
    ax.plot(steps[late], 100 * rel[late], ".-", color="C1", label="fp8 - bf16")
    for part in thirds:
        keep = part[steps[part] >= SETTLED]
        if len(keep):
            ax.hlines(100 * rel[keep].mean(), steps[keep[0]], steps[keep[-1]], color="C3", lw=2)
    ax.axhline(0, color="k", lw=0.6)
    ax.set(xlabel="step", ylabel="loss difference, % of bf16's", title=f"FP8's loss against bf16's, steps {SETTLED}+")
    ax.legend(loc="lower right", fontsize=8)
    ax = axes[2]
    ax.plot(ta, a, label=f"bf16 ({runs['bf16']['steady_tokens_per_s']:,.0f} tokens/s)", lw=1.2)
    ax.plot(tb, b, label=f"fp8 ({runs['fp8']['steady_tokens_per_s']:,.0f} tokens/s)", lw=1.2)
    ax.set_yscale("log")
    ax.set(xlabel="seconds of training steps", ylabel="training loss", title="loss at equal time")
    ax.legend()
    fig.suptitle("7B QLoRA preset on one H200, 90 steps: FP8 base matmuls against bf16")
    fig.tight_layout()
    fig.savefig(target, dpi=110)


if __name__ == "__main__":
    main(*sys.argv[1:3])
