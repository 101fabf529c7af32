"""An independent check of the phase timing: ``torch.profiler`` over a window of steps on rank 0.

    RAYFT_TORCH_PROFILE=21:30 rayft train spec.yaml     # profile steps 21..30 (inclusive)

Records the GPU kernels of the window (CUDA activity only) and writes ``{run dir}/torch_profile.json``
after training: the span from the window's first kernel to its last, the time kernels ran, and the
kernels by name, so that ``bench/compare_profile.py`` can set them beside the job's own step records and
``bench/kernel_shares.py`` can sort them into kinds.
Off unless the variable is set; the profiler's overhead lands only on the window.
"""

from __future__ import annotations

import json
import os
from typing import Any

ENV = "RAYFT_TORCH_PROFILE"
TOP = 1000
"""The most kernel names the report lists."""


class StepTrace:
    def __init__(self, first: int, last: int, out_uri: str):
        self.first, self.last, self.out_uri = first, last, out_uri
        self.prof: Any = None
        self.done = False

    @classmethod
    def from_env(cls, rank: int, out_uri: str) -> StepTrace:
        """The window from ``RAYFT_TORCH_PROFILE`` on rank 0; elsewhere a trace that does nothing."""
        window = os.environ.get(ENV)
        if not window or rank != 0:
            return cls(-1, -1, out_uri)
        first, last = (int(x) for x in window.split(":"))
        return cls(first, last, out_uri)

    def before_step(self, step: int) -> None:
        """Call with the number of the step about to run."""
        if step == self.first and self.prof is None:
            import torch

            # GPU kernels only: a CPU trace of a 7B step is millions of events and minutes to process.
            # (On a CPU-only worker the CPU ops stand in, so the path can be exercised anywhere.)
            cuda = torch.cuda.is_available()
            activity = torch.profiler.ProfilerActivity.CUDA if cuda else torch.profiler.ProfilerActivity.CPU
            self.prof = torch.profiler.profile(activities=[activity])
            self.prof.__enter__()

    def after_step(self, step: int) -> None:
        """Call once the step is done; stops the profiler after the window's last step."""
        if self.prof is not None and step == self.last and not self.done:
            import torch

            if torch.cuda.is_available():
                torch.cuda.synchronize()
            self.prof.__exit__(None, None, None)
            self.done = True

    def finish(self) -> None:
        """After training: write what the profiler saw (its processing stays out of the steps)."""
        if not self.done:
            return
        from torch.autograd import DeviceType

        from ray_jobs.storage import location

        gpu = any(e.device_type == DeviceType.CUDA for e in self.prof.events())
        kernels = [e for e in self.prof.events() if e.device_type == DeviceType.CUDA or (not gpu and e.cpu_parent is None)]
        starts = [e.time_range.start for e in kernels]
        ends = [e.time_range.end for e in kernels]
        by_name: dict[str, list[float]] = {}
        for e in kernels:
            by_name.setdefault(e.name[:100], []).append(e.time_range.elapsed_us() / 1e6)
        # Every name, longest first, so that a split by kind (bench/kernel_shares.py) leaves nothing out. The top 40
        # kept before covered all but 1.4 ms of the H200's profiled steps of 2026-12-03 (bench/attention_h200.json);
        # fused LoRA, FP8 and the fused loss have added kernel names since. The bound only keeps a report small.
        top = sorted(by_name.items(), key=lambda kv: -sum(kv[1]))[:TOP]
        report = {
            "first_step": self.first,
            "last_step": self.last,
            "kernels": len(kernels),
            "kernel_busy_s": sum(e.time_range.elapsed_us() for e in kernels) / 1e6,
            "kernel_span_s": (max(ends) - min(starts)) / 1e6 if kernels else 0.0,
            "top_kernels": [{"name": name, "s": sum(t), "calls": len(t)} for name, t in top],
        }
        location(self.out_uri).child("torch_profile.json").write_text(json.dumps(report, indent=2))
