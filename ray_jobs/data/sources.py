"""Where training rows come from: local files, directories and globs, an ``s3://`` prefix, or a hub dataset.

File types: JSONL/JSON, CSV and Parquet, each optionally compressed (``.gz``, ``.zst``, ``.bz2``,
``.lz4``, ``.br``; detected from the name). S3 settings come from the ``AWS_*`` environment (see
``ray_jobs.storage``), so AWS, MinIO and any S3-compatible store work the same way. This module lists the
files (:func:`data_files`); ``ray_jobs.data.reading`` reads them in parallel in Ray Data tasks. :func:`peek_columns`
reads only the first row, without Ray, so a wrong path or layout fails before any cluster starts.
"""

from __future__ import annotations

import fnmatch
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rayft_contract.spec import SpecError

READERS = {".jsonl": "json", ".json": "json", ".csv": "csv", ".parquet": "parquet"}
"""File suffix -> Ray Data reader."""
COMPRESSIONS = (".gz", ".zst", ".bz2", ".lz4", ".br")
HUB_PREFIX = "hf://datasets/"
"""Hugging Face hub datasets, read from the hub's cache (downloaded into it once; ``HF_HUB_OFFLINE=1`` works)."""


@dataclass(frozen=True)
class Files:
    """The data files a ``data.path`` names, on one pyarrow filesystem."""

    fs: Any
    paths: list[str]
    sizes: tuple[int, ...] | None = None
    """Each file's size in bytes, once listed (``ray_jobs.data.preflight.data_inputs``): what cuts large files into
    pieces. ``None``: every file is read by one task."""
    field: str = "data.path"
    """The spec field that names these files (``data.val_path`` for a validation set), for errors."""
    first_index: int = 0
    """The first file's index among all the job's files: a validation set's files come after the training
    files, so that every bad row has its own file index (``ray_jobs.data.quality``)."""

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
    from ray_jobs.cache.models import hub_snapshot

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


def _first_of_array(files: Files, path: str) -> Any:
    with files.fs.open_input_stream(path, compression="detect") as stream:
        return json.loads(stream.read())[0]


def _is_glob(path: str) -> bool:
    return any(c in path for c in "*?[")
