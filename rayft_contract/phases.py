"""Where a job's time goes: the one list of phases that the job, its report and the CLI all read.

Every row of a job's phase table (``summary["timing"]["phases"]``) is a :class:`Phase`, in the order the
table shows it, carrying its label and the group its ``report.png`` bar colours it by. The rows add up
to the job's wall time; ``other`` is what no phase covers, in the table and in the picture alike.
"""

from __future__ import annotations

from enum import StrEnum


class Group(StrEnum):
    """The few colours of ``report.png``'s "where the time went" bar."""

    STARTUP = "startup"
    WARMUP = "warm-up"
    DATA_WAIT = "data wait"
    COMPUTE = "compute"
    CHECKPOINT = "checkpoint"
    EVAL = "eval"
    FINISH = "finish"
    OTHER = "other"


class Phase(StrEnum):
    """One row of the phase table. ``in_step``: timed inside every training step (``ray_jobs.observe.metrics``)."""

    label: str
    group: Group
    in_step: bool

    def __new__(cls, value: str, label: str, group: Group, in_step: bool = False) -> Phase:
        member = str.__new__(cls, value)
        member._value_ = value
        member.label, member.group, member.in_step = label, group, in_step
        return member

    PREFLIGHT = "preflight", "preflight checks", Group.STARTUP
    CONNECT = "connect", "connect to Ray", Group.STARTUP
    MODEL_FETCH = "model_fetch", "model fetch", Group.STARTUP
    DATA_PREPARE = "data_prepare", "data prepare (cache lookup; tokenize when streaming)", Group.STARTUP
    DATA_FILL_START = "data_fill_start", "cache fill: start (tokenizer actors, first reads)", Group.STARTUP
    DATA_FILL_STREAM = "data_fill_stream", "cache fill: read, template, tokenize, pack", Group.STARTUP
    DATA_FILL_WRITE = "data_fill_write", "cache fill: write the entry", Group.STARTUP
    TRAINER_SETUP = "trainer_setup", "trainer setup", Group.STARTUP
    TRACKING = "tracking", "trackers start (TensorBoard, MLflow, W&B): the wait for them, opened beside the data", Group.STARTUP
    WORKER_LAUNCH = "worker_launch", "worker launch (controller, placement, worker processes)", Group.STARTUP
    WORKER_START = "worker_start", "worker start (imports, process group)", Group.STARTUP
    MODEL_LOAD = "model_load", "model load", Group.STARTUP
    COMPILE_WAIT = "compile_wait", "waiting for the kernels compiled ahead", Group.STARTUP
    RESUME = "resume", "resume from checkpoint", Group.STARTUP
    FIRST_EVAL = "first_eval", "first evaluation", Group.EVAL
    WORKER_SETUP = "worker_setup", "worker setup", Group.STARTUP
    FIRST_BATCH = "first_batch", "first batch", Group.STARTUP
    WARMUP_STEPS = "warmup_steps", "warm-up steps", Group.WARMUP
    DATA_WAIT = "data_wait", "data wait", Group.DATA_WAIT, True
    H2D = "h2d", "host to device", Group.COMPUTE, True
    FORWARD_BACKWARD = "forward_backward", "forward + backward", Group.COMPUTE, True
    OPTIMIZER = "optimizer", "optimizer", Group.COMPUTE, True
    CHECKPOINT = "checkpoint", "checkpoint (the copy to the CPU; written on a thread meanwhile)", Group.CHECKPOINT, True
    CHECKPOINT_WAIT = "checkpoint_wait", "checkpoint: waiting for an earlier write", Group.CHECKPOINT, True
    BASE_KEEP_WAIT = "base_keep_wait", "last step: waiting for the quantized base's write to the node's cache", Group.FINISH, True
    EVAL = "eval", "evaluation", Group.EVAL, True
    REPORT = "report", "report", Group.FINISH, True
    PROFILER = "profiler", "profiler", Group.FINISH, True
    STEP_OTHER = "step_other", "step, untimed", Group.COMPUTE
    SHUTDOWN = "shutdown", "shutdown", Group.FINISH  # rank 0's last report to its last event passed on: the teardown
    EXPORT = "export", "export adapter", Group.FINISH
    WRITE_REPORTS = "write_reports", "write reports", Group.FINISH
    OTHER = "other", "other", Group.OTHER


STEP_PHASES: tuple[Phase, ...] = tuple(p for p in Phase if p.in_step)
"""What the loop times inside each step, in the order a step runs them."""
