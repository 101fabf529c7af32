from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class JobState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    JOB_STATE_UNSPECIFIED: _ClassVar[JobState]
    QUEUED: _ClassVar[JobState]
    STARTING: _ClassVar[JobState]
    RUNNING: _ClassVar[JobState]
    SUCCEEDED: _ClassVar[JobState]
    FAILED: _ClassVar[JobState]
    CANCELLED: _ClassVar[JobState]

class JobView(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    JOB_VIEW_UNSPECIFIED: _ClassVar[JobView]
    JOB_VIEW_BASIC: _ClassVar[JobView]
    JOB_VIEW_FULL: _ClassVar[JobView]
JOB_STATE_UNSPECIFIED: JobState
QUEUED: JobState
STARTING: JobState
RUNNING: JobState
SUCCEEDED: JobState
FAILED: JobState
CANCELLED: JobState
JOB_VIEW_UNSPECIFIED: JobView
JOB_VIEW_BASIC: JobView
JOB_VIEW_FULL: JobView

class FineTuneSpec(_message.Message):
    __slots__ = ("name", "model", "quantization", "lora", "data", "train", "scaling", "output", "tracking")
    NAME_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    QUANTIZATION_FIELD_NUMBER: _ClassVar[int]
    LORA_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    TRAIN_FIELD_NUMBER: _ClassVar[int]
    SCALING_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_FIELD_NUMBER: _ClassVar[int]
    TRACKING_FIELD_NUMBER: _ClassVar[int]
    name: str
    model: ModelSpec
    quantization: QuantizationSpec
    lora: LoraSpec
    data: DataSpec
    train: TrainSpec
    scaling: ScalingSpec
    output: OutputSpec
    tracking: TrackingSpec
    def __init__(self, name: _Optional[str] = ..., model: _Optional[_Union[ModelSpec, _Mapping]] = ..., quantization: _Optional[_Union[QuantizationSpec, _Mapping]] = ..., lora: _Optional[_Union[LoraSpec, _Mapping]] = ..., data: _Optional[_Union[DataSpec, _Mapping]] = ..., train: _Optional[_Union[TrainSpec, _Mapping]] = ..., scaling: _Optional[_Union[ScalingSpec, _Mapping]] = ..., output: _Optional[_Union[OutputSpec, _Mapping]] = ..., tracking: _Optional[_Union[TrackingSpec, _Mapping]] = ...) -> None: ...

class ModelSpec(_message.Message):
    __slots__ = ("path", "revision", "dtype", "attn_implementation", "kernels", "compile")
    PATH_FIELD_NUMBER: _ClassVar[int]
    REVISION_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    ATTN_IMPLEMENTATION_FIELD_NUMBER: _ClassVar[int]
    KERNELS_FIELD_NUMBER: _ClassVar[int]
    COMPILE_FIELD_NUMBER: _ClassVar[int]
    path: str
    revision: str
    dtype: str
    attn_implementation: str
    kernels: str
    compile: bool
    def __init__(self, path: _Optional[str] = ..., revision: _Optional[str] = ..., dtype: _Optional[str] = ..., attn_implementation: _Optional[str] = ..., kernels: _Optional[str] = ..., compile: _Optional[bool] = ...) -> None: ...

class QuantizationSpec(_message.Message):
    __slots__ = ("mode", "double_quant", "cache", "fp8")
    MODE_FIELD_NUMBER: _ClassVar[int]
    DOUBLE_QUANT_FIELD_NUMBER: _ClassVar[int]
    CACHE_FIELD_NUMBER: _ClassVar[int]
    FP8_FIELD_NUMBER: _ClassVar[int]
    mode: str
    double_quant: bool
    cache: bool
    fp8: bool
    def __init__(self, mode: _Optional[str] = ..., double_quant: _Optional[bool] = ..., cache: _Optional[bool] = ..., fp8: _Optional[bool] = ...) -> None: ...

class LoraSpec(_message.Message):
    __slots__ = ("r", "alpha", "dropout", "target_modules", "modules_to_save", "fused")
    R_FIELD_NUMBER: _ClassVar[int]
    ALPHA_FIELD_NUMBER: _ClassVar[int]
    DROPOUT_FIELD_NUMBER: _ClassVar[int]
    TARGET_MODULES_FIELD_NUMBER: _ClassVar[int]
    MODULES_TO_SAVE_FIELD_NUMBER: _ClassVar[int]
    FUSED_FIELD_NUMBER: _ClassVar[int]
    r: int
    alpha: int
    dropout: float
    target_modules: _containers.RepeatedScalarFieldContainer[str]
    modules_to_save: _containers.RepeatedScalarFieldContainer[str]
    fused: bool
    def __init__(self, r: _Optional[int] = ..., alpha: _Optional[int] = ..., dropout: _Optional[float] = ..., target_modules: _Optional[_Iterable[str]] = ..., modules_to_save: _Optional[_Iterable[str]] = ..., fused: _Optional[bool] = ...) -> None: ...

class DataSpec(_message.Message):
    __slots__ = ("path", "format", "max_seq_len", "packing", "train_on_completions_only", "chat_template", "val_fraction", "val_path", "tokenize_workers", "tokenize_batch_size", "prefetch_batches", "overlong", "max_bad_row_frac", "cache", "cache_uri", "shuffle", "shuffle_buffer_rows")
    PATH_FIELD_NUMBER: _ClassVar[int]
    FORMAT_FIELD_NUMBER: _ClassVar[int]
    MAX_SEQ_LEN_FIELD_NUMBER: _ClassVar[int]
    PACKING_FIELD_NUMBER: _ClassVar[int]
    TRAIN_ON_COMPLETIONS_ONLY_FIELD_NUMBER: _ClassVar[int]
    CHAT_TEMPLATE_FIELD_NUMBER: _ClassVar[int]
    VAL_FRACTION_FIELD_NUMBER: _ClassVar[int]
    VAL_PATH_FIELD_NUMBER: _ClassVar[int]
    TOKENIZE_WORKERS_FIELD_NUMBER: _ClassVar[int]
    TOKENIZE_BATCH_SIZE_FIELD_NUMBER: _ClassVar[int]
    PREFETCH_BATCHES_FIELD_NUMBER: _ClassVar[int]
    OVERLONG_FIELD_NUMBER: _ClassVar[int]
    MAX_BAD_ROW_FRAC_FIELD_NUMBER: _ClassVar[int]
    CACHE_FIELD_NUMBER: _ClassVar[int]
    CACHE_URI_FIELD_NUMBER: _ClassVar[int]
    SHUFFLE_FIELD_NUMBER: _ClassVar[int]
    SHUFFLE_BUFFER_ROWS_FIELD_NUMBER: _ClassVar[int]
    path: str
    format: str
    max_seq_len: int
    packing: bool
    train_on_completions_only: bool
    chat_template: str
    val_fraction: float
    val_path: str
    tokenize_workers: int
    tokenize_batch_size: int
    prefetch_batches: int
    overlong: str
    max_bad_row_frac: float
    cache: bool
    cache_uri: str
    shuffle: bool
    shuffle_buffer_rows: int
    def __init__(self, path: _Optional[str] = ..., format: _Optional[str] = ..., max_seq_len: _Optional[int] = ..., packing: _Optional[bool] = ..., train_on_completions_only: _Optional[bool] = ..., chat_template: _Optional[str] = ..., val_fraction: _Optional[float] = ..., val_path: _Optional[str] = ..., tokenize_workers: _Optional[int] = ..., tokenize_batch_size: _Optional[int] = ..., prefetch_batches: _Optional[int] = ..., overlong: _Optional[str] = ..., max_bad_row_frac: _Optional[float] = ..., cache: _Optional[bool] = ..., cache_uri: _Optional[str] = ..., shuffle: _Optional[bool] = ..., shuffle_buffer_rows: _Optional[int] = ...) -> None: ...

class TrainSpec(_message.Message):
    __slots__ = ("max_steps", "epochs", "micro_batch_size", "global_batch_size", "learning_rate", "lr_schedule", "warmup_steps", "min_lr_ratio", "weight_decay", "max_grad_norm", "seed", "gradient_checkpointing", "fit_memory", "log_every", "eval_every", "checkpoint_every", "max_failures", "early_stopping_patience", "early_stopping_min_delta", "early_stopping_metric", "eval_samples", "sample_prompts")
    MAX_STEPS_FIELD_NUMBER: _ClassVar[int]
    EPOCHS_FIELD_NUMBER: _ClassVar[int]
    MICRO_BATCH_SIZE_FIELD_NUMBER: _ClassVar[int]
    GLOBAL_BATCH_SIZE_FIELD_NUMBER: _ClassVar[int]
    LEARNING_RATE_FIELD_NUMBER: _ClassVar[int]
    LR_SCHEDULE_FIELD_NUMBER: _ClassVar[int]
    WARMUP_STEPS_FIELD_NUMBER: _ClassVar[int]
    MIN_LR_RATIO_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_DECAY_FIELD_NUMBER: _ClassVar[int]
    MAX_GRAD_NORM_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    GRADIENT_CHECKPOINTING_FIELD_NUMBER: _ClassVar[int]
    FIT_MEMORY_FIELD_NUMBER: _ClassVar[int]
    LOG_EVERY_FIELD_NUMBER: _ClassVar[int]
    EVAL_EVERY_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_EVERY_FIELD_NUMBER: _ClassVar[int]
    MAX_FAILURES_FIELD_NUMBER: _ClassVar[int]
    EARLY_STOPPING_PATIENCE_FIELD_NUMBER: _ClassVar[int]
    EARLY_STOPPING_MIN_DELTA_FIELD_NUMBER: _ClassVar[int]
    EARLY_STOPPING_METRIC_FIELD_NUMBER: _ClassVar[int]
    EVAL_SAMPLES_FIELD_NUMBER: _ClassVar[int]
    SAMPLE_PROMPTS_FIELD_NUMBER: _ClassVar[int]
    max_steps: int
    epochs: int
    micro_batch_size: int
    global_batch_size: int
    learning_rate: float
    lr_schedule: str
    warmup_steps: int
    min_lr_ratio: float
    weight_decay: float
    max_grad_norm: float
    seed: int
    gradient_checkpointing: bool
    fit_memory: bool
    log_every: int
    eval_every: int
    checkpoint_every: int
    max_failures: int
    early_stopping_patience: int
    early_stopping_min_delta: float
    early_stopping_metric: str
    eval_samples: int
    sample_prompts: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, max_steps: _Optional[int] = ..., epochs: _Optional[int] = ..., micro_batch_size: _Optional[int] = ..., global_batch_size: _Optional[int] = ..., learning_rate: _Optional[float] = ..., lr_schedule: _Optional[str] = ..., warmup_steps: _Optional[int] = ..., min_lr_ratio: _Optional[float] = ..., weight_decay: _Optional[float] = ..., max_grad_norm: _Optional[float] = ..., seed: _Optional[int] = ..., gradient_checkpointing: _Optional[bool] = ..., fit_memory: _Optional[bool] = ..., log_every: _Optional[int] = ..., eval_every: _Optional[int] = ..., checkpoint_every: _Optional[int] = ..., max_failures: _Optional[int] = ..., early_stopping_patience: _Optional[int] = ..., early_stopping_min_delta: _Optional[float] = ..., early_stopping_metric: _Optional[str] = ..., eval_samples: _Optional[int] = ..., sample_prompts: _Optional[_Iterable[str]] = ...) -> None: ...

class ScalingSpec(_message.Message):
    __slots__ = ("num_workers", "use_gpu", "strategy", "cpus_per_worker")
    NUM_WORKERS_FIELD_NUMBER: _ClassVar[int]
    USE_GPU_FIELD_NUMBER: _ClassVar[int]
    STRATEGY_FIELD_NUMBER: _ClassVar[int]
    CPUS_PER_WORKER_FIELD_NUMBER: _ClassVar[int]
    num_workers: int
    use_gpu: bool
    strategy: str
    cpus_per_worker: int
    def __init__(self, num_workers: _Optional[int] = ..., use_gpu: _Optional[bool] = ..., strategy: _Optional[str] = ..., cpus_per_worker: _Optional[int] = ...) -> None: ...

class OutputSpec(_message.Message):
    __slots__ = ("dir", "adapter")
    DIR_FIELD_NUMBER: _ClassVar[int]
    ADAPTER_FIELD_NUMBER: _ClassVar[int]
    dir: str
    adapter: str
    def __init__(self, dir: _Optional[str] = ..., adapter: _Optional[str] = ...) -> None: ...

class TrackingSpec(_message.Message):
    __slots__ = ("mlflow", "mlflow_uri", "experiment", "wandb", "wandb_project", "wandb_mode")
    MLFLOW_FIELD_NUMBER: _ClassVar[int]
    MLFLOW_URI_FIELD_NUMBER: _ClassVar[int]
    EXPERIMENT_FIELD_NUMBER: _ClassVar[int]
    WANDB_FIELD_NUMBER: _ClassVar[int]
    WANDB_PROJECT_FIELD_NUMBER: _ClassVar[int]
    WANDB_MODE_FIELD_NUMBER: _ClassVar[int]
    mlflow: bool
    mlflow_uri: str
    experiment: str
    wandb: bool
    wandb_project: str
    wandb_mode: str
    def __init__(self, mlflow: _Optional[bool] = ..., mlflow_uri: _Optional[str] = ..., experiment: _Optional[str] = ..., wandb: _Optional[bool] = ..., wandb_project: _Optional[str] = ..., wandb_mode: _Optional[str] = ...) -> None: ...

class Job(_message.Message):
    __slots__ = ("id", "team", "state", "spec", "idempotency_key", "created_at", "updated_at", "ray_submission_id", "message", "last_seq", "summary_json")
    ID_FIELD_NUMBER: _ClassVar[int]
    TEAM_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    SPEC_FIELD_NUMBER: _ClassVar[int]
    IDEMPOTENCY_KEY_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    UPDATED_AT_FIELD_NUMBER: _ClassVar[int]
    RAY_SUBMISSION_ID_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    LAST_SEQ_FIELD_NUMBER: _ClassVar[int]
    SUMMARY_JSON_FIELD_NUMBER: _ClassVar[int]
    id: str
    team: str
    state: JobState
    spec: FineTuneSpec
    idempotency_key: str
    created_at: float
    updated_at: float
    ray_submission_id: str
    message: str
    last_seq: int
    summary_json: str
    def __init__(self, id: _Optional[str] = ..., team: _Optional[str] = ..., state: _Optional[_Union[JobState, str]] = ..., spec: _Optional[_Union[FineTuneSpec, _Mapping]] = ..., idempotency_key: _Optional[str] = ..., created_at: _Optional[float] = ..., updated_at: _Optional[float] = ..., ray_submission_id: _Optional[str] = ..., message: _Optional[str] = ..., last_seq: _Optional[int] = ..., summary_json: _Optional[str] = ...) -> None: ...

class CreateJobRequest(_message.Message):
    __slots__ = ("spec", "idempotency_key", "validate_only")
    SPEC_FIELD_NUMBER: _ClassVar[int]
    IDEMPOTENCY_KEY_FIELD_NUMBER: _ClassVar[int]
    VALIDATE_ONLY_FIELD_NUMBER: _ClassVar[int]
    spec: FineTuneSpec
    idempotency_key: str
    validate_only: bool
    def __init__(self, spec: _Optional[_Union[FineTuneSpec, _Mapping]] = ..., idempotency_key: _Optional[str] = ..., validate_only: _Optional[bool] = ...) -> None: ...

class GetJobRequest(_message.Message):
    __slots__ = ("job_id",)
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    def __init__(self, job_id: _Optional[str] = ...) -> None: ...

class ListJobsRequest(_message.Message):
    __slots__ = ("states", "page_size", "page_token", "view", "team")
    STATES_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    VIEW_FIELD_NUMBER: _ClassVar[int]
    TEAM_FIELD_NUMBER: _ClassVar[int]
    states: _containers.RepeatedScalarFieldContainer[JobState]
    page_size: int
    page_token: str
    view: JobView
    team: str
    def __init__(self, states: _Optional[_Iterable[_Union[JobState, str]]] = ..., page_size: _Optional[int] = ..., page_token: _Optional[str] = ..., view: _Optional[_Union[JobView, str]] = ..., team: _Optional[str] = ...) -> None: ...

class ListJobsResponse(_message.Message):
    __slots__ = ("jobs", "next_page_token")
    JOBS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    jobs: _containers.RepeatedCompositeFieldContainer[Job]
    next_page_token: str
    def __init__(self, jobs: _Optional[_Iterable[_Union[Job, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class CancelJobRequest(_message.Message):
    __slots__ = ("job_id",)
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    def __init__(self, job_id: _Optional[str] = ...) -> None: ...

class GetJobLogsRequest(_message.Message):
    __slots__ = ("job_id", "tail_lines", "from_line")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    TAIL_LINES_FIELD_NUMBER: _ClassVar[int]
    FROM_LINE_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    tail_lines: int
    from_line: int
    def __init__(self, job_id: _Optional[str] = ..., tail_lines: _Optional[int] = ..., from_line: _Optional[int] = ...) -> None: ...

class JobLogs(_message.Message):
    __slots__ = ("job_id", "lines", "lines_before", "lines_after")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    LINES_FIELD_NUMBER: _ClassVar[int]
    LINES_BEFORE_FIELD_NUMBER: _ClassVar[int]
    LINES_AFTER_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    lines: _containers.RepeatedScalarFieldContainer[str]
    lines_before: int
    lines_after: int
    def __init__(self, job_id: _Optional[str] = ..., lines: _Optional[_Iterable[str]] = ..., lines_before: _Optional[int] = ..., lines_after: _Optional[int] = ...) -> None: ...

class WatchJobRequest(_message.Message):
    __slots__ = ("job_id", "after_seq")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    AFTER_SEQ_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    after_seq: int
    def __init__(self, job_id: _Optional[str] = ..., after_seq: _Optional[int] = ...) -> None: ...

class JobEvent(_message.Message):
    __slots__ = ("job_id", "seq", "time", "state", "progress", "phase", "failure", "summary", "diagnosis")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    TIME_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    PROGRESS_FIELD_NUMBER: _ClassVar[int]
    PHASE_FIELD_NUMBER: _ClassVar[int]
    FAILURE_FIELD_NUMBER: _ClassVar[int]
    SUMMARY_FIELD_NUMBER: _ClassVar[int]
    DIAGNOSIS_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    seq: int
    time: float
    state: StateChange
    progress: Progress
    phase: Phase
    failure: Failure
    summary: Summary
    diagnosis: Diagnosis
    def __init__(self, job_id: _Optional[str] = ..., seq: _Optional[int] = ..., time: _Optional[float] = ..., state: _Optional[_Union[StateChange, _Mapping]] = ..., progress: _Optional[_Union[Progress, _Mapping]] = ..., phase: _Optional[_Union[Phase, _Mapping]] = ..., failure: _Optional[_Union[Failure, _Mapping]] = ..., summary: _Optional[_Union[Summary, _Mapping]] = ..., diagnosis: _Optional[_Union[Diagnosis, _Mapping]] = ...) -> None: ...

class StateChange(_message.Message):
    __slots__ = ("state", "message")
    STATE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    state: JobState
    message: str
    def __init__(self, state: _Optional[_Union[JobState, str]] = ..., message: _Optional[str] = ...) -> None: ...

class Progress(_message.Message):
    __slots__ = ("step", "total_steps", "epoch", "loss", "eval_loss", "learning_rate", "tokens_per_s", "samples_per_s", "eta_s", "gpu_mem_peak_gb", "checkpoint", "eval_token_accuracy")
    STEP_FIELD_NUMBER: _ClassVar[int]
    TOTAL_STEPS_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    LOSS_FIELD_NUMBER: _ClassVar[int]
    EVAL_LOSS_FIELD_NUMBER: _ClassVar[int]
    LEARNING_RATE_FIELD_NUMBER: _ClassVar[int]
    TOKENS_PER_S_FIELD_NUMBER: _ClassVar[int]
    SAMPLES_PER_S_FIELD_NUMBER: _ClassVar[int]
    ETA_S_FIELD_NUMBER: _ClassVar[int]
    GPU_MEM_PEAK_GB_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_FIELD_NUMBER: _ClassVar[int]
    EVAL_TOKEN_ACCURACY_FIELD_NUMBER: _ClassVar[int]
    step: int
    total_steps: int
    epoch: int
    loss: float
    eval_loss: float
    learning_rate: float
    tokens_per_s: float
    samples_per_s: float
    eta_s: float
    gpu_mem_peak_gb: float
    checkpoint: bool
    eval_token_accuracy: float
    def __init__(self, step: _Optional[int] = ..., total_steps: _Optional[int] = ..., epoch: _Optional[int] = ..., loss: _Optional[float] = ..., eval_loss: _Optional[float] = ..., learning_rate: _Optional[float] = ..., tokens_per_s: _Optional[float] = ..., samples_per_s: _Optional[float] = ..., eta_s: _Optional[float] = ..., gpu_mem_peak_gb: _Optional[float] = ..., checkpoint: _Optional[bool] = ..., eval_token_accuracy: _Optional[float] = ...) -> None: ...

class Phase(_message.Message):
    __slots__ = ("phase", "detail")
    PHASE_FIELD_NUMBER: _ClassVar[int]
    DETAIL_FIELD_NUMBER: _ClassVar[int]
    phase: str
    detail: str
    def __init__(self, phase: _Optional[str] = ..., detail: _Optional[str] = ...) -> None: ...

class Diagnosis(_message.Message):
    __slots__ = ("kind", "message", "cost_s")
    KIND_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    COST_S_FIELD_NUMBER: _ClassVar[int]
    kind: str
    message: str
    cost_s: float
    def __init__(self, kind: _Optional[str] = ..., message: _Optional[str] = ..., cost_s: _Optional[float] = ...) -> None: ...

class Failure(_message.Message):
    __slots__ = ("errors",)
    class ErrorsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    ERRORS_FIELD_NUMBER: _ClassVar[int]
    errors: _containers.ScalarMap[str, str]
    def __init__(self, errors: _Optional[_Mapping[str, str]] = ...) -> None: ...

class Summary(_message.Message):
    __slots__ = ("json",)
    JSON_FIELD_NUMBER: _ClassVar[int]
    json: str
    def __init__(self, json: _Optional[str] = ...) -> None: ...

class ClaimJobRequest(_message.Message):
    __slots__ = ("job_id", "report_token_sha256")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    REPORT_TOKEN_SHA256_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    report_token_sha256: str
    def __init__(self, job_id: _Optional[str] = ..., report_token_sha256: _Optional[str] = ...) -> None: ...

class ClaimJobResponse(_message.Message):
    __slots__ = ("spec", "team")
    SPEC_FIELD_NUMBER: _ClassVar[int]
    TEAM_FIELD_NUMBER: _ClassVar[int]
    spec: FineTuneSpec
    team: str
    def __init__(self, spec: _Optional[_Union[FineTuneSpec, _Mapping]] = ..., team: _Optional[str] = ...) -> None: ...

class ReportRequest(_message.Message):
    __slots__ = ("job_id", "report_seq", "event")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    REPORT_SEQ_FIELD_NUMBER: _ClassVar[int]
    EVENT_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    report_seq: int
    event: JobEvent
    def __init__(self, job_id: _Optional[str] = ..., report_seq: _Optional[int] = ..., event: _Optional[_Union[JobEvent, _Mapping]] = ...) -> None: ...

class ReportResponse(_message.Message):
    __slots__ = ("stored", "job_ended")
    STORED_FIELD_NUMBER: _ClassVar[int]
    JOB_ENDED_FIELD_NUMBER: _ClassVar[int]
    stored: bool
    job_ended: bool
    def __init__(self, stored: _Optional[bool] = ..., job_ended: _Optional[bool] = ...) -> None: ...
