"""The quantized base kept in the node's model cache (``quantization.cache``): a later job's load is a read.

Loading a 7B base in NF4 reads the bf16 checkpoint (13.5 GB) and quantizes it on the GPU: 14.4 s of a warm start on an
H200 (``bench/RESULTS.md``). The quantized base is 3.9 GB. The first job on a node keeps it in a cache entry, in
transformers' own 4-bit serialization (safetensors, the quantization config in ``config.json``), written on a thread
beside its training from after its first step (:class:`Keeping`); later jobs with the same base and the same
quantization load that, already quantized.

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

import copy
import dataclasses
import hashlib
import json
import logging
import threading
import time
from concurrent.futures import Future
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


class Keeping:
    """A quantized base to keep in the node's cache: what its files hold, taken when it was loaded (:func:`keep`), and
    their write on a thread once :meth:`start` is called. The job calls it after its first step: started at the load,
    the write's copies beside the LoRA and FP8 set-up made that set-up 3 s longer on an H100 (``bench/RESULTS.md``)."""

    def __init__(self, *write_args: Any) -> None:
        """``write_args``: :func:`_write`'s, but its future."""
        self.future: Future[Kept] = Future()
        self._thread = threading.Thread(target=_write, args=(*write_args, self.future), name="rayft-keep-base", daemon=True)

    def start(self) -> None:
        """Start the write (once; later calls do nothing)."""
        if self._thread.ident is None:  # never started (a thread starts once)
            self._thread.start()

    def done(self) -> bool:
        return self.future.done()

    def wait(self) -> Kept:
        """Start the write if it has not started, and wait for it: what was kept, or why not, raised."""
        self.start()
        return self.future.result()


def keep(model: torch.nn.Module, model_dir: str, settings: dict[str, Any], root: str | None = None) -> Keeping | None:
    """Take what the just-quantized ``model`` will be kept as, before LoRA wraps it; ``None`` where the cache root is
    not local. Taken now, in memory: the state dict's tensors, its tied weights dropped and names reverted as
    transformers' ``save_pretrained`` does, and copies of its config and generation config. Nothing is written until
    :meth:`Keeping.start` (:func:`_write`, on a thread beside the job). Nothing writes those tensors meanwhile: the base
    is frozen, and bitsandbytes' CPU path, which rewrites a layer's quantization state in its first forward, gives the
    layer new tensors (a training step before the write keeps what was loaded:
    ``tests/unit/ray_jobs/cache/test_quantized.py``). A job keeps it from its first worker on each node
    (``load_base_from``'s ``keep``); two jobs of one node keeping at once both succeed, and one payload stays."""
    import torch
    from transformers.core_model_loading import dot_natural_key, revert_weight_conversion
    from transformers.modeling_utils import remove_tied_weights_from_state_dict

    entry = _entry(model_dir, settings, root)
    if entry is None:
        return None
    state = remove_tied_weights_from_state_dict(model.state_dict(), model)
    if getattr(model, "_weight_conversions", None) == []:  # loaded with no renaming: the names are the files'
        # revert_weight_conversion runs an empty list as renamings all the same, one regular expression compiled per
        # tensor (1,411 for a 7B base: 92% of this function on CPU, about 0.9 s of the load on an H100). Only its
        # order, which decides what goes in which file, is kept.
        state = dict(sorted(state.items(), key=lambda item: dot_natural_key(item[0])))
    else:
        state = revert_weight_conversion(model, state)
    gpu = next((t.device for t in state.values() if t.is_cuda), None)
    config = copy.deepcopy(model.config)
    config.dtype, config.architectures = str(model.dtype).split(".")[1], [type(model).__name__]
    generation = copy.deepcopy(model.generation_config) if model.can_generate() else None
    loaded = None
    if gpu is not None:  # the load's copies, on this thread's stream, come before the writer's reads
        (loaded := torch.cuda.Event()).record(torch.cuda.current_stream(gpu))
    return Keeping(state, config, generation, entry, gpu, loaded, f"quantized base of {model_dir} ({settings})")


@dataclasses.dataclass(frozen=True)
class Kept:
    """A base :func:`keep` wrote: where, how large, and how long the write took beside the job."""

    path: str
    bytes: int
    seconds: float


SHARD_BYTES = 2 * 2**30
"""The largest file of a kept base: what the thread holds on the CPU at once (3.9 GB for a 7B base in two files)."""


def _write(
    state: dict[str, Any],
    config: Any,
    generation: Any,
    entry: Location,
    gpu: Any,
    loaded: Any,
    about: str,
    future: Future[Kept],
) -> None:
    """Write ``state`` and the configs into a new payload of ``entry`` as transformers' 4-bit serialization does
    (safetensors files, an index where there are several), then commit the entry. Written here, not by
    ``save_pretrained``: that walks the model's modules while the job's thread wraps them in LoRA. Each file's tensors
    are copied to the CPU beside the job's kernels (:class:`_Staging`). safetensors releases the GIL while it writes:
    the job's thread keeps running (a Python loop beside a 1.3 GB write on 2 cores never waited more than 2 ms,
    ``bench/RESULTS.md``)."""
    from huggingface_hub import split_torch_state_dict_into_shards
    from safetensors.torch import save_file

    started, payload, staging = time.perf_counter(), None, None
    try:
        entry.fs.create_dir(entry.path, recursive=True)
        payload = entries.new_payload(entry)
        config.save_pretrained(payload.path)
        if generation is not None:
            generation.save_pretrained(payload.path)
        split = split_torch_state_dict_into_shards(
            state, filename_pattern="model{suffix}.safetensors", max_shard_size=SHARD_BYTES
        )
        staging = _Staging(gpu, loaded, split.filename_to_tensors.values(), state)
        for filename, names in split.filename_to_tensors.items():
            shard = staging.on_cpu({name: state.pop(name) for name in names})
            save_file(shard, str(Path(payload.path) / filename), metadata={"format": "pt"})
            del shard
        if split.is_sharded:
            index = {"metadata": split.metadata, "weight_map": split.tensor_to_filename}
            (Path(payload.path) / "model.safetensors.index.json").write_text(json.dumps(index, indent=2, sort_keys=True))
        size = sum(p.stat().st_size for p in Path(payload.path).rglob("*") if p.is_file())
        meta = entries.commit(entry, payload, {"description": about, "bytes": size})
        future.set_result(Kept(entries.payload_of(entry, meta).path, size, round(time.perf_counter() - started, 1)))
    except Exception as exc:  # a full disk, or a bug: the next job quantizes again, this one runs on (its summary says)
        log.warning("the quantized base was not kept in %s: %r", entry.uri, exc, exc_info=not isinstance(exc, OSError))
        if payload is not None:
            payload.delete()
        future.set_exception(exc)
    finally:
        if staging is not None:
            staging.close()


_ALIGN = 64
"""Where each tensor starts in the staging buffer: a multiple of any dtype's size, so each view has its own dtype."""

CHUNK_BYTES = 256 * 2**20
"""The pinned memory the write copies through. Pinning is what costs the job: 2 GB pinned at the write's start
stalled a GPU-bound loop of launches 0.6 s on an H100; through 256 MiB the whole write cost it 0.21 s, as much as with
the 2 GB pinned ahead of it, and 0.15 s when this writer ran on an H100 (``bench/keep_beside_steps.py``,
``bench/RESULTS.md``)."""


class _Staging:
    """Copies a kept base's tensors from the GPU to the CPU, one file's tensors at a time, on a CUDA stream of the
    writer's own: through one pinned chunk (:data:`CHUNK_BYTES`) into a pageable buffer of the largest file's size,
    where they stay while safetensors writes them. On a CPU the tensors are taken as they are.

    Why not ``tensor.to("cpu")``, as before: on an H100 the write of a 7B base (3.9 GB, 1,411 tensors) that way made the
    job's second step 2.3 s longer (5.67 s against 3.33-3.35 s), and cost a GPU-bound loop of launches 2.0 s. Each copy
    into pageable memory is staged by the driver and waited for on its own; copies into pinned memory run on the copy
    engine, and the writer waits once a chunk. The buffers are allocated once and reused, and the pinned chunk is
    given back to the driver at :meth:`close`, so that the job does not hold it for the rest of its run."""

    def __init__(self, gpu: Any, loaded: Any, files: Any, state: dict[str, Any]) -> None:
        """``gpu``: the base's device, or ``None`` on a CPU; ``loaded``: the event after its load's copies;
        ``files``: each file's tensor names; ``state``: the tensors."""
        import torch

        self.side = self.pinned = self.buffer = None
        if gpu is None:
            return
        largest = max((sum(_aligned(state[name]) for name in names) for names in files), default=0)
        self.side = torch.cuda.Stream(gpu)
        self.side.wait_event(loaded)  # the load's copies, on the job's stream, come before these reads
        self.pinned = torch.empty(max(1, min(CHUNK_BYTES, largest)), dtype=torch.uint8, pin_memory=True)
        self.buffer = torch.empty(largest, dtype=torch.uint8)

    def on_cpu(self, tensors: dict[str, Any]) -> dict[str, Any]:
        """``tensors`` on the CPU: views of the buffer, valid until the next call (or the tensors as they are)."""
        import torch

        if self.side is None:
            return {name: tensor.contiguous() for name, tensor in tensors.items()}
        views = _laid_out(self.buffer, tensors)
        with torch.cuda.stream(self.side):  # a non-contiguous tensor's copy is made on this stream too
            pairs = [(_bytes(tensors[name].contiguous()), _bytes(view)) for name, view in views.items()]
            _through(self.pinned, pairs, self.side.synchronize)
        return views

    def close(self) -> None:
        """Give the pinned chunk back to the driver (PyTorch's host allocator keeps what it freed, otherwise)."""
        import torch

        if self.pinned is not None:
            self.pinned = self.buffer = None
            torch._C._host_emptyCache()  # no public name in torch 2.13; cudaFreeHost waits for the device once


def _laid_out(buffer: torch.Tensor, tensors: dict[str, Any]) -> dict[str, Any]:
    """Views of ``buffer`` (bytes) shaped as ``tensors``, side by side, each from a multiple of ``_ALIGN``."""
    views, offset = {}, 0
    for name, tensor in tensors.items():
        views[name] = buffer[offset : offset + tensor.nbytes].view(tensor.dtype).view(tensor.shape)
        offset += _aligned(tensor)
    return views


def _through(pinned: torch.Tensor, pairs: list[tuple[Any, Any]], wait: Any) -> None:
    """Copy each ``(source, destination)`` pair of byte tensors through ``pinned``: as many bytes as it holds,
    non-blocking, then ``wait()`` for them, then into their destinations; again until all are copied."""
    room, used, pending = pinned.numel(), 0, []
    for source, destination in pairs:
        for start in range(0, source.numel(), room):
            n = min(room, source.numel() - start)
            if used + n > room:
                _drain(pinned, pending, wait)
                used = 0
            pinned[used : used + n].copy_(source[start : start + n], non_blocking=True)
            pending.append((used, destination[start : start + n]))
            used += n
    _drain(pinned, pending, wait)


def _drain(pinned: torch.Tensor, pending: list[tuple[int, Any]], wait: Any) -> None:
    wait()
    for at, destination in pending:
        destination.copy_(pinned[at : at + destination.numel()])
    pending.clear()


def _bytes(tensor: Any) -> Any:
    """A contiguous tensor's bytes, flat (a view)."""
    import torch

    return tensor.reshape(-1).view(torch.uint8)


def _aligned(tensor: Any) -> int:
    return -(-tensor.nbytes // _ALIGN) * _ALIGN
