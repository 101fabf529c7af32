"""A core of its own for each tokenizer actor, where Ray owns every core the actor may run on.

Ray gives an actor ``num_cpus=1`` as a count, not a core: the kernel moves its process among all the cores,
beside the reading tasks, the Parquet writes, the driver and whatever else runs on the node. Pinned, an actor
keeps its caches warm on one core, and the one-thread line of ``bench/s3_data_bench.py`` (a process pinned to
one core) is the same kind of process (``bench/RESULTS.md`` gives what it was worth).

Pinning is only safe where the cores are Ray's to hand out: when the process may run on no more cores than the
node's ``CPU`` resource (a machine, a VM or a pod with an exclusive cpuset). In a pod limited by a CPU *quota* the
process may run on every core of the host, which other pods use too: two jobs' actors pinned to the same few
cores would share them while the rest stay idle, so nothing is pinned there.

Actors of different jobs on one node take different cores through one lock file a core, held (``flock``) for
the life of the process and released by the kernel when it ends, however it ends. Ray has no per-core
assignment for CPUs (it has one for GPUs), so this is written here.
"""

from __future__ import annotations

import fcntl
import os
import tempfile
from pathlib import Path

PIN_ENV = "RAYFT_PIN_TOKENIZERS"
"""The operator's switch, read by the job's driver: ``0`` never pins (default: pin where it is safe)."""
LOCK_DIR = Path(tempfile.gettempdir(), "rayft-cores")
"""One lock file a core, shared by every job's actors on the node (all run as the Ray workers' user)."""

_held: list[int] = []
"""The lock's file descriptor, kept open for the life of the process."""


def pinning_wanted() -> bool:
    return os.environ.get(PIN_ENV, "1") != "0"


def claim_core(node_cpus: float, lock_dir: Path = LOCK_DIR) -> int | None:
    """Pin this process to the first core no other claimer holds; the core, or ``None`` where pinning is not
    safe (see the module's docstring), every core is held, or this process already holds one."""
    if _held:
        return None
    allowed = sorted(os.sched_getaffinity(0))
    if len(allowed) > node_cpus or len(allowed) < 2:
        return None
    lock_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    for core in allowed:
        fd = os.open(lock_dir / f"core-{core}.lock", os.O_CREAT | os.O_RDWR, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            continue
        os.sched_setaffinity(0, {core})
        _held.append(fd)
        return core
    return None


def node_cpus() -> float:
    """This Ray node's ``CPU`` resource (its total, not what is free)."""
    import ray

    here = ray.get_runtime_context().get_node_id()
    return next((n["Resources"].get("CPU", 0.0) for n in ray.nodes() if n["NodeID"] == here), 0.0)
