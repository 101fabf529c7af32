"""The Ray Data pipeline: read records, template + tokenize + pack on CPU actors, feed the trainers.

    read_records (ray_jobs.data.reading)  ->  TokenizeAndPack (actor pool, CPU)  ->  dataset cache / Ray Train

The tokenizer lives in a callable class, so each actor loads it once and keeps it. Every record is
parsed and checked there: a bad one is counted by kind in the job's :class:`RowLedger` (see
``ray_jobs.data.quality``), never dropped silently. Rows go to the train or eval split by a stable hash
of the record, so the split is the same in every run and on every worker; with ``data.val_path`` the
eval split is that set's rows (read with the others, in its own format), and every row of
``data.path`` trains.

``data.cache`` on (the default): :func:`datasets_for` tokenizes the whole dataset once, in parallel
on every free CPU, into the content-addressed cache (``ray_jobs.data.cache``); training reads
the Parquet shards. Off: each split streams from the tokenizers into training as it runs.
"""

from __future__ import annotations

import contextlib
import gc
import hashlib
import json
import os
import time
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from ray_jobs.chaos import NO_CHAOS, Chaos
from ray_jobs.data.formats import BadRowError, detect_format, to_text, to_turns
from ray_jobs.data.packing import Example, pack
from ray_jobs.data.quality import BadRow, DataQualityError, QualityReport, StageSeconds
from ray_jobs.data.reading import read_records
from ray_jobs.data.sources import Files, peek_columns
from rayft_contract.spec import DataSpec, SpecError

if TYPE_CHECKING:
    import pyarrow as pa
    import ray.data

    from ray_jobs.data.preflight import DataInputs

Split = Literal["train", "eval"]
TOKEN_COLUMNS = ["input_ids", "labels", "position_ids", "num_tokens", "num_examples", "num_truncated"]
BATCHES_PER_TASK = 8
"""Tokenizer batches (``data.tokenize_batch_size`` rows, the unit of packing) one actor task of a cache fill
takes at once (a streaming job's tasks take one: its trainers wait for a task's whole output, and its rate,
about 120 rows/s for two GPUs at 20,000 tokens/s each, is far under the limit below).
Ray Data's driver ran about 40 actor tasks a second whatever they did: a UDF that returned at once was held to
39-46 tasks/s on this 2-core machine, and a 12-actor fill on the 16-core H200 host to 40 tasks/s (10,200
rows/s at 256 rows a task) on two hosts whose cores differed 2x in speed, the actors 35-71% busy. Packing is
still per batch, in the data's order, so the entry is the same as with one batch a task."""

ACTORS_PER_READER: int | None = 8
"""Tokenizer actors per reading task a fill runs at once (at least 2 reading tasks; ``None``: no bound, as many as
fit, one per piece). A reading task is far faster than an actor: 600,000 chat rows took the reading tasks 3.0-3.6 s
of work in all, against 388-482 s of tokenizing over 14 actors, and 2M rows of gzipped shards in S3 took 30 s of
reading against 145 s of 12 actors' stream (``bench/RESULTS.md``). Unbounded, a new job's fill started
one reading task per piece at once, and each new worker process imports Ray Data (1-3 s) beside the 14 actors doing
the same: on the 16-core H200 host, 200,000 rows, the first tokenizer task began 7.0-7.2 s into the fill, against
5.1-5.9 s with one or two reading tasks at once (``bench/fill_start.py --actors-per-reader``)."""


def resolve_format(data: DataSpec, files: Files) -> str:
    """The spec's format, or the one detected from the columns of ``files``' first row (raises with the
    columns found). A validation set (``data.val_path``) is detected on its own."""
    if data.format != "auto":
        return data.format
    try:
        return detect_format(peek_columns(files))
    except ValueError as exc:
        if isinstance(exc, SpecError):
            raise
        raise SpecError("data.format" if files.field == "data.path" else files.field, str(exc)) from None


def in_eval_split(record: str, val_fraction: float) -> bool:
    """Stable across runs, workers and row order: a hash of the record's text."""
    digest = hashlib.blake2b(record.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2**64 < val_fraction


class TokenizeAndPack:
    """Ray Data UDF (run as an actor): records -> packed, fixed-length token rows with a ``split`` column."""

    def __init__(
        self,
        model_path: str,
        revision: str | None,
        data: DataSpec,
        fmt: str,
        splits: tuple[Split, ...],
        ledger: Any,
        chaos: Chaos = NO_CHAOS,
        val_from: int | None = None,
        val_fmt: str | None = None,
    ):
        """``val_from``: with ``data.val_path``, the index of its first file; rows of files from there on are
        the eval split, in format ``val_fmt``, and every other row trains."""
        started = time.perf_counter()
        from ray_jobs.cache.models import fetch_model
        from ray_jobs.data.template import ChatEncoder, load_tokenizer

        # The actor has one CPU (Ray's num_cpus=1), but the Rust tokenizer spreads each encode_batch over a
        # thread per core of the machine: 14 actors on a 16-core host would run 224 threads. Serial here.
        os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
        # This actor's node may not be the driver's: fetch there (once per node); the driver counted the job's hit.
        tokenizer = load_tokenizer(fetch_model(model_path, revision, count_hit=False).path)
        self.encoder = ChatEncoder(tokenizer, data.chat_template, data.train_on_completions_only)
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id or 0
        self.data, self.fmt, self.splits, self.ledger, self.chaos = data, fmt, splits, ledger, chaos
        self.val_from, self.val_fmt = val_from, val_fmt
        if ledger is not None:
            import ray

            ray.get(ledger.add_node.remote(ray.get_runtime_context().get_node_id(), time.perf_counter() - started))

    def __call__(self, batch: pa.Table) -> dict[str, Any]:
        """Up to :data:`BATCHES_PER_TASK` tokenizer batches at once: every row templated and tokenized in one
        call, then each batch's rows packed on their own, batch by batch and split by split."""
        with collector_paused():
            return self._tokenize_and_pack(batch)

    def _tokenize_and_pack(self, batch: pa.Table) -> dict[str, Any]:
        import ray

        started, began_ts = time.perf_counter(), time.time()
        report = QualityReport()
        per_batch = self.data.tokenize_batch_size
        examples: list[dict[str, list[Example]]] = [
            {split: [] for split in self.splits} for _ in range(max(-(-batch.num_rows // per_batch), 1))
        ]
        columns = ("source", "file", "piece", "line", "record")
        pending: list[tuple[int, str, tuple[Any, ...]]] = []  # (batch, split, where) of each row whose segments follow
        segments: list[tuple[list[tuple[str, bool]], bool]] = []
        for row, (source, file, piece, line, record) in enumerate(zip(*(batch.column(c).to_pylist() for c in columns))):
            if row % per_batch == 0:
                self.chaos.slow_tokenizer()
            if self.val_from is None:
                held_out = in_eval_split(record, self.data.val_fraction)
            else:
                held_out = file >= self.val_from
            split = "eval" if held_out else "train"
            if split not in self.splits:
                continue
            report.rows += 1
            try:
                segments.append(self.segments_of(record, self.val_fmt if self.val_from is not None and held_out else self.fmt))
                pending.append((row // per_batch, split, (source, file, piece, line)))
            except BadRow as bad:
                report.record(bad, source, file, piece, line)
        templated = time.perf_counter()
        # One tokenizer call for all the rows (ray_jobs/data/template.py says why), then each row's length check.
        for (at, split, where), example in zip(pending, self.encoder.encode_many(segments)):
            try:
                examples[at][split].append(self._fits(example, report))
            except BadRow as bad:
                report.record(bad, *where)
        tokenized = time.perf_counter()
        parts = [self._pack(split, rows) for one in examples for split, rows in one.items()]
        packed = {c: np.concatenate([p[c] for p in parts]) for c in parts[0]}
        busy = StageSeconds(template=templated - started, tokenize=tokenized - templated, pack=time.perf_counter() - tokenized)
        if self.ledger is not None and ray.get(self.ledger.add.remote(report, busy, began_ts)):  # streaming: fail early
            raise DataQualityError(ray.get(self.ledger.get.remote()).describe(self.data.max_bad_row_frac))
        return packed

    def encode(self, record: str, report: QualityReport, fmt: str | None = None) -> Example:
        """One record (in format ``fmt``, default the data's) -> ``(input_ids, labels)``; raises :class:`BadRow`
        with the kind and the reason. (A batch goes through ``__call__``, which tokenizes its rows at once.)"""
        (example,) = self.encoder.encode_many([self.segments_of(record, fmt)])
        return self._fits(example, report)

    def segments_of(self, record: str, fmt: str | None = None) -> tuple[list[tuple[str, bool]], bool]:
        """One record -> its ``(text, trained)`` segments and whether BOS/EOS wrap it (plain text); raises
        :class:`BadRow` for what is wrong with the row before it is tokenized."""
        fmt = fmt or self.fmt
        try:
            row = json.loads(record)
        except ValueError as exc:
            raise BadRow("unparsable", f"not valid JSON ({exc})") from None
        if not isinstance(row, dict):
            raise BadRow("unparsable", f"a JSON {type(row).__name__}, not an object")
        try:
            if fmt == "text":
                text = to_text(row)
                if not text.strip():
                    raise BadRow("empty_completion", "empty text")
                return self.encoder.text_segments(text), True
            turns = to_turns(row, fmt)
            if not any(t.role == "assistant" and t.content.strip() for t in turns):
                raise BadRow("empty_completion", "no non-empty assistant answer to train on")
            return self.encoder.segments(turns), False
        except BadRowError as exc:
            raise BadRow("missing_field", str(exc)) from None

    def _fits(self, example: Example, report: QualityReport) -> Example:
        """The row as tokenized, or :class:`BadRow` when it is longer than ``max_seq_len`` and ``overlong: drop``."""
        ids, labels = example
        if len(ids) > self.data.max_seq_len:
            if self.data.overlong == "drop":
                raise BadRow("too_long", f"{len(ids)} tokens, over data.max_seq_len {self.data.max_seq_len}")
            report.truncated += 1
        return ids, labels

    def _pack(self, split: str, examples: list[Example]) -> dict[str, np.ndarray]:
        rows = pack(examples, self.data.max_seq_len, self.pad_id, packing=self.data.packing)
        rows["split"] = np.full(len(rows["num_tokens"]), split)
        return rows


@contextlib.contextmanager
def collector_paused():
    """Python's cyclic garbage collector off for the block, back on after. A task makes a few lists a row
    (segments, ids, labels) and no reference cycles, so every collection in it is wasted work, and the later
    ones walk all of the task's rows: on one core here with the 32k BPE, the UDF did 1,880 rows/s with the
    collector and 2,143 without (``bench/RESULTS.md``). Reference counting still frees everything at once."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def tokenize(
    data: DataSpec,
    inputs: DataInputs,
    model_path: str,
    revision: str | None,
    splits: tuple[Split, ...],
    ledger: Any,
    chaos: Chaos = NO_CHAOS,
    batches_per_task: int = 1,
) -> ray.data.Dataset:
    """The records of ``splits`` (``inputs``: the files and their formats, see :func:`resolve_format`) as a
    lazy, streaming dataset of packed rows. With a validation set, only the files a split needs are read.
    ``batches_per_task``: tokenizer batches an actor task takes (:data:`BATCHES_PER_TASK` for a cache fill)."""
    import ray.data

    val = inputs.val
    readers = None if ACTORS_PER_READER is None else max(2, -(-data.tokenize_workers // ACTORS_PER_READER))
    reading = {"ledger": ledger, "at_once": readers, "delay_s": chaos.read_delay_s}
    parts = []
    if val is None or "train" in splits:
        parts.append(read_records(inputs.files, data.path, **reading))
    if val is not None and "eval" in splits:
        parts.append(read_records(val.files, data.val_path, **reading))
    # Records arrive in the reading tasks' blocks (``ray_jobs.data.reading``); cut them into tokenizer-sized blocks
    # so that every actor gets work and each packed batch streams on as soon as it is ready.
    records = parts[0].union(*parts[1:]) if len(parts) > 1 else parts[0]
    # strict: every task's rows but the last are exactly BATCHES_PER_TASK tokenizer batches in the data's order,
    # wherever the pieces were cut. Packing is per batch, so otherwise a file's entry depended on how it was read
    # (a JSONL cut into byte ranges and the same rows as Parquet cut into row groups packed differently).
    task_rows = data.tokenize_batch_size * batches_per_task
    records = records.repartition(target_num_rows_per_block=task_rows, strict=True)
    return records.map_batches(
        TokenizeAndPack,
        fn_constructor_kwargs={
            "model_path": model_path,
            "revision": revision,
            "data": data,
            "fmt": inputs.format,
            "splits": splits,
            "ledger": ledger,
            "chaos": chaos,
            "val_from": val.files.first_index if val is not None else None,
            "val_fmt": val.format if val is not None else None,
        },
        batch_format="pyarrow",
        batch_size=task_rows,
        compute=ray.data.ActorPoolStrategy(size=data.tokenize_workers),
        num_cpus=1,
    )


def new_ledger(data: DataSpec, fail_early: bool) -> Any:
    """A :class:`RowLedger` actor; ``fail_early`` lets the tokenizers stop a streaming job mid-way."""
    import ray

    from ray_jobs.data.quality import RowLedger

    return ray.remote(num_cpus=0)(RowLedger).remote(data.max_bad_row_frac if fail_early else float("inf"))
