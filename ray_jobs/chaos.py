"""Deliberate failures and slowdowns: every test hook of the job goes through one :class:`Chaos`.

Never set by a spec. Code passes it as ``run(..., chaos=Chaos(...))`` (the recovery and diagnosis
tests); two flags set it: ``rayft train --inject-failure-at STEP`` (``fail_at_step``) and
``--cap-gpu-memory GB`` (``gpu_memory_gb``).
"""

from __future__ import annotations

import dataclasses
import time


@dataclasses.dataclass(frozen=True)
class Chaos:
    tokenize_delay_s: float = 0.0
    """Sleep per tokenization batch: a slow tokenizer (data-bound training, with ``data.cache`` off)."""
    read_delay_s: float = 0.0
    """Sleep per piece a reading task reads (``ray_jobs.data.reading``): a slow store."""
    checkpoint_delay_s: float = 0.0
    """Sleep per checkpoint write (on the upload thread, before the copy to storage): a slow store."""
    checkpoint_write_fails_at_step: int | None = None
    """The background write of this step's checkpoint raises :class:`InjectedFailure` once: a store that
    failed mid-run (the worker fails; Ray Train resumes from the checkpoint before it)."""
    slow_steps: int = 0
    """The first ``slow_steps`` steps sleep ``slow_step_s`` more: compile or allocator warm-up."""
    slow_step_s: float = 0.0
    fail_at_step: int | None = None
    """Rank 1 (or 0 alone) raises :class:`InjectedFailure` once, after this step: Ray Train must recover."""
    oom_above_rows: int | None = None
    """A micro-batch of more rows raises torch's ``OutOfMemoryError``, as a GPU too small for it would."""
    overfit_after_step: int | None = None
    """Evaluations after this step read 1.0 higher per step beyond it: a model that stopped generalizing
    (what early stopping must catch)."""
    gpu_memory_gb: float | None = None
    """Each worker may allocate at most this much of its GPU, as a smaller GPU would allow
    (``torch.cuda.set_per_process_memory_fraction``); ``rayft train --cap-gpu-memory GB``."""
    record_rows: bool = False
    """Each worker appends the ids of the rows of every step to ``{run_dir}/rows-seen/rank{r}.jsonl``
    (a local run dir), for the tests of the training order."""

    def cap_gpu_memory(self, device: object) -> None:
        if self.gpu_memory_gb is None or getattr(device, "type", "cpu") != "cuda":
            return
        import torch

        total = torch.cuda.get_device_properties(device).total_memory
        torch.cuda.set_per_process_memory_fraction(min(1.0, self.gpu_memory_gb * 2**30 / total), device)

    def check_memory(self, rows: int) -> None:
        if self.oom_above_rows is not None and rows > self.oom_above_rows:
            import torch

            raise torch.OutOfMemoryError(f"injected: a micro-batch of {rows} rows > {self.oom_above_rows}")

    def eval_loss(self, step: int, loss: float) -> float:
        if self.overfit_after_step is None or step <= self.overfit_after_step:
            return loss
        return loss + (step - self.overfit_after_step)

    def eval_token_accuracy(self, step: int, accuracy: float | None) -> float | None:
        if accuracy is None or self.overfit_after_step is None or step <= self.overfit_after_step:
            return accuracy
        return max(accuracy - 0.05 * (step - self.overfit_after_step), 0.0)

    def slow_tokenizer(self) -> None:
        if self.tokenize_delay_s:
            time.sleep(self.tokenize_delay_s)

    def checkpoint_write(self, step: int, run_dir: str) -> None:
        """On the checkpoint upload thread, once the files are written and before they are persisted."""
        if self.checkpoint_delay_s:
            time.sleep(self.checkpoint_delay_s)
        if self.checkpoint_write_fails_at_step == step and self._first_time(run_dir, "injected-checkpoint-failure", step):
            raise InjectedFailure(f"injected failure writing the checkpoint of step {step}")

    def slow_step(self, step: int) -> None:
        if step <= self.slow_steps:
            time.sleep(self.slow_step_s)

    def rows_seen(self, step: int, rank: int, run_dir: str, ids: list) -> None:
        if not self.record_rows or any(i is None for i in ids):
            return
        import json
        from pathlib import Path

        path = Path(run_dir, "rows-seen", f"rank{rank}.jsonl")
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("a") as out:
            out.write(json.dumps({"step": step, "rows": [int(i) for t in ids for i in t.tolist()]}) + "\n")

    def maybe_fail(self, step: int, rank: int, world: int, run_dir: str) -> None:
        """Raise once per run (a marker file in the run directory remembers that it did)."""
        if self.fail_at_step != step or rank != min(1, world - 1):
            return
        if self._first_time(run_dir, "injected-failure", step):
            raise InjectedFailure(f"injected failure at step {step} on rank {rank}")

    @staticmethod
    def _first_time(run_dir: str, name: str, step: int) -> bool:
        """True once per run: a marker file in the run directory remembers it across restarts."""
        from ray_jobs.storage import location

        marker = location(run_dir).child(name)
        if marker.exists():
            return False
        marker.write_text(f"step {step}\n")
        return True


class InjectedFailure(RuntimeError):
    """Raised on purpose by ``Chaos.fail_at_step`` to exercise recovery."""


NO_CHAOS = Chaos()
"""The default everywhere: nothing injected."""
