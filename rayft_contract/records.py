"""Typed records that cross process boundaries: built on one side, read by attribute on the other.

A :class:`StepRecord` is made on every Ray Train worker (``ray_jobs.metrics``), travels inside a
``ray.train.report`` as its :meth:`~StepRecord.to_dict` (Ray and ``metrics.jsonl`` carry plain JSON),
and is read back with :meth:`~StepRecord.from_dict` by the driver's profile, the diagnosis, the picture
and the benchmarks.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from rayft_contract.phases import Phase


@dataclasses.dataclass(frozen=True)
class StepRecord:
    """One optimizer step, summed over workers where it counts things."""

    step: int
    wall: float
    """Seconds from the end of the previous step to the end of this one (host clock)."""
    phases: dict[str, float]
    """Seconds per in-step :class:`~rayft_contract.phases.Phase` (CUDA events for GPU phases)."""
    tokens: int
    """Real (non-padding) tokens trained on."""
    processed: int
    """Tokens the model ran on: real + padding."""
    samples: int
    """Examples trained on."""
    attn_ctx: int
    """Sum over real tokens of their causal context length (what attention FLOPs scale with)."""

    def __post_init__(self) -> None:
        unknown = set(self.phases) - {p.value for p in Phase if p.in_step}
        if unknown:
            raise ValueError(f"step {self.step}: unknown phases {sorted(unknown)}")

    def seconds(self, phase: Phase) -> float:
        return self.phases.get(phase, 0.0)

    @property
    def busy(self) -> float:
        """The step's time minus waiting for data, checkpoints, evaluation and reports: the compute."""
        idle = (Phase.DATA_WAIT, Phase.CHECKPOINT, Phase.EVAL, Phase.REPORT)
        return self.wall - sum(self.seconds(p) for p in idle)

    @property
    def training_wall(self) -> float:
        """Wall time without evaluation: evaluation is not training."""
        return self.wall - self.seconds(Phase.EVAL)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> StepRecord:
        return cls(**{f.name: data[f.name] for f in dataclasses.fields(cls)})
