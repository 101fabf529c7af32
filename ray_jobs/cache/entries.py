"""Cache entries shared by the dataset and model caches: atomic fill, hit log, listing and pruning.

A cache root (a local directory or an ``s3://`` prefix) holds one directory per entry, named by
its content key::

    {root}/{kind}/{key}/
        entry.json        the manifest, written last: its presence means the entry is complete
        data-{uuid}/      the payload the manifest names (Parquet shards, model files)
        hits/{ns}-{uuid}  one empty file per reuse (for "last use" and "hits")

Filling writes a fresh ``data-{uuid}`` payload, then commits by creating ``entry.json``. Locally
the manifest is linked into place, which fails if another job committed first: that job's
payload wins and the loser deletes its own. On S3 a single PUT is atomic, so readers never see a
half-written entry; two racing fills are both complete and the last manifest wins. Payloads no
manifest names are removed by ``prune``.
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
import uuid
from pathlib import Path
from typing import Any

from ray_jobs.storage import Location, location

KINDS = ("datasets", "models")
ORPHAN_AGE_S = 3600.0
"""Payloads no manifest names are pruned once this old (a fill may still be writing a younger one)."""


def default_root() -> str:
    """``$RAYFT_CACHE_DIR``, else ``~/.cache/rayft``."""
    return os.environ.get("RAYFT_CACHE_DIR") or str(Path("~/.cache/rayft").expanduser())


def entry(root: str, kind: str, key: str) -> Location:
    return location(root).child(kind).child(key)


def manifest(loc: Location) -> dict[str, Any] | None:
    """The committed manifest of an entry, or None while it is missing or being filled."""
    try:
        with loc.fs.open_input_stream(loc.child("entry.json").path) as stream:
            return json.loads(stream.read())
    except (FileNotFoundError, OSError, ValueError):
        return None


def new_payload(loc: Location) -> Location:
    payload = loc.child(f"data-{uuid.uuid4().hex[:12]}")
    payload.fs.create_dir(payload.path, recursive=True)
    return payload


def commit(loc: Location, payload: Location, meta: dict[str, Any]) -> dict[str, Any]:
    """Publish ``payload`` as the entry; return the manifest that won (ours, or a racing fill's)."""
    body = {**meta, "payload": payload.path.rsplit("/", 1)[-1], "created": time.time()}
    if loc.is_local:
        tmp = Path(payload.path) / "entry.json"
        tmp.write_text(json.dumps(body, indent=2))
        try:
            os.link(tmp, Path(loc.path) / "entry.json")  # atomic, and fails if another fill committed
        except FileExistsError:
            payload.delete()
            winner = manifest(loc)
            assert winner is not None
            return winner
        return body
    loc.child("entry.json").write_text(json.dumps(body, indent=2))
    return body


def payload_of(loc: Location, meta: dict[str, Any]) -> Location:
    return loc.child(meta["payload"])


def record_hit(loc: Location) -> None:
    loc.child("hits").child(f"{time.time_ns()}-{uuid.uuid4().hex[:6]}").write_text("")


@dataclasses.dataclass(frozen=True)
class EntryInfo:
    kind: str
    key: str
    uri: str
    size_bytes: int
    created: float
    last_used: float
    hits: int
    complete: bool
    description: str


def list_entries(root: str | None = None) -> list[EntryInfo]:
    """Every entry under ``root`` (default :func:`default_root`), most recently used first."""
    import pyarrow.fs as pafs

    base = location(root or default_root())
    entries = []
    for kind in KINDS:
        kind_dir = base.child(kind)
        if not kind_dir.exists():
            continue
        for info in kind_dir.fs.get_file_info(pafs.FileSelector(kind_dir.path)):
            if info.type != pafs.FileType.Directory:
                continue
            loc = kind_dir.child(info.base_name)
            files = [f for f in loc.fs.get_file_info(pafs.FileSelector(loc.path, recursive=True)) if f.type == pafs.FileType.File]
            meta = manifest(loc)
            hits = [f for f in files if "/hits/" in f.path]
            stamped = hits if meta else files  # a fill in progress is as recent as its newest file
            stamps = [f.mtime.timestamp() for f in stamped if f.mtime] + ([meta["created"]] if meta else [])
            entries.append(
                EntryInfo(
                    kind=kind,
                    key=info.base_name,
                    uri=loc.uri,
                    size_bytes=sum(f.size for f in files),
                    created=meta["created"] if meta else 0.0,
                    last_used=max(stamps, default=0.0),
                    hits=len(hits),
                    complete=meta is not None,
                    description=(meta or {}).get("description", "(being filled, or abandoned)"),
                )
            )
    return sorted(entries, key=lambda e: -e.last_used)


def prune(max_bytes: int, root: str | None = None, dry_run: bool = False) -> list[EntryInfo]:
    """Delete least-recently-used entries until the cache holds at most ``max_bytes``; return them.

    Abandoned fills (no manifest, older than ``ORPHAN_AGE_S``) go first, whatever the size.
    """
    entries = list_entries(root)
    now = time.time()
    removed = []
    for e in entries:
        if not e.complete and _age(e, now) > ORPHAN_AGE_S:
            removed.append(e)
    total = sum(e.size_bytes for e in entries if e not in removed)
    for e in reversed(entries):  # least recently used first
        if total <= max_bytes:
            break
        if e in removed or not e.complete:
            continue
        removed.append(e)
        total -= e.size_bytes
    if not dry_run:
        for e in removed:
            location(e.uri).delete()
    return removed


def _age(e: EntryInfo, now: float) -> float:
    return now - max(e.last_used, e.created)
