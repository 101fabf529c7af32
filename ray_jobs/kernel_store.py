"""The cluster's compiled kernels, kept where every GPU node reads them: a new node's first job takes the kernels
another node compiled instead of compiling them again.

Why: a node's compile cache (``$RAYFT_CACHE_DIR/compile``, :func:`ray_jobs.model.keep_compiled_kernels`) lives as
long as its cache volume, and a new pod's starts empty: every GPU pod that prod's autoscaler adds (``k8s/``) is a
fresh node. There the 7B preset's first job took 76.4 s to its first step on an H200, where a job on a node that had
compiled the kernels took 33-39 s (``bench/RESULTS.md``). The kernels do not depend on the node, only on what
:func:`ray_jobs.compile_ahead.kernels_key` hashes and on the GPU's model.

What is kept: torch's own portable form of a process's compiles ("Mega-Cache", ``torch.compiler.save_cache_artifacts``:
inductor's graphs with their Triton kernels, AOTAutograd's, autotuning's), one file per kernels key and GPU model::

    {RAYFT_KERNELS_URI}/{kernels key}/{gpu model}.bin

written by the copy's task once it compiled (:mod:`ray_jobs.compile_ahead`), and read by that task on another node
in place of compiling (``torch.compiler.load_cache_artifacts`` fills the node's compile cache). This module holds the
storage alone and never imports torch: the driver's probe asks it.

Trust: the file holds compiled code and pickles, which torch loads and runs. Only rayft's job code writes it, from
the base's ``config.json`` and the spec's shapes, signed with the node's own identity (``team_keys=False``), never a
team's keys. ``RAYFT_KERNELS_URI`` is the operator's, set on the Ray nodes (never in a spec), and must be a place
no team's keys can write (``docs/kubernetes.md``). Unset: each node compiles its own, as before.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import subprocess

from ray_jobs.storage import Location, location

log = logging.getLogger(__name__)

ENV = "RAYFT_KERNELS_URI"
"""The operator's shared location for compiled kernels: an ``s3://`` prefix, or a directory every node mounts."""


def gpu_model() -> str:
    """This node's GPU model as one path component (``NVIDIA-H200``), read with ``nvidia-smi`` (a CUDA context would
    cost about 500 MB of a GPU another job may hold); ``cpu`` on a node without GPUs. torch checks the GPU itself on
    load; the name keeps one model's kernels from hiding another's."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return "cpu"
    listed = subprocess.run([smi, "--query-gpu=name", "--format=csv,noheader"], capture_output=True, text=True, timeout=60)
    names = listed.stdout.strip().splitlines() if listed.returncode == 0 else []
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", names[0].strip()) if names else "cpu"


def entry(key: str) -> Location | None:
    """Where ``key``'s kernels for this node's GPU model are kept; ``None`` where the operator keeps none."""
    uri = os.environ.get(ENV, "").strip()
    if not uri:
        return None
    return location(uri, team_keys=False).child(key).child(f"{gpu_model()}.bin")


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


def read(key: str) -> bytes | None:
    """``key``'s kernels for this node's GPU model, or ``None`` where the store has none or cannot be read."""
    kept = entry(key)
    if kept is None:
        return None
    try:
        return kept.read_bytes()
    except OSError:  # FileNotFoundError among them
        log.warning("the kernels of %s could not be read from %s", key, kept.uri, exc_info=True)
        return None


def publish(key: str, artifacts: bytes) -> str:
    """Keep ``artifacts`` as ``key``'s kernels for this node's GPU model, unless the store has them: the first node
    to compile a key publishes it, and a racing one's copy is the same kernels. Returns what it did, in words; a
    store that cannot be written loses nothing but the sharing."""
    kept = entry(key)
    if kept is None:
        return f"not kept for other nodes ({ENV} unset)"
    try:
        if kept.exists():
            return f"already kept in {kept.uri}"
        kept.write_bytes(artifacts)
    except OSError as err:
        log.warning("the kernels of %s could not be kept in %s", key, kept.uri, exc_info=True)
        return f"not kept for other nodes ({type(err).__name__}: {str(err).splitlines()[0][:160]})"
    return f"kept for other nodes in {kept.uri} ({len(artifacts) / 2**20:.1f} MiB)"
