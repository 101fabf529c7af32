"""A tiny, learnable world for smoke runs and tests: a BPE tokenizer, a random Llama and a dataset.

Nothing is downloaded. The task is learnable by a few-thousand-parameter model in a minute on
CPU: "count from golf by 3" -> "golf juliett mike papa" (NATO words, cyclic, step 1-5). The next
word depends only on the previous word and the step, so a LoRA adapter (plus trained embeddings
and head, ``lora.modules_to_save``) drives the eval loss down by a clear margin.

    python -m ray_jobs.tiny .rayft/tiny     # writes model/ (with tokenizer), train.jsonl
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

from ray_jobs.data.template import CHATML_TEMPLATE

WORDS = (
    "alpha bravo charlie delta echo foxtrot golf hotel india juliett kilo lima mike november "
    "oscar papa quebec romeo sierra tango uniform victor whiskey xray yankee zulu"
).split()
SYSTEM = "You count in NATO words."
SPECIAL = ["<pad>", "<s>", "</s>", "<|im_start|>", "<|im_end|>"]


def example(rng: random.Random) -> dict[str, list[dict[str, str]]]:
    """One chat row of the counting task."""
    start, step, n = rng.randrange(len(WORDS)), rng.randint(1, 5), rng.randint(4, 8)
    answer = " ".join(WORDS[(start + i * step) % len(WORDS)] for i in range(n))
    return {
        "messages": [
            {"role": "system", "content": SYSTEM},
            {"role": "user", "content": f"count from {WORDS[start]} by {step}, {n} words"},
            {"role": "assistant", "content": answer},
        ]
    }


def write_dataset(path: Path, rows: int, seed: int = 0) -> Path:
    rng = random.Random(seed)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as fh:
        for _ in range(rows):
            fh.write(json.dumps(example(rng)) + "\n")
    return path


BAD_LINES = {
    "unparsable": '{"messages": [{"role": "user", "content": "count fro',
    "missing_field": json.dumps({"messages": [{"role": "user"}, {"role": "assistant", "content": "alpha"}]}),
    "empty_completion": json.dumps({"messages": [{"role": "user", "content": "count"}, {"role": "assistant", "content": " "}]}),
    "too_long": json.dumps(
        {"messages": [{"role": "user", "content": "count"}, {"role": "assistant", "content": " ".join(WORDS * 40)}]}
    ),
}
"""One line of each bad-row kind (``ray_jobs.data.quality``); ``too_long`` needs ``data.overlong: drop``."""


def write_dataset_with_bad_rows(path: Path, rows: int, bad: int, seed: int = 0) -> dict[int, str]:
    """``rows`` lines of which ``bad`` (spread evenly, cycling through the kinds) are bad; returns line -> kind."""
    rng = random.Random(seed)
    kinds = list(BAD_LINES)
    bad_at = {1 + (i * rows) // bad + rows // (2 * bad): kinds[i % len(kinds)] for i in range(bad)} if bad else {}
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as fh:
        for line in range(1, rows + 1):
            fh.write((BAD_LINES[bad_at[line]] if line in bad_at else json.dumps(example(rng))) + "\n")
    return bad_at


def write_tokenizer(directory: Path, vocab_size: int = 320) -> None:
    """Train a byte-level BPE on the task's text; save it as a transformers tokenizer with ChatML."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    rng = random.Random(1)
    corpus = [m["content"] for _ in range(2000) for m in example(rng)["messages"]]
    corpus += [" ".join(rng.sample(WORDS, 6)) for _ in range(500)] + ["system user assistant"]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=SPECIAL, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train_from_iterator(corpus, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="<pad>")
    fast.chat_template = CHATML_TEMPLATE
    fast.save_pretrained(directory)


def write_model(directory: Path, hidden: int = 64, layers: int = 2, seed: int = 0) -> None:
    """A randomly initialised Llama sized to the tokenizer in ``directory``."""
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    tok = AutoTokenizer.from_pretrained(directory)
    config = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=hidden,
        intermediate_size=hidden * 3,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=1024,
        tie_word_embeddings=False,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
    )
    torch.manual_seed(seed)
    LlamaForCausalLM(config).save_pretrained(directory)


def ensure_tiny_assets(root: str | Path, rows: int = 2000) -> Path:
    """Create ``root/model`` (tokenizer + random Llama) and ``root/train.jsonl`` unless present."""
    root = Path(root)
    model_dir = root / "model"
    if not (model_dir / "config.json").is_file():
        model_dir.mkdir(parents=True, exist_ok=True)
        write_tokenizer(model_dir)
        write_model(model_dir)
    if not (root / "train.jsonl").is_file():
        write_dataset(root / "train.jsonl", rows)
    return root


if __name__ == "__main__":
    print(ensure_tiny_assets(sys.argv[1] if len(sys.argv) > 1 else ".rayft/tiny"))
