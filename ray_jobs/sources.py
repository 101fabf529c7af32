"""Where training rows come from: local files, directories and globs, an ``s3://`` prefix, or a hub dataset.

File types: JSONL/JSON, CSV and Parquet, each optionally compressed (``.gz``, ``.zst``, ``.bz2``,
``.lz4``, ``.br``; detected from the name). S3 settings come from the ``AWS_*`` environment (see
``ray_jobs.storage``), so AWS, MinIO and any S3-compatible store work the same way. Ray Data reads the
files in parallel across CPU workers; :func:`peek_columns` reads only the first row, without Ray, so a
wrong path or layout fails before any cluster starts.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ray_jobs.quality import StageSeconds
from rayft_contract.spec import SpecError

if TYPE_CHECKING:
    import ray.data

READERS = {".jsonl": "json", ".json": "json", ".csv": "csv", ".parquet": "parquet"}
"""File suffix -> Ray Data reader."""
COMPRESSIONS = (".gz", ".zst", ".bz2", ".lz4", ".br")
HUB_PREFIX = "hf://datasets/"
"""Hugging Face hub datasets, read from the hub's cache (downloaded into it once; ``HF_HUB_OFFLINE=1`` works)."""


PIECE_BYTES = 32 * 2**20
"""An uncompressed JSONL file over this size is read in ranges of about this size, each by a task of its own,
so that one large file keeps every CPU busy. Read whole, a 5 GB file was one task holding one 5 GB object.
A compressed file cannot be cut where its lines are: one task streams it, in blocks of
:data:`RECORDS_PER_BLOCK` records, so its memory stays bounded all the same (see :data:`BLOCK_BYTES`)."""
RECORDS_PER_BLOCK = 4096
"""Records per block a reading task hands on (the tokenizers re-cut them into their own batches)."""
BLOCK_BYTES = 16 * 2**20
"""The fill's ``target_max_block_size`` (Ray Data's default: 128 MiB, into which it gathers what a task yields
before handing any on). With it, a gzipped shard of 85 MB left its reading task as one block, read whole before
its first row reached a tokenizer: 14 s on the H200 host (``bench/RESULTS.md``). At 16 MiB a block of ~12,000 chat
rows goes on once read. Smaller blocks cost more (each is re-cut into tokenizer tasks by a task of its own): at 4 MiB
the 1M-row fill ran 16,808 rows/s (14 actors) and 1,770 (one) against 17,478 and 1,918 at 16 MiB, one host, one call."""
READ_BUFFER_BYTES = 8 * 2**20
"""The read-ahead of a streamed (compressed, or whole) file. Unbuffered, pyarrow read a gzipped file from S3 in
GETs of about 62 KB: 16,198 requests for 992 MiB of shards on the H200 host (moto), where each request to real
S3 costs tens of milliseconds of latency. Buffered, a shard of 31 MB is 4 requests."""
HELPER_CPUS = 0.25
"""The CPU a reading (or a cache-writing) task reserves from Ray: a quarter, not Ray Data's default of one.
Measured on the 16-core H200 host, 1M rows (1.3 GB): the reading tasks' own work was 5 s in all, yet each
held a whole CPU slot, and the tokenizer actors hold one each. With 14 actors on 16 CPUs the actors were
busy 49% of the fill's stream; with 12, 74%; with 8, 89% (``bench/RESULTS.md``). The fill's helpers, the
stitching of tokenizer batches included, shared the 2 slots left."""


@dataclass(frozen=True)
class Files:
    """The data files a ``data.path`` names, on one pyarrow filesystem."""

    fs: Any
    paths: list[str]
    sizes: tuple[int, ...] | None = None
    """Each file's size in bytes, once listed (``ray_jobs.preflight.data_inputs``): what cuts large files into
    pieces. ``None``: every file is read by one task."""
    field: str = "data.path"
    """The spec field that names these files (``data.val_path`` for a validation set), for errors."""
    first_index: int = 0
    """The first file's index among all the job's files: a validation set's files come after the training
    files, so that every bad row has its own file index (``ray_jobs.quality``)."""

    @property
    def reader(self) -> str:
        return READERS[file_type(self.paths[0])]

    def identity(self) -> list[tuple[str, int, int]]:
        """``(path, size, mtime_ns)`` of every file: what the dataset cache keys on, and what a read downloads."""
        return [(info.path, info.size, info.mtime_ns) for info in self.fs.get_file_info(self.paths)]


def file_type(path: str) -> str:
    """``.jsonl`` for ``train.jsonl.gz``; ``""`` for unreadable types."""
    name = path.lower()
    for codec in COMPRESSIONS:
        if name.endswith(codec):
            name = name[: -len(codec)]
    suffix = "." + name.rsplit(".", 1)[-1] if "." in name.rsplit("/", 1)[-1] else ""
    return suffix if suffix in READERS else ""


def data_files(path: str, field: str = "data.path") -> Files:
    """List the readable files of a file, a directory (recursively), a glob or an ``s3://`` prefix. ``field``:
    the spec field that named ``path``, for the errors."""
    import pyarrow.fs as pafs

    from ray_jobs.storage import s3_filesystem

    kinds = ", ".join(READERS) + " (optionally " + "/".join(COMPRESSIONS) + ")"
    if path.startswith(HUB_PREFIX):
        return data_files(hub_dataset_dir(path, field), field)
    if path.startswith("s3://"):
        fs, root = s3_filesystem(), path[len("s3://") :].rstrip("/")
    elif "://" in path:
        raise SpecError(field, f"{path!r}: unsupported scheme; use a local path, s3://bucket/prefix or hf://datasets/org/name")
    else:
        fs, root = (
            pafs.LocalFileSystem(),
            str(Path(path).expanduser().resolve()) if not _is_glob(path) else str(Path(path).expanduser()),
        )
    pattern = None
    if _is_glob(root):
        base = root[: min(root.find(c) for c in "*?[" if c in root)].rsplit("/", 1)[0]
        root, pattern = base, root
    try:
        info = fs.get_file_info(root)
    except OSError as exc:
        raise SpecError(field, f"cannot read {path!r}: {exc}") from None
    if info.type == pafs.FileType.File:
        if not file_type(root):
            raise SpecError(field, f"{path!r}: unsupported file type; use {kinds}")
        return Files(fs, [root], field=field)
    if info.type == pafs.FileType.NotFound:
        raise SpecError(field, f"dataset file {path!r} does not exist; check the path")
    found = fs.get_file_info(pafs.FileSelector(root, recursive=True))
    paths = sorted(
        f.path
        for f in found
        if f.type == pafs.FileType.File and file_type(f.path) and (pattern is None or fnmatch.fnmatch(f.path, pattern))
    )
    if not paths:
        raise SpecError(field, f"{path!r} holds no {kinds} files")
    types = {READERS[file_type(p)] for p in paths}
    if len(types) > 1:
        raise SpecError(field, f"{path!r} mixes file types {sorted(types)}; point it at one kind")
    return Files(fs, paths, field=field)


def hub_dataset_dir(path: str, field: str = "data.path") -> str:
    """``hf://datasets/org/name[@revision][/sub/path]`` -> that path inside the repo's local snapshot."""
    from ray_jobs.model_cache import hub_snapshot

    parts = path[len(HUB_PREFIX) :].split("/")
    if len(parts) < 2 or not all(parts[:2]):
        raise SpecError(field, f"{path!r}: a hub dataset is hf://datasets/org/name (optionally @revision and a path inside)")
    name, _, revision = parts[1].partition("@")
    snapshot, _ = hub_snapshot(f"{parts[0]}/{name}", revision or None, "dataset", field)
    return str(Path(snapshot, *parts[2:]))


def peek_columns(files: Files) -> list[str]:
    """Column names of the first row of the first file."""
    first = files.paths[0]
    if files.reader == "parquet":
        import pyarrow.parquet as pq

        return list(pq.read_schema(first, filesystem=files.fs).names)
    with files.fs.open_input_stream(first, compression="detect") as stream:
        head = stream.read(1 << 20).decode("utf-8", errors="replace").lstrip()
    if files.reader == "csv":
        import csv

        return next(csv.reader([head.splitlines()[0]])) if head else []
    try:
        row = json.loads(head.splitlines()[0]) if not head.startswith("[") else _first_of_array(files, first)
    except (ValueError, IndexError) as exc:
        raise SpecError(files.field, f"{first!r}: the first row is not valid JSON ({exc})") from None
    if not isinstance(row, dict):
        raise SpecError(files.field, f"{first!r}: rows must be JSON objects, got {type(row).__name__}")
    return list(row)


@dataclass(frozen=True)
class Piece:
    """One reading task's share of the data: a whole file, or the lines that start in ``[start, end)`` of one."""

    path: str
    file: int
    """The file's index in the sorted listing."""
    piece: int = 0
    """This range's index within its file (0: the file's start, or the whole file)."""
    start: int = 0
    end: int = -1
    """Byte offset the range stops at (``-1``: the file's end)."""
    row_groups: tuple[int, int] | None = None
    """A Parquet file's row groups ``[first, end)`` (``None``: all of them). Its rows are numbered from the
    file's first, so a Parquet piece needs no help from the ledger to place a bad row."""


def pieces_of(files: Files, piece_bytes: int | None = None) -> list[Piece]:
    """Every file as one piece, but uncompressed JSONL files over ``piece_bytes`` (:data:`PIECE_BYTES`), cut
    into even byte ranges, and Parquet files over it, cut into runs of whole row groups (read from each
    such file's footer: one small read)."""
    piece_bytes = piece_bytes or PIECE_BYTES
    out = []
    for local, path in enumerate(files.paths):
        size, index = files.sizes[local] if files.sizes else 0, files.first_index + local
        if size <= piece_bytes or not path.lower().endswith((".jsonl", ".parquet")):
            out.append(Piece(path, index))
            continue
        count = -(-size // piece_bytes)
        if path.lower().endswith(".jsonl"):
            out.extend(Piece(path, index, k, k * size // count, (k + 1) * size // count) for k in range(count))
            continue
        import pyarrow.parquet as pq

        groups = pq.read_metadata(path, filesystem=files.fs).num_row_groups
        count = max(min(count, groups), 1)
        cuts = [k * groups // count for k in range(count + 1)]
        out.extend(Piece(path, index, row_groups=(a, b)) for a, b in zip(cuts, cuts[1:]))
    return out


def read_records(files: Files, path: str, ledger: Any = None, piece_bytes: int | None = None) -> ray.data.Dataset:
    """One row per record, unparsed, with where it came from: ``{"source", "file", "piece", "line", "record"}``.

    ``record`` is the JSON text of the row (a JSONL line as written; CSV and Parquet rows are
    re-encoded), parsed by the tokenizer actors so that a bad line is counted there, not fatal here.
    Text, not the Parquet file's own columns, because every block then has one schema, whatever the
    format of ``data.path`` and of ``data.val_path`` and whatever columns each Parquet file adds: the
    blocks of both sets are re-cut together into the tokenizers' batches. The round trip is cheap beside
    the tokenizer: parsing was 0.9% of a 32k-BPE actor's time (cProfile, 5,120 chat rows).
    ``line`` is the 1-based line of a JSONL file within its ``piece`` (:func:`pieces_of`), or the row number
    of the other file types; ``file`` is the file's index in the sorted listing, so that "the first bad row"
    means first in the data. A task that read a piece tells ``ledger`` (``ray_jobs.quality.RowLedger``) how
    many lines it held, which turns a piece's line into the file's line. ``files``: ``path``'s listing, made
    once by the driver (``ray_jobs.preflight``).
    """
    import ray.data

    pieces = pieces_of(files, piece_bytes)
    listing = ray.data.from_items([dataclasses.asdict(p) for p in pieces], override_num_blocks=len(pieces))
    # This dataset's own context (a copy of the driver's), shared by every stage built on it: the fill's.
    listing.context.target_max_block_size = BLOCK_BYTES
    return listing.map_batches(
        read_pieces,
        batch_size=1,
        batch_format="pyarrow",
        num_cpus=HELPER_CPUS,
        fn_kwargs={
            "fs": files.fs,
            "reader": files.reader,
            "scheme": "s3://" if path.startswith("s3://") else "",
            "ledger": ledger,
        },
    )


def read_pieces(batch: Any, fs: Any, reader: str, scheme: str = "", ledger: Any = None) -> Iterator[dict[str, list[Any]]]:
    """Ray Data UDF: the records of each piece in ``batch`` (a table of :class:`Piece` rows), in blocks. Tells
    ``ledger`` how long its own work took (not the waits for the next stage to take a block)."""
    import ray

    busy, since = 0.0, time.perf_counter()
    told = ledger is None  # whether the ledger knows when this task first handed on rows (or there is none)
    if not told:  # when reading began and first handed on rows: the fill's start (not waited for)
        ledger.reading.remote(time.time(), handed_on=False)
    for row in batch.to_pylist():
        piece = Piece(**row)
        lines = 0
        for block, count in _piece_blocks(fs, piece, reader, scheme):
            lines = count
            if block is None:
                continue
            busy += time.perf_counter() - since
            if not told:
                ledger.reading.remote(time.time(), handed_on=True)
                told = True
            yield block
            since = time.perf_counter()
        if ledger is not None and piece.end >= 0:  # a range: the ledger turns its lines into the file's
            ray.get(ledger.add_lines.remote(piece.file, piece.piece, lines, piece.start))
    if ledger is not None:
        ray.get(ledger.add_busy.remote(StageSeconds(read=busy + time.perf_counter() - since)))


def _piece_blocks(fs: Any, piece: Piece, reader: str, scheme: str) -> Iterator[tuple[dict[str, list[Any]] | None, int]]:
    """``(block, lines read so far)`` of one piece, then ``(None, lines)``: an empty piece has no block, but
    its lines still count."""
    if file_type(piece.path) == ".parquet":
        yield from _parquet_blocks(fs, piece, scheme)
        return
    if file_type(piece.path) != ".jsonl":  # whole-file formats: CSV, JSON (an array, or lines)
        with fs.open_input_stream(piece.path, compression="detect") as stream:
            records = split_records({"path": piece.path, "bytes": stream.read()}, reader, scheme, {piece.path: piece.file})
        for i in range(0, len(records), RECORDS_PER_BLOCK):
            yield _columns([{"piece": 0, **r} for r in records[i : i + RECORDS_PER_BLOCK]]), len(records)
        yield None, len(records)
        return
    lines = 0
    block: list[dict[str, Any]] = []
    for lines, text in enumerate(_lines(fs, piece), start=1):
        if text.strip():
            block.append({"source": scheme + piece.path, "file": piece.file, "piece": piece.piece, "line": lines, "record": text})
        if len(block) >= RECORDS_PER_BLOCK:
            yield _columns(block), lines
            block = []
    if block:
        yield _columns(block), lines
    yield None, lines


def _parquet_blocks(fs: Any, piece: Piece, scheme: str) -> Iterator[tuple[dict[str, list[Any]] | None, int]]:
    """A Parquet piece's rows, streamed by row group in blocks of :data:`RECORDS_PER_BLOCK` (never the whole
    file in memory), each numbered from the file's first row. Each row is re-encoded as JSON text like the
    other formats' records (``read_records`` says why the records are text)."""
    import pyarrow.parquet as pq

    with fs.open_input_file(piece.path) as f:
        parquet = pq.ParquetFile(f)
        first, end = piece.row_groups or (0, parquet.num_row_groups)
        row = sum(parquet.metadata.row_group(g).num_rows for g in range(first))
        for batch in parquet.iter_batches(batch_size=RECORDS_PER_BLOCK, row_groups=range(first, end)):
            records = [json.dumps(r, default=str) for r in batch.to_pylist()]
            lines = range(row + 1, row + 1 + len(records))
            source = scheme + piece.path
            block = [{"source": source, "file": piece.file, "piece": 0, "line": n, "record": r} for n, r in zip(lines, records)]
            row += len(records)
            yield _columns(block), row
    yield None, row


def _lines(fs: Any, piece: Piece) -> Iterator[str]:
    """The lines of ``piece``: all of a file's, or those that start in ``[start, end)`` (the last one read to
    its end past ``end``; the line cut at ``start`` belongs to the piece before)."""
    import io

    if piece.end < 0:  # whole file, compressed or not: streamed
        with fs.open_input_stream(piece.path, compression="detect", buffer_size=READ_BUFFER_BYTES) as stream:
            for line in io.TextIOWrapper(stream, encoding="utf-8", errors="replace", newline="\n"):
                yield line.rstrip("\n").rstrip("\r")
        return
    with fs.open_input_file(piece.path) as f:
        begin = max(piece.start - 1, 0)  # the byte before the range says whether a line starts at its first byte
        f.seek(begin)
        data = f.read(piece.end - begin)
        if piece.start > 0:
            cut = data.find(b"\n")
            data = data[cut + 1 :] if cut >= 0 else b""
        if not data:
            return
        while not data.endswith(b"\n"):  # the range's last line runs on past its end
            more = f.read(1 << 16)
            if not more:
                break
            newline = more.find(b"\n")
            data += more if newline < 0 else more[: newline + 1]
            if newline >= 0:
                break
    for line in data.decode("utf-8", errors="replace").split("\n")[: -1 if data.endswith(b"\n") else None]:
        yield line.rstrip("\r")


def _columns(rows: list[dict[str, Any]]) -> dict[str, list[Any]]:
    return {key: [r[key] for r in rows] for key in ("source", "file", "piece", "line", "record")}


def split_records(
    file: dict[str, Any], reader: str, scheme: str = "", order: dict[str, int] | None = None
) -> list[dict[str, Any]]:
    """A file's bytes (a ``read_binary_files`` row) -> its records. ``order`` maps each path to its index in
    the listing (absent: 0)."""
    source, data = scheme + file["path"], file["bytes"]
    index = (order or {}).get(file["path"], 0)
    if reader == "json":
        text = data.decode("utf-8", errors="replace")
        if text.lstrip().startswith("["):
            try:
                rows = json.loads(text)
            except ValueError:
                return [{"source": source, "file": index, "line": 1, "record": text[:200]}]  # counted as unparsable
            return [{"source": source, "file": index, "line": i + 1, "record": json.dumps(r)} for i, r in enumerate(rows)]
        lines = enumerate(text.splitlines())
        return [{"source": source, "file": index, "line": i + 1, "record": line} for i, line in lines if line.strip()]
    import io

    if reader == "csv":
        import pyarrow as pa
        import pyarrow.csv as pacsv

        table = pacsv.read_csv(io.BytesIO(data))  # every column as text: "42" is an answer, not a number
        table = table.cast(pa.schema([(name, pa.string()) for name in table.column_names]))
    else:
        import pyarrow.parquet as pq

        table = pq.read_table(io.BytesIO(data))
    rows = enumerate(table.to_pylist())
    return [{"source": source, "file": index, "line": i + 1, "record": json.dumps(row, default=str)} for i, row in rows]


def _first_of_array(files: Files, path: str) -> Any:
    with files.fs.open_input_stream(path, compression="detect") as stream:
        return json.loads(stream.read())[0]


def _is_glob(path: str) -> bool:
    return any(c in path for c in "*?[")
