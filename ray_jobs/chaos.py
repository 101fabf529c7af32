"""Deliberate slowdowns, for the tests that check the diagnosis names each bottleneck.

Never set by a spec or a flag: only code passes it, as ``run(..., chaos=Chaos(...))`` (the diagnosis tests).
"""

from __future__ import annotations

import dataclasses
import time


@dataclasses.dataclass(frozen=True)
class Chaos:
    tokenize_delay_s: float = 0.0
    """Sleep per tokenization batch: a slow tokenizer (data-bound training, with ``data.cache`` off)."""
    checkpoint_delay_s: float = 0.0
    """Sleep per checkpoint save: a slow checkpoint writer."""
    slow_steps: int = 0
    """The first ``slow_steps`` steps sleep ``slow_step_s`` more: compile or allocator warm-up."""
    slow_step_s: float = 0.0

    def slow_tokenizer(self) -> None:
        if self.tokenize_delay_s:
            time.sleep(self.tokenize_delay_s)

    def slow_checkpoint(self) -> None:
        if self.checkpoint_delay_s:
            time.sleep(self.checkpoint_delay_s)

    def slow_step(self, step: int) -> None:
        if step <= self.slow_steps:
            time.sleep(self.slow_step_s)


NO_CHAOS = Chaos()
"""The default everywhere: nothing injected."""
