"""Checks that run before any cluster starts, so bad input costs a second, not a minute.

Each failure is a :class:`~rayft_contract.spec.SpecError`: one line naming the field and the fix.
"""

from __future__ import annotations

import os
from pathlib import Path

from ray_jobs.data import resolve_format
from ray_jobs.sources import data_files
from rayft_contract.spec import FineTuneSpec, SpecError


def check(spec: FineTuneSpec) -> str:
    """Validate what the spec points at; return the dataset format (detected if ``auto``)."""
    check_model(spec.model.path)
    data_files(spec.data.path)
    return resolve_format(spec.data)


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
