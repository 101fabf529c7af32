"""Resumable checkpoints: the adapter (PEFT format), optimizer, scheduler and data position.

Only trainable weights are gathered (``ignore_frozen_params``): a 7B QLoRA checkpoint is the
adapter's megabytes, not the base's gigabytes. The strategy (``ray_jobs.train.strategy``) gathers them,
and scatters them again on resume, whatever it spreads the model with. The step copies them to the CPU
(:func:`take`); rank 0 writes the directory and copies it into the run's storage on Ray Train's upload
thread while the next steps train (:class:`Pending`).

Layout::

    adapter/adapter_config.json, adapter/adapter_model.safetensors   # loads with PeftModel.from_pretrained
    best_adapter/                    # when an earlier step had a lower eval loss (ray_jobs.train.best)
    train_state.safetensors   # every tensor: trainable weights, optimizer moments
    train_state.json          # everything else, with the tensors' places; the run's owner and spec hash

Data, never code: tensors in safetensors, the rest in JSON, so reading a checkpoint unpickles nothing.
The run directory is the team's own, writable storage; a file planted there cannot run in our workers.
A checkpoint also names who started the run and from which spec (``RunIdentity``); a job resumes only
its own team's run of the same spec, and refuses anything else by name.
"""

from __future__ import annotations

import dataclasses
import getpass
import json
import shutil
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import ray.train
    import torch

    from ray_jobs.train.strategy import Strategy
    from rayft_contract.spec import FineTuneSpec

FORMAT = 2
"""1 was a pickled ``train_state.pt``; it is no longer read."""
MANIFEST = "train_state.json"
"""Written last: a checkpoint directory without it is not whole."""


class CheckpointRefused(RuntimeError):
    """A checkpoint this job will not resume: another owner, another spec, or not a rayft checkpoint."""


@dataclasses.dataclass(frozen=True)
class RunIdentity:
    """Who started a run and from what: written into every checkpoint, checked before resuming one."""

    owner: str
    """The team (through the service), or ``local:<user>`` for ``rayft train``."""
    spec_hash: str
    """SHA-256 of the spec as the job runs it."""

    @classmethod
    def of(cls, spec: FineTuneSpec, owner: str = "") -> RunIdentity:
        return cls(owner or f"local:{getpass.getuser()}", spec.digest())


@dataclasses.dataclass
class TrainState:
    """Where training stands; restored on resume."""

    step: int = 0
    """Optimizer steps done."""
    epoch: int = 0
    """Epoch of the next micro-batch."""
    batches_in_epoch: int = 0
    """Micro-batches of ``epoch`` already consumed by this worker."""
    tokens: int = 0
    """Real (non-padding) tokens trained on, over all workers: what tokens/s counts."""
    samples: int = 0
    """Examples seen, over all workers."""
    best_step: int = 0
    """The step of the best evaluation so far (0: none yet; ``ray_jobs.train.best``)."""
    best_eval_loss: float | None = None
    """That evaluation's loss."""
    best_score: float | None = None
    """That evaluation's ``train.early_stopping_metric``, higher better (a loss negated)."""
    evals_since_best: int = 0
    """Evaluations since that one: what ``train.early_stopping_patience`` counts."""


def take(
    strategy: Strategy,
    model: torch.nn.Module,
    optimizer: Any,
    scheduler: Any,
    state: TrainState,
    identity: RunIdentity,
    best: dict[str, Any] | None = None,
    before_persist: Callable[[int], None] | None = None,
) -> Pending | None:
    """Collective: every rank calls it; rank 0 gets the checkpoint to write, the others ``None``.

    Only the copy happens here, on the step's path: the trainable weights, optimizer and scheduler state
    onto the CPU (a 7B adapter with AdamW's moments is about 0.5 GB). The files are written, and copied
    to the run's storage, by :meth:`Pending.upload` on an upload thread while training goes on
    (``ray.train.report(checkpoint_upload_mode=ASYNC)`` under Ray Train): on an H200 the write and the copy cost the
    step they were taken at 1.3-2.0 s.

    ``best``: the trainable weights of an earlier step with a lower eval loss (rank 0's copy), saved beside the
    current ones (``best_adapter/``, and in the train state for a resume). ``before_persist(step)``: called on
    the upload thread once the files are written (``Chaos.checkpoint_write``: a slow or failing store)."""
    from ray_jobs.train import session

    weights, optim = strategy.state_dict(model, optimizer)
    if session.current().rank != 0:
        return None
    # A copy of what is still the live tensors (a CPU model's, the optimizer's step counts), which the next
    # optimizer step changes while the upload thread writes them; what came off a GPU is a copy already.
    states = _copied({"model": weights, "optimizer": optim, "scheduler": scheduler.state_dict()}, live_storages(model, optimizer))
    if best is not None:
        states["best"] = best  # already a copy (ray_jobs.train.best.snapshot_of)
    return Pending(
        Path(tempfile.mkdtemp(prefix="rayft-ckpt-")),
        strategy.unwrap(model),
        states,
        dataclasses.replace(state),
        identity,
        before_persist,
    )


@dataclasses.dataclass
class Pending:
    """A checkpoint taken (CPU copies) and not yet written: :meth:`upload` writes and persists it."""

    directory: Path
    """A local temporary directory, removed once the files are in the run's storage (or the write failed)."""
    adapter: Any
    """The unwrapped PEFT model: its ``save_pretrained`` writes ``adapter/`` from the copied weights."""
    states: dict[str, Any]
    state: TrainState
    identity: RunIdentity
    before_persist: Callable[[int], None] | None = None
    written: threading.Event = dataclasses.field(default_factory=threading.Event)
    """Set once :meth:`upload` is over, written or failed: the loop waits on it before its next report."""

    def report(self, metrics: dict[str, Any]) -> threading.Event:
        """A report of ``metrics`` with this checkpoint (``ray.train.report``, ASYNC, under Ray Train): it returns
        at once, :meth:`upload` runs on an upload thread, and the report (``checkpoint: true``) goes out once the
        files are persisted; later reports wait behind it. Returns :attr:`written`."""
        import ray.train

        from ray_jobs.train import session

        checkpoint = ray.train.Checkpoint.from_directory(str(self.directory))
        session.current().report_checkpoint(metrics, checkpoint, self.upload)
        return self.written

    def upload(self, checkpoint: ray.train.Checkpoint, dir_name: str) -> ray.train.Checkpoint:
        """The report's upload, on its own thread: write the files, then copy them to the run's storage
        (``ray_jobs.train.session``: where Ray Train's own upload would, or a warm worker's folder). A failure here
        fails the worker, and the job resumes from the checkpoint before this one."""
        from ray_jobs.train import session

        try:
            self.adapter.save_pretrained(self.directory / "adapter", state_dict=self.states["model"])
            if "best" in self.states:
                self.adapter.save_pretrained(self.directory / "best_adapter", state_dict=self.states["best"])
            write(self.directory, self.states, self.state, self.identity)
            if self.before_persist is not None:
                self.before_persist(self.state.step)
            return session.current().persist(checkpoint, dir_name)
        finally:
            shutil.rmtree(self.directory, ignore_errors=True)  # our own temporary directory
            self.written.set()


def live_storages(model: torch.nn.Module, optimizer: Any) -> set[int]:
    """Where the model's parameters and the optimizer's state tensors live (their storages' addresses)."""
    import torch

    tensors = [*model.parameters(), *(v for state in optimizer.state.values() for v in state.values() if torch.is_tensor(v))]
    return {_storage(t) for t in tensors}


def _storage(tensor: torch.Tensor) -> int:
    """The address of ``tensor``'s storage; a DTensor's (FSDP2) is its local shard's: it has none of its own."""
    local = tensor.to_local() if hasattr(tensor, "to_local") else tensor
    return local.untyped_storage().data_ptr()


def _copied(value: Any, live: set[int]) -> Any:
    """``value`` with its tensors in contiguous CPU memory of their own (nesting, keys and plain values kept): those
    that share a live tensor's storage (``live``, :func:`live_storages`) copied, the others already are. On
    the GPU the state dict's weights and moments are already fresh CPU copies (about 0.5 GB for a 7B adapter
    with AdamW's moments), and copying them again was time on the step's path."""
    import torch

    if isinstance(value, torch.Tensor):
        address = _storage(value)
        if address in live or address == 0:
            return value.detach().to("cpu", copy=True).contiguous()
        return value.detach().to("cpu").contiguous()
    if isinstance(value, dict):
        return {k: _copied(v, live) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return (tuple if isinstance(value, tuple) else list)(_copied(v, live) for v in value)
    return value


def load(
    checkpoint: ray.train.Checkpoint,
    strategy: Strategy,
    model: torch.nn.Module,
    optimizer: Any,
    scheduler: Any,
    identity: RunIdentity,
) -> dict[str, Any] | None:
    """Check the checkpoint is this run's; restore the trainable weights, optimizer and scheduler into place;
    return the best earlier weights it holds (``None``: the current ones are the best, or there was no eval)."""
    with checkpoint.as_directory() as directory:
        saved, _ = read(Path(directory), identity)
    strategy.load_state_dict(model, optimizer, saved["model"], saved["optimizer"])
    scheduler.load_state_dict(saved["scheduler"])
    return saved.get("best")


def step_of(checkpoint: ray.train.Checkpoint) -> int | None:
    """The optimizer step a checkpoint was taken at (from its JSON, nothing else read)."""
    try:
        return state_of(checkpoint).step
    except CheckpointRefused:
        return None


def state_of(checkpoint: ray.train.Checkpoint) -> TrainState:
    """Where a checkpoint's run stood (step, data position, counts), from its JSON alone: known before the
    model loads. Whose run it is is checked by :func:`load`."""
    with checkpoint.as_directory() as directory:
        return TrainState(**_manifest(Path(directory))["state"])


def write(directory: Path, states: dict[str, Any], state: TrainState, identity: RunIdentity) -> None:
    """``states`` (nested dicts, lists, tensors, plain values) into ``train_state.safetensors`` + ``.json``."""
    from safetensors.torch import save_file

    tensors: dict[str, Any] = {}
    skeleton = _pack(states, tensors)
    save_file(tensors, str(directory / "train_state.safetensors"))
    manifest = {"format": FORMAT, **dataclasses.asdict(identity), "state": dataclasses.asdict(state), "states": skeleton}
    (directory / MANIFEST).write_text(json.dumps(manifest))


def read(directory: Path, identity: RunIdentity) -> tuple[dict[str, Any], TrainState]:
    """What :func:`write` wrote, after checking it is this run's; raises ``CheckpointRefused``."""
    from safetensors.torch import load_file

    manifest = _manifest(directory)
    owner, spec_hash = manifest["owner"], manifest["spec_hash"]
    if owner != identity.owner:
        raise CheckpointRefused(f"checkpoint {directory}: the run was started by {owner!r}, not {identity.owner!r}")
    if spec_hash != identity.spec_hash:
        raise CheckpointRefused(
            f"checkpoint {directory}: the run was started from another spec; resume with the same spec or use a new name"
        )
    tensors = load_file(str(directory / "train_state.safetensors"))
    return _unpack(manifest["states"], tensors), TrainState(**manifest["state"])


def _manifest(directory: Path) -> dict[str, Any]:
    """``train_state.json``, if it is a rayft manifest of this format; raises ``CheckpointRefused``."""
    path = directory / MANIFEST
    if not path.is_file():
        raise CheckpointRefused(f"checkpoint {directory}: no train_state.json (not a rayft checkpoint of format {FORMAT})")
    try:
        manifest = json.loads(path.read_text())
        missing = {"format", "owner", "spec_hash", "state", "states"} - set(manifest)
        if missing:
            raise KeyError(", ".join(sorted(missing)))
        TrainState(**manifest["state"])  # a field missing or unknown: TypeError
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise CheckpointRefused(f"checkpoint {directory}: train_state.json is not a rayft manifest ({exc})") from None
    if manifest["format"] != FORMAT:
        raise CheckpointRefused(f"checkpoint {directory}: format {manifest['format']!r}, this rayft reads {FORMAT}")
    return manifest


def _pack(value: Any, tensors: dict[str, Any]) -> Any:
    """A JSON skeleton of ``value`` whose tensors move into ``tensors`` (named t0, t1, ...). Dicts keep
    their keys' types (the optimizer's state is keyed by int). Hand-written: safetensors holds flat
    name->tensor maps only, and a state dict's nesting, int keys and plain values need a place too."""
    import torch

    if isinstance(value, torch.Tensor):
        name = f"t{len(tensors)}"
        tensors[name] = value.detach().to("cpu").contiguous().clone()  # clone: safetensors refuses shared storage
        return {"tensor": name}
    if isinstance(value, dict):
        if not all(isinstance(k, (str, int)) for k in value):
            raise TypeError(f"a checkpoint's dict keys are str or int, got {[type(k).__name__ for k in value]}")
        return {"dict": [[k, _pack(v, tensors)] for k, v in value.items()]}
    if isinstance(value, (list, tuple)):
        return {"tuple" if isinstance(value, tuple) else "list": [_pack(v, tensors) for v in value]}
    if value is None or isinstance(value, (bool, int, float, str)):
        return {"value": value}
    raise TypeError(f"a checkpoint holds tensors and plain values, not {type(value).__name__}")


def _unpack(node: Any, tensors: dict[str, Any]) -> Any:
    (kind, body), *rest = node.items()
    if rest:
        raise CheckpointRefused(f"train_state.json: a node with more than one entry: {sorted(node)}")
    if kind == "tensor":
        return tensors[body]
    if kind == "dict":
        return {k: _unpack(v, tensors) for k, v in body}
    if kind in ("list", "tuple"):
        items = [_unpack(v, tensors) for v in body]
        return tuple(items) if kind == "tuple" else items
    if kind == "value":
        return body
    raise CheckpointRefused(f"train_state.json: unknown node {kind!r}")
