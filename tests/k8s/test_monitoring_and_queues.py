"""k8s/: what Prometheus scrapes and Grafana charts exists, and a RayJob waits in a Kueue queue that exists."""

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


def test_the_grafana_dashboard_charts_only_series_that_rayft_exports():
    from prometheus_client import generate_latest

    from ray_jobs.observe.tracking import RAY_GAUGES
    from service.metrics import ServiceMetrics

    (config,) = [c for c in objects("ConfigMap") if c["metadata"]["name"] == "rayft-grafana-dashboard"]
    assert config["metadata"]["labels"]["grafana_dashboard"] == "1"
    dashboard = json.loads(config["data"]["rayft.json"])
    exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    used = {name for e in exprs for name in re.findall(r"\b(rayft_\w+|ray_rayft_\w+)", e)}
    text = generate_latest(ServiceMetrics(lambda: {}).registry).decode()
    service = {m for m in re.findall(r"^# TYPE (\w+) (\w+)", text, re.M) for m in [m[0]]}
    service |= {f"{name}{suffix}" for name in service for suffix in ("_total", "_bucket", "_count", "_sum")}
    jobs = {f"ray_rayft_job_{name}" for name in RAY_GAUGES}
    assert used - service - jobs == set()
    assert jobs <= used  # every job gauge has a panel
    assert {"rayft_jobs", "rayft_rpc_total", "rayft_watch_streams", "rayft_launch_failures_total"} <= used


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
