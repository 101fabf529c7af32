"""Launching jobs on Ray through the Ray Jobs API (``JobSubmissionClient``).

The rayft job id is the Ray submission id, and the team, job name, model and dataset go in its metadata,
so the Ray dashboard lists every job with its owner and what it trains. The entrypoint is ``python -m ray_jobs.submitted``; the job
id, the service's report address and the job's launch ticket travel as environment variables of its
runtime environment, which the Ray dashboard shows. Nothing there is a lasting secret: the job trades
the ticket once for its spec (no size ceiling, unlike an environment variable) and binds a report token
it made itself (``service/auth.py``).
"""

from __future__ import annotations

import re
from typing import Protocol

from service.store import JobRecord


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


class Launcher(Protocol):
    address: str
    """Where Ray's Jobs API is (for messages)."""

    def submit(self, job: JobRecord, report_address: str, launch_ticket: str) -> str:
        """Start the job; return its Ray submission id. Raises ``RayUnavailable`` or ``LaunchRejected``."""

    def status(self, submission_id: str) -> tuple[str, str] | None:
        """``(Ray job status, message)`` or ``None`` when Ray has no such job."""

    def stop(self, submission_id: str) -> None: ...

    def ping(self) -> None:
        """Raise ``RayUnavailable`` unless the Jobs API answers."""


class RayJobLauncher:
    def __init__(self, address: str, python: str, report_env: dict[str, str] | None = None):
        """``report_env``: how every job reaches the service (``RAYFT_REPORT_TLS``, and the public CA
        certificate it verifies the service with, ``RAYFT_REPORT_CA``)."""
        self.address, self.python, self.report_env = address, python, dict(report_env or {})
        self._client = None

    def _jobs(self):  # noqa: ANN202 - ray.job_submission.JobSubmissionClient, imported lazily
        if self._client is None:
            from ray.job_submission import JobSubmissionClient

            try:
                self._client = JobSubmissionClient(self.address)
            except (ConnectionError, RuntimeError) as exc:
                raise RayUnavailable(f"Ray Jobs API at {self.address} is unreachable: {exc}") from exc
        return self._client

    def submit(self, job: JobRecord, report_address: str, launch_ticket: str) -> str:
        env = {
            **self.report_env,
            "RAYFT_JOB_ID": job.id,
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
                    "rayft_job": job.spec.get("name", ""),
                    "rayft_model": job.spec.get("model", {}).get("path", ""),
                    "rayft_data": job.spec.get("data", {}).get("path", ""),
                },
            )
        except RuntimeError as exc:
            if "already exists" in str(exc):  # a launch retried after the service restarted
                return job.id
            raise _submit_error(exc) from exc
        except ConnectionError as exc:
            self._client = None
            raise RayUnavailable(str(exc)) from exc

    def status(self, submission_id: str) -> tuple[str, str] | None:
        try:
            info = self._jobs().get_job_info(submission_id)
        except RuntimeError as exc:
            if "does not exist" in str(exc) or "404" in str(exc):
                return None
            raise RayUnavailable(str(exc)) from exc
        except ConnectionError as exc:
            self._client = None
            raise RayUnavailable(str(exc)) from exc
        return str(info.status.value if hasattr(info.status, "value") else info.status), info.message or ""

    def stop(self, submission_id: str) -> None:
        try:
            self._jobs().stop_job(submission_id)
        except (RuntimeError, ConnectionError) as exc:
            raise RayUnavailable(str(exc)) from exc

    def ping(self) -> None:
        try:
            self._jobs().get_version()
        except (RuntimeError, ConnectionError) as exc:
            self._client = None
            raise RayUnavailable(str(exc)) from exc
