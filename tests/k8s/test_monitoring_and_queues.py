"""k8s/: what Prometheus scrapes, Grafana charts and the alerts watch exists, and a RayJob waits in a Kueue queue
that exists."""

from __future__ import annotations

import json
import re

import yaml

from tests.k8s.rendering import objects, one, pod_templates


def test_podmonitors_select_pods_that_serve_the_port_they_scrape():
    pods = {
        "rayft-service": [one("Deployment")["spec"]["template"]],
        "rayft-ray": [
            {"metadata": {"labels": {"ray.io/cluster": "rayft"}}, "spec": pod} for _, pod in pod_templates(one("RayCluster"))
        ],
    }
    for monitor in objects("PodMonitor"):
        selected = pods[monitor["metadata"]["name"]]
        for template in selected:
            assert monitor["spec"]["selector"]["matchLabels"].items() <= template["metadata"]["labels"].items()
            names = {p["name"] for c in template["spec"]["containers"] for p in c.get("ports", [])}
            assert {e["port"] for e in monitor["spec"]["podMetricsEndpoints"]} <= names


TARGET_LABELS = {"job", "instance", "namespace", "pod", "container", "endpoint"}
"""What Prometheus adds to every series a PodMonitor scrapes."""


def exported_series() -> dict[str, set[str]]:
    """Every series rayft exports, by name, with the labels it can be selected and grouped by: the service's
    (each histogram's ``_bucket``, ``_count`` and ``_sum``, each counter's ``_total``), the jobs' Ray gauges, ``up``."""
    from prometheus_client.metrics import MetricWrapperBase

    from ray_jobs.observe.tracking import RAY_GAUGES
    from rayft_contract.states import JobState
    from service.metrics import ServiceMetrics

    metrics = ServiceMetrics(lambda: {(JobState.QUEUED, "team-a"): 1})
    series = {"up": set(TARGET_LABELS), "rayft_jobs": {"state", "team", *TARGET_LABELS}}
    for metric in vars(metrics).values():
        if isinstance(metric, MetricWrapperBase):
            name, labels = metric._name, {*metric._labelnames, *TARGET_LABELS}  # no public accessor for either
            kind = metric._type
            suffixes = {"counter": ["_total"], "histogram": ["_bucket", "_count", "_sum"]}.get(kind, [""])
            for suffix in suffixes:
                series[name + suffix] = labels | ({"le"} if suffix == "_bucket" else set())
    for name in RAY_GAUGES:
        series[f"ray_rayft_job_{name}"] = {"job_id", "team", *TARGET_LABELS}
    return series


def selectors(expr) -> list:
    """Every metric selector in a parsed PromQL expression."""
    import promql_parser

    found: list = []
    promql_parser.walk(expr, lambda node: found.append(node) if isinstance(node, promql_parser.VectorSelector) else None)
    return found


def output_labels(expr, series: dict[str, set[str]]) -> set[str]:
    """The labels an expression's result keeps: what an alert's ``$labels`` can name."""
    import promql_parser as p

    if isinstance(expr, p.VectorSelector):
        return series[expr.name]
    if isinstance(expr, p.MatrixSelector):
        return output_labels(expr.vector_selector, series)
    if isinstance(expr, p.ParenExpr):
        return output_labels(expr.expr, series)
    if isinstance(expr, p.AggregateExpr):
        inner = output_labels(expr.expr, series)
        if expr.modifier is None:
            return set()
        kept = set(expr.modifier.labels)
        return kept if expr.modifier.type == p.AggModifierType.By else inner - kept
    if isinstance(expr, p.Call):
        vectors = [output_labels(a, series) for a in expr.args if not isinstance(a, (p.NumberLiteral, p.StringLiteral))]
        if expr.func.name in ("absent", "vector", "scalar", "time") or not vectors:
            return set()
        return vectors[-1] - ({"le"} if expr.func.name == "histogram_quantile" else set())
    if isinstance(expr, p.BinaryExpr):  # a comparison or `and` keeps the left side's labels
        return output_labels(expr.lhs, series) if not isinstance(expr.lhs, p.NumberLiteral) else output_labels(expr.rhs, series)
    return set()


def test_the_grafana_dashboard_charts_only_series_that_rayft_exports():
    import promql_parser

    from ray_jobs.observe.tracking import RAY_GAUGES

    (config,) = [c for c in objects("ConfigMap") if c["metadata"]["name"] == "rayft-grafana-dashboard"]
    assert config["metadata"]["labels"]["grafana_dashboard"] == "1"
    dashboard = json.loads(config["data"]["rayft.json"])
    series = exported_series()
    used = set()
    for expr in (promql_parser.parse(t["expr"]) for p in dashboard["panels"] for t in p["targets"]):
        for selector in selectors(expr):
            assert {m.name for m in selector.matchers.matchers} <= series[selector.name], selector  # a KeyError: not ours
            used.add(selector.name)
    assert {f"ray_rayft_job_{name}" for name in RAY_GAUGES} <= used  # every job gauge has a panel
    assert {
        "rayft_jobs",
        "rayft_rpc_total",
        "rayft_watch_streams",
        "rayft_launch_failures_total",
        "rayft_store_faults_total",
    } <= used


def test_every_alert_parses_selects_what_rayft_exports_and_names_only_labels_its_result_keeps():
    import promql_parser

    from rayft_contract.states import JobState

    (rule,) = objects("PrometheusRule")
    (service_monitor,) = [m for m in objects("PodMonitor") if m["metadata"]["name"] == "rayft-service"]
    assert rule["metadata"]["labels"] == service_monitor["metadata"]["labels"]  # the same Prometheus selects both
    series = exported_series()
    alerts = [r for group in rule["spec"]["groups"] for r in group["rules"]]
    assert len({a["alert"] for a in alerts}) == len(alerts)
    for alert in alerts:
        where = alert["alert"]
        expr = promql_parser.parse(alert["expr"])  # a syntax error raises, naming where
        for selector in selectors(expr):
            assert selector.name in series, (where, selector.name)
            for matcher in selector.matchers.matchers:
                assert matcher.name in series[selector.name], (where, selector.name, matcher.name)
                if matcher.name == "state":
                    assert set(matcher.value.split("|")) <= {s.value for s in JobState}, (where, matcher.value)
                if selector.name == "up" and matcher.name == "job":  # PodMonitor targets are namespace/name
                    assert matcher.value == f"{service_monitor['metadata']['namespace']}/rayft-service", where
        named = set(re.findall(r"\$labels\.(\w+)", json.dumps(alert["annotations"])))
        assert named <= output_labels(expr, series), (where, named)
        assert alert["labels"]["severity"] in {"critical", "warning", "info"}, where
        assert alert["annotations"]["summary"] and alert["annotations"]["description"], where


def test_an_alert_that_names_a_label_its_expression_drops_is_caught():
    """The check above can fail: a sum without `by` keeps no label, so a message naming the job would be empty."""
    import promql_parser

    series = exported_series()
    dropped = promql_parser.parse("sum(changes(ray_rayft_job_step[30m])) == 0")
    kept = promql_parser.parse("changes(ray_rayft_job_step[30m]) == 0")
    grouped = promql_parser.parse("sum by (kind) (increase(rayft_store_faults_total[5m])) > 0")
    assert "job_id" not in output_labels(dropped, series) and {"job_id", "team"} <= output_labels(kept, series)
    assert output_labels(grouped, series) == {"kind"}


# -- RayJobs and Kueue -------------------------------------------------------------------------------


def test_the_rayjob_runs_its_own_spec_and_waits_in_a_kueue_queue_that_exists():
    from rayft_contract.spec import FineTuneSpec

    job = one("RayJob", "jobs/finetune")
    (config,) = objects("ConfigMap", "jobs/finetune")
    volume = next(v for v in job["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]["volumes"] if "configMap" in v)
    assert volume["configMap"]["name"] == config["metadata"]["name"]  # the generated name, hash and all
    spec = FineTuneSpec.from_dict(yaml.safe_load(config["data"]["job.yaml"]))
    assert all(p.startswith("s3://") for p in (spec.model.path, spec.data.path, spec.output.dir))  # pods keep nothing
    (gpu,) = job["spec"]["rayClusterSpec"]["workerGroupSpecs"]
    assert gpu["replicas"] == spec.scaling.num_workers
    assert job["spec"]["shutdownAfterJobFinishes"] is True  # Kueue admits only jobs that give their cluster back
    labels = job["metadata"]["labels"]
    queues = {(q["metadata"]["namespace"], q["metadata"]["name"]): q for q in objects("LocalQueue", "kueue")}
    queue = queues[(job["metadata"]["namespace"], labels["kueue.x-k8s.io/queue-name"])]
    assert labels["kueue.x-k8s.io/priority-class"] in {p["metadata"]["name"] for p in objects("WorkloadPriorityClass", "kueue")}
    cluster_queue = one("ClusterQueue", "kueue", queue["spec"]["clusterQueue"])
    (group,) = cluster_queue["spec"]["resourceGroups"]
    flavors = {f["metadata"]["name"] for f in objects("ResourceFlavor", "kueue")}
    assert {f["name"] for f in group["flavors"]} <= flavors
    quota = {r["name"]: r["nominalQuota"] for f in group["flavors"] for r in f["resources"]}
    assert quota["nvidia.com/gpu"] >= int(gpu["template"]["spec"]["containers"][0]["resources"]["requests"]["nvidia.com/gpu"])
