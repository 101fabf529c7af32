"""Live tracking on the driver: TensorBoard scalars as the job runs, and MLflow and W&B runs when asked.

Every progress report the trainer forwards passes through :meth:`Trackers.add` as it arrives, so
``tensorboard --logdir runs/`` and the MLflow UI follow a job while it trains (TensorBoard used to be
written once the job had ended). Both write into the run directory: live for a local one, uploaded
with the rest for ``s3://``.

MLflow (``tracking.mlflow``) goes through :class:`mlflow.MlflowClient`, not the fluent API, so no
global "active run" leaks between jobs in one process. The run is named after the job and tagged with
the team, the model, the dataset and the service's job id; the spec's fields are its parameters. The
default store is a directory in the run (``mlruns/``): MLflow 3 keeps that file store only behind
``MLFLOW_ALLOW_FILE_STORE``, which is set for it here; any other URI is the user's (through the
service, one the operator's policy names).

Weights & Biases (``tracking.wandb``) gets its own run object (``reinit="create_new"``), for the same
reason, named and tagged as the MLflow run, with the spec as its config. Offline by default: the run is
written to ``wandb/`` in the run directory, with no network, for ``wandb sync`` later. W&B's own
system-metrics sampler is off: the job reports its GPU memory and speed itself.

Ray's own metrics (:class:`_RayMetrics`) carry the same figures, tagged with the job's id and team, for
the Ray dashboard's Metrics view and for Prometheus, which scrapes every Ray node's export port
(``ray_rayft_job_*``; ``k8s/monitoring``). They need no setting: every job on a Ray cluster has them.
"""

from __future__ import annotations

import dataclasses
import os
import time
from concurrent.futures import Future
from pathlib import Path
from typing import Any

from ray_jobs.observe.profile import step_flops
from rayft_contract.records import JobSummary, Progress
from rayft_contract.spec import FineTuneSpec

SCALARS = (
    "loss",
    "eval_loss",
    "eval_token_accuracy",
    "learning_rate",
    "tokens_per_s",
    "samples_per_s",
    "step_time_s",
    "data_wait_frac",
    "gpu_mem_peak_gb",
)
"""The progress fields tracked at every report, under ``train/`` in TensorBoard and by name in MLflow."""
MAX_PARAM_CHARS = 6000
"""MLflow refuses longer parameter values (a chat template can be longer): they are cut, with a mark."""


@dataclasses.dataclass
class Trackers:
    """The job's live sinks. ``add`` every event, then ``finish`` once (``None`` summary: the job failed)."""

    logdir: Path
    mlflow: _MlflowRun | None = None
    wandb: _WandbRun | None = None
    ray: _RayMetrics | None = None
    _opening: Future[Any] | None = None

    @classmethod
    def open(cls, spec: FineTuneSpec, staging: Path, owner: str) -> Trackers:
        """MLflow's and W&B's runs; TensorBoard's writer comes with :meth:`open_tensorboard`."""
        mlflow = _MlflowRun.start(spec, staging, owner) if spec.tracking.mlflow else None
        wandb = _WandbRun.start(spec, staging, owner) if spec.tracking.wandb else None
        return cls(staging / "tensorboard", mlflow, wandb)

    def open_tensorboard(self) -> None:
        """Start making TensorBoard's writer on a thread: once the workers are starting, not beside the connect.
        tensorboardX imports torch (3.5 s on an H200 host), and an import holds Python's lock: opened beside the
        connect, the connect took 5.3-6.1 s on a warm worker's job instead of 2.3-2.4 s (``bench/RESULTS.md``). While the
        workers start, the driver has nothing else to do; the first report waits for the writer if it must."""
        if self._opening is None:
            from ray_jobs.background import in_background

            self._opening = in_background(_tensorboard, self.logdir)

    @property
    def tensorboard(self) -> Any:
        """The writer (``tensorboardX.SummaryWriter``), made now if :meth:`open_tensorboard` was not called."""
        self.open_tensorboard()
        assert self._opening is not None
        return self._opening.result()

    def join_cluster(self, spec: FineTuneSpec, owner: str) -> None:
        """The job's Ray gauges, once the driver is on the cluster (before it, none would be exported)."""
        self.ray = _RayMetrics.start(spec, owner)

    def add(self, report: Progress) -> None:
        if report.final:  # the closing report: step records only
            return
        values = {key: float(getattr(report, key)) for key in SCALARS if getattr(report, key) is not None}
        for key, value in values.items():
            self.tensorboard.add_scalar(f"train/{key}", value, report.step)
        self.tensorboard.flush()  # followable now, not after tensorboardX's two-minute flush interval
        if self.mlflow is not None:
            self.mlflow.log(values, report.step)
        if self.wandb is not None:
            self.wandb.log(values, report.step)
        if self.ray is not None:
            self.ray.set(report, values)

    def finish(self, summary: JobSummary | None) -> None:
        if summary is not None:
            steps = summary.steps
            for name, seconds in summary.timing.phases.items():
                self.tensorboard.add_scalar(f"time/{name}_s", seconds, steps)
            for key, value in summary.efficiency.to_dict().items():
                if isinstance(value, (int, float)):
                    self.tensorboard.add_scalar(f"efficiency/{key}", value, steps)
            diagnosis = "\n\n".join(f.message for f in summary.diagnosis) or "no bottleneck found"
            self.tensorboard.add_text("diagnosis", diagnosis, steps)
        self.tensorboard.close()
        if self.mlflow is not None:
            self.mlflow.end(summary)
        if self.wandb is not None:
            self.wandb.end(summary)


def _tensorboard(logdir: Path) -> Any:
    from tensorboardX import SummaryWriter

    return SummaryWriter(str(logdir))


RAY_GAUGES = {
    "step": "The job's last reported optimizer step.",
    "loss": "Training loss at the last report.",
    "eval_loss": "Loss on the eval split at the last evaluation.",
    "tokens_per_s": "Real (non-padding) tokens trained per second over the last report's steps, all workers.",
    "mfu": "Model FLOPs utilization over the last report's steps (GPU jobs of a known GPU).",
    "data_wait_frac": "Share of the last report's step time spent waiting for data.",
    "gpu_mem_peak_gb": "Peak GPU memory of rank 0 so far, GB.",
}
"""Ray gauges, each ``rayft_job_<name>`` (``ray_rayft_job_<name>`` in Prometheus), tagged job_id and team."""


@dataclasses.dataclass
class _RayMetrics:
    """The job's figures as Ray gauges, set on the driver at every report.

    Ray keeps a gauge's value while the process that set it lives: the driver's, so a finished job's
    series end with its driver. Tags are the job's id (the service's, else the spec's name) and its team:
    no path or spec, because Prometheus is read more widely than a job's own run directory."""

    gauges: dict[str, Any]
    tags: dict[str, str]

    @classmethod
    def start(cls, spec: FineTuneSpec, owner: str) -> _RayMetrics | None:
        import ray

        if not ray.is_initialized():  # a driver off any cluster (some unit tests): nowhere to export to
            return None
        from ray.util.metrics import Gauge

        gauges = {
            name: Gauge(f"rayft_job_{name}", description=text, tag_keys=("job_id", "team")) for name, text in RAY_GAUGES.items()
        }
        return cls(gauges, {"job_id": os.environ.get("RAYFT_JOB_ID") or spec.name, "team": owner})

    def set(self, report: Progress, values: dict[str, float]) -> None:
        values = {**values, "step": float(report.step)}
        mfu = _live_mfu(report)
        if mfu is not None:
            values["mfu"] = mfu
        for name, value in values.items():
            if name in self.gauges:
                self.gauges[name].set(value, tags=self.tags)


def _live_mfu(report: Progress) -> float | None:
    """MFU over the steps this report covers, by the same FLOP count as the summary's (``profile.step_flops``)."""
    facts = report.facts
    if facts is None or facts.model_shape is None or not facts.peak_flops or not report.step_timing:
        return None
    wall = sum(s.training_wall for s in report.step_timing)
    if wall <= 0:
        return None
    model = sum(step_flops(facts.model_shape, s.tokens, s.attn_ctx)[0] for s in report.step_timing)
    return model / wall / (facts.peak_flops * facts.world_size)


@dataclasses.dataclass
class _MlflowRun:
    client: Any
    run_id: str

    @classmethod
    def start(cls, spec: FineTuneSpec, staging: Path, owner: str) -> _MlflowRun:
        from mlflow import MlflowClient
        from mlflow.entities import Param

        uri = spec.tracking.mlflow_uri or (staging / "mlruns").resolve().as_uri()
        if uri.startswith("file:"):
            os.environ["MLFLOW_ALLOW_FILE_STORE"] = "true"
        client = MlflowClient(tracking_uri=uri)
        experiment = client.get_experiment_by_name(spec.tracking.experiment)
        experiment_id = experiment.experiment_id if experiment else client.create_experiment(spec.tracking.experiment)
        run = client.create_run(experiment_id, run_name=spec.name, tags=_tags(spec, owner))
        params = [Param(key, _param(value)) for key, value in _flat(spec.to_dict()).items()]
        client.log_batch(run.info.run_id, params=params)
        return cls(client, run.info.run_id)

    def log(self, values: dict[str, float], step: int) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        self.client.log_batch(self.run_id, metrics=[Metric(key, value, now, step) for key, value in values.items()])

    def end(self, summary: JobSummary | None) -> None:
        if summary is not None:
            self.log(_final(summary), summary.steps)
        self.client.set_terminated(self.run_id, "FINISHED" if summary is not None else "FAILED")


@dataclasses.dataclass
class _WandbRun:
    run: Any
    last_step: int = -1

    @classmethod
    def start(cls, spec: FineTuneSpec, staging: Path, owner: str) -> _WandbRun:
        import wandb

        tags = [f"{key.removeprefix('rayft.')}={value}"[:MAX_WANDB_TAG] for key, value in _tags(spec, owner).items() if value]
        run = wandb.init(
            project=spec.tracking.wandb_project,
            name=spec.name,
            mode=spec.tracking.wandb_mode,
            dir=str(staging),
            config=_flat(spec.to_dict()),
            tags=tags,
            reinit="create_new",
            settings=wandb.Settings(console="off", x_disable_stats=True, silent=True),
        )
        return cls(run)

    def log(self, values: dict[str, float], step: int) -> None:
        # W&B's steps only go forward: a run resumed from its checkpoint repeats steps it has logged, and W&B
        # would warn and drop them one by one. MLflow and TensorBoard keep both.
        if step > self.last_step:
            self.run.log(values, step=step)
            self.last_step = step

    def end(self, summary: JobSummary | None) -> None:
        if summary is not None:
            self.run.summary.update(_final(summary))
        self.run.finish(exit_code=0 if summary is not None else 1)


MAX_WANDB_TAG = 64
"""W&B refuses longer tags: a long model or data path is cut."""


def _tags(spec: FineTuneSpec, owner: str) -> dict[str, str]:
    return {
        "rayft.team": owner,
        "rayft.model": spec.model.path,
        "rayft.data": spec.data.path,
        "rayft.job_id": os.environ.get("RAYFT_JOB_ID", ""),
    }


def _final(summary: JobSummary) -> dict[str, float]:
    """The job's closing figures, logged once at its last step."""
    final = {
        "steady_tokens_per_s": summary.steady_tokens_per_s,
        "mfu": summary.mfu,
        "wall_time_s": summary.wall_time_s,
        "time_to_first_step_s": summary.time_to_first_step_s,
        "final_eval_loss": summary.eval_loss,
        "final_eval_token_accuracy": summary.eval_token_accuracy,
    }
    return {k: float(v) for k, v in final.items() if v is not None}


def _flat(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            out.update(_flat(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def _param(value: Any) -> str:
    text = str(value)
    return text if len(text) <= MAX_PARAM_CHARS else text[: MAX_PARAM_CHARS - 3] + "..."
