"""This node's GPUs, read with ``nvidia-smi``, never through a CUDA context: asking torch opens one (about 500 MB) on
every GPU of the node, other jobs' included. For the tasks that run beside a job on its GPU node
(:mod:`ray_jobs.train.compile_ahead`'s copy, :mod:`ray_jobs.train.kernel_store`'s key)."""

from __future__ import annotations

import re
import shutil
import subprocess
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch


def gpu_model() -> str:
    """This node's GPU model as one path component (``NVIDIA-H200``); ``cpu`` on a node without GPUs. The kernel
    store keeps each model's kernels apart (torch checks the GPU itself on load, and would only miss)."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return "cpu"
    listed = subprocess.run([smi, "--query-gpu=name", "--format=csv,noheader"], capture_output=True, text=True, timeout=60)
    names = listed.stdout.strip().splitlines() if listed.returncode == 0 else []
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", names[0].strip()) if names else "cpu"


def idle_gpu() -> torch.device | None:
    """A GPU of this node that no process holds, made this process's only one; ``None`` if there is none. Called
    before this process's first CUDA call (the copy's task runs in a process of its own, ``max_calls=1``), so
    ``CUDA_VISIBLE_DEVICES`` still decides what it sees."""
    import os

    import torch

    smi = shutil.which("nvidia-smi")
    if smi is None:
        return None
    query = [smi, "--query-gpu=index,uuid,memory.used,memory.total", "--format=csv,noheader,nounits"]
    listed = subprocess.run(query, capture_output=True, text=True, timeout=60)
    if listed.returncode != 0:
        return None
    uuid = pick_idle(listed.stdout, os.environ.get("CUDA_VISIBLE_DEVICES"))
    if uuid is None:
        return None
    os.environ["CUDA_VISIBLE_DEVICES"] = uuid
    return torch.device("cuda", 0) if torch.cuda.is_available() else None


def pick_idle(listing: str, visible: str | None) -> str | None:
    """From ``nvidia-smi``'s ``index, uuid, memory.used, memory.total`` lines, the UUID of the GPU with the least memory
    in use, if that is under 5% of it (a CUDA context alone is about 0.4% of an H200), and among ``visible``
    (``CUDA_VISIBLE_DEVICES``: indices or UUIDs) where that is set."""
    allowed = {v.strip() for v in visible.split(",")} if visible is not None else None
    idle = []
    for line in listing.strip().splitlines():
        index, uuid, used, total = (field.strip() for field in line.split(","))
        if allowed is not None and index not in allowed and uuid not in allowed:
            continue
        if float(used) < 0.05 * float(total):
            idle.append((float(used), uuid))
    return min(idle)[1] if idle else None
