"""The QLoRA recipe teams run today, on transformers' ``Trainer``: the baseline rayft is measured against (issue 12).

    python3 bench/trainer_recipe.py MODEL_DIR DATA.jsonl OUT.json [--steps 15] [--started EPOCH_S]

What it runs is the common recipe, as written in tutorials and in the team's own scripts before rayft
(``../shared/NOTES.md``, "What users run today"), and nothing faster:

- the base loaded in 4 bits (NF4, double quant, bf16 compute) by ``from_pretrained``, then PEFT's
  ``prepare_model_for_kbit_training`` (which upcasts the norms and embeddings to fp32);
- LoRA r=16, alpha 32, dropout 0.05 on every linear layer;
- gradient checkpointing, micro-batch 4, 4 accumulation steps, ``adamw_torch``, bf16;
- every example tokenized as its batch is loaded (through the tokenizer's chat template, in the collator, in the
  training process: ``dataloader_num_workers=0``), padded to the longest in its batch, random order.

It measures what rayft's summary reports, by the same rules where they apply: real (non-padding) tokens a second
over the steady steps (every optimizer step after the first ``--warmup`` ones), MFU by rayft's own FLOPs formula
(``ray_jobs.observe.profile.step_flops``; the recomputation of gradient checkpointing is not useful work and not
counted), peak GPU memory, data wait (the share of step time spent loading, tokenizing and padding batches), the
padding share, and the time to the first finished step from the script's first line (its imports of torch and
transformers counted; ``--started`` moves that clock). rayft's own figure counts from its job's start, which
``rayft train`` reaches 0.2 s after its first line (its lazy imports, measured on the 2-core machine). Writes one JSON record (``TrainerRun``) to OUT.json.

Without a GPU (``--no-quant``, what ``tests/unit/bench/test_trainer_recipe.py`` runs with the tiny model) it loads the base
in fp32 on the CPU: the same loop and counters, no 4-bit layers.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

STARTED = time.time()  # before the heavy imports below: they are part of a Trainer job's time to its first step
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout, installed or not

from rayft_contract.records import Record  # noqa: E402


@dataclasses.dataclass(frozen=True)
class TrainerStep(Record):
    step: int
    seconds: float
    tokens: int
    """Real (non-padding) tokens of the step's micro-batches."""
    processed: int
    """Tokens computed, padding included."""
    attn_ctx: int
    """Sum over its real tokens of each one's causal context (its position + 1): the attention term of the FLOPs."""
    data_s: float
    """Seconds spent loading, tokenizing and padding its micro-batches."""
    loss: float | None


@dataclasses.dataclass(frozen=True)
class TrainerRun(Record):
    """One run of the Trainer recipe: the figures rayft's ``JobSummary`` gives for a job, for the same table."""

    recipe: str
    steps: tuple[TrainerStep, ...]
    warmup: int
    micro_batch: int
    accumulation: int
    max_seq_len: int
    time_to_first_step_s: float
    gpu_mem_peak_gb: float | None
    peak_flops: float | None
    model_flops_per_step: tuple[float, ...]
    quantized: bool

    def steady(self) -> tuple[TrainerStep, ...]:
        return self.steps[self.warmup :] or self.steps[-1:]

    @property
    def steady_tokens_per_s(self) -> float:
        steady = self.steady()
        return sum(s.tokens for s in steady) / max(sum(s.seconds for s in steady), 1e-9)

    @property
    def mfu(self) -> float | None:
        if not self.peak_flops:
            return None
        steady = self.steady()
        flops = sum(self.model_flops_per_step[len(self.steps) - len(steady) :])
        return flops / max(sum(s.seconds for s in steady), 1e-9) / self.peak_flops

    @property
    def data_wait_frac(self) -> float:
        steady = self.steady()
        return sum(s.data_s for s in steady) / max(sum(s.seconds for s in steady), 1e-9)

    @property
    def padding_frac(self) -> float:
        return 1 - sum(s.tokens for s in self.steps) / max(sum(s.processed for s in self.steps), 1)

    def to_json(self) -> str:
        figures = {k: getattr(self, k) for k in ("steady_tokens_per_s", "mfu", "data_wait_frac", "padding_frac")}
        return json.dumps({**self.to_dict(), **figures}, indent=1)  # the figures for a reader of the file; from_json skips them

    @classmethod
    def from_json(cls, text: str) -> TrainerRun:
        return cls.from_dict(json.loads(text))


class TokenizingCollator:
    """Tokenizes each batch's chat rows as it is loaded and pads them to the longest; times that work."""

    def __init__(self, tokenizer: Any, max_seq_len: int):
        self.tokenizer, self.max_seq_len = tokenizer, max_seq_len
        self.seconds = 0.0

    def __call__(self, rows: list[dict[str, Any]]) -> dict[str, Any]:
        began = time.perf_counter()
        texts = [self.tokenizer.apply_chat_template(row["messages"], tokenize=False) for row in rows]
        batch = self.tokenizer(texts, truncation=True, max_length=self.max_seq_len, padding="longest", return_tensors="pt")
        batch["labels"] = batch["input_ids"].masked_fill(batch["attention_mask"] == 0, -100)
        self.seconds += time.perf_counter() - began
        return dict(batch)


class Counts:
    """What the micro-batches trained since the last step's end. Counted where each is trained, not where it is
    collated: accelerate's data loader collates one batch ahead (to know the last), so a step's collator calls are
    not its micro-batches."""

    def __init__(self) -> None:
        self.tokens = self.processed = self.attn_ctx = 0

    def add(self, attention_mask: Any) -> None:
        lengths = attention_mask.sum(dim=1).tolist()
        self.tokens += sum(lengths)
        self.processed += attention_mask.numel()
        self.attn_ctx += sum(n * (n + 1) // 2 for n in lengths)

    def take(self) -> tuple[int, int, int]:
        taken = self.tokens, self.processed, self.attn_ctx
        self.tokens = self.processed = self.attn_ctx = 0
        return taken


def load_model(path: str, quantize: bool) -> Any:
    import torch
    from peft import LoraConfig, get_peft_model, prepare_model_for_kbit_training
    from transformers import AutoModelForCausalLM, BitsAndBytesConfig

    if quantize:
        bnb = BitsAndBytesConfig(
            load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True, bnb_4bit_compute_dtype=torch.bfloat16
        )
        model = AutoModelForCausalLM.from_pretrained(path, quantization_config=bnb, dtype=torch.bfloat16, device_map={"": 0})
    else:
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=True)
    lora = LoraConfig(r=16, lora_alpha=32, lora_dropout=0.05, target_modules="all-linear", task_type="CAUSAL_LM")
    return get_peft_model(model, lora)


def run(args: argparse.Namespace) -> TrainerRun:
    import torch
    from transformers import AutoTokenizer, Trainer, TrainerCallback, TrainingArguments

    from ray_jobs.observe.profile import model_shape, peak_flops, step_flops

    on_gpu = torch.cuda.is_available() and not args.no_quant
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    rows = [json.loads(line) for line in Path(args.data).read_text().splitlines() if line.strip()]
    model = load_model(args.model, quantize=on_gpu)
    shape = model_shape(model, gradient_checkpointing=True)
    collator, counts = TokenizingCollator(tokenizer, args.max_seq_len), Counts()
    steps: list[TrainerStep] = []
    losses: dict[int, float] = {}

    first_step: list[float] = []  # the epoch time the first step ended

    class Clock(TrainerCallback):
        """Each optimizer step's wall time, from the end of the one before (the first from the loop's start)."""

        last = 0.0

        def on_train_begin(self, *_: Any, **__: Any) -> None:
            self.last = time.perf_counter()

        def on_step_end(self, _args: Any, state: Any, *_: Any, **__: Any) -> None:
            if on_gpu:
                torch.cuda.synchronize()
            now = time.perf_counter()
            tokens, processed, attn_ctx = counts.take()
            steps.append(TrainerStep(state.global_step, now - self.last, tokens, processed, attn_ctx, collator.seconds, None))
            collator.seconds, self.last = 0.0, now
            if len(steps) == 1:
                first_step.append(time.time())

        def on_log(self, _args: Any, state: Any, _control: Any, logs: dict[str, Any] | None = None, **__: Any) -> None:
            if logs and "loss" in logs:
                losses[state.global_step] = float(logs["loss"])

    class CountingTrainer(Trainer):
        def training_step(self, model: Any, inputs: dict[str, Any], *rest: Any, **kw: Any) -> Any:
            counts.add(inputs["attention_mask"])
            return super().training_step(model, inputs, *rest, **kw)

    scratch = tempfile.TemporaryDirectory(prefix="trainer-recipe-")  # the Trainer's output_dir: nothing is saved there
    training = TrainingArguments(
        output_dir=scratch.name,
        per_device_train_batch_size=args.micro_batch,
        gradient_accumulation_steps=args.accumulation,
        max_steps=args.steps,
        learning_rate=2e-4,
        lr_scheduler_type="cosine",
        warmup_steps=2,
        optim="adamw_torch",
        bf16=on_gpu,
        use_cpu=not on_gpu,
        gradient_checkpointing=True,
        gradient_checkpointing_kwargs={"use_reentrant": False},
        logging_steps=1,
        save_strategy="no",
        report_to=[],
        dataloader_num_workers=0,
        remove_unused_columns=False,
        seed=0,
    )
    with scratch:
        CountingTrainer(model=model, args=training, train_dataset=rows, data_collator=collator, callbacks=[Clock()]).train()
    trained = tuple(dataclasses.replace(s, loss=losses.get(s.step)) for s in steps)
    return TrainerRun(
        recipe=(
            f"Trainer + PEFT QLoRA: {'NF4' if on_gpu else 'fp32 base on CPU (no 4-bit)'}, prepare_model_for_kbit_training, "
            f"gradient checkpointing, micro-batch {args.micro_batch} x {args.accumulation} accumulation, padded to the longest"
        ),
        steps=trained,
        warmup=min(args.warmup, max(len(trained) - 1, 0)),
        micro_batch=args.micro_batch,
        accumulation=args.accumulation,
        max_seq_len=args.max_seq_len,
        time_to_first_step_s=first_step[0] - args.started,
        gpu_mem_peak_gb=torch.cuda.max_memory_allocated() / 2**30 if on_gpu else None,
        peak_flops=peak_flops(torch.device("cuda")) if on_gpu else None,
        model_flops_per_step=tuple(step_flops(shape, s.tokens, s.attn_ctx)[0] for s in trained),
        quantized=on_gpu,
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model")
    parser.add_argument("data")
    parser.add_argument("out", type=Path)
    parser.add_argument("--steps", type=int, default=15, help="optimizer steps")
    parser.add_argument("--warmup", type=int, default=2, help="leading steps left out of the steady figures")
    parser.add_argument("--micro-batch", type=int, default=4)
    parser.add_argument("--accumulation", type=int, default=4)
    parser.add_argument("--max-seq-len", type=int, default=2048)
    parser.add_argument("--started", type=float, default=STARTED, help="epoch seconds the run started (the shell's clock)")
    parser.add_argument("--no-quant", action="store_true", help="fp32 base on the CPU: the loop without a GPU")
    args = parser.parse_args(argv)
    result = run(args)
    args.out.write_text(result.to_json())
    print(
        f"Trainer recipe: {result.steady_tokens_per_s:,.0f} steady tokens/s over {len(result.steady())} steps, "
        f"MFU {'-' if result.mfu is None else f'{result.mfu:.1%}'}, data wait {result.data_wait_frac:.1%}, "
        f"padding {result.padding_frac:.1%}, first step {result.time_to_first_step_s:.1f} s, "
        f"peak {'-' if result.gpu_mem_peak_gb is None else f'{result.gpu_mem_peak_gb:.1f} GiB'}"
    )


if __name__ == "__main__":
    main()
