"""Typed records that cross process boundaries: built on one side, read by attribute on the other.

Every record is a frozen dataclass that travels as its :meth:`~Record.to_dict` (Ray, ``metrics.jsonl``,
``summary.json`` and the service's store carry plain JSON) and is read back with
:meth:`~Record.from_dict`. Nothing on the reading side looks a value up by a string key.

| record           | made by                          | read by                                              |
|------------------|----------------------------------|------------------------------------------------------|
| :class:`StepRecord` | every Ray Train worker (``ray_jobs.observe.metrics``) | the profile, the diagnosis, the picture, the benchmarks |
| :class:`Progress`   | rank 0, at each ``ray.train.report`` (``ray_jobs.train.loop``) | the driver, the trackers, the wire ``Progress`` (``convert``), the CLI |
| :class:`Finding`    | the diagnosis (``ray_jobs.observe.diagnosis``) | the summary, the wire ``Diagnosis``, the CLI           |
| :class:`JobSummary` | the driver at the end (``ray_jobs.summary``) | ``summary.json``, the service's ``Job.summary_json``, the CLI, the trackers, the picture |
| :class:`JobPhase`, :class:`StateChange`, :class:`Failure` | the driver; the service's store; Ray Train's controller | the CLI, the reconciler, the wire |

What preparing a job's data and model cost (the cache fill's times, the data's quality) is in
``rayft_contract.data_records``. Every record is a :class:`~rayft_contract._record.Record`: its ``from_dict``
reads what a newer or an older job wrote.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from rayft_contract._record import Record
from rayft_contract.data_records import Caches, DataQuality
from rayft_contract.phases import Phase

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
    collector_s: float = 0.0
    """Seconds Python's garbage collector ran during the step, on the worker that recorded it. Inside the phases, not
    beside them: a collection holds the GIL, so the step's thread waits in whichever phase it was (``ray_jobs.observe
    .collector``)."""
    full_collections: int = 0
    """Of those collections, the full ones (the oldest generation's): the ones that walk every object not frozen."""
    waits: int = 0
    """Times the thread that ran the step stopped to wait: a lock, the GIL another thread held, a read, a blocking GPU
    sync (its voluntary context switches; 0 where the OS does not count them a thread)."""
    preemptions: int = 0
    """Times the OS took that thread's CPU for another thread or process (its involuntary context switches)."""
    process_cpu_s: float = 0.0
    """CPU seconds the worker's process used during the step, all its threads (the step's, the data reader's, Ray's)."""
    host_busy: float = 0.0
    """How busy the host's CPUs were during the step, as a share of all its cores, every process counted."""
    thread_cpu_s: float = 0.0
    """CPU seconds of the thread that ran the step: its Python and the forward's kernel launches, and its spin while it
    waits for the GPU (CUDA spins by default). A GPU's backward is launched from autograd's own thread, which
    ``process_cpu_s`` counts and this does not."""
    device_allocs: int = 0
    """Times PyTorch's caching allocator asked the GPU's driver for memory during the step (``cudaMalloc``); a steady
    step reuses what it cached and asks for none. 0 on a CPU."""
    alloc_retries: int = 0
    """Times an allocation found no room, freed every cached block and tried again: each one waits for the GPU."""

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
    """What the FLOPs formula needs (``ray_jobs.observe.profile.step_flops``), read from the model before it is wrapped."""

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
    """``liger (rope, ...)`` or ``none (why)`` (``ray_jobs.train.kernels``), then what ``lora.fused`` and ``model.compile``
    add when they are on."""
    attention: str = ""
    """The attention kernel the worker loaded the model with (``model.attn_implementation``, ``auto`` resolved)."""
    quantized_base: str = ""
    """How the quantized base came to be: quantized, or read from the node's cache (``quantization.cache``)."""
    micro_batch: str = ""
    """The micro-batch trained with, and why if it is not the spec's (``ray_jobs.train.memory``)."""
    worker: str = ""
    """Which worker trained: Ray Train's, started for the job, or a warm one (``ray_jobs.warm.pool``)."""


@dataclasses.dataclass(frozen=True)
class SetupTimes(Record):
    """How a worker's setup went, sent once with its first report after setup (``ray_jobs.observe.profile``)."""

    worker_start_ts: float
    """When the training function began on this worker."""
    process_start_ts: float | None = None
    """When this worker's process was created (before the run, if Ray had it started already)."""
    model_load_s: float = 0.0
    compile_wait_s: float = 0.0
    """Waiting, after the base's load, for the kernels being compiled ahead (``ray_jobs.train.compile_ahead``)."""
    resume_s: float = 0.0
    first_eval_s: float = 0.0
    loop_start_ts: float | None = None


@dataclasses.dataclass(frozen=True)
class Sample(Record):
    """One held-out prompt, its reference answer and what the model answered (``ray_jobs.train.samples``)."""

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

    @staticmethod
    def reason_of(error: BaseException, limit: int = 1000) -> str:
        """One line that says what failed: the first line of the error that caused ``error``.

        Ray Train's ``WorkerGroupError`` says only "Training failed due to worker errors:" on its first line,
        which became the job's message, so a team whose LoRA matched no module read that and nothing more;
        its ``worker_failures`` hold what the ranks raised (the lowest rank's is given). A ``ControllerError``
        holds its ``controller_failure``, and a Ray task's error (a warm worker's) its ``cause``. Read by
        attribute, so that this module imports nothing of Ray."""
        prefix = ""
        if worker_failures := getattr(error, "worker_failures", None):
            rank = min(worker_failures)
            prefix, error = f"rank {rank}: ", worker_failures[rank]
        for attribute in ("controller_failure", "cause"):
            if isinstance(inner := getattr(error, attribute, None), BaseException):
                error = inner
        words = str(error).strip().splitlines()
        said = f"{type(error).__name__}: {words[0]}" if words else type(error).__name__
        return (prefix + said)[:limit]


# -- the driver's findings and summary -------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Finding(Record):
    """A bottleneck the diagnosis found (``ray_jobs.observe.diagnosis``), with the fix in the spec's field names."""

    kind: str
    message: str
    cost_s: float
    """Seconds this problem cost (what ranks the findings)."""


@dataclasses.dataclass(frozen=True)
class Efficiency(Record):
    """Steady-state throughput, MFU/HFU, padding share and memory (``ray_jobs.observe.profile``)."""

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
    collector_s: float = 0.0
    """Seconds Python's garbage collector ran inside the steady steps (:attr:`StepRecord.collector_s`)."""
    full_collections: int = 0


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
    """What to know before serving the adapter elsewhere (``ray_jobs.train.model.serving_notes``)."""
    caches: Caches = dataclasses.field(default_factory=Caches)
    data_quality: DataQuality | None = None
    spec: dict[str, Any] = dataclasses.field(default_factory=dict)
    """The spec as run (``FineTuneSpec.to_dict``)."""

    def replace(self, **changes: Any) -> JobSummary:
        return dataclasses.replace(self, **changes)
