"""The Ray Data pipeline: read rows, template + tokenize + pack on CPU actors, stream to trainers.

    read (ray_jobs.sources)  ->  TokenizeAndPack (actor pool, CPU)  ->  Ray Train shards

The tokenizer lives in a callable class, so each actor loads it once and keeps it; the actors run
ahead of training as Ray Data streams, and each trainer prefetches ``data.prefetch_batches``
micro-batches from its shard. Rows are routed to the train or eval split by a stable hash of their
content, so both splits read the same files and each tokenizes only its own rows.
"""

from __future__ import annotations

import hashlib
import json
from typing import TYPE_CHECKING, Any, Literal

from ray_jobs.formats import detect_format, to_text, to_turns
from ray_jobs.packing import pack
from ray_jobs.sources import data_files, peek_columns, read_rows
from ray_jobs.spec import DataSpec, SpecError

if TYPE_CHECKING:
    import pyarrow as pa
    import ray.data

Split = Literal["train", "eval"]


def resolve_format(data: DataSpec) -> str:
    """The spec's format, or the one detected from the columns (raises with the columns found)."""
    if data.format != "auto":
        return data.format
    try:
        return detect_format(peek_columns(data_files(data.path)))
    except ValueError as exc:
        if isinstance(exc, SpecError):
            raise
        raise SpecError("data.format", str(exc)) from None


def in_eval_split(row: dict[str, Any], val_fraction: float) -> bool:
    """Stable across runs, workers and row order: a hash of the row's content."""
    digest = hashlib.blake2b(json.dumps(row, sort_keys=True, default=str).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2**64 < val_fraction


class TokenizeAndPack:
    """Ray Data UDF (run as an actor): rows of one split -> packed, fixed-length token rows."""

    def __init__(self, tokenizer_path: str, data: DataSpec, fmt: str, split: Split):
        from transformers import AutoTokenizer

        from ray_jobs.template import ChatEncoder

        tokenizer = AutoTokenizer.from_pretrained(tokenizer_path)
        self.encoder = ChatEncoder(tokenizer, data.chat_template, data.train_on_completions_only)
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id or 0
        self.data, self.fmt, self.split = data, fmt, split

    def __call__(self, batch: pa.Table) -> dict[str, Any]:
        examples = []
        for row in batch.to_pylist():
            if in_eval_split(row, self.data.val_fraction) != (self.split == "eval"):
                continue
            if self.fmt == "text":
                examples.append(self.encoder.encode_text(to_text(row)))
            else:
                examples.append(self.encoder.encode_turns(to_turns(row, self.fmt)))
        return pack(examples, self.data.max_seq_len, self.pad_id, packing=self.data.packing)


def token_dataset(data: DataSpec, tokenizer_path: str, split: Split) -> ray.data.Dataset:
    """One split as a lazy, streaming dataset of packed rows."""
    import ray.data

    return read_rows(data.path).map_batches(
        TokenizeAndPack,
        fn_constructor_kwargs={"tokenizer_path": tokenizer_path, "data": data, "fmt": resolve_format(data), "split": split},
        batch_format="pyarrow",
        batch_size=data.tokenize_batch_size,
        compute=ray.data.ActorPoolStrategy(size=data.tokenize_workers),
        num_cpus=1,
    )
