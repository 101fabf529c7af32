"""What the model answers at each evaluation: a few held-out prompts, its greedy answer and the reference,
and the spec's own prompts (``train.sample_prompts``), which have no reference.

A loss says the model improves; reading its answers says how. At every evaluation (the baseline
included) rank 0 answers the first ``train.eval_samples`` prompts of its eval split with the adapter as
it stands, and the report carries them to the driver, which appends them to the run's ``samples.jsonl``
and prints them in the CLI. Prompts and references come from the packed eval rows themselves: an
example starts where its positions restart at 0, its prompt is the masked tokens before its first
trained one, its reference the trained tokens after.

Only where one rank can run the model alone: a single worker or DDP (the module inside the wrapper). Under
FSDP2 every forward is a collective, so the other ranks would have to generate in lockstep; samples are
left out there and the summary says so.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from ray_jobs.data.template import IGNORE_INDEX
from rayft_contract.records import Sample
from rayft_contract.spec import FineTuneSpec

MAX_NEW_TOKENS = 128
"""An answer stops at its end-of-turn token, the reference's length plus 16, or this, whichever comes first."""


@dataclasses.dataclass(frozen=True)
class Prompt:
    ids: list[int]
    reference: list[int]


def prompts_of(batches: Any, count: int) -> list[Prompt]:
    """The first ``count`` examples with a prompt and a reference in packed eval micro-batches."""
    found: list[Prompt] = []
    for batch in batches:
        for ids, labels, positions, real in zip(
            batch["input_ids"].tolist(), batch["labels"].tolist(), batch["position_ids"].tolist(), batch["num_tokens"].tolist()
        ):
            starts = [i for i in range(real) if positions[i] == 0] + [real]
            for start, end in zip(starts, starts[1:]):
                trained = [i for i in range(start, end) if labels[i] != IGNORE_INDEX]
                if trained and trained[0] > start:
                    found.append(Prompt(ids[start : trained[0]], [ids[i] for i in trained]))
                if len(found) == count:
                    return found
    return found


def answer_all(model: Any, tokenizer: Any, prompts: list[Prompt], device: Any, autocast: Callable[[], Any]) -> list[Sample]:
    """Greedy answers of ``model`` (the PEFT model, unwrapped) to ``prompts``, decoded beside prompt and reference."""
    import torch

    ends = sorted({tokenizer.eos_token_id, tokenizer.convert_tokens_to_ids("<|im_end|>")} - {None, tokenizer.unk_token_id})
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else (ends[0] if ends else 0)
    was_training = model.training
    model.eval()
    out = []
    try:
        for prompt in prompts:
            inputs = torch.tensor([prompt.ids], device=device)
            with torch.no_grad(), autocast():
                generated = model.generate(
                    input_ids=inputs,
                    attention_mask=torch.ones_like(inputs),
                    max_new_tokens=min(len(prompt.reference) + 16, MAX_NEW_TOKENS) if prompt.reference else MAX_NEW_TOKENS,
                    do_sample=False,
                    eos_token_id=ends or None,
                    pad_token_id=pad,
                    use_cache=True,
                )
            out.append(
                Sample(
                    prompt=tokenizer.decode(prompt.ids, skip_special_tokens=True).strip(),
                    reference=tokenizer.decode(prompt.reference, skip_special_tokens=True).strip(),
                    answer=tokenizer.decode(generated[0, len(prompt.ids) :], skip_special_tokens=True).strip(),
                )
            )
    finally:
        model.train(was_training)
    return out


@dataclasses.dataclass
class Answers:
    """Rank 0's answers to a few held-out prompts at each evaluation: what the training loop calls."""

    spec: FineTuneSpec
    strategy: Any
    model: Any
    device: Any
    rank: int
    eval_batches: Any
    prompts: list[Any] | None = None
    tokenizer: Any = None

    def take(self) -> tuple[Sample, ...]:
        """The answers on rank 0 (after an evaluation); none elsewhere, when off, or where one rank cannot run
        the model alone."""
        count, own = self.spec.train.eval_samples, self.spec.train.sample_prompts
        if self.rank != 0 or not (count or own) or self.eval_batches is None or not self.strategy.one_rank_runs:
            return ()
        if self.prompts is None:
            from transformers import AutoTokenizer

            from ray_jobs.cache.models import fetch_model
            from ray_jobs.data.formats import Turn
            from ray_jobs.data.template import ChatEncoder

            local = fetch_model(self.spec.model.path, self.spec.model.revision, count_hit=False).path
            self.tokenizer = AutoTokenizer.from_pretrained(local)
            encoder = ChatEncoder(self.tokenizer, self.spec.data.chat_template)
            held_out = prompts_of(self.eval_batches, count) if count else []
            self.prompts = held_out + [Prompt(encoder.prompt_ids([Turn("user", text)]), []) for text in own]
        from ray_jobs.train.model import autocast

        module = self.strategy.unwrap(self.model)
        return tuple(answer_all(module, self.tokenizer, self.prompts, self.device, lambda: autocast(self.spec, self.device)))
