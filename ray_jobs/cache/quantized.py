"""The quantized base kept in the node's model cache (``quantization.cache``): a later job's load is a read.

Loading a 7B base in NF4 reads the bf16 checkpoint (13.5 GB) and quantizes it on the GPU: 14.4 s of a warm start on an
H200 (``bench/RESULTS.md``). The quantized base is 3.9 GB. The first job on a node saves it with transformers'
own 4-bit serialization (safetensors, the quantization config in ``config.json``) into a cache entry; later jobs
with the same base and the same quantization load that, already quantized.

The entry's key covers what the quantized weights depend on: every file of the base (name, size and modification
time, so a checkpoint rewritten in place is a new entry), the quantization settings, the storage dtype, and the
versions of transformers and bitsandbytes. It lives under ``$RAYFT_CACHE_DIR/models`` beside the fetched bases, so
``rayft cache list`` and ``prune`` see it. Only rayft's own job code writes it, and it is read as safetensors:
nothing in it is unpickled or run. A round trip gives the quantized model exactly: every tensor of its state
dict and its logits are equal (``tests/unit/ray_jobs/cache/test_quantized.py``).

Where it does not apply, a load quantizes as before: a cache root in S3 (the entry must be on the node's disk),
bases not in NF4, and FSDP, whose 4-bit weights are stored in the compute dtype to be sharded.
"""

from __future__ import annotations

import hashlib
import json
import logging
from importlib.metadata import version
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ray_jobs.cache import entries

if TYPE_CHECKING:
    import torch

    from ray_jobs.storage import Location

log = logging.getLogger(__name__)

KIND = "models"


def key(model_dir: str, settings: dict[str, Any]) -> str:
    """The entry's key: the base's files (name, size, mtime), ``settings`` and the libraries that wrote it."""
    base = Path(model_dir)
    files = sorted((str(p.relative_to(base)), p.stat().st_size, p.stat().st_mtime_ns) for p in base.rglob("*") if p.is_file())
    libraries = {name: version(name) for name in ("transformers", "bitsandbytes")}
    blob = json.dumps({"files": files, "settings": settings, "libraries": libraries}, sort_keys=True)
    return "nf4-" + hashlib.sha256(blob.encode()).hexdigest()[:24]


def _entry(model_dir: str, settings: dict[str, Any], root: str | None) -> Location | None:
    """The cache entry of this base and settings, or ``None`` where the cache root is not on this node's disk."""
    entry = entries.entry(root or entries.default_root(), KIND, key(model_dir, settings))
    return entry if entry.is_local else None


def lookup(model_dir: str, settings: dict[str, Any], root: str | None = None) -> str | None:
    """The local directory of the quantized base, or ``None`` (not kept yet, or the cache root is not local)."""
    entry = _entry(model_dir, settings, root)
    meta = entries.manifest(entry) if entry is not None else None
    if entry is None or meta is None:
        return None
    entries.record_hit(entry)  # its last use, which `rayft cache prune` keeps the most recent by
    return entries.payload_of(entry, meta).path


def store(model: torch.nn.Module, model_dir: str, settings: dict[str, Any], root: str | None = None) -> str | None:
    """Save the just-quantized ``model`` as the entry (before LoRA wraps it); the directory that won, or ``None``
    where the cache root is not local. Two workers of one node storing at once both succeed; one payload stays."""
    entry = _entry(model_dir, settings, root)
    if entry is None:
        return None
    entry.fs.create_dir(entry.path, recursive=True)
    payload = entries.new_payload(entry)
    try:
        model.save_pretrained(payload.path, safe_serialization=True)
    except OSError as exc:  # a full disk costs the next job its read, not this job its run
        log.warning("the quantized base was not kept in %s: %s", entry.uri, exc)
        payload.delete()
        return None
    size = sum(p.stat().st_size for p in Path(payload.path).rglob("*") if p.is_file())
    meta = entries.commit(entry, payload, {"description": f"quantized base of {model_dir} ({settings})", "bytes": size})
    return entries.payload_of(entry, meta).path
