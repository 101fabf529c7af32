"""Service settings, from flags or ``RAYFT_*`` environment variables (flags win)."""

from __future__ import annotations

import dataclasses
import os
import sys
from collections.abc import Mapping
from pathlib import Path

from rayft_contract.channel import is_loopback


@dataclasses.dataclass(frozen=True)
class ServiceSettings:
    host: str = "127.0.0.1"
    """Listen address (``RAYFT_HOST``). Anything but loopback requires auth and TLS."""
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
    max_streams_per_team: int = 32
    """Open WatchJob streams per team (``RAYFT_MAX_STREAMS_PER_TEAM``). Every event goes out once per stream
    on its job, in one burst on the event loop: 100 fed streams of one team raised another team's p99 5-12x,
    32 streams 1.8-5x (bench/tenant_bench.py, 2 cores)."""
    max_streams: int = 1000
    """Open WatchJob streams in all (``RAYFT_MAX_STREAMS``): 1,500 idle watchers made other calls 15x slower."""
    max_log_reads_per_team: int = 2
    """GetJobLogs calls of one team in flight at once (``RAYFT_MAX_LOG_READS_PER_TEAM``). Each reads the job's whole
    log from Ray's dashboard on one of the API process's threads, which every team's cancels also use."""
    watch_process: bool = True
    """Serve ``WatchJob`` from a process of its own (``RAYFT_WATCH_PROCESS=0``: in the API's process), so that
    one team's streams never hold up another team's calls (``service/watch.py`` says why, with numbers).
    Clients are sent there by the API port (``rayft-watch-address`` metadata); rayft's client follows."""
    watch_port: int | None = None
    """The watch process's port (``RAYFT_WATCH_PORT``); unset: the API's port + 1 (+ 2 when that is
    ``report_port``), or a free one when the API's port is picked (0). Same host, TLS and tokens as the API."""
    watch_address: str = ""
    """The address clients are told to watch at (``RAYFT_WATCH_ADDRESS``), where the watch port is reached
    under another name or port (a load balancer); default ``:{watch_port}``, the host the client dialed."""
    tls_cert: Path | None = None
    """PEM certificate chain the service presents (``RAYFT_TLS_CERT``), with ``tls_key``: TLS on every port."""
    tls_key: Path | None = None
    """PEM private key of ``tls_cert`` (``RAYFT_TLS_KEY``)."""
    tls_client_ca: Path | None = None
    """PEM roots that sign team clients' certificates (``RAYFT_TLS_CLIENT_CA``): mutual TLS on the team API.
    Running jobs then report on ``report_port``, where a job's token, not a certificate, admits it."""
    report_port: int = 0
    """The port running jobs report on (``RAYFT_REPORT_PORT``), apart from the team API; 0: with mutual TLS a
    free one, without it the API's own port. Apart, a NetworkPolicy can open it to the Ray pods alone."""
    report_tls_ca: Path | None = None
    """PEM roots jobs verify this service's certificate with (``RAYFT_REPORT_TLS_CA``); it travels to the job
    (a CA certificate is public). Unset with TLS on: the system's roots on the Ray nodes."""
    health_port: int | None = None
    """A plaintext port serving only ``grpc.health.v1`` (``RAYFT_HEALTH_PORT``), for probes that cannot speak
    TLS (Kubernetes' gRPC probes cannot). It carries no tokens and no data, so it may listen off loopback."""
    metrics_port: int | None = None
    """Serve Prometheus metrics over plaintext HTTP on this port (``RAYFT_METRICS_PORT``; 0 picks a free one;
    unset: none). ``service/metrics.py`` lists the series; they hold counts and team names, never a spec."""
    report_address: str = ""
    """Where running jobs reach this service to report (``RAYFT_REPORT_ADDRESS``); default host:port (or
    host:report_port with mutual TLS)."""
    job_python: str = sys.executable
    """Python the Ray job's entrypoint runs with (``RAYFT_JOB_PYTHON``; ``python`` in containers)."""
    launch_paused: bool = False
    """Accept and queue jobs but launch none (``RAYFT_LAUNCH_PAUSED=1``), e.g. while the Ray cluster is
    being upgraded; running jobs are still followed. Unpause by restarting without it."""
    cluster_autoscales: bool = False
    """The Ray cluster adds nodes on demand (``RAYFT_CLUSTER_AUTOSCALES=1``, e.g. KubeRay's autoscaler): then a job
    larger than the nodes running now is queued, not refused as one that can never be placed."""
    cluster_gpus: float | None = None
    """The GPUs rayft's launched jobs may hold at once (``RAYFT_CLUSTER_GPUS``): a GPU job launches only when
    that many are free of the jobs already launched, teams taking turns by the GPUs they hold
    (``service/admission.py``). Unset: the alive nodes' GPUs on a fixed cluster, no limit on one that
    autoscales. Set it on an autoscaling cluster to the most GPUs it can grow to (KubeRay's maxReplicas)."""
    warm_workers: int = 0
    """Warm workers kept for jobs of one worker (``RAYFT_WARM_WORKERS``; ``ray_jobs/warm/pool.py``): processes that
    imported the training stack before a job came, one job each. Each holds a worker's resources (a GPU) while it
    waits; a job that does not take one stands the pool down first. 0: none."""
    warm_idle_s: float = 600.0
    """How long warm workers wait for a job before they stop and free their GPUs (``RAYFT_WARM_IDLE_S``)."""
    events_keep_days: float = 30.0
    """Days an ended job keeps every progress event (``RAYFT_EVENTS_KEEP_DAYS``); then they are thinned to 100, its
    other events kept (``service/retention.py``: the store would otherwise only grow). 0: keep every event."""
    reconcile_interval_s: float = 2.0
    """How often queued jobs are launched and running ones checked against Ray."""
    grace_s: float = 10.0
    """Seconds in-flight calls get on shutdown."""

    def __post_init__(self) -> None:
        if not self.auth and not is_loopback(self.host):
            raise ValueError(
                f"auth can be off only on a loopback address, not {self.host!r}: create tokens with `rayft token create`"
            )
        if (self.tls_cert is None) != (self.tls_key is None):
            raise ValueError("tls_cert and tls_key: give both (RAYFT_TLS_CERT, RAYFT_TLS_KEY) or neither")
        if self.tls_client_ca is not None and self.tls_cert is None:
            raise ValueError("tls_client_ca: mutual TLS needs the service's own certificate too (RAYFT_TLS_CERT, RAYFT_TLS_KEY)")
        if self.tls_cert is None and not is_loopback(self.host):
            raise ValueError(
                f"plaintext only on loopback, not {self.host!r}: give the service a certificate "
                "(--tls-cert/--tls-key or RAYFT_TLS_CERT/RAYFT_TLS_KEY), so tokens never cross the network in clear"
            )
        if self.warm_workers < 0 or not self.warm_idle_s >= 0:
            raise ValueError(
                f"warm_workers and warm_idle_s (RAYFT_WARM_WORKERS, RAYFT_WARM_IDLE_S): 0 or more, not {self.warm_workers!r} "
                f"and {self.warm_idle_s!r}"
            )
        for name, (variable, least) in QUOTAS.items():
            if getattr(self, name) < least:
                raise ValueError(f"{name} ({variable}): {least} or more, not {getattr(self, name)!r}")
        if not self.events_keep_days >= 0:
            raise ValueError(
                f"events_keep_days (RAYFT_EVENTS_KEEP_DAYS): days, 0 (keep every event) or more, not {self.events_keep_days!r}"
            )
        if self.cluster_gpus is not None and not self.cluster_gpus >= 0:
            raise ValueError(f"cluster_gpus (RAYFT_CLUSTER_GPUS): a number of GPUs, 0 or more, not {self.cluster_gpus!r}")

    @property
    def job_env(self) -> dict[str, str]:
        """What every job is told by the operator, besides where to report: the warm pool's settings, when it is on
        (off, a job stands down a pool left from before all the same: ``ray_jobs.warm.pool.take``)."""
        if not self.warm_workers:
            return {}
        return {"RAYFT_WARM_WORKERS": str(self.warm_workers), "RAYFT_WARM_IDLE_S": str(self.warm_idle_s)}

    @property
    def tls(self) -> bool:
        return self.tls_cert is not None

    @property
    def resolved_watch_port(self) -> int:
        """``watch_port``, or its default: the API's port + 1 (0, a free one, when the API's is picked)."""
        if self.watch_port is not None:
            return self.watch_port
        if not self.port:
            return 0
        return self.port + 2 if self.report_port == self.port + 1 else self.port + 1

    @classmethod
    def from_env(cls, **overrides: object) -> ServiceSettings:
        env = os.environ
        values: dict[str, object] = {
            "host": env.get("RAYFT_HOST", cls.host),
            "port": int(env.get("RAYFT_PORT", cls.port)),
            "data_dir": Path(env.get("RAYFT_DATA_DIR", str(cls.data_dir))),
            "ray_address": env.get("RAYFT_RAY_ADDRESS") or None,
            "auth": _flag(env, "RAYFT_AUTH", True),
            "policy_file": env.get("RAYFT_POLICY") or None,
            **{name: _count(env, variable, getattr(cls, name)) for name, (variable, _) in QUOTAS.items()},
            "report_address": env.get("RAYFT_REPORT_ADDRESS", ""),
            "watch_process": _flag(env, "RAYFT_WATCH_PROCESS", True),
            "watch_port": int(env["RAYFT_WATCH_PORT"]) if env.get("RAYFT_WATCH_PORT") else None,
            "watch_address": env.get("RAYFT_WATCH_ADDRESS", ""),
            "tls_cert": env.get("RAYFT_TLS_CERT") or None,
            "tls_key": env.get("RAYFT_TLS_KEY") or None,
            "tls_client_ca": env.get("RAYFT_TLS_CLIENT_CA") or None,
            "report_port": int(env.get("RAYFT_REPORT_PORT", cls.report_port)),
            "health_port": int(env["RAYFT_HEALTH_PORT"]) if env.get("RAYFT_HEALTH_PORT") else None,
            "metrics_port": int(env["RAYFT_METRICS_PORT"]) if env.get("RAYFT_METRICS_PORT") else None,
            "report_tls_ca": env.get("RAYFT_REPORT_TLS_CA") or None,
            "job_python": env.get("RAYFT_JOB_PYTHON", sys.executable),
            "launch_paused": _flag(env, "RAYFT_LAUNCH_PAUSED", False),
            "cluster_autoscales": _flag(env, "RAYFT_CLUSTER_AUTOSCALES", False),
            "cluster_gpus": float(env["RAYFT_CLUSTER_GPUS"]) if env.get("RAYFT_CLUSTER_GPUS") else None,
            "warm_workers": int(env.get("RAYFT_WARM_WORKERS") or cls.warm_workers),
            "warm_idle_s": float(env.get("RAYFT_WARM_IDLE_S") or cls.warm_idle_s),
            "events_keep_days": float(env.get("RAYFT_EVENTS_KEEP_DAYS") or cls.events_keep_days),
        }
        values.update({k: v for k, v in overrides.items() if v is not None})
        values["data_dir"] = Path(values["data_dir"])  # type: ignore[arg-type]
        for name in ("policy_file", "tls_cert", "tls_key", "tls_client_ca", "report_tls_ca"):
            if values[name] is not None:
                values[name] = Path(values[name])  # type: ignore[arg-type]
        return cls(**values)  # type: ignore[arg-type]


QUOTAS = {
    "max_active_jobs_per_team": ("RAYFT_MAX_ACTIVE_JOBS", 1),
    "max_running_jobs_per_team": ("RAYFT_MAX_RUNNING_JOBS", 0),
    "max_streams_per_team": ("RAYFT_MAX_STREAMS_PER_TEAM", 1),
    "max_streams": ("RAYFT_MAX_STREAMS", 1),
    "max_log_reads_per_team": ("RAYFT_MAX_LOG_READS_PER_TEAM", 1),
}
"""Each limit: the variable that sets it and its least value. Below it, every call of its kind would be refused;
``RAYFT_MAX_RUNNING_JOBS=0`` may hold every job QUEUED while the service still answers (and asks Ray what fits)."""


def _count(env: Mapping[str, str], name: str, default: int) -> int:
    value = env.get(name) or str(default)
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"{name}: a whole number, not {value!r}") from None


def _flag(env: Mapping[str, str], name: str, default: bool) -> bool:
    """An on/off variable: ``0``, ``false`` or ``no`` (any case) is off, anything else on; unset or empty is the
    default (so an empty ``RAYFT_AUTH=`` never turns auth off)."""
    value = (env.get(name) or "").strip().lower()
    return default if not value else value not in ("0", "false", "no")
