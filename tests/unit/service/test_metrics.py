"""The service's metrics: the watch process's series join the API process's on one endpoint."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from service.metrics import ServiceMetrics, _Merged


def samples(text: str) -> dict[tuple[str, frozenset], float]:
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if not s.name.endswith("_created")
    }


def test_another_processs_series_are_summed_into_ours_and_each_series_appears_once():
    api, watch = ServiceMetrics(lambda: {}), ServiceMetrics()
    api.rpcs.labels("GetJob", "OK").inc(2)
    api.rpcs.labels("WatchJob", "FAILED_PRECONDITION").inc()  # sent on to the watch process
    watch.rpcs.labels("WatchJob", "OK").inc(3)
    watch.streams.labels("team-a").inc()
    api.rpc_seconds.labels("WatchJob").observe(0.002)
    watch.rpc_seconds.labels("WatchJob").observe(0.5)
    elsewhere = list(text_string_to_metric_families(generate_latest(watch.registry).decode()))
    exposed = CollectorRegistry()
    exposed.register(_Merged(api.registry, lambda: elsewhere))
    text = generate_latest(exposed).decode()
    got = samples(text)
    assert got[("rayft_rpc_total", frozenset({("method", "GetJob"), ("code", "OK")}))] == 2
    assert got[("rayft_rpc_total", frozenset({("method", "WatchJob"), ("code", "OK")}))] == 3
    assert got[("rayft_rpc_total", frozenset({("method", "WatchJob"), ("code", "FAILED_PRECONDITION")}))] == 1
    assert got[("rayft_watch_streams", frozenset({("team", "team-a")}))] == 1
    assert got[("rayft_rpc_seconds_count", frozenset({("method", "WatchJob")}))] == 2
    assert got[("rayft_rpc_seconds_bucket", frozenset({("method", "WatchJob"), ("le", "0.005")}))] == 1
    assert got[("rayft_rpc_seconds_bucket", frozenset({("method", "WatchJob"), ("le", "1.0")}))] == 2
    type_lines = [line for line in text.splitlines() if line.startswith("# TYPE")]
    assert len(type_lines) == len(set(type_lines))
