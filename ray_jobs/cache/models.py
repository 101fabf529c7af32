"""Base models on local disk, fetched once per node: local directories, ``s3://`` prefixes, hub ids.

* A local directory is used where it is.
* An ``s3://`` prefix is downloaded once into the node's cache (``$RAYFT_CACHE_DIR/models``), all
  files in parallel, each verified by size, then published atomically (``ray_jobs.cache.entries``). The
  entry's key covers the URI and every file's size and modification time, so a re-uploaded model
  is a new entry. A file lock makes the workers of one node wait for a single download.
* A hub id goes through the Hugging Face hub's own cache (``HF_HOME``); with ``HF_HUB_OFFLINE=1`` it
  must already be there. Datasets on the hub (``hf://datasets/org/name``, ``ray_jobs.data.sources``) use the
  same :func:`hub_snapshot`.

The driver, every tokenizer actor and every training worker call :func:`fetch_model`; the first
on a node downloads, the rest hit. Only the driver's call counts as the job's hit (``count_hit``), so
``rayft cache list`` counts jobs, not processes.
"""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path

from ray_jobs.cache import entries
from rayft_contract.data_records import Fetched
from rayft_contract.spec import SpecError

__all__ = ["Fetched", "fetch_model", "hub_snapshot"]


def fetch_model(
    path: str, revision: str | None = None, root: str | None = None, *, count_hit: bool = True, field: str = "model.path"
) -> Fetched:
    """A local directory holding the model at ``path`` (downloading it into the cache if needed).

    ``count_hit=False`` for the job's other processes (tokenizer actors, training workers): the driver's
    call already counted the job's hit. ``field``: what an error names (``rayft merge`` names the adapter's base)."""
    start = time.perf_counter()
    if path.startswith("s3://"):
        return _from_s3(path, root or entries.default_root(), start, count_hit, field)
    if Path(path).expanduser().is_dir():
        local = Path(path).expanduser()
        return Fetched(str(local), "local", identity=_files_identity(local))
    return _from_hub(path, revision, start, field)


def _from_s3(uri: str, root: str, start: float, count_hit: bool, field: str) -> Fetched:
    import pyarrow.fs as pafs
    from filelock import FileLock

    from ray_jobs.storage import location

    src = location(uri)
    files = [f for f in src.fs.get_file_info(pafs.FileSelector(src.path, recursive=True)) if f.type == pafs.FileType.File]
    if not any(f.path.endswith("/config.json") for f in files):
        raise SpecError(field, f"{uri!r} holds no config.json; point it at a Hugging Face model saved to S3")
    listing = sorted((f.path[len(src.path) + 1 :], f.size, f.mtime_ns) for f in files)
    key = hashlib.sha256(json.dumps([uri, listing]).encode()).hexdigest()[:24]
    entry = entries.entry(root, "models", key)
    if (meta := entries.manifest(entry)) is None:
        entry.fs.create_dir(entry.path, recursive=True)
        with FileLock(entry.path + ".lock"):  # one download per node; the others wait, then hit
            if (meta := entries.manifest(entry)) is None:
                payload = entries.new_payload(entry)
                pafs.copy_files(
                    src.path, payload.path, source_filesystem=src.fs, destination_filesystem=entry.fs, use_threads=True
                )
                _verify_sizes(payload.path, listing)
                size = sum(s for _, s, _ in listing)
                entries.commit(entry, payload, {"description": f"model {uri}", "bytes": size, "files": len(listing)})
                return Fetched(payload.path, "download", size, time.perf_counter() - start, _files_identity(Path(payload.path)))
    if count_hit:
        entries.record_hit(entry)
    local = entries.payload_of(entry, meta).path
    return Fetched(local, "cache", 0, time.perf_counter() - start, _files_identity(Path(local)))


def _verify_sizes(directory: str, listing: list[tuple[str, int, int]]) -> None:
    for rel, size, _ in listing:
        got = Path(directory, rel).stat().st_size if Path(directory, rel).is_file() else -1
        if got != size:
            raise OSError(f"downloaded {rel} has {got} bytes, expected {size}; the model changed during download?")


def _from_hub(repo_id: str, revision: str | None, start: float, field: str) -> Fetched:
    local, downloaded = hub_snapshot(repo_id, revision, "model", field)
    commit = f"hub commit {Path(local).name}"  # the hub cache keeps each snapshot under its commit hash
    if not downloaded:
        return Fetched(local, "hub-cache", 0, time.perf_counter() - start, commit)
    size = sum(f.stat().st_size for f in Path(local).rglob("*") if f.is_file())
    return Fetched(local, "hub", size, time.perf_counter() - start, commit)


def _files_identity(directory: Path) -> str:
    digest = hashlib.sha256()
    for f in sorted(p for p in directory.rglob("*") if p.is_file()):
        digest.update(f"{f.relative_to(directory)}\0{f.stat().st_size}\0".encode())
    config = directory / "config.json"
    if config.is_file():
        digest.update(config.read_bytes())
    return f"files sha256:{digest.hexdigest()[:32]}"


def hub_snapshot(repo_id: str, revision: str | None, repo_type: str, field: str) -> tuple[str, bool]:
    """A hub repo's local snapshot from the hub cache, downloading it only if it is not there.

    Returns ``(directory, downloaded)``. With ``HF_HUB_OFFLINE=1`` a repo missing from the cache is an error
    naming ``field``, and so is a name that is no hub id: most often a local directory that is not there.
    """
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HFValidationError, LocalEntryNotFoundError

    try:
        return snapshot_download(repo_id, repo_type=repo_type, revision=revision, local_files_only=True), False
    except HFValidationError:  # "/models/llam" read as a hub id: say what it most likely is, a missing directory
        raise SpecError(
            field, f"{repo_id!r} is no directory here and no hub id (namespace/name); point it at a {repo_type} directory"
        ) from None
    except LocalEntryNotFoundError:
        pass
    try:
        return snapshot_download(repo_id, repo_type=repo_type, revision=revision), True
    except Exception as exc:  # offline, unknown repo, no network
        raise SpecError(
            field, f"hub {repo_type} {repo_id!r} is not in the hub cache and cannot be downloaded ({type(exc).__name__}): {exc}"
        ) from None
