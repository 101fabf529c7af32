"""How a fill reads its files: each file cut into pieces (:func:`pieces_of`), each piece read by a Ray Data task
(:func:`read_records`) into blocks of records, unparsed, with where each came from.

The listing (``ray_jobs.data.sources``) says which files; this module says how their rows reach the tokenizers:
uncompressed JSONL by byte ranges and Parquet by runs of row groups, so one large file keeps several tasks busy;
compressed files streamed, in bounded blocks; each task telling the job's ledger what it read and when.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ray_jobs.data.quality import StageSeconds
from ray_jobs.data.sources import Files, file_type

if TYPE_CHECKING:
    import ray.data

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


def read_records(
    files: Files, path: str, ledger: Any = None, at_once: int | None = None, delay_s: float = 0.0
) -> ray.data.Dataset:
    """One row per record, unparsed, with where it came from: ``{"source", "file", "piece", "line", "record"}``.

    ``record`` is the JSON text of the row (a JSONL line as written; CSV and Parquet rows are
    re-encoded), parsed by the tokenizer actors so that a bad line is counted there, not fatal here.
    Text, not the Parquet file's own columns, because every block then has one schema, whatever the
    format of ``data.path`` and of ``data.val_path`` and whatever columns each Parquet file adds: the
    blocks of both sets are re-cut together into the tokenizers' batches. The round trip is cheap beside
    the tokenizer: parsing was 0.9% of a 32k-BPE actor's time (cProfile, 5,120 chat rows).
    ``line`` is the 1-based line of a JSONL file within its ``piece`` (:func:`pieces_of`), or the row number
    of the other file types; ``file`` is the file's index in the sorted listing, so that "the first bad row"
    means first in the data. A task that read a piece tells ``ledger`` (``ray_jobs.data.quality.RowLedger``) how
    many lines it held, which turns a piece's line into the file's line. ``files``: ``path``'s listing, made
    once by the driver (``ray_jobs.data.preflight``). ``at_once``: reading tasks at most at once (``None``: as many as
    fit). ``delay_s``: a sleep per piece, a slow store (``Chaos.read_delay_s``).
    """
    import ray.data

    pieces = pieces_of(files)
    listing = ray.data.from_items([dataclasses.asdict(p) for p in pieces], override_num_blocks=len(pieces))
    # This dataset's own context (a copy of the driver's), shared by every stage built on it: the fill's.
    listing.context.target_max_block_size = BLOCK_BYTES
    return listing.map_batches(
        read_pieces,
        batch_size=1,
        batch_format="pyarrow",
        num_cpus=HELPER_CPUS,
        concurrency=min(at_once, len(pieces)) if at_once else None,  # no more than the pieces: Ray Data warns
        fn_kwargs={
            "fs": files.fs,
            "reader": files.reader,
            "scheme": "s3://" if path.startswith("s3://") else "",
            "ledger": ledger,
            "delay_s": delay_s,
        },
    )


def read_pieces(
    batch: Any, fs: Any, reader: str, scheme: str = "", ledger: Any = None, delay_s: float = 0.0
) -> Iterator[dict[str, list[Any]]]:
    """Ray Data UDF: the records of each piece in ``batch`` (a table of :class:`Piece` rows), in blocks. Tells
    ``ledger`` how long its own work took (not the waits for the next stage to take a block), and when it ran."""
    import ray

    began, busy, since = time.time(), 0.0, time.perf_counter()
    told = ledger is None  # whether the ledger knows when this task first handed on rows (or there is none)
    if not told:  # when reading began and first handed on rows: the fill's start (not waited for)
        ledger.reading.remote(began, handed_on=False)
    for row in batch.to_pylist():
        piece = Piece(**row)
        time.sleep(delay_s)
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
        ray.get(ledger.add_busy.remote(StageSeconds(read=busy + time.perf_counter() - since), (began, time.time())))


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
