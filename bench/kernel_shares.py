"""Where a step's GPU time goes, by kind of kernel, from the torch.profiler window of one or more runs.

    python3 bench/kernel_shares.py OUT.png LABEL=RUN_DIR_OR_torch_profile.json [LABEL=...]

Each run needs ``RAYFT_TORCH_PROFILE=A:B`` (``PROFILE=A:B bash bench/qlora_7b.sh``), which writes
``torch_profile.json`` (``ray_jobs/observe/torch_trace.py``): every kernel name's time over the window's steps.
Prints, per run, the seconds a step each kind of kernel ran and its share of the kernel time, the GPU's idle share of
the window (first kernel to last), and the ten longest kernels; plots the kinds as stacked bars, one per run.

The kinds are matched on the kernel's name, first rule first (:data:`KINDS`): cuBLAS names its Hopper kernels
``nvjet_*``, inductor its templates ``triton_tem_*``, Liger its kernels by their Python names.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

KINDS: tuple[tuple[str, str], ...] = (
    ("attention", r"flex_attention|sdpa|fmha|flash|cudnn"),
    ("matmuls (cuBLAS)", r"^nvjet|gemm|cutlass|xmma|splitKreduce"),
    ("FP8 row scaling", r"^triton_.*(amax|abs|clamp)"),
    ("Liger (norm, SwiGLU, RoPE, loss)", r"_rms_norm|_swiglu|_triton_rope|liger_|element_mul"),
    ("NF4 dequantization", r"kDequantize|dequantize"),
    ("optimizer", r"multi_tensor_apply"),
    ("elementwise and copies", r"elementwise|Memcpy|Memset|copy|reduce_kernel|gather|scatter|^triton_"),
)
"""(kind, regex on the kernel's name). The first kind whose pattern matches takes the kernel; "other" takes the rest."""


def kind_of(name: str) -> str:
    for kind, pattern in KINDS:
        if re.search(pattern, name):
            return kind
    return "other"


def shares(profile: dict) -> dict:
    """Seconds a step by kind (and the names the window's list left out as "not listed"), the idle share of the
    window, and the ten longest kernels."""
    steps = profile["last_step"] - profile["first_step"] + 1
    by_kind: dict[str, float] = {}
    for k in profile["top_kernels"]:
        kind = kind_of(k["name"])
        by_kind[kind] = by_kind.get(kind, 0.0) + k["s"] / steps
    busy = profile["kernel_busy_s"]
    unlisted = busy / steps - sum(by_kind.values())
    if unlisted > 1e-6:
        by_kind["not listed"] = unlisted
    return {
        "steps": steps,
        "s_per_step": dict(sorted(by_kind.items(), key=lambda kv: -kv[1])),
        "kernel_s_per_step": busy / steps,
        "idle_share": max(0.0, 1 - busy / profile["kernel_span_s"]) if profile["kernel_span_s"] else 0.0,
        "longest": [(k["name"], k["s"] / steps, k["calls"] // steps) for k in profile["top_kernels"][:10]],
    }


def read(arg: str) -> tuple[str, dict]:
    label, _, path = arg.partition("=")
    p = Path(path)
    return label, json.loads((p / "torch_profile.json" if p.is_dir() else p).read_text())


def kinds_in(runs: dict[str, dict]) -> list[str]:
    """Every kind any run has, in the order they first appear (each run's longest first)."""
    return list(dict.fromkeys(k for r in runs.values() for k in r["s_per_step"]))


def table(runs: dict[str, dict]) -> str:
    kinds = kinds_in(runs)
    lines = ["| kernels | " + " | ".join(f"{label}: s a step (share)" for label in runs) + " |",
             "|---|" + "---|" * len(runs)]  # fmt: skip
    for kind in kinds:
        cells = []
        for r in runs.values():
            s = r["s_per_step"].get(kind, 0.0)
            cells.append(f"{s:.3f} ({s / r['kernel_s_per_step']:.0%})")
        lines.append(f"| {kind} | " + " | ".join(cells) + " |")
    lines.append("| **all kernels** | " + " | ".join(f"**{r['kernel_s_per_step']:.3f}**" for r in runs.values()) + " |")
    lines.append("| GPU idle, share of the window | " + " | ".join(f"{r['idle_share']:.1%}" for r in runs.values()) + " |")
    for label, r in runs.items():
        lines += ["", f"{label}, the ten longest kernels (s a step, calls a step):"]
        lines += [f"- {s:.3f} s, {calls} calls: `{name}`" for name, s, calls in r["longest"]]
    return "\n".join(lines)


def plot(runs: dict[str, dict], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    kinds = kinds_in(runs)
    fig, ax = plt.subplots(figsize=(9, 1.2 + 0.6 * len(runs)))
    left = [0.0] * len(runs)
    for kind in kinds:
        widths = [r["s_per_step"].get(kind, 0.0) for r in runs.values()]
        ax.barh(list(runs), widths, left=left, label=kind)
        left = [a + b for a, b in zip(left, widths, strict=True)]
    ax.set_xlabel("GPU kernel seconds a step")
    ax.set_title("Where a step's GPU time goes (torch.profiler)")
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.35), ncol=3)
    fig.tight_layout()
    fig.savefig(out, dpi=120)


def main(argv: list[str]) -> dict[str, dict]:
    out, *args = argv
    runs = {label: shares(profile) for label, profile in map(read, args)}
    print(table(runs))
    plot(runs, Path(out))
    return runs


if __name__ == "__main__":
    main(sys.argv[1:])
