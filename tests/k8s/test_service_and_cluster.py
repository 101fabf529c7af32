"""k8s/: the service and the Ray cluster wired to each other: ports, Ray's token, the path policy, GPUs
handed out, drains, each team's storage credentials, caches on their volumes."""

from __future__ import annotations

import dataclasses

import pytest
import yaml

from tests.k8s.rendering import KUBERAY, env_of, objects, one, pod_templates, rendered


@pytest.mark.parametrize("path", ["overlays/dev", "overlays/prod"])
def test_service_deployment_wiring(path):
    deployment, service, cluster = one("Deployment", path), one("Service", path, "rayft"), one("RayCluster", path)
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    env = env_of(container)
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert int(env["RAYFT_PORT"]) == ports["grpc"]
    assert int(env["RAYFT_WATCH_PORT"]) == ports["watch"]  # WatchJob's process: clients are sent to this port
    assert int(env["RAYFT_HEALTH_PORT"]) == ports["health"] == container["readinessProbe"]["grpc"]["port"]
    assert container["livenessProbe"]["grpc"]["port"] == ports["health"] and int(env["RAYFT_METRICS_PORT"]) == ports["metrics"]
    assert service["spec"]["selector"] == deployment["spec"]["selector"]["matchLabels"]
    service_ports = {p["port"] for p in service["spec"]["ports"]}
    host, _, port = env["RAYFT_REPORT_ADDRESS"].partition(":")
    assert host == service["metadata"]["name"] and int(port) in service_ports
    assert int(env["RAYFT_WATCH_PORT"]) in service_ports
    open_ports = {p["port"] for r in one("NetworkPolicy", path, "rayft-service")["spec"]["ingress"] for p in r["ports"]}
    assert {int(env["RAYFT_PORT"]), int(env["RAYFT_WATCH_PORT"])} <= open_ports
    assert int(port) == int(env.get("RAYFT_REPORT_PORT") or env["RAYFT_PORT"])
    assert env["RAYFT_RAY_ADDRESS"] == f"http://{cluster['metadata']['name']}-head-svc:8265"
    assert deployment["spec"]["replicas"] == 1 and deployment["spec"]["strategy"]["type"] == "Recreate"  # one SQLite writer
    assert pod["automountServiceAccountToken"] is False


@pytest.mark.parametrize("path", ["overlays/dev", "overlays/prod"])
def test_the_service_hands_out_the_gpus_the_ray_cluster_can_hold(path):
    """RAYFT_CLUSTER_GPUS gates GPU launches (service/admission.py): it must be what the workers can grow to."""
    env = env_of(one("Deployment", path)["spec"]["template"]["spec"]["containers"][0])
    groups = one("RayCluster", path)["spec"]["workerGroupSpecs"]
    most = sum(
        g["maxReplicas"] * int(g["template"]["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"]) for g in groups
    )
    assert float(env["RAYFT_CLUSTER_GPUS"]) == most


def test_the_service_reads_a_path_policy_that_loads_and_keeps_jobs_off_its_data_volume():
    from rayft_contract.spec import FineTuneSpec
    from service.policy import PathPolicy, PolicyDenied

    pod = one("Deployment")["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    env = env_of(container)
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    volume = next(v for v in pod["volumes"] if v["name"] == "policy")
    config = one("ConfigMap", name=volume["configMap"]["name"])
    assert env["RAYFT_POLICY"] == f"{mounts['policy']}/policy.yaml"
    # Off loopback the service needs TLS: its certificate and key come from a mounted Secret.
    tls = next(v for v in pod["volumes"] if v["name"] == "tls")
    assert "secret" in tls and env["RAYFT_HOST"] == "0.0.0.0"
    for name in ("RAYFT_TLS_CERT", "RAYFT_TLS_KEY", "RAYFT_REPORT_TLS_CA"):
        assert env[name].startswith(mounts["tls"] + "/")
    policy = PathPolicy.from_dict(yaml.safe_load(config["data"]["policy.yaml"]), protected=(env["RAYFT_DATA_DIR"],))
    spec = FineTuneSpec.from_dict(
        {"name": "j", "model": {"path": "s3://rayft-models/llama"}, "data": {"path": "s3://rayft-datasets/vision/x.jsonl"}}
    )
    assert policy.apply("vision", spec, "ft-1").output.dir == "s3://rayft-outputs/vision/ft-1"
    with pytest.raises(PolicyDenied):
        policy.apply("vision", spec.replace(data=dataclasses.replace(spec.data, path="/data/jobs.db")), "ft-1")


@pytest.mark.parametrize("path", ["overlays/dev", "overlays/prod"])
def test_ray_token_auth_is_on_everywhere_and_only_the_service_reaches_the_jobs_api(path):
    """Issue 10: the Jobs API runs anything it is given; teams must go through rayft, never around it."""
    cluster, service = one("RayCluster", path), one("Deployment", path)
    pods = [pod for _, pod in pod_templates(cluster) + pod_templates(service)]
    for pod in pods:
        auth = {v["name"]: v for v in pod["volumes"]}["ray-auth"]
        assert auth["secret"]["secretName"] == "rayft-ray-auth"
        for container in pod["containers"]:
            env = env_of(container)
            mount = next(m["mountPath"] for m in container["volumeMounts"] if m["name"] == "ray-auth")
            assert env["RAY_AUTH_MODE"] == "token" and env["RAY_AUTH_TOKEN_PATH"] == f"{mount}/auth_token", container["name"]
    policy = one("NetworkPolicy", path, "rayft-ray-cluster")
    assert policy["spec"]["podSelector"]["matchLabels"] == {"ray.io/cluster": cluster["metadata"]["name"]}
    rules = policy["spec"]["ingress"]
    service_labels = service["spec"]["template"]["metadata"]["labels"]
    (from_service,) = [r for r in rules if r["from"][0]["podSelector"]["matchLabels"].items() <= service_labels.items()]
    assert from_service["ports"] == [{"protocol": "TCP", "port": 8265}]
    assert all("namespaceSelector" not in f and "ipBlock" not in f for r in rules for f in r["from"])  # nobody else
    # Ray's export port opens to Prometheus only where monitoring is on, and only that port.
    metrics = [p for p in objects("NetworkPolicy", path) if p["metadata"]["name"] == "rayft-ray-metrics"]
    for extra in metrics:
        assert [p["port"] for r in extra["spec"]["ingress"] for p in r["ports"]] == [8080]


def test_in_prod_only_the_ray_pods_reach_the_reporting_port():
    container = one("Deployment")["spec"]["template"]["spec"]["containers"][0]
    report_port = int(env_of(container)["RAYFT_REPORT_PORT"])
    rules = one("NetworkPolicy", name="rayft-service")["spec"]["ingress"]
    reaching = [r for r in rules if any(p["port"] == report_port for p in r["ports"])]
    assert [r["from"] for r in reaching] == [[{"podSelector": {"matchLabels": {"ray.io/cluster": "rayft"}}}]]
    public = one("Service", name="rayft-public")  # the team API and its watch streams; never the reporting port
    env = env_of(container)
    assert public["spec"]["type"] == "LoadBalancer"
    assert [p["port"] for p in public["spec"]["ports"]] == [int(env["RAYFT_PORT"]), int(env["RAYFT_WATCH_PORT"])]


def test_in_prod_drains_wait_for_running_jobs_and_pods_have_defined_priorities():
    cluster = one("RayCluster")
    budgets = objects("PodDisruptionBudget")
    # KubeRay labels every pod with its cluster, node type and group.
    head = {"ray.io/cluster": "rayft", "ray.io/node-type": "head"}
    workers = [{"ray.io/cluster": "rayft", "ray.io/group": g["groupName"]} for g in cluster["spec"]["workerGroupSpecs"]]
    covered = [b["spec"]["selector"]["matchLabels"] for b in budgets if b["spec"]["maxUnavailable"] == 0]
    assert head in covered and all(w in covered for w in workers)
    classes = {p["metadata"]["name"] for p in objects("PriorityClass")}
    used = {pod.get("priorityClassName") for d in rendered("overlays/prod") for _, pod in pod_templates(d)}
    assert used == classes
    (gpu,) = cluster["spec"]["workerGroupSpecs"]
    assert gpu["maxReplicas"] > gpu["minReplicas"] == 0 and cluster["spec"]["enableInTreeAutoscaling"]
    cache = {v["name"]: v for v in gpu["template"]["spec"]["volumes"]}["cache"]
    assert "ephemeral" in cache and gpu["template"]["spec"]["nodeSelector"]  # node-local NVMe on labelled GPU nodes


def test_dev_is_one_small_fixed_cluster():
    cluster = one("RayCluster", "overlays/dev")
    (gpu,) = cluster["spec"]["workerGroupSpecs"]
    assert gpu["replicas"] == gpu["minReplicas"] == gpu["maxReplicas"] == 1 and not cluster["spec"]["enableInTreeAutoscaling"]
    assert (
        env_of(one("Deployment", "overlays/dev")["spec"]["template"]["spec"]["containers"][0])["RAYFT_CLUSTER_AUTOSCALES"] == "0"
    )
    assert not objects("PodMonitor", "overlays/dev") and not objects("PriorityClass", "overlays/dev")


def test_each_team_has_its_own_storage_credentials_on_the_ray_nodes():
    """One Secret per team, mounted under its team's name; the job signs with its own (ray_jobs/storage.py)."""
    cluster = one("RayCluster")
    for _, pod in pod_templates(cluster):
        volume = {v["name"]: v for v in pod["volumes"]}["team-credentials"]
        for source in volume["projected"]["sources"]:
            secret = source["secret"]
            team = secret["name"].removeprefix("rayft-team-")
            assert secret["optional"] and all(i["path"].startswith(f"{team}/") for i in secret["items"])
        for container in pod["containers"]:
            mount = next(m for m in container["volumeMounts"] if m["name"] == "team-credentials")
            assert mount["readOnly"] and env_of(container)["RAYFT_TEAM_CREDENTIALS_DIR"] == mount["mountPath"]
            assert "envFrom" not in container  # no keys shared by every team's jobs


@pytest.mark.parametrize("path", ["overlays/dev", "overlays/prod", "jobs/finetune"])
def test_every_cache_of_a_ray_pod_is_on_its_cache_volume_not_on_tmp(path):
    """rayft's caches (datasets, models, compiled kernels), the hub's and Triton's: unset, RAYFT_CACHE_DIR falls
    back to ~/.cache/rayft, which is /tmp here (HOME), a smaller volume than the one sized for caches."""
    for doc in rendered(path):
        if doc["kind"] not in KUBERAY:
            continue
        for where, pod in pod_templates(doc):
            for container in pod["containers"]:
                cache = next(m["mountPath"] for m in container["volumeMounts"] if m["name"] == "cache")
                env = env_of(container)
                for name in ("RAYFT_CACHE_DIR", "HF_HOME", "TRITON_CACHE_DIR"):
                    assert (env.get(name) or "").startswith(cache + "/"), f"{path} {where}: {name}={env.get(name)}"
