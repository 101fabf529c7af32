"""The service's Prometheus metrics, served on a port of their own (``RAYFT_METRICS_PORT``, plaintext: they
carry counts, never a spec, a path or a token).

| series                          | type      | labels        | what                                                 |
|---------------------------------|-----------|---------------|------------------------------------------------------|
| ``rayft_rpc_total``             | counter   | method, code  | calls by method and the status they ended with       |
| ``rayft_rpc_seconds``           | histogram | method        | how long calls took (a stream: until it ended)       |
| ``rayft_jobs``                  | gauge     | state, team   | jobs in each state, read from the store at each scrape |
| ``rayft_watch_streams``         | gauge     | team          | open ``WatchJob`` streams                            |
| ``rayft_report_lag_seconds``    | histogram |               | a job's event time to the service storing it         |
| ``rayft_stream_lag_seconds``    | histogram |               | an event stored to its sending on a live stream      |
| ``rayft_launch_failures_total`` | counter   | reason        | ``rejected`` (Ray refused the job: it failed) or ``unavailable`` (launches paused) |
| ``rayft_events_thinned_total``  | counter   |               | progress events deleted from long-ended jobs (``service/retention.py``) |

Teams are labels: their number is the operator's (tokens are issued per team), not a caller's choice.
The report lag compares the job's clock with the service's: on different hosts it includes their skew.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable, Iterable
from typing import Any

import grpc
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server
from prometheus_client.core import GaugeMetricFamily, Metric

from rayft_contract.states import JobState

LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 60, 600, 3600)
LAG_BUCKETS = (0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 10, 60, 300)


class ServiceMetrics:
    """One registry per service (not Prometheus' global one), so every series is the service's own."""

    def __init__(
        self,
        count_jobs: Callable[[], dict[tuple[JobState, str], int]] | None = None,
        elsewhere: Callable[[], Iterable[Metric]] | None = None,
    ):
        """``count_jobs``: the store's job counts (the API process; the watch process has none);
        ``elsewhere``: another process's series, added into these at each scrape (the watch process's:
        ``service/watch.py``), so the operator scrapes one endpoint."""
        self.elsewhere = elsewhere
        self.registry = CollectorRegistry()
        self.rpcs = Counter("rayft_rpc", "Calls by method and final status", ["method", "code"], registry=self.registry)
        self.rpc_seconds = Histogram(
            "rayft_rpc_seconds", "Call duration", ["method"], buckets=LATENCY_BUCKETS, registry=self.registry
        )
        self.streams = Gauge("rayft_watch_streams", "Open WatchJob streams", ["team"], registry=self.registry)
        self.report_lag = Histogram(
            "rayft_report_lag_seconds",
            "A job's event time to the service storing it",
            buckets=LAG_BUCKETS,
            registry=self.registry,
        )
        self.stream_lag = Histogram(
            "rayft_stream_lag_seconds",
            "An event stored to its sending on a live stream",
            buckets=LAG_BUCKETS,
            registry=self.registry,
        )
        self.launch_failures = Counter("rayft_launch_failures", "Launches that failed", ["reason"], registry=self.registry)
        self.store_faults = Counter(
            "rayft_store_faults", "Job store calls that failed, by kind: busy, full, broken", ["kind"], registry=self.registry
        )
        self.events_thinned = Counter(
            "rayft_events_thinned", "Progress events deleted from long-ended jobs", registry=self.registry
        )
        if count_jobs is not None:
            self.registry.register(_JobsByState(count_jobs))

    def serve(self, host: str, port: int) -> int:
        """Serve ``/metrics`` on ``host:port`` (0: a free port) in a thread of its own; the port."""
        exposed = self.registry
        if self.elsewhere is not None:
            exposed = CollectorRegistry()
            exposed.register(_Merged(self.registry, self.elsewhere))
        server, _ = start_http_server(port, addr=host, registry=exposed)
        return server.server_port

    def interceptor(self) -> grpc.aio.ServerInterceptor:
        return _RpcMetrics(self)


class _Merged:
    """This process's series with another's added in: samples with the same name and labels are summed
    (counters, histograms' buckets, sums and counts, and the stream gauge: each process holds its own
    share), the rest put beside. Written here because prometheus_client's multiprocess mode needs its
    directory set before the library is first imported, and the service imports it at start-up."""

    def __init__(self, own: CollectorRegistry, elsewhere: Callable[[], Iterable[Metric]]):
        self.own, self.elsewhere = own, elsewhere

    def collect(self) -> Iterable[Metric]:
        families = {family.name: family for family in self.own.collect()}
        for family in self.elsewhere():
            if family.name.endswith("_created"):  # a series' creation time (text format: a gauge of its own)
                continue
            mine = families.setdefault(family.name, family)
            if mine is family:
                continue
            at = {(s.name, tuple(sorted(s.labels.items()))): i for i, s in enumerate(mine.samples)}
            for sample in family.samples:
                i = at.get((sample.name, tuple(sorted(sample.labels.items()))))
                if i is None:
                    mine.samples.append(sample)
                elif not sample.name.endswith("_created"):  # a creation time is not a count: keep ours
                    mine.samples[i] = mine.samples[i]._replace(value=mine.samples[i].value + sample.value)
        yield from families.values()


class _JobsByState:
    """``rayft_jobs{state, team}``: asked of the store at each scrape (on the scrape's thread), so it is never stale."""

    def __init__(self, count_jobs: Callable[[], dict[tuple[JobState, str], int]]):
        self.count_jobs = count_jobs

    def collect(self) -> Any:
        family = GaugeMetricFamily("rayft_jobs", "Jobs by state and team", labels=["state", "team"])
        for (state, team), count in sorted(self.count_jobs().items()):
            family.add_metric([state.value, team], count)
        yield family


class _RpcMetrics(grpc.aio.ServerInterceptor):
    """Counts and times every unary and server-streaming call by method and the code it ended with.
    Hand-written: grpc.aio has no Prometheus interceptor of its own, and the ones on PyPI are for sync gRPC."""

    def __init__(self, metrics: ServiceMetrics):
        self.metrics = metrics

    async def intercept_service(self, continuation: Any, details: Any) -> Any:
        handler = await continuation(details)
        if handler is None or not (handler.unary_unary or handler.unary_stream):
            return handler
        method = details.method.rsplit("/", 1)[-1]
        metrics = self.metrics

        def done(context: grpc.aio.ServicerContext, start: float, failed: BaseException | None) -> None:
            code = context.code() if hasattr(context, "code") else None  # set by abort() or set_code()
            if code is None:
                code = grpc.StatusCode.OK if failed is None else grpc.StatusCode.UNKNOWN
            name = code.name if isinstance(code, grpc.StatusCode) else str(code)
            metrics.rpcs.labels(method, name).inc()
            metrics.rpc_seconds.labels(method).observe(time.perf_counter() - start)

        async def unary(request: Any, context: grpc.aio.ServicerContext) -> Any:
            start, failed = time.perf_counter(), None
            try:
                return await handler.unary_unary(request, context)
            except BaseException as exc:  # recorded and raised again: an abort() is an exception too
                failed = exc
                raise
            finally:
                done(context, start, failed)

        async def stream(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
            start, failed = time.perf_counter(), None
            try:
                async for item in handler.unary_stream(request, context):
                    yield item
            except BaseException as exc:  # recorded and raised again (a client's cancel is CancelledError)
                failed = exc
                raise
            finally:
                done(context, start, failed)

        if handler.unary_unary:
            return grpc.unary_unary_rpc_method_handler(
                unary, request_deserializer=handler.request_deserializer, response_serializer=handler.response_serializer
            )
        return grpc.unary_stream_rpc_method_handler(
            stream, request_deserializer=handler.request_deserializer, response_serializer=handler.response_serializer
        )
