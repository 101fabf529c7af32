"""The spec's sections (``model``, ``quantization``, ``lora``, ``data``, ``train``, ``scaling``, ``output``,
``tracking``): frozen dataclasses with a default and a docstring on every field, each validating itself in
``__post_init__``. :class:`~rayft_contract.spec.FineTuneSpec` holds one of each and checks what spans sections.
"""

from __future__ import annotations

import typing
from dataclasses import dataclass
from typing import Literal

from rayft_contract.spec_parse import check, positive

QuantMode = Literal["nf4", "int8", "none"]
DType = Literal["bfloat16", "float16", "float32"]
Kernels = Literal["auto", "liger", "none"]
DataFormat = Literal["auto", "alpaca", "chat", "sharegpt", "prompt_completion", "text"]
Schedule = Literal["cosine", "linear", "constant"]
EvalMetric = Literal["eval_loss", "eval_token_accuracy"]
AdapterChoice = Literal["best", "last"]
Strategy = Literal["ddp", "fsdp"]
Overlong = Literal["truncate", "drop"]
WandbMode = Literal["offline", "online"]


STEPS_MAX = 10_000_000
"""Optimizer steps, and step intervals: a year of 3 steps a second."""


@dataclass(frozen=True)
class ModelSpec:
    """The base model to adapt."""

    path: str = ""
    """A local directory (holding ``config.json``) or a hub id (``org/name``, through the hub cache)."""
    revision: str | None = None
    """Hub revision (branch, tag or commit) when ``path`` is a hub id."""
    dtype: DType = "bfloat16"
    """Dtype of the frozen base weights and of autocast. ``float32`` is for CPU smoke runs."""
    attn_implementation: str = "auto"
    """Attention kernel passed to transformers. ``auto``: ``flex_attention`` on a CUDA GPU when rows are packed (its
    block mask skips the blocks where one packed example would see another, which SDPA computes and masks; on an
    H200 the 7B preset's attention took 0.31 s a step instead of 0.92, +12% tokens/s, the same loss at every step;
    its kernels compile in the first step, about 30 s), ``sdpa`` elsewhere. Or a name transformers knows: ``sdpa``,
    ``flex_attention`` (GPUs only: it has no backward on CPU), ``flash_attention_2``, ``eager``."""
    kernels: Kernels = "auto"
    """Fused Triton kernels (Liger) for RMSNorm, SwiGLU, RoPE and the loss, which then never materializes the
    logits. ``auto``: on where they run (a CUDA GPU, liger-kernel installed, a model family Liger knows),
    off elsewhere with the reason in the summary; ``liger``: on, or the job fails saying why; ``none``: off.
    Measured on an H200 (``bench/RESULTS.md``)."""
    compile: bool = False
    """``torch.compile`` each decoder layer (inductor): fewer, fused kernels where eager PyTorch launches about
    40,000 a step on the 7B preset. The first steps pay the compile (tens of seconds, cached per node for the next
    job). Measured on an H200 in ``bench/RESULTS.md``."""

    def __post_init__(self) -> None:
        check(bool(self.path.strip()), "model.path", "is required: a local model directory or a hub id")
        check(self.dtype in typing.get_args(DType), "model.dtype", f"must be one of {typing.get_args(DType)}")
        kernels = typing.get_args(Kernels)
        check(self.kernels in kernels, "model.kernels", f"must be one of {kernels}, got {self.kernels!r}")


@dataclass(frozen=True)
class QuantizationSpec:
    """How the frozen base is stored. QLoRA is ``nf4`` (the default)."""

    mode: QuantMode = "nf4"
    """``nf4`` (4-bit NormalFloat, QLoRA), ``int8`` (LLM.int8) or ``none`` (base kept in ``model.dtype``)."""
    double_quant: bool = True
    """Quantize the 4-bit scales too: about 0.4 bit/param saved, no measurable speed cost."""
    cache: bool = False
    """Keep the NF4 base, once quantized, in the node's model cache (``$RAYFT_CACHE_DIR/models``), so that a later job
    with the same base and settings reads it instead of quantizing again (``ray_jobs.cache.quantized``; 3.9 GB for a
    7B base, written on a thread from after the first job's first step: 2.3-3.0 s on an H100, costing a loop of steps
    beside it 0.15-0.22 s). Exact: on CPU the same tensors and logits; on an H100 the 7B preset's loss the same to the
    last digit in every run that kept or read it. Its gain there, through the service without warm workers, was 2-5 s
    of a job's 36-42 s to the first step on some hosts, and within the host's drift on two others (0.6-1.2 s of 29 s;
    ``bench/RESULTS.md``). A read takes 0.96 s of a worker's load against 2.5 s to quantize on an H100, and on a cached
    dataset a one-GPU job's driver waits for its early worker's load, so the read is on the path to the first step.
    Off here, where a spec may name any base (each kept one takes its size again on every node's disk); on in the 7B
    GPU presets, which say why. The summary's worker line gives the load's seconds. Not under FSDP."""
    fp8: bool = False
    """Run the frozen base's matmuls (its forward, and the gradient through it) in FP8 with one scale per row, on
    GPUs with FP8 tensor cores (Hopper, Ada); the adapter stays bf16 (``ray_jobs.train.fp8``). Trades precision for
    speed (on an H200, +26% tokens/s and a loss 0.5% higher at equal steps), so off here and on in the 7B GPU presets,
    which say so. Needs ``lora.fused`` (its forward carries it) and an ``nf4`` or unquantized base, not
    FSDP. Holds the base in FP8 too, 2 bytes a parameter (13 GB for a 7B)."""

    def __post_init__(self) -> None:
        modes = typing.get_args(QuantMode)
        check(self.mode in modes, "quantization.mode", f"must be one of {modes}, got {self.mode!r}")


@dataclass(frozen=True)
class LoraSpec:
    """The LoRA adapter trained on top of the frozen base (PEFT)."""

    r: int = 16
    """Rank of the update matrices."""
    alpha: int = 32
    """Scaling numerator: the update is scaled by ``alpha / r``."""
    dropout: float = 0.0
    """Dropout on the adapter input. 0.05 costs about 5% speed and a copy of each adapter input."""
    target_modules: tuple[str, ...] = ("all-linear",)
    """Module names to adapt, each a whole name or its last dotted parts (``q_proj``, ``self_attn.q_proj``), PEFT's rule;
    ``all-linear`` adapts every linear layer but the output head. Checked against the base's weight files before the
    job starts (``ray_jobs.cache.model_files``): a name that matches no layer with a weight matrix fails the job in
    its first second, with the name it may have meant."""
    modules_to_save: tuple[str, ...] = ()
    """Modules trained in full and saved with the adapter (e.g. ``embed_tokens``, ``lm_head``); each must end the name
    of a module of the base (checked as ``target_modules`` are)."""
    fused: bool = True
    """Add each adapter's update inside its second matmul (one ``addmm``: ``base(x) + scale * B(A(x))``) instead of
    PEFT's copy, multiply and add over every adapted layer's output, 13% of the 7B preset's GPU time on an H200
    (``ray_jobs.train.lora_fused``). The same weights and adapter files. Measured there: a step 3.94 -> 3.73 s (+6%
    tokens/s), the same peak memory, the loss equal at all 12 steps (``bench/RESULTS.md``). ``false``: PEFT's own
    forward."""

    def __post_init__(self) -> None:
        positive(self.r, "lora.r", at_most=4096)
        positive(self.alpha, "lora.alpha", at_most=65536)
        check(0.0 <= self.dropout < 1.0, "lora.dropout", f"must be in [0, 1), got {self.dropout!r}")
        check(len(self.target_modules) > 0, "lora.target_modules", "needs at least one name, or 'all-linear'")


@dataclass(frozen=True)
class DataSpec:
    """Where the training data comes from and how it becomes token blocks."""

    path: str = ""
    """A file, directory, glob or ``s3://`` prefix of JSONL/JSON/CSV/Parquet files (``.gz``/``.zst`` too)."""
    format: DataFormat = "auto"
    """Row layout; ``auto`` detects it from the columns (see ``ray_jobs.data.formats``)."""
    max_seq_len: int = 2048
    """Tokens per training row. Longer examples are truncated or dropped (``overlong``), and counted."""
    packing: bool = True
    """Pack several examples into each row (attention never crosses examples). Off pads each example."""
    train_on_completions_only: bool = True
    """Mask prompt, system and user tokens out of the loss; train only on the answers."""
    chat_template: str | None = None
    """A Jinja chat template overriding the tokenizer's; ``None`` uses the tokenizer's or ChatML."""
    val_fraction: float = 0.02
    """Share of the rows of ``path`` held out for evaluation, chosen by a stable hash of the row. Not used
    when ``val_path`` is set."""
    val_path: str = ""
    """A validation set of its own: a file, directory, glob, ``s3://`` prefix or hub dataset, in any format
    ``path`` accepts (under ``format: auto`` its format is detected from its own first row). Set, every row
    of ``path`` trains and ``val_fraction`` is not used. Empty: ``val_fraction`` of ``path`` is held out."""
    tokenize_workers: int = 2
    """Ray Data CPU workers (actors) that template, tokenize and pack, ahead of the trainers."""
    tokenize_batch_size: int = 256
    """Rows per tokenization batch. Each batch leaves at most one part-filled packed row."""
    prefetch_batches: int = 4
    """Micro-batches each trainer prefetches from a Ray Data stream (streaming mode, or a local cache on
    another node). A cache the trainer can open itself is read one window ahead instead."""
    overlong: Overlong = "truncate"
    """Examples longer than ``max_seq_len``: ``truncate`` keeps their start; ``drop`` skips them as bad rows."""
    max_bad_row_frac: float = 0.01
    """Bad rows (unparsable, missing fields, empty answers, dropped overlong) up to this share are skipped
    and reported; above it the job fails with the report. 0 makes any bad row fatal."""
    cache: bool = True
    """Tokenize once into the dataset cache, then train from it; later jobs with the same data, tokenizer
    and settings skip download and tokenization. Off: tokenize while training (streaming), every run."""
    cache_uri: str | None = None
    """Dataset cache root. Default ``$RAYFT_CACHE_DIR/datasets`` (``~/.cache/rayft``) on the driver's node;
    an ``s3://`` prefix shares entries across nodes and jobs (use it on multi-node clusters)."""
    shuffle: bool = True
    """Train on the rows in a new random order each epoch, derived from ``train.seed``; a resumed run
    continues the same order from the same row. Off: the data's own order (curricula), every epoch."""
    shuffle_buffer_rows: int = 4096
    """How many packed rows are mixed at once. Cache: the rows of random windows of this many rows
    (whole cache files) are shuffled together, windows in a random order. Streaming: each trainer's
    shuffle buffer, which must fill before the first step. Larger mixes better and holds more memory
    (``max_seq_len`` x 12 bytes per row)."""

    def __post_init__(self) -> None:
        check(bool(self.path.strip()), "data.path", "is required: a JSONL, JSON or Parquet file or directory")
        formats = typing.get_args(DataFormat)
        check(self.format in formats, "data.format", f"must be one of {formats}, got {self.format!r}")
        check(self.max_seq_len >= 8, "data.max_seq_len", f"must be >= 8 tokens, got {self.max_seq_len!r}")
        positive(self.max_seq_len, "data.max_seq_len", at_most=1 << 20)
        check(0.0 <= self.val_fraction < 0.5, "data.val_fraction", f"must be in [0, 0.5), got {self.val_fraction!r}")
        if self.val_path:
            check(
                self.val_path.startswith(("s3://", "hf://datasets/")) or "://" not in self.val_path,
                "data.val_path",
                f"must be a local path, an s3:// prefix or hf://datasets/org/name, got {self.val_path!r}",
            )
            check(
                self.val_path != self.path,
                "data.val_path",
                "is data.path itself, so the same rows would train and validate: point it at a held-out set, "
                "or leave it empty to hold out data.val_fraction of data.path",
            )
        positive(self.tokenize_workers, "data.tokenize_workers", at_most=1024)
        positive(self.tokenize_batch_size, "data.tokenize_batch_size", at_most=65536)
        check(0 <= self.prefetch_batches <= 256, "data.prefetch_batches", f"must be in [0, 256], got {self.prefetch_batches!r}")
        positive(self.shuffle_buffer_rows, "data.shuffle_buffer_rows", at_most=1 << 24)
        overlongs = typing.get_args(Overlong)
        check(self.overlong in overlongs, "data.overlong", f"must be one of {overlongs}, got {self.overlong!r}")
        check(0.0 <= self.max_bad_row_frac <= 1.0, "data.max_bad_row_frac", f"must be in [0, 1], got {self.max_bad_row_frac!r}")
        check(
            self.cache_uri is None or self.cache_uri.startswith("s3://") or "://" not in self.cache_uri,
            "data.cache_uri",
            f"must be a local directory or an s3:// prefix, got {self.cache_uri!r}",
        )

    @property
    def held_out(self) -> bool:
        """Whether the job has an eval split: ``val_path``, or ``val_fraction`` of ``path``."""
        return bool(self.val_path) or self.val_fraction > 0


@dataclass(frozen=True)
class TrainSpec:
    """The optimisation loop."""

    max_steps: int | None = None
    """Optimizer steps to run. Set it to stream data into training; ``None`` runs ``epochs``."""
    epochs: int = 1
    """Passes over the data when ``max_steps`` is unset (the dataset is tokenized up front to count steps)."""
    micro_batch_size: int = 4
    """Rows per forward pass on each worker."""
    global_batch_size: int | None = None
    """Rows per optimizer step over all workers; a multiple of micro_batch_size x workers.
    ``None`` means no gradient accumulation."""
    learning_rate: float = 2e-4
    """Peak learning rate of AdamW."""
    lr_schedule: Schedule = "cosine"
    """Decay after warmup: ``cosine`` or ``linear`` to 0, or ``constant`` (transformers' schedules of those names)."""
    warmup_steps: int = 0
    """Linear warmup steps from 0 to the peak learning rate."""
    min_lr_ratio: float = 0.0
    """Cosine only: the floor the learning rate decays to, as a share of the peak (transformers'
    ``cosine_with_min_lr``; 0.1 is a common choice). 0: decay to zero."""
    weight_decay: float = 0.0
    """AdamW decoupled weight decay."""
    max_grad_norm: float | None = 1.0
    """Gradient clipping norm; ``None`` disables clipping."""
    seed: int = 42
    """Seed for adapter initialisation."""
    gradient_checkpointing: bool = False
    """Recompute activations in backward: 5-7x less activation memory, about 30% slower."""
    fit_memory: bool = True
    """Before the first step, run each micro-batch in as many pieces as the GPU memory left after the model
    holds (and, for one worker, turn gradient checkpointing on if even one row a piece would not fit), from
    an estimate of its activations (``ray_jobs.train.memory.plan``); the global batch stays. ``false``: run
    ``micro_batch_size`` as it is (an out-of-memory step still halves it once, for one worker)."""
    log_every: int = 10
    """Report metrics every N steps."""
    eval_every: int | None = None
    """Evaluate every N steps (and always at the end); ``None`` only at the end."""
    checkpoint_every: int = 100
    """Save a resumable checkpoint every N steps."""
    max_failures: int = 1
    """Worker-group restarts allowed; each resumes from the last checkpoint."""
    early_stopping_patience: int | None = None
    """Stop after this many evaluations in a row without a better ``early_stopping_metric`` (``None``: train
    every step). Needs ``eval_every`` and a validation split. With any evaluation, the best step's adapter
    is kept (``output.adapter`` says which one is exported as ``adapter/``)."""
    early_stopping_min_delta: float = 0.0
    """How much better (a lower loss, a higher accuracy) an evaluation must be to count as better."""
    early_stopping_metric: EvalMetric = "eval_loss"
    """What makes an evaluation the best: ``eval_loss`` (lower) or ``eval_token_accuracy`` (higher)."""
    eval_samples: int = 3
    """Held-out prompts answered at every evaluation, beside their references (``samples.jsonl``, and the
    first and last in the summary); 0: none."""
    sample_prompts: tuple[str, ...] = ()
    """Prompts of your own (a user turn each, templated as in training) answered at every evaluation after
    the held-out ones; they have no reference: what the model says is the point."""

    def __post_init__(self) -> None:
        positive(self.max_steps, "train.max_steps", allow_none=True, at_most=STEPS_MAX)
        positive(self.epochs, "train.epochs", at_most=1000)
        positive(self.micro_batch_size, "train.micro_batch_size", at_most=4096)
        positive(self.global_batch_size, "train.global_batch_size", allow_none=True, at_most=1 << 20)
        positive(self.learning_rate, "train.learning_rate", at_most=1.0)
        schedules = typing.get_args(Schedule)
        check(self.lr_schedule in schedules, "train.lr_schedule", f"must be one of {schedules}")
        check(0 <= self.min_lr_ratio < 1, "train.min_lr_ratio", f"must be in [0, 1), got {self.min_lr_ratio!r}")
        check(
            self.min_lr_ratio == 0 or self.lr_schedule == "cosine",
            "train.min_lr_ratio",
            "applies to lr_schedule: cosine only; set it to 0 or the schedule to cosine",
        )
        check(0 <= self.warmup_steps <= STEPS_MAX, "train.warmup_steps", f"must be in [0, {STEPS_MAX}]")
        check(0 <= self.weight_decay <= 10, "train.weight_decay", "must be in [0, 10]")
        positive(self.max_grad_norm, "train.max_grad_norm", allow_none=True, at_most=1e6)
        check(0 <= self.seed < 2**32, "train.seed", f"must be in [0, 2**32), got {self.seed!r}")
        positive(self.log_every, "train.log_every", at_most=STEPS_MAX)
        positive(self.eval_every, "train.eval_every", allow_none=True, at_most=STEPS_MAX)
        positive(self.checkpoint_every, "train.checkpoint_every", at_most=STEPS_MAX)
        check(0 <= self.max_failures <= 100, "train.max_failures", f"must be in [0, 100], got {self.max_failures!r}")
        positive(self.early_stopping_patience, "train.early_stopping_patience", allow_none=True, at_most=10_000)
        check(0 <= self.eval_samples <= 32, "train.eval_samples", f"must be in [0, 32], got {self.eval_samples!r}")
        metrics = typing.get_args(EvalMetric)
        check(self.early_stopping_metric in metrics, "train.early_stopping_metric", f"must be one of {metrics}")
        check(
            len(self.sample_prompts) <= 16 and all(p.strip() and len(p) <= 4096 for p in self.sample_prompts),
            "train.sample_prompts",
            "must be at most 16 prompts, each non-empty and at most 4096 characters",
        )
        delta = self.early_stopping_min_delta
        check(0 <= delta < 100, "train.early_stopping_min_delta", f"must be in [0, 100), got {delta!r}")


@dataclass(frozen=True)
class ScalingSpec:
    """How many Ray Train workers, on what, and how the model is spread over them."""

    num_workers: int = 1
    """Training workers (one per GPU)."""
    use_gpu: bool = True
    """One GPU per worker; ``false`` trains on CPU (tests and smoke runs)."""
    strategy: Strategy = "ddp"
    """``ddp`` replicates the model; ``fsdp`` shards it (for bases that don't fit one GPU)."""
    cpus_per_worker: int = 1
    """CPUs reserved by each training worker; the rest feed Ray Data."""

    def __post_init__(self) -> None:
        positive(self.num_workers, "scaling.num_workers", at_most=1024)
        check(self.strategy in typing.get_args(Strategy), "scaling.strategy", "must be 'ddp' or 'fsdp'")
        positive(self.cpus_per_worker, "scaling.cpus_per_worker", at_most=256)


@dataclass(frozen=True)
class OutputSpec:
    """Where the adapter, checkpoints and summary go."""

    dir: str = "runs"
    """A local directory or an ``s3://`` prefix; the job writes under ``{dir}/{name}``."""
    adapter: AdapterChoice = "best"
    """Which adapter ``adapter/`` holds when the job evaluated: ``best`` (the best evaluation's, by
    ``train.early_stopping_metric``; the last is kept as ``last_adapter/`` when they differ) or ``last``
    (the last step's; the best is kept as ``best_adapter/``). The summary says which step it is."""

    def __post_init__(self) -> None:
        check(bool(self.dir.strip()), "output.dir", "is required: a directory or s3:// prefix")
        choices = typing.get_args(AdapterChoice)
        check(self.adapter in choices, "output.adapter", f"must be one of {choices}, got {self.adapter!r}")


@dataclass(frozen=True)
class TrackingSpec:
    """Experiment tracking while the job runs (TensorBoard scalars are always written, live)."""

    mlflow: bool = False
    """Log the run to MLflow: parameters (the spec), metrics at every report, tags (team, model, dataset)."""
    mlflow_uri: str | None = None
    """MLflow tracking URI. Unset: a file store in the run directory, ``{output.dir}/{name}/mlruns``
    (``mlflow ui --backend-store-uri`` there). Through the service only URIs the operator's policy allows."""
    experiment: str = "rayft"
    """MLflow experiment the run goes under; the run itself is named after the job."""
    wandb: bool = False
    """Log the run to Weights & Biases: the spec as its config, metrics at every report, tags (team, model,
    dataset), named after the job. Written into the run directory (``{output.dir}/{name}/wandb``)."""
    wandb_project: str = "rayft"
    """W&B project the run goes under."""
    wandb_mode: WandbMode = "offline"
    """``offline`` (no network: ``wandb sync`` the run directory's ``wandb/`` later) or ``online`` (needs a
    W&B login or ``WANDB_API_KEY`` where the job's driver runs; ``rayft train`` only: the service refuses it,
    as an API key in a job's environment would be readable by other teams)."""

    def __post_init__(self) -> None:
        check(bool(self.experiment.strip()), "tracking.experiment", "must not be empty")
        check(
            bool(self.wandb_project.strip()) and len(self.wandb_project) <= 128 and "/" not in self.wandb_project,
            "tracking.wandb_project",
            f"must be a W&B project name (1-128 characters, no '/'), got {self.wandb_project!r}",
        )
        modes = typing.get_args(WandbMode)
        check(self.wandb_mode in modes, "tracking.wandb_mode", f"must be one of {modes}, got {self.wandb_mode!r}")
        if self.mlflow_uri is not None:
            check(
                bool(self.mlflow_uri.strip()),
                "tracking.mlflow_uri",
                "must not be empty; leave it unset for the run's own file store",
            )
