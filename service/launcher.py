"""Launching jobs on Ray through the Ray Jobs API (``JobSubmissionClient``).

The rayft job id is the Ray submission id, and the team, job name, model and dataset go in its metadata,
so the Ray dashboard lists every job with its owner and what it trains. The entrypoint is ``python -m ray_jobs.submitted``; the job
id, the service's report address and the job's launch ticket travel as environment variables of its
runtime environment, which the Ray dashboard shows. Nothing there is a lasting secret: the job trades
the ticket once for its spec (no size ceiling, unlike an environment variable) and binds a report token
it made itself (``service/auth.py``).
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Callable
from typing import Any, Protocol, TypeVar

from rayft_contract.spec import FineTuneSpec
from service.store import JobRecord

T = TypeVar("T")


class RayUnavailable(ConnectionError):
    """The Ray cluster's Jobs API cannot be reached (or failed on its side: try again later)."""


class LaunchRejected(ValueError):
    """Ray's Jobs API refused this submission (an HTTP 4xx): retrying it would not help, the job fails."""


def _submit_error(exc: RuntimeError) -> Exception:
    """Ray's SDK raises ``RuntimeError("Request failed with status code 400: ...")`` for any HTTP error:
    4xx is the request's fault, everything else (5xx, "no available agent") the cluster's."""
    match = re.search(r"status code (\d{3})", str(exc))
    if match and 400 <= int(match.group(1)) < 500:
        return LaunchRejected(str(exc).splitlines()[0][:500])
    return RayUnavailable(str(exc))


@dataclasses.dataclass(frozen=True)
class Capacity:
    """What each alive node of the Ray cluster holds (its total resources), as the Jobs API's state API says."""

    nodes: tuple[dict[str, float], ...]

    @property
    def gpus(self) -> float:
        return sum(n.get("GPU", 0.0) for n in self.nodes)

    def refusal(self, spec: FineTuneSpec) -> str | None:
        """Why ``spec``'s workers can never all be placed on these nodes, naming the field and the fix; ``None``
        when they fit (idle or not: Ray's queue handles a busy cluster).

        Ray Train asks for ``num_workers`` identical bundles (``cpus_per_worker`` CPUs, and 1 GPU with
        ``use_gpu``), so the workers fit when the nodes' whole bundles add up to ``num_workers``."""
        s = spec.scaling
        gpus = self.gpus
        cpus = max((n.get("CPU", 0.0) for n in self.nodes), default=0.0)
        if s.use_gpu and gpus == 0:
            return "scaling.use_gpu: the Ray cluster has no GPU; set scaling.use_gpu false, or add GPU nodes"
        if s.cpus_per_worker > cpus:
            return (
                f"scaling.cpus_per_worker: {s.cpus_per_worker:g} CPUs per worker, and the Ray cluster's largest node has "
                f"{cpus:g}; lower scaling.cpus_per_worker"
            )
        fit = sum(self._workers_on(node, s.cpus_per_worker, s.use_gpu) for node in self.nodes)
        if fit < s.num_workers:
            what = "GPU" if s.use_gpu else f"{s.cpus_per_worker:g} CPUs"
            return (
                f"scaling.num_workers: {s.num_workers} workers of {what} each, and the Ray cluster's nodes hold {fit} "
                f"({len(self.nodes)} nodes, {gpus:g} GPUs); lower scaling.num_workers to {fit} or less"
            )
        return None

    @staticmethod
    def _workers_on(node: dict[str, float], cpus: float, gpu: bool) -> int:
        fit = math.floor(node.get("CPU", 0.0) / cpus) if cpus else math.inf
        if gpu:
            fit = min(fit, math.floor(node.get("GPU", 0.0)))
        return int(fit)


class Launcher(Protocol):
    address: str
    """Where Ray's Jobs API is (for messages)."""

    def submit(self, job: JobRecord, report_address: str, launch_ticket: str) -> str:
        """Start the job; return its Ray submission id. Raises ``RayUnavailable`` or ``LaunchRejected``."""

    def status(self, submission_id: str) -> tuple[str, str] | None:
        """``(Ray job status, message)`` or ``None`` when Ray has no such job."""

    def stop(self, submission_id: str) -> None: ...

    def logs(self, submission_id: str) -> str | None:
        """The job's driver log as Ray holds it, or ``None`` when Ray has no such job; raises ``RayUnavailable``."""

    def ping(self) -> None:
        """Raise ``RayUnavailable`` unless the Jobs API answers."""

    def capacity(self) -> Capacity:
        """The cluster's alive nodes and what each holds; raises ``RayUnavailable``."""


class RayJobLauncher:
    def __init__(self, address: str, python: str, job_env: dict[str, str] | None = None):
        """``job_env``: what every job gets from the operator: how it reaches the service (``RAYFT_REPORT_TLS``, and
        the public CA certificate it verifies the service with, ``RAYFT_REPORT_CA``), the warm pool's settings."""
        self.address, self.python, self.job_env = address, python, dict(job_env or {})
        self._client = None
        # Imported now, on one thread: imported lazily in the launcher's worker threads, two of them at once
        # (a ping and a capacity look) failed with "partially initialized module 'ray.util'".
        import ray.job_submission  # noqa: F401
        import ray.util.state  # noqa: F401

    def _jobs(self):  # noqa: ANN202 - ray.job_submission.JobSubmissionClient, imported lazily
        if self._client is None:
            from ray.job_submission import JobSubmissionClient

            try:
                self._client = JobSubmissionClient(self.address)
            except (ConnectionError, RuntimeError) as exc:
                raise RayUnavailable(f"Ray Jobs API at {self.address} is unreachable: {exc}") from exc
        return self._client

    def submit(self, job: JobRecord, report_address: str, launch_ticket: str) -> str:
        spec = FineTuneSpec.from_dict(job.spec)
        env = {
            **self.job_env,
            "RAYFT_JOB_ID": job.id,
            "RAYFT_TEAM": job.team,  # which team's storage keys the job signs with (ray_jobs/storage.py)
            "RAYFT_REPORT_ADDRESS": report_address,
            "RAYFT_LAUNCH_TICKET": launch_ticket,
        }
        try:
            return self._jobs().submit_job(
                entrypoint=f"{self.python} -m ray_jobs.submitted",
                submission_id=job.id,
                runtime_env={"env_vars": env},
                metadata={
                    "rayft_team": job.team,
                    "rayft_job": spec.name,
                    "rayft_model": spec.model.path,
                    "rayft_data": spec.data.path,
                },
            )
        except RuntimeError as exc:
            if "already exists" in str(exc):  # a launch retried after the service restarted
                return job.id
            raise _submit_error(exc) from exc
        except ConnectionError as exc:
            self._client = None
            raise RayUnavailable(str(exc)) from exc

    def _of_job(self, ask: Callable[[Any], T]) -> T | None:
        """``ask(client)`` of one job on the Jobs API; ``None`` when Ray has no such job (its HTTP 404)."""
        try:
            return ask(self._jobs())
        except RuntimeError as exc:
            if "does not exist" in str(exc) or "404" in str(exc):
                return None
            raise RayUnavailable(str(exc)) from exc
        except ConnectionError as exc:
            self._client = None
            raise RayUnavailable(str(exc)) from exc

    def status(self, submission_id: str) -> tuple[str, str] | None:
        info = self._of_job(lambda jobs: jobs.get_job_info(submission_id))
        if info is None:
            return None
        return str(info.status.value if hasattr(info.status, "value") else info.status), info.message or ""

    def stop(self, submission_id: str) -> None:
        try:
            self._jobs().stop_job(submission_id)
        except (RuntimeError, ConnectionError) as exc:
            raise RayUnavailable(str(exc)) from exc

    def logs(self, submission_id: str) -> str | None:
        return self._of_job(lambda jobs: jobs.get_job_logs(submission_id))

    def ping(self) -> None:
        try:
            self._jobs().get_version()
        except (RuntimeError, ConnectionError) as exc:
            self._client = None
            raise RayUnavailable(str(exc)) from exc

    def capacity(self) -> Capacity:
        from ray.util.state import list_nodes
        from ray.util.state.exception import RayStateApiException

        try:
            nodes = list_nodes(address=self.address, filters=[("state", "=", "ALIVE")], detail=True, timeout=10)
        except (RayStateApiException, RuntimeError, OSError) as exc:  # requests' ConnectionError is an OSError
            raise RayUnavailable(f"Ray's state API at {self.address}: {exc}") from exc
        return Capacity(tuple({k: float(v) for k, v in node.resources_total.items()} for node in nodes))
