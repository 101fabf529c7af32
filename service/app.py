"""Wiring the service together and running it: ``start()`` builds the servers, the store, the event
stream and the reconciler from the settings; ``serve()`` runs them until SIGINT/SIGTERM.

The servicers themselves are ``service/server.py``. Here: TLS (and mutual TLS) per port, the watch process
that serves WatchJob (``service/watch.py``), a reporting port of its own where asked, a plaintext health-only port for probes, Prometheus metrics, standard health
checking, server reflection, keepalive for long streams, and graceful shutdown.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import signal
from typing import TYPE_CHECKING, Any

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from rayft_contract.v1 import finetune_pb2 as pb
from rayft_contract.v1 import finetune_pb2_grpc as pb_grpc
from service import auth
from service.faults import StoreFaults, StoreHealth
from service.metrics import ServiceMetrics
from service.policy import PathPolicy
from service.progress import JobEvents
from service.reconciler import Reconciler
from service.reporting import JobReportingServicer
from service.retention import EventRetention
from service.server import FineTuningServicer
from service.settings import ServiceSettings
from service.store import AsyncJobStore, JobStore
from service.transport import KEEPALIVE, MAX_MESSAGE_BYTES, bind, server_credentials
from service.watch import WatchProcess

if TYPE_CHECKING:
    from service.launcher import Launcher

log = logging.getLogger(__name__)


class Service:
    """A running server and what it owns; ``await service.stop()`` shuts it down gracefully."""

    def __init__(
        self,
        servers: list[grpc.aio.Server],
        port: int,
        report_port: int,
        health_servicer: Any,
        reconciler: Reconciler,
        task: asyncio.Task,
        watch: WatchProcess | None = None,
        supervisor: asyncio.Task | None = None,
        retention: asyncio.Task | None = None,
    ):
        self.servers, self.port, self.report_port, self.health = servers, port, report_port, health_servicer
        self.reconciler, self.task, self.watch, self.supervisor = reconciler, task, watch, supervisor
        self.retention = retention

    async def stop(self, grace: float) -> None:
        await self.health.enter_graceful_shutdown()
        for task in (self.supervisor, self.retention):
            if task is not None:  # a thinning transaction in flight finishes in its thread; the store closes after
                task.cancel()
        # The watch process's streams get the same grace, at the same time as the API's calls.
        watch_stopped = asyncio.create_task(asyncio.to_thread(self.watch.stop, grace)) if self.watch is not None else None
        for server in self.servers:
            await server.stop(grace)  # no new calls; in-flight ones get `grace` seconds
        if watch_stopped is not None:
            await watch_stopped
        try:
            await asyncio.wait_for(self.reconciler.shutdown(), timeout=grace)
        except TimeoutError:
            log.warning("reconciler did not finish within %.0f s; the next start picks up from the store", grace)
        await asyncio.wait_for(self.task, timeout=grace)


async def start(settings: ServiceSettings, sync_store: JobStore, policy: PathPolicy, launcher: Launcher | None = None) -> Service:
    """``launcher``: how jobs reach Ray; default the Ray Jobs API at ``settings.ray_address``. A test gives one that
    injects a fault into the real one (a slow Ray dashboard, say)."""
    from service.launcher import RayJobLauncher

    if not settings.ray_address:
        raise ValueError(
            "ray_address: the service needs a Ray Jobs API address (`rayft serve` starts a local cluster without one)"
        )
    ray_address = settings.ray_address
    health_servicer = health.aio.HealthServicer()
    names = [pb.DESCRIPTOR.services_by_name[n].full_name for n in ("FineTuning", "JobReporting")]
    options = [*KEEPALIVE, ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES)]
    watch = WatchProcess(settings) if settings.watch_process else None
    watch_address = ""
    if watch is not None:  # first: it takes a second or two to import and open the store
        watch_address = settings.watch_address or f":{await asyncio.to_thread(watch.start)}"
    metrics = ServiceMetrics(sync_store.count_by_state, elsewhere=watch.families if watch is not None else None)
    store_health = StoreHealth(health_servicer, names, metrics.store_faults)
    interceptors = [metrics.interceptor(), StoreFaults()]  # outermost first: a store fault is counted by its status
    server = grpc.aio.server(options=options, interceptors=interceptors)
    port = bind(server, f"{settings.host}:{settings.port}", server_credentials(settings, client_certs=True))
    reporting_at, report_port = server, port  # where JobReporting is served
    if settings.tls_client_ca is not None or settings.report_port:
        # Mutual TLS admits team clients by certificate; running jobs hold no certificate (a key in Ray's
        # runtime environment would be readable by anyone who reaches the dashboard), so they report on
        # a port of their own: TLS, and the job's token. gRPC asks for client certificates per port. A
        # port of their own also lets a NetworkPolicy open reporting to the Ray pods alone (k8s/).
        reporting_at = grpc.aio.server(options=options, interceptors=interceptors)
        report_port = bind(reporting_at, f"{settings.host}:{settings.report_port}", server_credentials(settings, False))
    endpoints = list(dict.fromkeys([server, reporting_at]))  # health on each
    servers = list(endpoints)
    if settings.health_port is not None:
        probe_server = grpc.aio.server(options=KEEPALIVE)
        probe_server.add_insecure_port(f"{settings.host}:{settings.health_port}")
        health_pb2_grpc.add_HealthServicer_to_server(health_servicer, probe_server)
        servers.append(probe_server)
    host = "127.0.0.1" if settings.host in ("0.0.0.0", "::") else settings.host
    report_address = settings.report_address or f"{host}:{report_port}"
    store = AsyncJobStore(sync_store, watch=store_health.watch)
    events = JobEvents(store)
    job_env = settings.job_env
    if settings.tls:
        job_env["RAYFT_REPORT_TLS"] = "1"
        if settings.report_tls_ca is not None:
            job_env["RAYFT_REPORT_CA"] = settings.report_tls_ca.read_text()
    launcher = launcher or RayJobLauncher(ray_address, settings.job_python, job_env)
    launch_key = auth.service_key(settings.data_dir)
    reconciler = Reconciler(
        events,
        launcher,
        report_address,
        settings.reconcile_interval_s,
        settings.launch_paused,
        launch_key=launch_key,
        max_running_per_team=settings.max_running_jobs_per_team,
        cluster_autoscales=settings.cluster_autoscales,
        cluster_gpus=settings.cluster_gpus,
        metrics=metrics,
    )
    reporting = JobReportingServicer(store, events, launch_key, metrics, on_last_event=reconciler.ending)
    pb_grpc.add_FineTuningServicer_to_server(
        FineTuningServicer(store, events, reconciler, settings, policy, metrics, watch_address), server
    )
    pb_grpc.add_JobReportingServicer_to_server(reporting, reporting_at)
    for each in endpoints:
        health_pb2_grpc.add_HealthServicer_to_server(health_servicer, each)
    reflection.enable_server_reflection([*names, health.SERVICE_NAME, reflection.SERVICE_NAME], server)
    for each in servers:
        await each.start()
    if settings.metrics_port is not None:
        metrics_port = metrics.serve(settings.host, settings.metrics_port)
        log.info("Prometheus metrics on http://%s:%d/metrics", settings.host, metrics_port)
    for name in ["", *names]:
        await health_servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
    task = asyncio.create_task(reconciler.run_forever(), name="reconciler")
    supervisor = asyncio.create_task(watch.supervise(), name="watch-supervisor") if watch is not None else None
    retention = asyncio.create_task(
        EventRetention(store, settings.events_keep_days, metrics=metrics).run_forever(), name="event-retention"
    )
    log.info(
        "rayft service on %s:%d (%s; streams %s; jobs report to %s; Ray %s, auth %s, %s)",
        settings.host,
        port,
        "mutual TLS" if settings.tls_client_ca else "TLS" if settings.tls else "plaintext, loopback only",
        f"on port {watch.port}, a process of their own" if watch is not None else "in this process",
        report_address,
        ray_address,
        "on" if settings.auth else "off",
        f"path policy {settings.policy_file}"
        if policy.enforce
        else "no path policy: one person's service, spec paths used as given",
    )
    return Service(servers, port, report_port, health_servicer, reconciler, task, watch, supervisor, retention)


async def serve(settings: ServiceSettings, store: JobStore, policy: PathPolicy, ready: asyncio.Event | None = None) -> None:
    """Run until SIGINT/SIGTERM, then stop gracefully (health NOT_SERVING, in-flight calls finish)."""
    service = await start(settings, store, policy)
    # What start-up made (gRPC, protobuf descriptors, Ray's client modules) lives as long as the process:
    # out of the collector's view, a full collection pauses the loop 4-6 ms instead of 45-68 ms
    # (measured beside a noisy team in bench/tenant_bench.py).
    gc.freeze()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    if ready is not None:
        ready.set()
    print(f"rayft service listening on {settings.host}:{service.port}", flush=True)
    await stop.wait()
    await service.stop(settings.grace_s)
    store.close()
