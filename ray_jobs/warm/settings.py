"""The warm pool's plain records: the operator's settings, the shape of job a pool serves, and what a pool says of
itself (``ray_jobs.warm.pool``). No Ray here: the CLI and the unit tests read them without a cluster."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rayft_contract.spec import FineTuneSpec


@dataclasses.dataclass(frozen=True)
class WarmSettings:
    workers: int = 0
    """``RAYFT_WARM_WORKERS``: warm workers to keep; 0 keeps none."""
    idle_s: float = 600.0
    """``RAYFT_WARM_IDLE_S``: a pool no job took from for this long stops its workers."""

    @classmethod
    def from_env(cls, environ: Mapping[str, str] = os.environ) -> WarmSettings:
        values: dict[str, Any] = {}
        for field, name, kind, example in (
            ("workers", "RAYFT_WARM_WORKERS", int, "a whole number of workers, e.g. RAYFT_WARM_WORKERS=1"),
            ("idle_s", "RAYFT_WARM_IDLE_S", float, "seconds, e.g. RAYFT_WARM_IDLE_S=600"),
        ):
            if environ.get(name):
                try:
                    values[field] = kind(environ[name])
                except ValueError:
                    raise ValueError(f"{name}={environ[name]!r}: {example}") from None
                if values[field] < 0:
                    raise ValueError(f"{name}={environ[name]!r}: 0 or more")
        return cls(**values)


@dataclasses.dataclass(frozen=True)
class Shape:
    """The resources of one worker; a pool serves jobs of one shape."""

    gpus: float
    cpus: float

    @classmethod
    def of(cls, spec: FineTuneSpec) -> Shape | None:
        """The job's shape, or ``None`` for a job no warm worker can run (more than one worker)."""
        if spec.scaling.num_workers != 1:
            return None
        return cls(1.0 if spec.scaling.use_gpu else 0.0, float(spec.scaling.cpus_per_worker))


@dataclasses.dataclass(frozen=True)
class PoolState:
    """What :meth:`WarmPool.describe` says: its workers now and in all, and what it keeps them for."""

    idle: int
    ready: int
    """Idle workers whose start (imports, the base loaded ahead) is done."""
    lent: int
    standing_down_for: int
    """Running jobs that took no warm worker: no new one starts until they end."""
    started: int
    lent_in_all: int
    shape: Shape
    settings: WarmSettings
    base: str | None
    """The base the next workers load ahead (the operator's, or the last job's)."""

    def line(self) -> str:
        return (
            f"{self.ready} of {self.settings.workers} worker(s) ready, {self.idle} idle, {self.lent} lent; base "
            f"{self.base or '(none yet)'}; jobs of {self.shape.gpus:g} GPU and {self.shape.cpus:g} CPU(s); idle workers "
            f"stop after {self.settings.idle_s:g} s without a job"
        )
