"""Where each step's time goes, measured on every worker and read at each report.

The loop wraps every part of a step in ``meter.phase(name)`` and closes the step with
``meter.end_step(counts)``. Host phases (waiting for data, checkpoint, eval, report: the host is
blocked anyway) use the host clock. GPU phases (``gpu=True``: host-to-device copy, forward and
backward, optimizer) are timed with CUDA events on the current stream, never with host clocks
around asynchronous work; the events are resolved at the next report, when the loop has synced.
On CPU every phase is synchronous and uses the host clock.

Each step's record also says what the host did meanwhile: how often the thread that ran it stopped to wait (a lock,
the GIL another thread held, a read, a GPU sync that blocks) and how often the OS gave its CPU to another thread or
process; the CPU seconds of that thread, and of the worker's process, all its threads; how busy the host's cores were,
every process counted; and on a GPU, how often PyTorch's caching allocator asked the driver for memory. A step that
ran long with its GPU waiting for the host (``bench/RESULTS.md``: the GPU's clock higher and its power lower in such
steps on an H100) says with these whether the step's thread was held back, by what, and whether the host was busy
with other work.

A meter given the job's :class:`~ray_jobs.observe.collector.Collector` records, with each step, how long Python's
garbage collector ran inside it and how many of its collections were full ones; :meth:`StepMeter.close` hands the
collector back as it found it.

``meter.window()`` returns the finished steps since the last window, one
:class:`~rayft_contract.records.StepRecord` each (``step_timing``), and the rates the progress bar
shows, from the same records: the :class:`~rayft_contract.records.Progress` fields of the next report.
"""

from __future__ import annotations

import resource
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from ray_jobs.observe.collector import Collector
from rayft_contract.phases import Phase
from rayft_contract.records import StepRecord


class StepMeter:
    def __init__(self, device: Any = None, collector: Collector | None = None):
        self.cuda = device is not None and getattr(device, "type", "cpu") == "cuda"
        self.collector = collector
        self._done: list[dict[str, Any]] = []
        self._host: dict[str, float] = {}
        self._events: list[tuple[str, Any, Any]] = []
        self._t0 = time.perf_counter()
        import psutil

        self._me = psutil.Process()  # made once: each step reads its CPU times
        self._switches = thread_switches()
        self._cpu = host_times(self._me)
        self._thread_cpu = time.thread_time()
        self._alloc = allocator_counts(self.cuda)

    @contextmanager
    def phase(self, name: str, gpu: bool = False) -> Iterator[None]:
        if gpu and self.cuda:
            import torch

            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            try:
                yield
            finally:
                end.record()
                self._events.append((name, start, end))
            return
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self._host[name] = self._host.get(name, 0.0) + time.perf_counter() - t0

    def end_step(self, step: int, tokens: int, processed: int, samples: int, attn_ctx: int) -> None:
        """Close step ``step``, which began at the previous ``end_step`` (or at construction)."""
        now = time.perf_counter()
        collector_s, full = self.collector.take() if self.collector else (0.0, 0)
        switches, cpu, thread_cpu, alloc = (
            thread_switches(),
            host_times(self._me),
            time.thread_time(),
            allocator_counts(self.cuda),
        )
        waited, preempted = (n - before for n, before in zip(switches, self._switches, strict=True))
        process_cpu, host_busy, host_total = (n - before for n, before in zip(cpu, self._cpu, strict=True))
        allocs, retries = (n - before for n, before in zip(alloc, self._alloc, strict=True))
        self._done.append(
            {
                "step": step,
                "wall": now - self._t0,
                "phases": self._host,
                "events": self._events,
                "tokens": tokens,
                "processed": processed,
                "samples": samples,
                "attn_ctx": attn_ctx,
                "collector_s": collector_s,
                "full_collections": full,
                "waits": waited,
                "preemptions": preempted,
                "process_cpu_s": process_cpu,
                "host_busy": host_busy / host_total if host_total > 0 else 0.0,
                "thread_cpu_s": thread_cpu - self._thread_cpu,
                "device_allocs": allocs,
                "alloc_retries": retries,
            }
        )
        self._host, self._events, self._t0, self._switches, self._cpu = {}, [], now, switches, cpu
        self._thread_cpu, self._alloc = thread_cpu, alloc

    def window(self) -> dict[str, Any]:
        """Rates over the steps finished since the last window, and their records."""
        if self.cuda and any(s["events"] for s in self._done):
            import torch

            torch.cuda.synchronize()
        steps = []
        for s in self._done:
            phases = dict(s.pop("phases"))
            for name, start, end in s.pop("events"):
                phases[name] = phases.get(name, 0.0) + start.elapsed_time(end) / 1e3
            steps.append(StepRecord(**s, phases=phases))
        self._done = []
        wall = sum(s.training_wall for s in steps) or 1e-9  # training time: evaluation apart
        data_wait = sum(s.seconds(Phase.DATA_WAIT) for s in steps)
        return {
            "tokens_per_s": sum(s.tokens for s in steps) / wall,
            "samples_per_s": sum(s.samples for s in steps) / wall,
            "step_time_s": wall / max(len(steps), 1),
            "data_wait_frac": data_wait / wall,
            "step_timing": tuple(steps),
        }

    def close(self) -> None:
        """The collector as it was before the steps (its start-up no longer frozen), whatever ended them."""
        if self.collector is not None:
            self.collector.close()


def thread_switches() -> tuple[int, int]:
    """The calling thread's context switches so far: (it waited, the OS preempted it). (0, 0) where the OS does not
    count them a thread (``RUSAGE_THREAD`` is Linux's)."""
    if not hasattr(resource, "RUSAGE_THREAD"):
        return 0, 0
    usage = resource.getrusage(resource.RUSAGE_THREAD)
    return usage.ru_nvcsw, usage.ru_nivcsw


def host_times(me: Any) -> tuple[float, float, float]:
    """So far: the CPU seconds of ``me`` (this process's ``psutil.Process``, all its threads), and the host's busy and
    total CPU seconds (every core, every process). 65 us a call on the 2-core machine."""
    import psutil

    mine, host = me.cpu_times(), psutil.cpu_times()
    total = sum(host) - getattr(host, "guest", 0.0) - getattr(host, "guest_nice", 0.0)  # Linux counts guests in user too
    idle = host.idle + getattr(host, "iowait", 0.0)
    return mine.user + mine.system, total - idle, total


def allocator_counts(cuda: bool) -> tuple[int, int]:
    """So far, on this process's current GPU: the caching allocator's calls for device memory (``cudaMalloc``, or a
    map of an expandable segment) and its retries after freeing every cached block. (0, 0) without a GPU."""
    if not cuda:
        return 0, 0
    import torch

    stats = torch.cuda.memory_stats()
    return stats.get("num_device_alloc", 0), stats.get("num_alloc_retries", 0)


def step_counts(group: list[dict[str, Any]]) -> Any:
    """This worker's [label tokens, real tokens, examples, processed tokens, attention context] of one step.

    Attention context: each real token attends to its position + 1 tokens (causal, within its
    example), the figure attention FLOPs scale with.
    """
    import torch

    out = torch.zeros(5, dtype=torch.float64)
    for b in group:
        real = torch.arange(b["input_ids"].shape[1]) < b["num_tokens"][:, None]
        out += torch.tensor(
            [
                (b["labels"] != -100).sum(),
                b["num_tokens"].sum(),
                b["num_examples"].sum(),
                b["input_ids"].numel(),
                ((b["position_ids"] + 1) * real).sum(),
            ],
            dtype=torch.float64,
        )
    return out
