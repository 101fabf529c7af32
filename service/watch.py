"""The watch process: ``WatchJob``'s streams served by a process of their own, beside the API's.

Why a process: Python runs one thread at a time per process. With the streams on the API's event loop,
every event one team's job reported went out to each of its streams in one burst there, and another
team's GetJob waited for it: that team's p99 rose 1.4-4x beside a team at its quotas
(``bench/tenant_bench.py``, ``bench/RESULTS.md``), with the handlers themselves fast and the loop waiting
for the interpreter lock. A second process has a lock of its own, and the operating system shares the
cores between the two. Streams are what a caller holds for minutes and what the service sends most of;
the API's calls are what a person waits on.

How the two processes work together::

    API process (service/app.py)                 watch process (this module, spawned)
    start(): spawn                 ------------>  main(): bind the watch port, open the store
                                   <-- its port   serve WatchJob, health; follow the store's event log
    WatchJob on the API port: FAILED_PRECONDITION, trailing metadata rayft-watch-address = :PORT
    a scrape of /metrics: "metrics" ----------->  <--- its series (streams, stream lag, its calls)
    stop(): SIGTERM                -----------> graceful stop; the pipe's end (the API process died) too

Both open the same SQLite store (WAL: readers never wait for the writer). The API process writes every
event; this one follows the store's log (``JobEvents.follow_store``), so nothing between them is lost when
either restarts, and a client that reconnects with its last seq misses nothing. The API process restarts
this one if it dies, on the same port.
"""

from __future__ import annotations

import asyncio
import dataclasses
import gc
import logging
import multiprocessing
import os
import signal
import threading
import time
from collections.abc import Iterable
from multiprocessing.connection import Connection
from typing import Any

from service.settings import ServiceSettings

log = logging.getLogger(__name__)
START_TIMEOUT_S = 60.0
"""How long the API process waits for the watch process to serve (imports and the store's check)."""
SCRAPE_TIMEOUT_S = 2.0
BIND_WAIT_S = 15.0
"""How long a starting watch process tries to bind its port: one that an orphaned predecessor still holds is
free within a second of that one seeing its API process gone."""
WATCH_NICE = 10
"""The watch process's niceness: where the two processes want one core, the API's calls go first, and the
streams (which a client reads in its own time) take what is left. Measured (``bench/tenant_bench.py``)
with the server on one core of this project's 2-core machine, at 0 and 10: the quiet team's p99 was the
same within the runs' spread there, where its tail came from the API's own work; on the H200 host with
two cores for the server (``bench/tenant_device.sh``), at 10, the split took GetJob's p99 ratio from
3.3-4.4x to 1.7-2.1x."""


class WatchProcess:
    """The API process's handle on the watch process: start it, restart it, ask it for its metrics, stop it."""

    def __init__(self, settings: ServiceSettings):
        self.settings = settings
        self.port: int | None = None
        self._process: Any = None
        self._conn: Connection | None = None
        self._lock = threading.Lock()
        """One question at a time on the pipe (scrapes come on the metrics server's threads)."""
        self._stopping = False

    def start(self) -> int:
        """Start the process and wait until it serves; its port (the same one on every restart). Blocking."""
        port = self.port if self.port is not None else self.settings.resolved_watch_port
        context = multiprocessing.get_context("spawn")  # never fork a process that runs gRPC's threads
        ours, theirs = context.Pipe()
        process = context.Process(
            target=main, args=(dataclasses.replace(self.settings, watch_port=port), theirs), name="rayft-watch", daemon=True
        )
        process.start()
        theirs.close()  # the child holds its end: when this process dies, the child reads the pipe's end
        if not ours.poll(START_TIMEOUT_S):
            process.kill()
            raise RuntimeError(f"the watch process did not start within {START_TIMEOUT_S:.0f} s")
        try:
            answer = ours.recv()
        except EOFError:
            process.join(5)
            raise RuntimeError(f"the watch process exited at start (exit code {process.exitcode}); its log says why") from None
        if isinstance(answer, str):  # what stopped it, in one line
            process.join(5)
            raise RuntimeError(f"the watch process did not start: {answer}")
        with self._lock:
            self._process, self._conn, self.port = process, ours, int(answer)
        return self.port

    async def supervise(self, every_s: float = 1.0) -> None:
        """Restart the process whenever it dies, until cancelled; clients reconnect with their last seq."""
        while True:
            await asyncio.sleep(every_s)
            if self._stopping or self._process.is_alive():
                continue
            log.error("the watch process exited (code %s): restarting it on port %s", self._process.exitcode, self.port)
            try:
                await asyncio.to_thread(self.start)
            except RuntimeError as exc:  # e.g. the port not free yet: the next round tries again
                log.error("%s", exc)

    def families(self) -> Iterable[Any]:
        """The watch process's metric families (``service.metrics.ServiceMetrics`` merges them into its own);
        none while it is down or slow to answer, so a scrape never hangs on it."""
        from prometheus_client.parser import text_string_to_metric_families

        with self._lock:
            if self._conn is None or not self._process.is_alive():
                return []
            try:
                self._conn.send("metrics")
                if not self._conn.poll(SCRAPE_TIMEOUT_S):
                    log.warning("the watch process did not send its metrics within %.0f s", SCRAPE_TIMEOUT_S)
                    return []  # the late answer is read and dropped by the next scrape
                while True:  # an answer a slow scrape left behind comes first
                    text = self._conn.recv_bytes().decode()
                    if not self._conn.poll(0):
                        break
            except (EOFError, OSError, BrokenPipeError):
                return []
        return list(text_string_to_metric_families(text))

    def stop(self, grace_s: float) -> None:
        """Graceful: the process ends its streams (clients reconnect elsewhere or later) and exits."""
        self._stopping = True
        with self._lock:
            process, self._conn = self._process, None
        if process is None or not process.is_alive():
            return
        process.terminate()  # SIGTERM: a graceful stop
        process.join(grace_s + 5)
        if process.is_alive():
            process.kill()
            process.join(5)


def main(settings: ServiceSettings, conn: Connection) -> None:
    """The watch process: serve WatchJob on ``settings.watch_port`` until told to stop or the API process dies."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s watch %(levelname)s %(name)s: %(message)s")
    if WATCH_NICE:
        os.nice(WATCH_NICE)
    from service.store import StoreError
    from service.store_sqlite import SqliteJobStore

    try:
        store = SqliteJobStore(settings.data_dir / "jobs.db")
    except StoreError as exc:
        conn.send(str(exc))
        return
    try:
        asyncio.run(_serve(settings, store, conn))
    finally:
        store.close()


async def _serve(settings: ServiceSettings, sync_store: Any, conn: Connection) -> None:
    import grpc
    from grpc_health.v1 import health, health_pb2, health_pb2_grpc
    from prometheus_client import generate_latest

    from rayft_contract.v1 import finetune_pb2 as pb
    from rayft_contract.v1 import finetune_pb2_grpc as pb_grpc
    from service.faults import StoreFaults, StoreHealth
    from service.metrics import ServiceMetrics
    from service.progress import JobEvents
    from service.server import WatchServicer
    from service.store import AsyncJobStore
    from service.transport import KEEPALIVE, MAX_MESSAGE_BYTES, bind, server_credentials

    health_servicer = health.aio.HealthServicer()
    name = pb.DESCRIPTOR.services_by_name["FineTuning"].full_name
    metrics = ServiceMetrics()
    store_health = StoreHealth(health_servicer, [name], metrics.store_faults)
    # so_reuseport off: a watch process left from an earlier run must not share the port with this one.
    options = [*KEEPALIVE, ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES), ("grpc.so_reuseport", 0)]
    address = f"{settings.host}:{settings.watch_port}"
    deadline = time.monotonic() + BIND_WAIT_S
    while True:
        server = grpc.aio.server(options=options, interceptors=[metrics.interceptor(), StoreFaults()])
        try:
            port = bind(server, address, server_credentials(settings, client_certs=True))
            break
        except RuntimeError as exc:  # gRPC's "failed to bind": the port is taken, perhaps by a predecessor ending
            if time.monotonic() >= deadline:
                conn.send(f"cannot listen on {address} ({exc}): free the port or set RAYFT_WATCH_PORT")
                return
            await asyncio.sleep(0.5)
    store = AsyncJobStore(sync_store, watch=store_health.watch)
    events = JobEvents(store)
    pb_grpc.add_FineTuningServicer_to_server(WatchServicer(store, events, settings, metrics), server)
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    await server.start()
    for each in ("", name):
        await health_servicer.set(each, health_pb2.HealthCheckResponse.SERVING)
    following = asyncio.create_task(events.follow_store(), name="follow-store")
    gc.freeze()  # as in the API process (service/app.py): start-up's objects out of the collector's view
    stop, orphaned = asyncio.Event(), asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)

    def on_message() -> None:
        try:
            message = conn.recv()
        except (EOFError, OSError):  # the API process is gone: so is the reason to serve
            loop.remove_reader(conn.fileno())
            orphaned.set()
            stop.set()
            return
        if message == "metrics":
            conn.send_bytes(generate_latest(metrics.registry))

    loop.add_reader(conn.fileno(), on_message)
    conn.send(port)
    log.info("watch streams on %s:%d (pid %d)", settings.host, port, os.getpid())
    await stop.wait()
    started = time.monotonic()
    await health_servicer.enter_graceful_shutdown()
    # Orphaned (the API process was killed): its successor needs this port now, so the streams end at once
    # and their clients reconnect with their last seq. A graceful stop held the port for grace_s (10 s), and
    # a service restarted 3 s after a kill could not listen (seen in a fresh-clone CI run).
    await server.stop(0 if orphaned.is_set() else settings.grace_s)
    following.cancel()
    log.info("watch process stopped in %.1f s", time.monotonic() - started)
