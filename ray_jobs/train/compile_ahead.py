"""A job's first step on a one-layer copy of its base (:mod:`ray_jobs.train.one_layer`), in a process of its own: the
node's compiles, done ahead.

Why: on a node whose compile cache is empty, the 7B preset's first step took 31-35 s longer than on one whose cache
held its kernels (H200, ``bench/RESULTS.md``): flex attention's (forward, backward and the block mask), FP8's row
scaling and Liger's Triton kernels, compiled in the worker after its start and its base's load, one after the other.
The copy's step compiles the same kernels into the node's compile cache (:func:`ray_jobs.train.model.keep_compiled_kernels`),
where the job's own first step reads them.

Nothing of the team's is run or read here beyond the base's ``config.json`` (parsed by transformers, no remote code)
and the spec's shapes: the weights are random, and so are the rows' token ids.

    python -m ray_jobs.train.compile_ahead SPEC.json [--set KEY=VALUE] [--whole] [--steps N] [--keep [--address ADDR]]

prints one JSON line, an :class:`ray_jobs.train.one_layer.AheadReport`. ``--whole`` steps the base itself, as the job would, for the benchmark
that measures what the copy saves (``bench/compile_ahead.sh``). ``--keep``: the operator's; compiles the spec's
kernels on a GPU node of the Ray cluster into the cluster's kernel store (:func:`keep`).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ray_jobs import node_gpus
from ray_jobs.train import kernel_store
from ray_jobs.train.one_layer import first_steps
from rayft_contract.records import Failure
from rayft_contract.spec import FineTuneSpec

if TYPE_CHECKING:
    import torch

log = logging.getLogger(__name__)


AHEAD_WAIT_S = 180.0
"""How long a job's worker waits, before its memory plan and first step, for the copy's step still running: past
this, the job compiles what is left itself."""
OFF_ENV = "RAYFT_COMPILE_AHEAD"
"""``0``: the operator turns compiling ahead off (any other value, or none: on)."""


def training_code(root: Path = Path(__file__).parent) -> str:
    """A digest of rayft's training modules (``ray_jobs/train/*.py``): their code decides what a first step compiles
    as much as the libraries' versions do. The loss's kernel arguments, FP8's row scaling and flex attention's mask
    are rayft's, so a rayft that changes them needs kernels that an older one's key would say the node has, and its
    job would compile them in its first step instead of the copy ahead. (In the thirty-ninth session's runs in turns
    on one H100 node, ``bench/RESULTS.md``, the newer code's first step ran 1.3-1.8 s longer under the older code's
    key; that this was the cause is not shown.)"""
    import hashlib

    digest = hashlib.sha256()
    for path in sorted(root.glob("*.py")):
        code = path.read_bytes()
        digest.update(f"{path.name}\0{len(code)}\0".encode() + code)
    return digest.hexdigest()[:16]


def kernels_key(spec: FineTuneSpec, base_config: dict[str, Any]) -> str:
    """What the compiled kernels of ``spec``'s first step depend on: one layer's architecture (the base's config but
    its layer count), the spec's kernels, attention, quantization, LoRA and row shapes, the compilers' versions and
    rayft's own training code (:func:`training_code`). A node that ran the copy for a key has its kernels
    (:func:`_marker`). The spec's micro-batch stands for the rows the copy steps: the memory plan that may cut it
    follows from the spec and the GPU's memory, and a node's marker and the store's entries are each one GPU model's."""
    import hashlib
    from importlib import metadata

    def version(package: str) -> str:
        try:
            return metadata.version(package)
        except metadata.PackageNotFoundError:
            return ""

    architecture = {k: v for k, v in base_config.items() if k not in ("num_hidden_layers", "layer_types", "_name_or_path")}
    m, t = spec.model, spec.train
    what = {
        "architecture": architecture,
        "model": [m.dtype, m.kernels, m.attn_implementation, m.compile],
        "quantization": dataclasses.asdict(spec.quantization) | {"cache": None},
        "lora": dataclasses.asdict(spec.lora),
        "rows": [spec.data.max_seq_len, spec.data.packing, t.micro_batch_size, t.gradient_checkpointing],
        "versions": [version(p) for p in ("torch", "triton", "transformers", "peft", "liger-kernel", "bitsandbytes")],
        "rayft": training_code(),
    }
    return hashlib.sha256(json.dumps(what, sort_keys=True, default=str).encode()).hexdigest()[:24]


def launch(spec: FineTuneSpec, gpus_free: float, early: Any | None = None) -> tuple[Any, Any | None]:
    """Start the copy's first step from the driver once it is connected, as a Ray task with no GPU of its own, on the
    GPU node the job's worker will run on: the cluster's one GPU node, or the driver's where there are several (a
    cluster of several GPU nodes is otherwise left to each node's cache of earlier jobs). On the node the task takes
    a GPU no process holds (:func:`ray_jobs.node_gpus.idle_gpu`), and does nothing where the node has this key's kernels.

    ``gpus_free``: GPUs free in Ray's count before ``early`` took one. ``early``: the job's own early worker
    (``ray_jobs.warm.early``), just started. Where the node has the kernels it runs the job; so it does where the
    cluster's kernel store has them (``RAYFT_KERNELS_URI``), while the task fills the node's cache from there and
    the worker waits for the task before its first step. Where neither has them, it is stopped and the job runs on
    Ray Train while the copy compiles: on a fresh H200 node the copy, slowed by that worker's load beside it, ended
    42 s after the worker was ready (78 s to the first step), where Ray Train's launch and load hid it (67-68 s, and
    then its first step ran under other numerics than the copy's). Returns the copy's ``ObjectRef`` (or ``None``:
    :func:`why_not`) and the early worker (or ``None``)."""
    import os

    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    if skipped := why_not(spec, gpus_free, os.environ.get(OFF_ENV, "")):
        log.info("no kernels compiled ahead: %s", skipped)
        return None, early
    gpu_nodes = [n["NodeID"] for n in ray.nodes() if n["Alive"] and n["Resources"].get("GPU", 0) >= 1]
    here = ray.get_runtime_context().get_node_id()
    node = gpu_nodes[0] if len(gpu_nodes) == 1 else here if here in gpu_nodes else None
    if node is None:
        return None, early
    on_node = NodeAffinitySchedulingStrategy(node, soft=False)
    # A process of its own that ends with the task (max_calls=1): its CUDA context and cached memory leave the GPU
    # before the job plans its micro-batch from the free memory, and its CUDA_VISIBLE_DEVICES dies with it.
    task = ray.remote(num_cpus=1, num_gpus=0, max_retries=0, max_calls=1)(_ahead_on_node).options(scheduling_strategy=on_node)
    if early is not None:
        probe = ray.remote(num_cpus=0, max_retries=0)(kernels_at).options(scheduling_strategy=on_node)
        try:
            found = ray.get(probe.remote(spec), timeout=PROBE_S)
        except ray.exceptions.RayError:  # optional, as the copy is: the early worker runs the job, compiling itself
            log.warning("could not learn whether the GPU node has the kernels; the early worker runs the job", exc_info=True)
            return None, early
        if found == "node":
            return None, early
        if found == "store":  # the task fills the node's cache from the store; the early worker waits for it
            log.info("the cluster's kernel store has this job's kernels: the node takes them, the early worker runs the job")
            return task.remote(spec), early
        log.info("a node without this job's kernels: the early worker stops, Ray Train runs the job, a copy compiles")
        ray.kill(early)
    return task.remote(spec), None


PROBE_S = 60.0
"""How long the driver waits to learn whether the GPU node has the job's kernels (a file's existence, read by a task
there: a worker process's start)."""


def why_not(spec: FineTuneSpec, gpus_free: float, setting: str = "") -> str:
    """Why :func:`launch` starts nothing for ``spec`` with ``gpus_free`` GPUs free in the cluster and ``setting`` as
    ``RAYFT_COMPILE_AHEAD``; empty where it starts the copy's step."""
    if setting == "0":
        return f"{OFF_ENV}=0"
    if not spec.scaling.use_gpu:
        return "a CPU job compiles nothing"
    if spec.scaling.num_workers != 1:
        return "a job of several workers"
    if spec.model.path.startswith("s3://"):
        return "a base in s3:// is read with the team's keys, by the job alone"
    if gpus_free < 1:
        return "no GPU is free"
    return ""


def kernels_at(spec: FineTuneSpec) -> str:
    """The probe's task, on the GPU node: where ``spec``'s kernels are. ``node``: it ran the copy, or took the kernels
    from the store, for this key (:func:`_marker`); ``store``: the cluster's kernel store has them for this node's GPU
    model (:mod:`ray_jobs.train.kernel_store`); empty: nowhere, the copy compiles them."""

    key = _key_on_node(spec)
    marker = _marker(key)
    if marker is not None and marker.exists():
        return "node"
    return "store" if kernel_store.has(key) else ""


def _key_on_node(spec: FineTuneSpec) -> str:
    from ray_jobs.cache.models import fetch_model

    local = fetch_model(spec.model.path, spec.model.revision, count_hit=False).path
    return kernels_key(spec, json.loads((Path(local) / "config.json").read_text()))


def _ahead_on_node(spec: FineTuneSpec, device: str | None = None) -> str:
    """The Ray task: this node's kernels for ``spec``, unless it has them. From the cluster's kernel store where it
    holds them; else the copy's first step on ``device`` (``None``: a GPU of this node that no process holds,
    :func:`ray_jobs.node_gpus.idle_gpu`), whose compiles then go to the store for the next node. What it did, in
    words, for the job's log."""
    import torch

    key = _key_on_node(spec)
    marker = _marker(key)
    if marker is not None and marker.exists():
        return f"this node already has the kernels of {key}"
    if (kept := kernel_store.read(key)) is not None:
        took = kernel_store.take(kept)
        _mark(marker, json.dumps({"from_store": took}))
        return f"took the kernels of {key} from the cluster's kernel store: {took}"
    on = torch.device(device) if device is not None else node_gpus.idle_gpu()
    if on is None:
        return "no GPU on this node is free of other processes: nothing compiled ahead"
    return _compile_and_keep(spec, key, marker, on)


def _compile_and_keep(spec: FineTuneSpec, key: str, marker: Path | None, on: torch.device) -> str:
    """The copy's first step on ``on``, marked on this node, and what it compiled kept in the kernel store: torch's
    Mega-Cache, and the Triton entries the step added (those already in the node's Triton cache stay out)."""
    import torch

    triton_before = kernel_store.triton_entries()  # _marker (or keep) set the caches
    report = first_steps(spec, on)
    _mark(marker, report.to_json())
    saved = torch.compiler.save_cache_artifacts()  # what this process compiled, in torch's portable form
    triton = kernel_store.pack_triton(kernel_store.triton_entries() - triton_before)
    shared = kernel_store.publish(key, kernel_store.Kernels(saved[0], triton)) if saved is not None else "nothing compiled"
    return f"compiled ahead on {on} in {sum(report.step_s) + report.load_s + report.copy_s:.1f} s, {shared}: {report.to_json()}"


def keep(spec: FineTuneSpec, address: str) -> str:
    """For the operator (``--keep``): compile ``spec``'s kernels into the cluster's kernel store before any job, so
    that even the cluster's first job of that shape takes them (33.2 s to its first step on an H200, against
    63.8-70.2 s, ``bench/RESULTS.md``). Once per preset, GPU model and image. It runs as the job's copy does, a Ray
    task on one of the cluster's GPU nodes (:func:`_keep_on_node`): kept by a plain process outside Ray, the job
    missed part of the kernels (its first step 19.4-21.4 s, against 7.1-8.1 s kept by the task)."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    from ray_jobs import local_ray

    local_ray.connect(address)
    gpu_nodes = [n["NodeID"] for n in ray.nodes() if n["Alive"] and n["Resources"].get("GPU", 0) >= 1]
    if not gpu_nodes:
        raise SystemExit(f"no GPU node in the Ray cluster at {address}: the kernels are compiled on the GPU model jobs run on")
    task = ray.remote(num_cpus=1, num_gpus=0, max_retries=0, max_calls=1)(_keep_on_node)
    return ray.get(task.options(scheduling_strategy=NodeAffinitySchedulingStrategy(gpu_nodes[0], soft=False)).remote(spec))


def _keep_on_node(spec: FineTuneSpec, device: str | None = None) -> str:
    """:func:`keep`'s task: the copy's first step on ``device`` (``None``: a GPU of this node no process holds), in a
    scratch cache of its own, so that every kernel is compiled and kept, whatever the node's cache holds."""
    import os

    import torch

    from ray_jobs.train.model import COMPILE_CACHE_ENV, TRITON_CACHE_ENV

    key = _key_on_node(spec)
    if kernel_store.entry(key) is None:
        return f"{kernel_store.ENV} is not set on this node: no kernel store to keep {key}'s kernels in"
    if kernel_store.has(key):
        return f"the kernel store already keeps the kernels of {key}"
    on = torch.device(device) if device is not None else node_gpus.idle_gpu()
    if on is None:
        return "no GPU on this node is free of other processes: nothing kept; try again when one is"
    with tempfile.TemporaryDirectory(prefix="rayft-keep-") as scratch:  # the task's process ends with it (max_calls=1)
        os.environ[COMPILE_CACHE_ENV], os.environ[TRITON_CACHE_ENV] = scratch, os.path.join(scratch, "triton")
        return _compile_and_keep(spec, key, None, on)


def _mark(marker: Path | None, body: str) -> None:
    if marker is not None:
        marker.parent.mkdir(parents=True, exist_ok=True)
        marker.write_text(body)


def _marker(key: str) -> Path | None:
    """``{compile cache}/ahead/{key}``: written once the copy's step ran on this node; ``None`` under torch's own
    directory (an ``s3://`` cache root), where nothing marks a run."""
    from ray_jobs.train.model import keep_compiled_kernels

    kept = keep_compiled_kernels()
    return Path(kept) / "ahead" / key if kept else None


def wait(ref: Any) -> str:
    """In the job's worker, before its memory plan (whose free memory the copy's step would take) and its first step:
    the copy's step's outcome, waited for up to :data:`AHEAD_WAIT_S`. Never fails the job."""
    import ray

    if ref is None:
        return ""
    try:
        return str(ray.get(ref, timeout=AHEAD_WAIT_S))
    except ray.exceptions.GetTimeoutError:
        ray.cancel(ref, force=True)
        return f"the copy's step ran past {AHEAD_WAIT_S:.0f} s: cancelled; the job compiles what is left"
    except ray.exceptions.RayError as err:  # optional: the job's own first step compiles whatever this did not
        return f"compiling ahead failed ({Failure.reason_of(err, limit=240)}); the job compiles"  # the task's own error


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ray_jobs.train.compile_ahead", description=__doc__.split("\n")[0])
    parser.add_argument("spec", help="the job's spec, JSON or YAML (after its overrides)")
    parser.add_argument("--whole", action="store_true", help="step the base itself, not its one-layer copy")
    parser.add_argument("--steps", type=int, default=1, help="forward and backward passes (default 1)")
    parser.add_argument("--keep", action="store_true", help="keep the kernels in the cluster's kernel store (RAYFT_KERNELS_URI)")
    parser.add_argument("--address", default="auto", help="with --keep: the Ray cluster (default: auto, this node's)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a field, as rayft train")
    args = parser.parse_args(argv)
    import torch

    spec = FineTuneSpec.load(args.spec, args.set)
    if args.keep:
        print(keep(spec, args.address), flush=True)
        return 0
    device = torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")
    print(first_steps(spec, device, whole=args.whole, steps=args.steps).to_json(), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
