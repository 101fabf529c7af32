"""The cluster's compiled kernels, kept where every GPU node reads them: a new node's first job takes the kernels
another node compiled instead of compiling them again.

Why: a node's compile cache (``$RAYFT_CACHE_DIR/compile``, :func:`ray_jobs.train.model.keep_compiled_kernels`) lives as
long as its cache volume, and a new pod's starts empty: every GPU pod that prod's autoscaler adds (``k8s/``) is a
fresh node. There the 7B preset's first job took 76.4 s to its first step on an H200, where a job on a node that had
compiled the kernels took 33-39 s (``bench/RESULTS.md``). The kernels do not depend on the node, only on what
:func:`ray_jobs.train.compile_ahead.kernels_key` hashes and on the GPU's model.

What is kept: torch's own portable form of a process's compiles ("Mega-Cache", ``torch.compiler.save_cache_artifacts``:
inductor's graphs with their Triton kernels, AOTAutograd's, autotuning's), one file per kernels key and GPU model, and
beside it the Triton kernels compiled outside inductor (Liger's, ``@triton.jit``), which Mega-Cache does not hold: a
tar of the entries the copy added to Triton's cache. Without them the first step after a take ran 9.0-10.6 s on an
H200, against 6.6 s after the node's own copy::

    {RAYFT_KERNELS_URI}/{kernels key}/{gpu model}.triton.tar   written first
    {RAYFT_KERNELS_URI}/{kernels key}/{gpu model}.bin          written last: where it is, the entry is whole

written by the copy's task once it compiled (:mod:`ray_jobs.train.compile_ahead`), and read by that task on another node
in place of compiling (:func:`take`: ``torch.compiler.load_cache_artifacts`` fills the node's compile cache). Only
:func:`take` imports torch: the driver's probe asks the rest.

Trust: the file holds compiled code and pickles, which torch loads and runs. Only rayft's job code writes it, from
the base's ``config.json`` and the spec's shapes, signed with the node's own identity (``team_keys=False``), never a
team's keys. ``RAYFT_KERNELS_URI`` is the operator's, set on the Ray nodes (never in a spec), and must be a place
no team's keys can write (``docs/kubernetes.md``). Unset: each node compiles its own, as before.

A limit: the tar holds the Triton entries the copy *added*. A node that kept some of a new key's Liger kernels from
an earlier key keeps them out of the tar, and a node that takes that key compiles them (a few seconds).
"""

from __future__ import annotations

import dataclasses
import io
import logging
import os
import tarfile
import time
from pathlib import Path

from ray_jobs.node_gpus import gpu_model
from ray_jobs.storage import Location, location
from ray_jobs.train.model import TRITON_CACHE_ENV
from rayft_contract.records import Failure

log = logging.getLogger(__name__)

ENV = "RAYFT_KERNELS_URI"
"""The operator's shared location for compiled kernels: an ``s3://`` prefix, or a directory every node mounts."""


@dataclasses.dataclass(frozen=True)
class Kernels:
    """One key's kernels for one GPU model."""

    compiled: bytes
    """``torch.compiler.save_cache_artifacts``'s bytes: inductor's, AOTAutograd's and autotuning's caches."""
    triton: bytes = b""
    """A tar of Triton's cache entries that inductor does not hold (Liger's kernels); empty where there are none."""


def entry(key: str) -> Location | None:
    """Where ``key``'s kernels for this node's GPU model are kept (the ``.bin``; the tar beside it, :func:`_triton_of`);
    ``None`` where the operator keeps none."""
    uri = os.environ.get(ENV, "").strip()
    if not uri:
        return None
    return location(uri, team_keys=False).child(key).child(f"{gpu_model()}.bin")


def _triton_of(kept: Location) -> Location:
    folder = Location(kept.uri.rsplit("/", 1)[0], kept.fs, kept.path.rsplit("/", 1)[0])
    return folder.child(kept.path.rsplit("/", 1)[1].removesuffix(".bin") + ".triton.tar")


def has(key: str) -> bool:
    """Whether the store holds ``key``'s kernels for this node's GPU model. A store that cannot be read counts as
    empty: the node compiles, as it would without one."""
    kept = entry(key)
    if kept is None:
        return False
    try:
        return kept.exists()
    except OSError:
        log.warning("the kernel store %s could not be read; this node compiles its own", kept.uri, exc_info=True)
        return False


def read(key: str) -> Kernels | None:
    """``key``'s kernels for this node's GPU model, or ``None`` where the store has none or cannot be read."""
    kept = entry(key)
    if kept is None:
        return None
    try:
        compiled = kept.read_bytes()
        triton = _triton_of(kept)
        return Kernels(compiled, triton.read_bytes() if triton.exists() else b"")
    except OSError:  # FileNotFoundError among them
        log.warning("the kernels of %s could not be read from %s", key, kept.uri, exc_info=True)
        return None


def publish(key: str, kernels: Kernels) -> str:
    """Keep ``kernels`` as ``key``'s for this node's GPU model, unless the store has them: the first node to compile a
    key publishes it, and a racing one's copy is the same kernels. Returns what it did, in words; a store that cannot
    be written loses nothing but the sharing."""
    kept = entry(key)
    if kept is None:
        return f"not kept for other nodes ({ENV} unset)"
    try:
        if kept.exists():
            return f"already kept in {kept.uri}"
        if kernels.triton:
            _triton_of(kept).write_bytes(kernels.triton)
        kept.write_bytes(kernels.compiled)  # last: its presence says the entry is whole
    except OSError as err:
        log.warning("the kernels of %s could not be kept in %s", key, kept.uri, exc_info=True)
        return f"not kept for other nodes ({Failure.reason_of(err, limit=200)})"
    size = (len(kernels.compiled) + len(kernels.triton)) / 2**20
    return f"kept for other nodes in {kept.uri} ({size:.1f} MiB)"


def triton_entries() -> set[str]:
    """The entries (one directory per kernel) of this process's Triton cache, ``TRITON_CACHE_DIR``
    (:func:`ray_jobs.train.model.keep_compiled_kernels` sets it); empty where it is unset or not made yet."""
    where = os.environ.get(TRITON_CACHE_ENV)
    return {p.name for p in Path(where).iterdir() if p.is_dir()} if where and Path(where).is_dir() else set()


def pack_triton(names: set[str]) -> bytes:
    """A tar of the named entries of the Triton cache, as :func:`unpack_triton` reads it; empty for none.

    By hand, with the standard library's tar: Mega-Cache holds the Triton kernels inductor made, but not those a
    library compiled with ``@triton.jit`` itself, and Triton has no portable form of its cache."""
    if not names:
        return b""
    root = Path(os.environ[TRITON_CACHE_ENV])
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as tar:
        for name in sorted(names):
            tar.add(root / name, arcname=name)
    return out.getvalue()


def unpack_triton(data: bytes) -> int:
    """Add a :func:`pack_triton` tar's entries to this process's Triton cache; how many files. Regular files and
    directories under the cache only: tarfile's ``data`` filter refuses absolute paths, ``..``, links that leave
    the cache and device files."""
    where = os.environ.get(TRITON_CACHE_ENV)
    if not data or not where:
        return 0
    Path(where).mkdir(parents=True, exist_ok=True)
    with tarfile.open(fileobj=io.BytesIO(data), mode="r") as tar:
        files = [m for m in tar.getmembers() if m.isfile()]
        tar.extractall(where, filter="data")
    return len(files)


def take(kept: Kernels) -> str:
    """Fill this node's compile caches with a store's kernels (on the node, in place of compiling them):
    ``torch.compiler.load_cache_artifacts`` writes each artifact where a compile looks it up, and the tar's Triton
    kernels go to Triton's cache. How many of each kind, in words."""
    import torch

    from ray_jobs.train.model import keep_compiled_kernels

    keep_compiled_kernels()
    started = time.perf_counter()
    info = torch.compiler.load_cache_artifacts(kept.compiled)
    kinds = [f"{len(v)} {k}" for k, v in sorted((info.artifacts if info else {}).items())]
    kinds.append(f"{unpack_triton(kept.triton)} Triton files")
    size = (len(kept.compiled) + len(kept.triton)) / 2**20
    return f"{', '.join(kinds)} ({size:.1f} MiB) in {time.perf_counter() - started:.1f} s"
