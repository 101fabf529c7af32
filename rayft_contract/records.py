"""Typed records that cross process boundaries: built on one side, read by attribute on the other.

Every record is a frozen dataclass that travels as its :meth:`~Record.to_dict` (Ray, ``metrics.jsonl``,
``summary.json`` and the service's store carry plain JSON) and is read back with
:meth:`~Record.from_dict`. Nothing on the reading side looks a value up by a string key.

| record           | made by                          | read by                                              |
|------------------|----------------------------------|------------------------------------------------------|
| :class:`StepRecord` | every Ray Train worker (``ray_jobs.metrics``) | the profile, the diagnosis, the picture, the benchmarks |
| :class:`Progress`   | rank 0, at each ``ray.train.report`` (``ray_jobs.train_loop``) | the driver, the trackers, the wire ``Progress`` (``convert``), the CLI |
| :class:`Finding`    | the diagnosis (``ray_jobs.diagnosis``) | the summary, the wire ``Diagnosis``, the CLI           |
| :class:`JobSummary` | the driver at the end (``ray_jobs.summary``) | ``summary.json``, the service's ``Job.summary_json``, the CLI, the trackers, the picture |
| :class:`JobPhase`, :class:`StateChange`, :class:`Failure` | the driver; the service's store; Ray Train's controller | the CLI, the reconciler, the wire |

``from_dict`` ignores keys it does not know and fills fields that are missing with their defaults, so a
client reads a summary written by a newer or an older job. A field without a default is required.
"""

from __future__ import annotations

import dataclasses
import functools
import types
import typing
from typing import Any, ClassVar, TypeVar

from rayft_contract.phases import Phase

R = TypeVar("R", bound="Record")


class Record:
    """``to_dict`` / ``from_dict`` for a frozen dataclass whose fields are JSON values, records, or tuples and
    dicts of them (nested records are built from their own dicts)."""

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)  # type: ignore[call-overload]

    @classmethod
    def from_dict(cls: type[R], data: dict[str, Any]) -> R:
        hints = _hints(cls)
        known = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
        return cls(**{name: _build(hints[name], value) for name, value in data.items() if name in known})


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _build(hint: Any, value: Any) -> Any:
    """``value`` (plain JSON) as the type ``hint`` names."""
    if value is None:
        return None
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        return _build(next(a for a in args if a is not type(None)), value)
    if isinstance(hint, type) and issubclass(hint, Record):
        return value if isinstance(value, hint) else hint.from_dict(value)
    if origin is tuple:
        return tuple(_build(args[0], v) for v in value)
    if origin is dict:
        return {k: _build(args[1], v) for k, v in value.items()}
    return value


# -- one step, on every worker ---------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class StepRecord(Record):
    """One optimizer step, summed over workers where it counts things."""

    step: int
    wall: float
    """Seconds from the end of the previous step to the end of this one (host clock)."""
    phases: dict[str, float]
    """Seconds per in-step :class:`~rayft_contract.phases.Phase` (CUDA events for GPU phases)."""
    tokens: int
    """Real (non-padding) tokens trained on."""
    processed: int
    """Tokens the model ran on: real + padding."""
    samples: int
    """Examples trained on."""
    attn_ctx: int
    """Sum over real tokens of their causal context length (what attention FLOPs scale with)."""

    def __post_init__(self) -> None:
        unknown = set(self.phases) - {p.value for p in Phase if p.in_step}
        if unknown:
            raise ValueError(f"step {self.step}: unknown phases {sorted(unknown)}")

    def seconds(self, phase: Phase) -> float:
        return self.phases.get(phase, 0.0)

    @property
    def busy(self) -> float:
        """The step's time minus waiting for data, checkpoints, evaluation and reports: the compute."""
        idle = (Phase.DATA_WAIT, Phase.CHECKPOINT, Phase.CHECKPOINT_WAIT, Phase.EVAL, Phase.REPORT)
        return self.wall - sum(self.seconds(p) for p in idle)

    @property
    def training_wall(self) -> float:
        """Wall time without evaluation: evaluation is not training."""
        return self.wall - self.seconds(Phase.EVAL)


# -- a worker's report -----------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class ModelShape(Record):
    """What the FLOPs formula needs (``ray_jobs.profile.step_flops``), read from the model before it is wrapped."""

    matmul_params: int
    trainable_matmul_params: int
    layers: int
    attn_dim: int
    gradient_checkpointing: bool = False


@dataclasses.dataclass(frozen=True)
class RunFacts(Record):
    """What a worker knows of the run once it is set up; every progress report carries it."""

    world_size: int = 1
    trainable_params: int = 0
    model_shape: ModelShape | None = None
    peak_flops: float | None = None
    """The GPU's bf16 peak FLOP/s (``None`` on CPU or an unknown GPU: no MFU then)."""
    layout: str = ""
    """The strategy: ``single``, ``ddp`` or ``fsdp``."""
    quantized_layers: int = 0
    kernels: str = ""
    """``liger (rope, ...)`` or ``none (why)`` (``ray_jobs.kernels``), then what ``lora.fused`` and ``model.compile``
    add when they are on."""
    attention: str = ""
    """The attention kernel the worker loaded the model with (``model.attn_implementation``, ``auto`` resolved)."""
    quantized_base: str = ""
    """How the quantized base came to be: quantized, or read from the node's cache (``quantization.cache``)."""
    micro_batch: str = ""
    """The micro-batch trained with, and why if it is not the spec's (``ray_jobs.memory``)."""
    worker: str = ""
    """Which worker trained: Ray Train's, started for the job, or a warm one (``ray_jobs.warm_pool``)."""


@dataclasses.dataclass(frozen=True)
class SetupTimes(Record):
    """How a worker's setup went, sent once with its first report after setup (``ray_jobs.profile``)."""

    worker_start_ts: float
    """When the training function began on this worker."""
    process_start_ts: float | None = None
    """When this worker's process was created (before the run, if Ray had it started already)."""
    model_load_s: float = 0.0
    compile_wait_s: float = 0.0
    """Waiting, after the base's load, for the kernels being compiled ahead (``ray_jobs.compile_ahead``)."""
    resume_s: float = 0.0
    first_eval_s: float = 0.0
    loop_start_ts: float | None = None


@dataclasses.dataclass(frozen=True)
class Sample(Record):
    """One held-out prompt, its reference answer and what the model answered (``ray_jobs.samples``)."""

    prompt: str
    reference: str
    answer: str


@dataclasses.dataclass(frozen=True)
class Progress(Record):
    """One report of rank 0 (``ray.train.report``): where training stands, and the steps since the last one.

    The step-0 report (before any training) carries the baseline ``eval_loss``; the closing one
    (``final``) only the last step records and ``worker_end_ts``. On the wire (``JobEvent.progress``) a
    report keeps only what a watcher shows, with ``eta_s`` added (``rayft_contract.convert``).
    """

    step: int
    total_steps: int
    epoch: int = 0
    loss: float | None = None
    """The step's training loss, averaged over all workers' label tokens (``None``: no step trained yet)."""
    learning_rate: float | None = None
    tokens: int = 0
    """Real tokens trained on so far (all workers)."""
    samples: int = 0
    time_to_first_step_s: float | None = None
    eval_loss: float | None = None
    eval_token_accuracy: float | None = None
    """At an evaluation: the share of the eval split's answer tokens that the model's greedy next-token
    prediction gets exactly right (``None`` when the model returns no logits)."""
    eval_samples: tuple[Sample, ...] = ()
    checkpoint: bool = False
    """A checkpoint was saved at this step."""
    best_step: int | None = None
    best_eval_loss: float | None = None
    stopped_early: str | None = None
    """Why training stopped before ``total_steps`` (early stopping), in words."""
    facts: RunFacts | None = None
    setup: SetupTimes | None = None
    gpu_mem_peak_gb: float | None = None
    gpu_mem_total_gb: float | None = None
    tokens_per_s: float | None = None
    samples_per_s: float | None = None
    step_time_s: float | None = None
    data_wait_frac: float | None = None
    eta_s: float | None = None
    """Seconds left at the current step time (set on the wire)."""
    step_timing: tuple[StepRecord, ...] = ()
    final: bool = False
    """The closing report of the loop (``timing`` event): step records only, it is not shown."""
    worker_end_ts: float | None = None

    @property
    def trained(self) -> bool:
        """A report of a training step (not the step-0 baseline, not the closing report)."""
        return self.loss is not None


# -- the other events' payloads --------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class JobPhase(Record):
    """A ``phase`` event: the job moved on (``queued``, ``connect``, ``model``, ``data``, ``training``, ``export``)."""

    phase: str
    detail: str = ""
    """What happened, e.g. ``dataset cache hit ...: 0 bytes downloaded``."""
    total_steps: int | None = None
    """With ``training``: the steps the run will take (the job's own view only; not on the wire)."""


@dataclasses.dataclass(frozen=True)
class StateChange(Record):
    """A ``state`` event: the service moved the job to ``state`` (a ``JobState`` value), with why."""

    state: str
    message: str = ""


@dataclasses.dataclass(frozen=True)
class Failure(Record):
    """A ``failure`` event: the error of each Ray Train rank that failed (Ray Train restarts from the last
    checkpoint), or under ``job`` the error that ended the whole job."""

    errors: dict[str, str]

    @property
    def job_error(self) -> str | None:
        return self.errors.get("job")


# -- the driver's findings and summary -------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Finding(Record):
    """A bottleneck the diagnosis found (``ray_jobs.diagnosis``), with the fix in the spec's field names."""

    kind: str
    message: str
    cost_s: float
    """Seconds this problem cost (what ranks the findings)."""


@dataclasses.dataclass(frozen=True)
class Efficiency(Record):
    """Steady-state throughput, MFU/HFU, padding share and memory (``ray_jobs.profile``)."""

    steady_steps: int = 0
    warmup_steps: int = 0
    head_steps: int = 0
    tokens_per_s: float = 0.0
    tokens_per_s_per_worker: float = 0.0
    samples_per_s: float = 0.0
    step_time_s: float = 0.0
    padding_frac: float = 0.0
    mfu: float | None = None
    hfu: float | None = None
    flops_per_s: float | None = None
    gpu_mem_peak_gb: float | None = None
    gpu_mem_total_gb: float | None = None


@dataclasses.dataclass(frozen=True)
class Timing(Record):
    phases: dict[str, float] = dataclasses.field(default_factory=dict)
    """Seconds per :class:`~rayft_contract.phases.Phase` value, in the table's order; they add up to the wall time."""
    warmup_steps: int = 0


@dataclasses.dataclass(frozen=True)
class SamplesAt(Record):
    """The model's answers at the first and the last evaluation."""

    first_step: int
    last_step: int
    first: tuple[Sample, ...]
    last: tuple[Sample, ...]


@dataclasses.dataclass(frozen=True)
class FillTimes(Record):
    """Where a dataset cache fill's time went (``ray_jobs.dataset_cache``).

    The fill streams: files are read, templated, tokenized, packed and written at once, so its wall time
    is cut where the stream starts and ends, at the first and the last batch a tokenizer finished. The
    three ``*_s`` add up to the fill's wall time, and are rows of the job's phase table
    (:attr:`PHASES`). Inside the stream, the ``*_busy_s`` say what each stage cost, summed over the
    tasks and actors that ran it (so they may add up to more than the wall time): the stage with the
    most busy seconds per CPU it had is the one that set the pace."""

    start_s: float
    """From the fill's start to the first tokenizer task's start: the tokenizer actors start, the first rows
    are read and cut into tokenizer batches. Nothing is tokenized yet: the fill's fixed cost."""
    stream_s: float
    """From the first tokenizer task's start to the last tokenized batch: read, template, tokenize and pack,
    streamed."""
    write_s: float
    """From the last tokenized batch to the entry committed: the last Parquet files, the manifest."""
    read_busy_s: float = 0.0
    template_busy_s: float = 0.0
    """Rows parsed and put in the chat template (no tokenizer)."""
    tokenize_busy_s: float = 0.0
    pack_busy_s: float = 0.0
    workers: int = 0
    """Tokenizer actors."""
    actors_ready_s: float = 0.0
    """From the fill's start until the last tokenizer actor was ready (its process started, its modules
    imported, its constructor run). Tasks start on the first actors ready, so with many actors this can
    end inside the stream."""
    actor_init_s: float = 0.0
    """Inside that: the slowest actor's constructor (the tokenizer's load)."""
    first_batch_s: float = 0.0
    """From the fill's start to the first tokenized batch's end (inside the stream: the first task's rows)."""
    first_read_s: float = 0.0
    """From the fill's start to the first reading task's start (the listing, the executor's start, a worker
    process for the task), inside ``start_s``."""
    first_block_s: float = 0.0
    """From the fill's start to the first rows a reading task handed on. From there to ``start_s``, the rows
    wait for Ray Data to cut them into a tokenizer task's batch and give it to an actor."""
    readers_at_once: int = 0
    """The most reading tasks that ran at the same time (``ray_jobs.data.ACTORS_PER_READER`` bounds them)."""

    PHASES: ClassVar[tuple[Phase, Phase, Phase]] = (Phase.DATA_FILL_START, Phase.DATA_FILL_STREAM, Phase.DATA_FILL_WRITE)
    """The phase table's rows for ``start_s``, ``stream_s`` and ``write_s``, in that order."""

    def phases(self) -> dict[str, float]:
        return {p.value: s for p, s in zip(self.PHASES, (self.start_s, self.stream_s, self.write_s))}

    def describe(self) -> str:
        busy = (
            f"read {self.read_busy_s:.1f} s, template {self.template_busy_s:.1f} s, "
            f"tokenize {self.tokenize_busy_s:.1f} s, pack {self.pack_busy_s:.1f} s"
        )
        return (
            f"start {self.start_s:.1f} s (actors ready at {self.actors_ready_s:.1f} s, constructor {self.actor_init_s:.1f} s; "
            f"first read at {self.first_read_s:.1f} s, its first rows at {self.first_block_s:.1f} s; "
            f"{self.readers_at_once} reading tasks at most at once), "
            f"stream {self.stream_s:.1f} s (first batch done at {self.first_batch_s:.1f} s), write {self.write_s:.1f} s; busy over {self.workers} tokenizer actors: {busy}"
        )


@dataclasses.dataclass(frozen=True)
class DatasetCacheInfo(Record):
    """What preparing the data cost (``ray_jobs.dataset_cache``)."""

    enabled: bool
    hit: bool = False
    bytes_downloaded: int = 0
    rows_tokenized: int | None = None
    """Rows tokenized before training (0 on a hit, ``None`` when streaming: they are tokenized as it trains)."""
    key: str = ""
    uri: str = ""
    packed_rows: dict[str, int] = dataclasses.field(default_factory=dict)
    seconds: float = 0.0
    nodes: int = 0
    """The Ray nodes whose CPUs tokenized, on a fill (0 on a hit)."""
    fill: FillTimes | None = None
    """A fill's phases and busy stages (``None`` on a hit, or streaming)."""

    def describe(self) -> str:
        """One line for the progress view."""
        if not self.enabled:
            return "dataset cache off: tokenizing while training"
        if self.hit:
            return f"dataset cache hit {self.key}: 0 bytes downloaded, 0 rows tokenized"
        where = f" on {self.nodes} nodes" if self.nodes > 1 else ""
        return (
            f"dataset cache miss {self.key}: read {self.bytes_downloaded / 2**20:.1f} MiB, tokenized "
            f"{self.rows_tokenized} rows in {self.seconds:.1f} s{where}"
        )


@dataclasses.dataclass(frozen=True)
class Fetched(Record):
    """Where the base model came from (``ray_jobs.model_cache.fetch_model``)."""

    path: str
    """The model's local directory."""
    source: str
    """``local`` (used in place), ``cache`` (hit), ``download`` (miss), ``hub-cache`` or ``hub``."""
    bytes_downloaded: int = 0
    seconds: float = 0.0
    identity: str = ""
    """Which exact base this is, so an adapter stays tied to it: the hub commit, or a SHA-256 over every file's
    name and size and the config's bytes (``s3://``: as listed; local: as on disk). Not a hash of the weights'
    bytes: that would read gigabytes on every job."""

    @property
    def hit(self) -> bool:
        return self.source in ("local", "cache", "hub-cache")

    def describe(self) -> str:
        """One line for the progress view: where the model came from."""
        if self.source == "download":
            return f"downloaded {self.bytes_downloaded / 2**20:.1f} MiB into the cache in {self.seconds:.1f} s"
        return {
            "local": "local directory",
            "cache": "model cache hit",
            "hub-cache": "hub cache hit",
            "hub": "downloaded from the hub",
        }[self.source]


@dataclasses.dataclass(frozen=True)
class Caches(Record):
    dataset: DatasetCacheInfo | None = None
    model: Fetched | None = None


@dataclasses.dataclass(frozen=True, order=True)
class BadRowSample(Record):
    """One located bad row. Ordered by place in the data: file index in the listing, then line."""

    file_index: int
    """The file's position in the sorted listing of ``data.path`` (``ray_jobs.sources.data_files``)."""
    piece: int = 0
    """Which range of the file it was read in (``ray_jobs.reading.pieces_of``); 0 once ``line`` is the file's."""
    line: int = 0
    """1-based line of a JSONL file (within its piece until resolved), or row number in the other file types."""
    kind: str = dataclasses.field(default="", compare=False)
    location: str = dataclasses.field(default="", compare=False)
    """``file:line``, as a user would open it."""
    reason: str = dataclasses.field(default="", compare=False)


@dataclasses.dataclass(frozen=True)
class DataQuality(Record):
    """The bad rows of a job's data (``ray_jobs.quality``): counted by kind, the earliest of each located."""

    rows: int = 0
    bad_rows: int = 0
    bad_frac: float = 0.0
    bad_by_kind: dict[str, int] = dataclasses.field(default_factory=dict)
    truncated: int = 0
    examples: tuple[BadRowSample, ...] = ()


@dataclasses.dataclass(frozen=True)
class JobSummary(Record):
    """A finished job's ``summary.json``: what it trained, how fast, where the time went, and why."""

    name: str
    steps: int = 0
    tokens: int = 0
    samples: int = 0
    final_loss: float | None = None
    initial_eval_loss: float | None = None
    eval_loss: float | None = None
    initial_eval_token_accuracy: float | None = None
    eval_token_accuracy: float | None = None
    best_step: int | None = None
    """The step of the best evaluation (``train.early_stopping_metric``), when evaluation ran."""
    adapter_step: int | None = None
    """The step whose weights ``adapter/`` holds (``output.adapter``: the best step's, or the last's)."""
    best_eval_loss: float | None = None
    stopped_early: str | None = None
    eval_samples: SamplesAt | None = None
    wall_time_s: float = 0.0
    time_to_first_step_s: float | None = None
    tokens_per_s: float = 0.0
    """Tokens over the whole wall time, start-up included."""
    steady_tokens_per_s: float = 0.0
    mfu: float | None = None
    gpu_mem_peak_gb: float | None = None
    layout: str | None = None
    quantized_layers: int | None = None
    kernels: str | None = None
    attention: str | None = None
    quantized_base: str | None = None
    micro_batch: str | None = None
    worker: str | None = None
    restarts: int = 0
    reported_steps: tuple[int, ...] = ()
    timing: Timing = dataclasses.field(default_factory=Timing)
    efficiency: Efficiency = dataclasses.field(default_factory=Efficiency)
    diagnosis: tuple[Finding, ...] = ()
    """Most costly first; the first is the ``bottleneck``."""
    bottleneck: str | None = None
    verdict: str = ""
    adapter_dir: str = ""
    adapter_notes: tuple[str, ...] = ()
    """What to know before serving the adapter elsewhere (``ray_jobs.model.serving_notes``)."""
    caches: Caches = dataclasses.field(default_factory=Caches)
    data_quality: DataQuality | None = None
    spec: dict[str, Any] = dataclasses.field(default_factory=dict)
    """The spec as run (``FineTuneSpec.to_dict``)."""

    def replace(self, **changes: Any) -> JobSummary:
        return dataclasses.replace(self, **changes)
