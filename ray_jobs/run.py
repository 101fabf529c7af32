"""Driving one job: check, connect to Ray, build the data, fit with Ray Train, export the adapter.

``run(spec)`` is what ``rayft train`` and the service's Ray job both call. The output directory
``{output.dir}/{name}`` ends up holding::

    adapter/          PEFT adapter (adapter_config.json, adapter_model.safetensors) + tokenizer
    summary.json      steps, tokens, losses, the phase table, tokens/s, MFU, the diagnosis, caches, bad rows
    samples.jsonl     the model's answers to a few held-out prompts at each evaluation, with the references
    metrics.jsonl     every event of the run (progress reports with per-step timing, failures, diagnoses)
    report.png        loss, tokens/s over time and where the time went (``ray_jobs.observe.visuals``)
    tensorboard/      the same as TensorBoard scalars, written as the job runs
    mlruns/           the MLflow run, when tracking.mlflow is on and no tracking URI is given
    {name}/           Ray Train's run storage (checkpoints); a re-run of an unfinished job resumes here
"""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
import shutil
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path
from typing import Any

from ray_jobs import local_ray, storage
from ray_jobs.background import in_background
from ray_jobs.chaos import NO_CHAOS, Chaos
from ray_jobs.data import preflight
from ray_jobs.export import adapter_tokenizer, export
from ray_jobs.observe.diagnosis import diagnose
from ray_jobs.observe.profile import JobProfile
from ray_jobs.observe.tracking import Trackers
from ray_jobs.summary import summarize
from ray_jobs.train.checkpoint import RunIdentity
from ray_jobs.train.checkpoint import step_of as checkpoint_step
from rayft_contract.data_records import Caches
from rayft_contract.events import Event
from rayft_contract.records import Finding, JobPhase, JobSummary, Progress
from rayft_contract.spec import FineTuneSpec, SpecError

log = logging.getLogger(__name__)

LIVE_FILES = ("metrics.jsonl", "samples.jsonl", "tensorboard")
"""What an ``s3://`` run directory holds while its job runs; the rest arrives when the job ends."""
LIVE_COPY_S = 30.0
"""How often, at most, those are copied up to an ``s3://`` run directory, besides at every checkpoint:
S3 has no append, so each copy rewrites the objects."""
EventSink = Callable[[Event], None]


@dataclasses.dataclass(frozen=True)
class JobResult:
    run_dir: str
    """Local path or ``s3://`` URI of ``{output.dir}/{name}``."""
    adapter_dir: str
    summary: JobSummary
    local_dir: Path | None
    """The run dir itself when it is local; None for ``s3://`` (the staging copy is removed after upload)."""


def run(
    spec: FineTuneSpec,
    *,
    address: str | None = None,
    on_event: EventSink | None = None,
    overwrite: bool = False,
    chaos: Chaos = NO_CHAOS,
    owner: str = "",
    inputs: preflight.DataInputs | None = None,
) -> JobResult:
    """Run ``spec`` to completion on Ray (a local cluster unless ``address``); raise on failure.

    ``owner``: who runs it (the team, through the service; default ``local:<user>``). Checkpoints record
    it with the spec's hash, and a run resumes only its own owner's checkpoints of the same spec.

    ``chaos`` injects failures and slowdowns, for the recovery and diagnosis tests (``ray_jobs.chaos``).

    ``inputs``: the caller's own :func:`preflight.check` of the same spec (``rayft train`` checks before its
    progress view starts), so the data is listed once per job.
    """
    start = time.time()
    profile = JobProfile(start)
    with profile.phase("preflight"):
        inputs = inputs or preflight.check(spec)
        spec = spec.with_absolute_paths()
        run_dir = storage.location(spec.run_dir)
        _claim_run_dir(run_dir, overwrite)
    # Files are written locally, then uploaded when the run dir is remote (s3://).
    staging = Path(run_dir.path) if run_dir.is_local else Path(tempfile.mkdtemp(prefix="rayft-run-"))
    job = _Job(spec, inputs, run_dir, staging, profile, on_event or (lambda event: None), chaos, RunIdentity.of(spec, owner))
    try:
        return job.run(address)
    finally:
        if job.early is not None:  # failed before its lease: the worker holds the job's resources until stopped
            import ray

            ray.kill(job.early)
        if job.opening is not None and job.opening.exception() is None:  # failed while they opened: close them too
            job.trackers = job.opening.result()
        if job.trackers is not None:  # the job failed before its summary: the MLflow run ends FAILED
            job.trackers.finish(None)
        run_dir.upload(staging)
        if not run_dir.is_local:
            shutil.rmtree(staging)


@dataclasses.dataclass
class _Job:
    spec: FineTuneSpec
    inputs: preflight.DataInputs
    run_dir: storage.Location
    staging: Path
    profile: JobProfile
    emit: EventSink
    chaos: Chaos
    identity: RunIdentity
    history: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    """Every event, as ``metrics.jsonl`` holds it."""
    reports: list[Progress] = dataclasses.field(default_factory=list)
    """Rank 0's reports (``progress`` and the closing ``timing``), in order."""
    restarts: int = 0
    diagnosed: set[str] = dataclasses.field(default_factory=set)
    trackers: Trackers | None = None
    """TensorBoard (always), MLflow and W&B (``tracking``), fed as events arrive; closed with the summary."""
    opening: Future[Trackers] | None = None
    """:attr:`trackers` being opened, beside the model fetch, the data and the trainer's set-up."""
    early: Any | None = None
    """The job's own worker (``ray_jobs.warm.early``), starting beside the fetch and the data until the
    trainer's set-up leases it."""
    live_copied: float = 0.0
    """When the live files were last copied to an ``s3://`` run directory (``time.monotonic``)."""

    def run(self, address: str | None) -> JobResult:
        spec, profile, emit = self.spec, self.profile, self.emit
        # MLflow and W&B open beside the connect, fetch, data and set-up; TensorBoard at the fit's start (open_tensorboard).
        self.opening = in_background(Trackers.open, spec, self.staging, self.identity.owner)
        emit(Event("phase", JobPhase("connect").to_dict()))
        with profile.phase("connect"):
            local_ray.connect(address, spec)
            import ray

            from ray_jobs.train.session import latest_in, train_run_name
            from ray_jobs.warm import early as early_worker

            run_folder = self.run_dir.child(train_run_name(spec, self.identity.owner))  # Ray Train's, and warm/
            ray_train_began = any(name.startswith("checkpoint_") for name in run_folder.list_dirs())
            gpus_free = ray.available_resources().get("GPU", 0)
            # Before the driver's own imports below (Ray Train's and Ray Data's, pandas): the worker's imports and its
            # base's load are the path to the first step, and these are not on it.
            self.early = early_worker.start(spec, resumes_ray_train=ray_train_began)  # loads the base meanwhile
            local_ray.quiet_ray_data()
            from ray.util.queue import Queue

            from ray_jobs.cache.models import fetch_model
            from ray_jobs.data.cache import prepare
            from ray_jobs.events import fit_while_forwarding
            from ray_jobs.train import compile_ahead
            from ray_jobs.train.loop import LoopConfig
            from ray_jobs.warm import pool as warm_pool

            ahead, self.early = compile_ahead.launch(spec, gpus_free, self.early)  # a node without the kernels: a copy

        emit(Event("phase", JobPhase("model", f"fetching {spec.model.path}").to_dict()))
        with profile.phase("model_fetch"):
            model = fetch_model(spec.model.path, spec.model.revision)  # the job's one fetch on the driver
        emit(Event("phase", JobPhase("data", f"model: {model.describe()}").to_dict()))
        with profile.phase("data_prepare"):
            prepared = prepare(spec, self.chaos, self.inputs, model)
            total_steps = spec.train.max_steps or _count_steps(spec, prepared)
        if prepared.cache.fill is not None:  # a fill's start, stream and write: rows of their own
            profile.carve("data_prepare", prepared.cache.fill.phases())
        loop = LoopConfig(
            spec,
            total_steps,
            profile.start,
            self.identity,
            has_eval="eval" in prepared.datasets,
            order=prepared.order,
            eval_split=prepared.eval_split,
            chaos=self.chaos,
            compiled_ahead=ahead,
        )

        with profile.phase("trainer_setup"):
            queue = Queue()
            checkpoints = run_folder.child("warm")
            loop = dataclasses.replace(loop, resume_from=latest_in(checkpoints))  # a relaunch of a warm worker's job
            lease = warm_pool.take(spec, queue, fits=not ray_train_began, early=self.early)  # Ray Train resumes what it began
            self.early = None  # the lease's now, or stopped
            on_ray_train = functools.partial(_fit, spec, datasets=prepared.datasets, run_dir=self.run_dir, queue=queue)
        with profile.phase("tracking"):  # what is left of their start
            self.trackers, self.opening = self.opening.result(), None
            self.trackers.join_cluster(spec, self.identity.owner)  # Ray's gauges: after connect, or none are exported
        emit(Event("phase", JobPhase("training", prepared.cache.describe(), total_steps).to_dict()))
        # The driver waits while the workers train: the tokenizer the adapter ships with loads meanwhile.
        tokenizer = in_background(adapter_tokenizer, model.path, spec)
        with (self.staging / "metrics.jsonl").open("a") as metrics_log:
            self.metrics_log = metrics_log
            profile.fit_start = time.time()
            self.trackers.open_tensorboard()  # its import beside the workers' start, not the connect
            fit = functools.partial(warm_pool.fit, lease, loop, prepared.datasets, checkpoints, queue, on_ray_train)
            result = fit_while_forwarding(fit, queue, self.record)
            profile.fit_end = time.time()  # the last event passed on: the table's shutdown ends here
        emit(Event("phase", JobPhase("export").to_dict()))
        with profile.phase("export"):
            ray.kill(queue.actor)
            if result.error is not None:
                raise result.error
            if not profile.steps:  # resumed a run already at its end: nothing trained is not a success
                reached = checkpoint_step(result.checkpoint) if result.checkpoint is not None else None
                where = f"its checkpoint is already at step {reached}" if reached else "no step ran"
                raise NothingTrained(
                    f"trained 0 steps of {total_steps}: {where} in {self.run_dir.uri}; pass --overwrite to start "
                    "over, or use a new name"
                )
            quality = prepared.quality_report()
            quality.check(spec.data.max_bad_row_frac)  # streaming mode learns the final count only now
            export(result.checkpoint, spec, tokenizer.result(), self.staging / "adapter")
        adapter_uri = self.run_dir.child("adapter").uri
        caches = Caches(dataset=prepared.cache, model=model)
        summary = summarize(spec, self.reports, self.restarts, profile, adapter_uri, caches, quality.summary())
        for finding in summary.diagnosis:
            self._diagnosed(finding)
        summary = self._write_outputs(summary)
        emit(Event("summary", summary.to_dict()))
        return JobResult(self.run_dir.uri, adapter_uri, summary, self.staging if self.run_dir.is_local else None)

    def _copy_live(self, now: bool) -> None:
        """An ``s3://`` run's live files, copied up at most every :data:`LIVE_COPY_S` (and ``now``), so a
        remote run directory follows the job as a local one does. A failed copy is retried at the next; the
        upload when the job ends has everything."""
        if self.run_dir.is_local or (not now and time.monotonic() - self.live_copied < LIVE_COPY_S):
            return
        self.live_copied = time.monotonic()
        for name in LIVE_FILES:
            if (self.staging / name).exists():
                try:
                    self.run_dir.child(name).upload(self.staging / name)
                except OSError as exc:
                    log.warning("live copy of %s to %s failed (retried at the next report): %s", name, self.run_dir.uri, exc)

    def record(self, event: Event) -> None:
        """Log, profile and pass on one event from the trainer; name a bottleneck as soon as it shows."""
        self.history.append(event.to_dict())
        self.metrics_log.write(json.dumps(self.history[-1]) + "\n")
        self.metrics_log.flush()
        self.restarts += event.kind == "failure"
        report = Progress.from_dict(event.data) if event.kind in ("progress", "timing") else None
        if report is not None:
            self._copy_live(now=report.checkpoint)  # before the event goes on: what a watcher hears of is there
        if event.kind != "timing":  # the closing step records are for the profile only
            self.emit(event)
        if report is None:
            return
        self.reports.append(report)
        if self.trackers is not None:
            self.trackers.add(report)
        if report.eval_samples:  # what the model answered at this evaluation (ray_jobs.train.samples)
            with (self.staging / "samples.jsonl").open("a") as out:
                for sample in report.eval_samples:
                    out.write(json.dumps({"step": report.step, **sample.to_dict()}) + "\n")
        self.profile.add(report)
        if len(self.profile.steps) >= max(10, report.total_steps // 5):  # enough steady steps to judge
            for finding in diagnose(self.profile, self.spec, time.time() - self.profile.start):
                if finding.kind != "warmup":  # warm-up is only known once steady state is
                    self._diagnosed(finding)

    def _diagnosed(self, finding: Finding) -> None:
        if finding.kind not in self.diagnosed:
            self.diagnosed.add(finding.kind)
            event = Event("diagnosis", finding.to_dict())
            self.history.append(event.to_dict())
            self.emit(event)

    def _write_outputs(self, summary: JobSummary) -> JobSummary:
        """summary.json, the trackers' last scalars and report.png; the time they take joins the phase table."""
        from ray_jobs.observe.visuals import write_png

        t0 = time.time()
        if self.trackers is not None:
            self.trackers.finish(summary)
            self.trackers = None
        write_png(self.reports, summary, self.staging / "report.png")
        phases = dict(summary.timing.phases, write_reports=time.time() - t0)
        wall = time.time() - self.profile.start
        phases["other"] = wall - sum(v for k, v in phases.items() if k != "other")
        summary = summary.replace(wall_time_s=wall, timing=dataclasses.replace(summary.timing, phases=phases))
        (self.staging / "summary.json").write_text(json.dumps(summary.to_dict(), indent=2))
        return summary


def _fit(spec: FineTuneSpec, loop: Any, failures: int, *, datasets: dict[str, Any], run_dir: storage.Location, queue: Any) -> Any:
    """Fit ``loop`` on Ray Train (``ray_jobs.events.Fitted``), Ray Train restarting it up to ``failures`` times."""
    from ray.train import CheckpointConfig, FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    from ray_jobs.events import ForwardReports, fit_trainer
    from ray_jobs.train.loop import train_loop_per_worker
    from ray_jobs.train.session import train_run_name
    from ray_jobs.warm.train_view import tracking_on

    tracking_on()  # the dashboard's Train view lists this run (ray_jobs.warm.train_view lists a warm worker's)

    trainer = TorchTrainer(
        train_loop_per_worker,
        train_loop_config={"loop": loop},
        scaling_config=ScalingConfig(
            num_workers=spec.scaling.num_workers,
            use_gpu=spec.scaling.use_gpu,
            resources_per_worker={"CPU": spec.scaling.cpus_per_worker},
        ),
        run_config=RunConfig(
            # The Train run's name in the Ray dashboard (every run was "ray" before); also the storage folder
            # a re-run resumes from. The dashboard links it to its Ray job, whose metadata has the rest.
            name=train_run_name(spec, loop.identity.owner),
            storage_path=run_dir.path,
            storage_filesystem=run_dir.fs,
            callbacks=[ForwardReports(queue)],
            failure_config=FailureConfig(max_failures=failures),  # train.max_failures, less a warm worker's failure
            checkpoint_config=CheckpointConfig(num_to_keep=2),
        ),
        datasets=datasets,
    )
    return fit_trainer(trainer)


def _claim_run_dir(run_dir: storage.Location, overwrite: bool) -> None:
    """A finished run is never resumed; an unfinished one is (its last checkpoint), unless ``overwrite``:
    then whatever is there goes, finished or not, and the run starts over."""
    if overwrite and run_dir.exists():
        run_dir.delete()
    elif run_dir.child("summary.json").exists():
        raise SpecError("name", f"run {run_dir.uri!r} already finished; pick another name or pass --overwrite")
    run_dir.fs.create_dir(run_dir.path, recursive=True)


class NothingTrained(RuntimeError):
    """The job ran and trained no step (it resumed a run already at its end): a failure, with the reason."""


def _count_steps(spec: FineTuneSpec, prepared: Any) -> int:
    """Epoch mode: the optimizer steps of ``train.epochs`` passes (streaming: tokenize up front to count)."""
    world, micro = spec.scaling.num_workers, spec.train.micro_batch_size
    if prepared.order is not None:
        rows_per_worker = prepared.order.rows_per_epoch(world, micro) // world
    else:
        prepared.datasets["train"] = prepared.datasets["train"].materialize()
        rows_per_worker = prepared.datasets["train"].count() // world
    steps_per_epoch = rows_per_worker // spec.train.micro_batch_size // spec.grad_accum_steps
    if steps_per_epoch == 0:
        raise SpecError(
            "train.micro_batch_size",
            f"the dataset packs into {rows_per_worker} rows per worker, too few for one step; lower micro_batch_size, global_batch_size or num_workers",
        )
    return steps_per_epoch * spec.train.epochs
