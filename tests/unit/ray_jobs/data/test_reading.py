"""How a fill reads a file, without Ray: a large JSONL file cut into byte ranges and a Parquet file into runs of row
groups, every row once at its own line (ray_jobs.data.reading)."""

from __future__ import annotations

import json

import pytest

from ray_jobs.data.reading import _lines, _piece_blocks, pieces_of
from ray_jobs.data.sources import Files


@pytest.mark.parametrize("piece_bytes", [1, 7, 64, 333, 4096, 10**9])
def test_a_jsonl_file_cut_into_pieces_yields_every_line_once_in_order(tmp_path, piece_bytes):
    """Each piece holds the lines that start in its byte range; the one cut at its start is the previous piece's."""
    import random

    import pyarrow.fs as pafs

    rng = random.Random(0)
    lines = ["" if rng.random() < 0.05 else "x" * rng.randint(0, 300) + json.dumps({"i": i}) for i in range(200)]
    lines[-1] = '{"last": true}'
    path = tmp_path / "big.jsonl"
    path.write_text("\r\n".join(lines[:20]) + "\r\n" + "\n".join(lines[20:]))  # Windows line ends too, no final newline
    files = Files(pafs.LocalFileSystem(), [str(path)], (path.stat().st_size,))
    pieces = pieces_of(files, piece_bytes)
    assert len(pieces) == (1 if piece_bytes >= path.stat().st_size else -(-path.stat().st_size // piece_bytes))
    read = [line for piece in pieces for line in _lines(files.fs, piece)]
    assert read == lines


def test_of_the_line_formats_only_uncompressed_jsonl_is_cut(tmp_path):
    import pyarrow.fs as pafs

    names = ["a.jsonl", "a.jsonl.gz", "a.json", "a.csv"]
    files = Files(pafs.LocalFileSystem(), [str(tmp_path / n) for n in names], (10_000,) * len(names))
    assert [p.path.rsplit("/", 1)[-1] for p in pieces_of(files, 1_000) if p.piece == 1] == ["a.jsonl"]


@pytest.mark.parametrize("piece_bytes", [1, 2_000, 10**9])
def test_a_parquet_file_is_read_by_row_group_with_every_row_once_at_its_own_row_number(tmp_path, piece_bytes):
    """A Parquet file over the piece size is cut into runs of whole row groups, one reading task each; rows are
    numbered from the file's first, so a bad row in the third run is still located at its own row."""
    import pyarrow as pa
    import pyarrow.fs as pafs
    import pyarrow.parquet as pq

    rows = [{"text": f"row {i} " + "x" * (i % 50)} for i in range(1_000)]
    path = tmp_path / "big.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path, row_group_size=64)  # 16 row groups
    files = Files(pafs.LocalFileSystem(), [str(path)], (path.stat().st_size,))
    pieces = pieces_of(files, piece_bytes)
    assert len(pieces) == min(16, -(-path.stat().st_size // piece_bytes))
    read = [
        (line, json.loads(record))
        for piece in pieces
        for block, _ in _piece_blocks(files.fs, piece, "parquet", "")
        if block is not None
        for line, record in zip(block["line"], block["record"])
    ]
    assert read == [(i + 1, row) for i, row in enumerate(rows)]
