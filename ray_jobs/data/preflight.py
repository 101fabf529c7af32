"""Checks that run before any cluster starts, so bad input costs a second, not a minute, and what they
find about the data, kept for the rest of the job.

Each failure is a :class:`~rayft_contract.spec.SpecError`: one line naming the field and the fix.
:func:`check` lists the data once and reads its first row once; everything after it (the cache key,
the fill, the bytes-read count) takes the :class:`DataInputs` it returns. Before, one ``rayft train``
listed the data path 7 times and read its first file 3 times, each a LIST or GET on S3.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

from ray_jobs.cache import model_files
from ray_jobs.data.pipeline import resolve_format
from ray_jobs.data.sources import Files, data_files
from rayft_contract.spec import FineTuneSpec, SpecError


@dataclasses.dataclass(frozen=True)
class DataInputs:
    """What ``data.path`` names (and ``data.val_path``, in ``val``), looked up once on the driver."""

    files: Files
    format: str
    """The spec's format, or the one detected from the first row."""
    identity: tuple[tuple[str, int, int], ...]
    """``(path, size, mtime_ns)`` of every file: what the dataset cache keys on, and what a read downloads."""
    val: DataInputs | None = None
    """``data.val_path``'s files and format, when it is set (its files indexed after these)."""

    @property
    def bytes(self) -> int:
        return sum(size for _, size, _ in self.identity) + (self.val.bytes if self.val else 0)


def check(spec: FineTuneSpec) -> DataInputs:
    """Validate what the spec points at; return the data's files and format."""
    check_model(spec.model.path)
    model_files.check(spec)
    return data_inputs(spec)


def data_inputs(spec: FineTuneSpec) -> DataInputs:
    train = _inputs(spec, data_files(spec.data.path))
    if not spec.data.val_path:
        return train
    val_files = dataclasses.replace(data_files(spec.data.val_path, "data.val_path"), first_index=len(train.files.paths))
    return dataclasses.replace(train, val=_inputs(spec, val_files))


def _inputs(spec: FineTuneSpec, files: Files) -> DataInputs:
    identity = tuple(files.identity())
    files = dataclasses.replace(files, sizes=tuple(size for _, size, _ in identity))  # what cuts large files into pieces
    return DataInputs(files, resolve_format(spec.data, files), identity)


def check_model(path: str) -> None:
    if path.startswith("s3://"):
        from ray_jobs.storage import location

        try:
            found = location(path).child("config.json").exists()
        except OSError as exc:
            raise SpecError("model.path", f"cannot read {path!r}: {exc}") from None
        if not found:
            raise SpecError("model.path", f"{path!r} has no config.json; point it at a Hugging Face model saved to S3")
        return
    if "://" in path:
        raise SpecError("model.path", f"{path!r}: unsupported scheme; use a local directory, s3://bucket/prefix or a hub id")
    p = Path(path).expanduser()
    if p.is_dir():
        if not (p / "config.json").is_file():
            raise SpecError("model.path", f"{path!r} has no config.json; point it at a Hugging Face model directory")
        return
    if p.exists():
        raise SpecError("model.path", f"{path!r} is a file; point it at a model directory or a hub id")
    looks_local = path.startswith(("/", ".", "~")) or path.count("/") != 1
    if looks_local:
        raise SpecError("model.path", f"model directory {path!r} does not exist; check the path (or give a hub id org/name)")
    if os.environ.get("HF_HUB_OFFLINE", "0") not in ("", "0"):
        from huggingface_hub import try_to_load_from_cache

        if not isinstance(try_to_load_from_cache(path, "config.json"), str):
            raise SpecError("model.path", f"hub model {path!r} is not in the local hub cache and HF_HUB_OFFLINE is set")
