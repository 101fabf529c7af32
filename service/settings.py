"""Service settings, from flags or ``RAYFT_*`` environment variables (flags win)."""

from __future__ import annotations

import dataclasses
import ipaddress
import os
import socket
import sys
from pathlib import Path


@dataclasses.dataclass(frozen=True)
class ServiceSettings:
    host: str = "127.0.0.1"
    """Listen address (``RAYFT_HOST``). Anything but loopback requires auth."""
    port: int = 50051
    """Listen port (``RAYFT_PORT``); 0 picks a free one."""
    data_dir: Path = Path(".rayft/service")
    """Holds ``jobs.db`` (SQLite) (``RAYFT_DATA_DIR``)."""
    ray_address: str | None = None
    """Ray dashboard/Jobs API address, e.g. ``http://raycluster-head-svc:8265`` (``RAYFT_RAY_ADDRESS``).
    Unset: the service starts and owns a local Ray cluster (the embedded default)."""
    auth: bool = True
    """Require team API tokens (``RAYFT_AUTH=0`` turns it off; only allowed on loopback)."""
    policy_file: Path | None = None
    """The path policy (``RAYFT_POLICY``): each team's output root and the data, model and cache locations
    it may use (``service/policy.py`` shows the format). Required with auth on; without it, on loopback
    with auth off, the service is one person's and uses the spec's paths as given."""
    max_active_jobs_per_team: int = 4
    """Queued + running jobs a team may hold (``RAYFT_MAX_ACTIVE_JOBS``); CreateJob beyond is RESOURCE_EXHAUSTED."""
    max_running_jobs_per_team: int = 2
    """Jobs of one team launched on Ray at once (``RAYFT_MAX_RUNNING_JOBS``); the rest wait QUEUED, so one
    team's burst cannot take the whole cluster from the others."""
    max_streams_per_team: int = 100
    """Open WatchJob streams per team (``RAYFT_MAX_STREAMS_PER_TEAM``)."""
    max_streams: int = 1000
    """Open WatchJob streams in all (``RAYFT_MAX_STREAMS``): 1,500 idle watchers made other calls 15x slower."""
    report_address: str = ""
    """Where running jobs reach this service to report (``RAYFT_REPORT_ADDRESS``); default host:port."""
    job_python: str = sys.executable
    """Python the Ray job's entrypoint runs with (``RAYFT_JOB_PYTHON``; ``python`` in containers)."""
    launch_paused: bool = False
    """Accept and queue jobs but launch none (``RAYFT_LAUNCH_PAUSED=1``), e.g. while the Ray cluster is
    being upgraded; running jobs are still followed. Unpause by restarting without it."""
    reconcile_interval_s: float = 2.0
    """How often queued jobs are launched and running ones checked against Ray."""
    grace_s: float = 10.0
    """Seconds in-flight calls get on shutdown."""

    def __post_init__(self) -> None:
        if not self.auth and not is_loopback(self.host):
            raise ValueError(
                f"auth can be off only on a loopback address, not {self.host!r}: create tokens with `rayft token create`"
            )

    @classmethod
    def from_env(cls, **overrides: object) -> ServiceSettings:
        env = os.environ
        values: dict[str, object] = {
            "host": env.get("RAYFT_HOST", cls.host),
            "port": int(env.get("RAYFT_PORT", cls.port)),
            "data_dir": Path(env.get("RAYFT_DATA_DIR", str(cls.data_dir))),
            "ray_address": env.get("RAYFT_RAY_ADDRESS") or None,
            "auth": env.get("RAYFT_AUTH", "1") not in ("0", "false", "no"),
            "policy_file": env.get("RAYFT_POLICY") or None,
            "max_active_jobs_per_team": int(env.get("RAYFT_MAX_ACTIVE_JOBS", cls.max_active_jobs_per_team)),
            "max_running_jobs_per_team": int(env.get("RAYFT_MAX_RUNNING_JOBS", cls.max_running_jobs_per_team)),
            "max_streams_per_team": int(env.get("RAYFT_MAX_STREAMS_PER_TEAM", cls.max_streams_per_team)),
            "max_streams": int(env.get("RAYFT_MAX_STREAMS", cls.max_streams)),
            "report_address": env.get("RAYFT_REPORT_ADDRESS", ""),
            "job_python": env.get("RAYFT_JOB_PYTHON", sys.executable),
            "launch_paused": env.get("RAYFT_LAUNCH_PAUSED", "0") not in ("0", "false", "no", ""),
        }
        values.update({k: v for k, v in overrides.items() if v is not None})
        values["data_dir"] = Path(values["data_dir"])  # type: ignore[arg-type]
        if values["policy_file"] is not None:
            values["policy_file"] = Path(values["policy_file"])  # type: ignore[arg-type]
        return cls(**values)  # type: ignore[arg-type]


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        pass
    try:
        return ipaddress.ip_address(socket.gethostbyname(host)).is_loopback
    except (OSError, ValueError):
        return False
