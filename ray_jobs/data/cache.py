"""Tokenize once: the content-addressed dataset cache, and the datasets a job trains on.

The key of an entry hashes everything that changes the tokens: each source file's path, size and
modification time; the format; the tokenizer's files (``tokenizer.json``, its config, ...); the chat
template; ``max_seq_len``, ``overlong``, packing, masking, ``val_fraction`` and the tokenization
batch size (packing is per batch); a validation set's files and format (``data.val_path``); and
``CACHE_VERSION``, bumped whenever the pipeline's output
changes. Any change makes a new entry; an unchanged job reads the entry's Parquet shards and
downloads and tokenizes nothing.

On a miss the whole dataset is tokenized in one parallel pass (every record read once), written
as Parquet partitioned by split, checked against ``data.max_bad_row_frac`` and committed atomically
(``ray_jobs.cache.entries``); a job that fails the check leaves no entry. On a local root the writes and
reads run on the driver's node, where the directory is.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import time
from pathlib import Path
from typing import Any

from ray_jobs.cache import entries
from ray_jobs.cache.models import fetch_model
from ray_jobs.chaos import NO_CHAOS, Chaos
from ray_jobs.data.order import CachedOrder, CacheFile
from ray_jobs.data.pipeline import BATCHES_PER_TASK, TOKEN_COLUMNS, new_ledger, tokenize
from ray_jobs.data.preflight import DataInputs, data_inputs
from ray_jobs.data.quality import FillClock, QualityReport
from ray_jobs.data.reading import HELPER_CPUS
from rayft_contract.data_records import DatasetCacheInfo, Fetched, FillTimes
from rayft_contract.spec import FineTuneSpec

CACHE_VERSION = 4
"""3: rows written in the data's order (``preserve_order``), each split's files and row counts in the
manifest (the training order is built from them, see ``ray_jobs.data.order``). 4: tokenizer batches cut
at exact row counts, whatever the read's pieces (``ray_jobs.data.pipeline.tokenize``); the fill's phases in the
manifest."""
ROWS_PER_FILE = 512
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "tokenizer.model",
    "vocab.json",
    "merges.txt",
    "chat_template.jinja",
    "chat_template.json",
)


@dataclasses.dataclass
class Prepared:
    """What the trainer gets: Ray datasets by split, plus how they were made (for the summary)."""

    datasets: dict[str, Any]
    """What Ray Train splits over the workers: ``eval``, and ``train`` when streaming."""
    cache: DatasetCacheInfo
    ledger: Any = None
    """Streaming mode: the live :class:`RowLedger` (the report is final only after training)."""
    quality: QualityReport | None = None
    order: CachedOrder | None = None
    """Cache mode: the training split's files, read by each worker in the epoch's order."""
    eval_split: CachedOrder | None = None
    """Cache mode: the eval split's files, which each worker reads its share of directly when it is small
    (``ray_jobs.train.evaluation``); ``datasets["eval"]`` stays for workers that cannot open them."""

    def quality_report(self) -> QualityReport:
        import ray

        return self.quality if self.quality is not None else ray.get(self.ledger.get.remote())


def prepare(
    spec: FineTuneSpec, chaos: Chaos = NO_CHAOS, inputs: DataInputs | None = None, model: Fetched | None = None
) -> Prepared:
    """The train (and eval) datasets: from the cache (filling it on a miss), or streaming.

    ``inputs`` and ``model``: what the driver already looked up (``ray_jobs.data.preflight.check``, its one
    ``fetch_model``); looked up here when absent."""
    data, splits = spec.data, ("train", "eval") if spec.data.held_out else ("train",)
    start = time.perf_counter()
    inputs = inputs or data_inputs(spec)
    if not data.cache:
        ledger = new_ledger(data, fail_early=True)
        datasets = {s: tokenize(data, inputs, spec.model.path, spec.model.revision, (s,), ledger, chaos) for s in splits}
        datasets = {s: ds.select_columns(TOKEN_COLUMNS) for s, ds in datasets.items()}
        if "eval" in datasets:
            datasets["eval"] = datasets["eval"].materialize()
        info = DatasetCacheInfo(enabled=False, bytes_downloaded=inputs.bytes)
        return Prepared(datasets, info, ledger=ledger)

    key, parts = dataset_key(spec, inputs, model)
    entry = entries.entry(data.cache_uri or str(Path(entries.default_root())), "datasets", key)
    meta = entries.manifest(entry)
    hit = meta is not None
    if meta is None:
        meta = _fill(spec, entry, inputs, parts, splits, chaos)
    else:
        entries.record_hit(entry)
    payload = entries.payload_of(entry, meta)
    datasets = {"eval": _read_split(payload, "eval")} if meta["rows_by_split"].get("eval") else {}
    node = _this_node() if payload.is_local else None
    order, eval_split = (
        CachedOrder(
            fs=payload.fs,
            files=tuple(CacheFile(payload.child(name).path, rows) for name, rows in meta["files"].get(split, [])),
            seed=spec.train.seed,
            shuffle=data.shuffle and split == "train",
            window_rows=data.shuffle_buffer_rows,
            node_id=node,
        )
        for split in ("train", "eval")
    )
    info = DatasetCacheInfo(
        enabled=True,
        hit=hit,
        key=key,
        uri=entry.uri,
        bytes_downloaded=0 if hit else meta["source_bytes"],
        rows_tokenized=0 if hit else meta["quality"]["rows"],
        packed_rows=meta["rows_by_split"],
        seconds=time.perf_counter() - start,
        nodes=0 if hit else meta["tokenized_on_nodes"],
        fill=FillTimes.from_dict(meta["fill"]) if not hit and meta.get("fill") else None,
    )
    eval_split = eval_split if eval_split.files else None
    return Prepared(datasets, info, quality=QualityReport.from_dict(meta["quality"]), order=order, eval_split=eval_split)


def dataset_key(spec: FineTuneSpec, inputs: DataInputs | None = None, model: Fetched | None = None) -> tuple[str, dict[str, Any]]:
    """The entry's key and the parts it hashes (kept in the manifest, to explain a miss)."""
    data = spec.data
    inputs = inputs or data_inputs(spec)
    model = model or fetch_model(spec.model.path, spec.model.revision)
    parts = {
        "version": CACHE_VERSION,
        "sources": [list(s) for s in inputs.identity],  # JSON's form, as stored in the manifest
        "format": inputs.format,
        "tokenizer": tokenizer_fingerprint(model.path),
        **{f: getattr(data, f) for f in _TOKEN_FIELDS},
    }
    if inputs.val is not None:  # only then: entries made before val_path existed keep their keys
        parts.update(val_sources=[list(s) for s in inputs.val.identity], val_format=inputs.val.format)
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:24], parts


_TOKEN_FIELDS = (
    "chat_template",
    "max_seq_len",
    "overlong",
    "packing",
    "train_on_completions_only",
    "val_fraction",
    "tokenize_batch_size",
)
"""The ``DataSpec`` fields that change the tokens (``max_bad_row_frac`` does not: the report is kept)."""


def tokenizer_fingerprint(model_dir: str) -> str:
    digest = hashlib.sha256()
    for name in TOKENIZER_FILES:
        path = Path(model_dir, name)
        if path.is_file():
            digest.update(name.encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:24]


def _fill(
    spec: FineTuneSpec, entry: Any, inputs: DataInputs, parts: dict[str, Any], splits: tuple[str, ...], chaos: Chaos
) -> dict[str, Any]:
    import ray

    data = spec.data
    started = time.time()
    ledger = new_ledger(data, fail_early=False)
    payload = entries.new_payload(entry)
    try:
        tokens = tokenize(
            data,
            inputs,
            spec.model.path,
            spec.model.revision,
            splits,
            ledger,
            chaos,
            BATCHES_PER_TASK,  # type: ignore[arg-type]
        )
        # Rows leave the tokenizer pool in the data's order, so the entry's own order is the data's: what
        # data.shuffle=false trains on (a curriculum), and the same entry whatever the actors' timing.
        tokens.context.execution_options.preserve_order = True
        # Files of at least ROWS_PER_FILE packed rows (a few MB), not one per tokenizer batch: fewer read tasks later.
        on_node = _on_this_node(entry).get("ray_remote_args", {})
        tokens.write_parquet(
            payload.path,
            filesystem=payload.fs,
            partition_cols=["split"],
            min_rows_per_file=ROWS_PER_FILE,
            ray_remote_args={"num_cpus": HELPER_CPUS, **on_node},
        )
        report: QualityReport = ray.get(ledger.get.remote())
        nodes = ray.get(ledger.node_count.remote())
        clock: FillClock = ray.get(ledger.clock.remote())
        report.check(data.max_bad_row_frac)
        files = {s: _files_of(payload, s) for s in splits}
        rows_by_split = {s: sum(rows for _, rows in files[s]) for s in splits}
    except BaseException:
        payload.delete()
        raise
    finally:
        ray.kill(ledger)
    meta = {
        "fill": fill_times(clock, started, time.time(), data.tokenize_workers).to_dict(),
        "description": f"{data.path}{f' (validation: {data.val_path})' if data.val_path else ''} "
        f"({parts['format']}, {data.max_seq_len} tokens, packing={data.packing})",
        "key_parts": parts,
        "source_bytes": inputs.bytes,
        "quality": report.to_dict(),
        "rows_by_split": rows_by_split,
        "files": files,
        "tokenized_on_nodes": nodes,
    }
    return entries.commit(entry, payload, meta)


def fill_times(clock: FillClock, started: float, ended: float, workers: int) -> FillTimes:
    """The fill's three phases from its start and end, the ledger's first tokenizer task and its last batch
    (clamped: a tokenizer's clock on another node may be off by a little; a fill with no rows has no stream).
    The stream starts when the first tokenizer task begins, not when it ends: its rows are work, not fixed
    cost (a task of 2,048 rows took 1.5-2 s on the H200 host)."""
    first = min(max(clock.first_task_ts or clock.first_batch_ts or ended, started), ended)
    last = min(max(clock.last_batch_ts or first, first), ended)
    first_batch = min(max(clock.first_batch_ts or first, first), last)
    busy = clock.busy
    return FillTimes(
        start_s=first - started,
        stream_s=last - first,
        write_s=ended - last,
        read_busy_s=busy.read,
        template_busy_s=busy.template,
        tokenize_busy_s=busy.tokenize,
        pack_busy_s=busy.pack,
        workers=workers,
        actors_ready_s=_since(clock.actors_ready_ts, started, ended),
        actor_init_s=clock.actor_init_s,
        first_batch_s=first_batch - started,
        first_read_s=_since(clock.first_read_ts, started, ended),
        first_block_s=_since(clock.first_block_ts, started, ended),
        readers_at_once=clock.readers_at_once,
    )


def _since(ts: float | None, started: float, ended: float) -> float:
    """``ts`` as seconds into the fill, clamped to it (another node's clock may be off by a little); 0 for none."""
    return 0.0 if ts is None else min(max(ts - started, 0.0), ended - started)


def _read_split(payload: Any, split: str) -> Any:
    import warnings

    import ray.data

    with warnings.catch_warnings():  # ray_remote_args (deprecated for reads in 2.60) is still the only way to pin
        warnings.simplefilter("ignore", DeprecationWarning)
        ds = ray.data.read_parquet(payload.child(f"split={split}").path, filesystem=payload.fs, **_on_this_node(payload))
    return ds.select_columns(TOKEN_COLUMNS)


def _files_of(payload: Any, split: str) -> list[tuple[str, int]]:
    """``(path under the payload, rows)`` of a split's Parquet files, in the order they were written
    (Ray names them by write task, and the tasks take the rows in order)."""
    import pyarrow.fs as pafs
    import pyarrow.parquet as pq

    where = payload.child(f"split={split}")
    if not where.exists():
        return []
    infos = payload.fs.get_file_info(pafs.FileSelector(where.path, recursive=True))
    paths = sorted(i.path for i in infos if i.type == pafs.FileType.File and i.path.endswith(".parquet"))
    prefix = payload.path.rstrip("/") + "/"
    return [(p[len(prefix) :], pq.read_metadata(p, filesystem=payload.fs).num_rows) for p in paths]


def _this_node() -> str:
    import ray

    return ray.get_runtime_context().get_node_id()


def _on_this_node(loc: Any) -> dict[str, Any]:
    """A local cache directory exists on the driver's node only: run its reads and writes there."""
    if not loc.is_local:
        return {}
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    return {"ray_remote_args": {"scheduling_strategy": NodeAffinitySchedulingStrategy(_this_node(), soft=False)}}
