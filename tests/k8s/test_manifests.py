"""k8s/: every kustomization renders, and what it renders validates offline, strictly, and scans clean.

- Core kinds against the Kubernetes JSON schemas (``kubernetes-validate``, strict: unknown fields fail).
- RayCluster/RayJob against KubeRay v1.7.0's CRDs (copied, gzipped, from ``config/crd/bases``), made
  strict the same way: the API server prunes unknown fields silently, so a typo
  (``shutdownAfterJobFinish``) would deploy and be ignored.
- The Prometheus Operator's and Kueue's kinds have no schema here: their wiring is checked instead
  (what they select exists, what they name is defined).
- checkov on every rendering, with no failure left: each accepted finding is a ``checkov.io/skipN``
  annotation on its object, with its reason.
- The pod hardening checkov cannot see inside KubeRay's kinds, checked on every pod template here.
"""

from __future__ import annotations

import dataclasses
import functools
import gzip
import json
import re
import shutil
import subprocess
from pathlib import Path

import jsonschema
import kubernetes_validate
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "k8s"
CRDS = Path(__file__).parent / "crd"
KUBERNETES = "1.32.0"
"""The Kubernetes version the core kinds are checked against (kubectl here is 1.32)."""
RENDERED = ["base", "overlays/dev", "overlays/prod", "jobs/finetune", "kueue"]
"""Every kustomization one applies (``monitoring`` is a Component, rendered inside ``overlays/prod``)."""
KUBERAY = {"RayCluster", "RayJob"}
UNCHECKED = {"PodMonitor", "ResourceFlavor", "ClusterQueue", "LocalQueue", "WorkloadPriorityClass"}
"""Kinds whose CRDs are not vendored here; the tests below check their wiring instead."""


@functools.lru_cache
def rendered(path: str) -> tuple[dict, ...]:
    kubectl = shutil.which("kubectl")
    assert kubectl, "kubectl (its built-in kustomize) renders k8s/; install it"
    out = subprocess.run([kubectl, "kustomize", str(K8S / path)], capture_output=True, text=True, timeout=120, check=True).stdout
    return tuple(doc for doc in yaml.safe_load_all(out) if doc)


def objects(kind: str, path: str = "overlays/prod") -> list[dict]:
    return [doc for doc in rendered(path) if doc["kind"] == kind]


def one(kind: str, path: str = "overlays/prod", name: str | None = None) -> dict:
    (found,) = [d for d in objects(kind, path) if name is None or d["metadata"]["name"] == name]
    return found


def every_object():
    return [
        pytest.param(path, doc, id=f"{path}:{doc['kind']}/{doc['metadata']['name']}")
        for path in RENDERED
        for doc in rendered(path)
    ]


def strict(schema: dict) -> dict:
    """Reject unknown keys wherever the schema lists properties and does not preserve unknowns."""
    if isinstance(schema, dict):
        schema = {k: strict(v) for k, v in schema.items()}
        if (
            "properties" in schema
            and "additionalProperties" not in schema
            and not schema.get("x-kubernetes-preserve-unknown-fields")
        ):
            schema["additionalProperties"] = False
        return schema
    if isinstance(schema, list):
        return [strict(v) for v in schema]
    return schema


@functools.lru_cache
def crd_schema(kind: str) -> dict:
    for path in CRDS.glob("*.yaml.gz"):
        crd = yaml.safe_load(gzip.decompress(path.read_bytes()))
        if crd["spec"]["names"]["kind"] == kind:
            (version,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1"]
            return strict(version["schema"]["openAPIV3Schema"])
    raise LookupError(kind)


def pod_templates(doc: dict) -> list[tuple[str, dict]]:
    """(where, pod spec) of every pod an object makes, KubeRay's included."""
    spec = doc.get("spec", {})
    if doc["kind"] == "Deployment":
        return [("template", spec["template"]["spec"])]
    cluster = spec.get("rayClusterSpec", spec) if doc["kind"] in KUBERAY else None
    if cluster is None:
        return []
    groups = [("head", cluster["headGroupSpec"])] + [(g["groupName"], g) for g in cluster.get("workerGroupSpecs", [])]
    return [(name, group["template"]["spec"]) for name, group in groups]


def env_of(container: dict) -> dict[str, str | None]:
    return {e["name"]: e.get("value") for e in container.get("env", [])}


# -- every file, every rendering --------------------------------------------------------------------


@pytest.mark.parametrize("manifest", sorted(K8S.rglob("*.yaml")), ids=lambda p: str(p.relative_to(K8S)))
def test_every_manifest_opens_with_what_it_is_for(manifest):
    lines = manifest.read_text().splitlines()
    assert lines[0].startswith("# ") and len([line for line in lines[:12] if line.startswith("#")]) >= 2


@pytest.mark.parametrize(("path", "doc"), every_object())
def test_every_object_validates_strictly(path, doc):
    if doc["kind"] in KUBERAY:
        jsonschema.validate(doc, crd_schema(doc["kind"]))
    elif doc["kind"] in UNCHECKED:
        assert doc["apiVersion"] in ("monitoring.coreos.com/v1", "kueue.x-k8s.io/v1beta1")
    else:
        kubernetes_validate.validate(doc, KUBERNETES, strict=True)


def test_strict_validation_catches_a_typo_in_either_kind_of_schema():
    job = one("RayJob", "jobs/finetune")
    with pytest.raises(jsonschema.ValidationError, match="shutdownAfterJobFinish"):
        jsonschema.validate({**job, "spec": {**job["spec"], "shutdownAfterJobFinish": True}}, crd_schema("RayJob"))
    deployment = one("Deployment")
    typo = {**deployment, "spec": {**deployment["spec"], "replica": 1}}
    with pytest.raises(kubernetes_validate.ValidationError, match="replica"):
        kubernetes_validate.validate(typo, KUBERNETES, strict=True)


@pytest.mark.parametrize("path", RENDERED)
def test_checkov_finds_nothing_that_is_not_accepted_with_its_reason(path, tmp_path):
    checkov = ROOT / ".venv" / "checkov" / "bin" / "checkov"
    assert checkov.exists(), "checkov has its own venv (its pins clash with ours): `make install` makes it"
    (tmp_path / "rendered.yaml").write_text(yaml.safe_dump_all(rendered(path)))
    run = subprocess.run(
        [str(checkov), "-d", str(tmp_path), "--framework", "kubernetes", "--skip-download", "-o", "json", "--quiet"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    report = json.loads(run.stdout) if run.stdout.strip() else {}
    reports = report if isinstance(report, list) else [report]
    failed = [(c["check_id"], c["resource"]) for r in reports for c in r.get("results", {}).get("failed_checks", [])]
    assert failed == [], failed
    for doc in rendered(path):
        for key, value in doc["metadata"].get("annotations", {}).items():
            if key.startswith("checkov.io/skip"):
                check, _, reason = value.partition("=")
                assert re.fullmatch(r"CKV2?_K8S_\d+", check) and len(reason.split()) >= 5, (doc["metadata"]["name"], value)


@pytest.mark.parametrize("path", RENDERED)
def test_every_pod_runs_non_root_without_capabilities_on_a_read_only_root(path):
    pods = [(f"{d['kind']}/{d['metadata']['name']}/{where}", pod) for d in rendered(path) for where, pod in pod_templates(d)]
    assert pods or path == "kueue"
    for where, pod in pods:
        security = pod["securityContext"]
        assert security["runAsNonRoot"] and security["runAsUser"] >= 10000, where
        assert security["seccompProfile"] == {"type": "RuntimeDefault"}, where
        volumes = {v["name"] for v in pod["volumes"]}
        for container in pod["containers"]:
            c = container["securityContext"]
            assert c == {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}, "readOnlyRootFilesystem": True}, (
                where
            )
            mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
            assert "/tmp" in mounts and set(mounts.values()) <= volumes, where  # what it writes is a named volume
            assert all(not r.get("valueFrom", {}).get("secretKeyRef") for r in container.get("env", [])), (
                where
            )  # secrets as files
            assert container["resources"]["limits"]["memory"], where
    for doc in objects("RayCluster", path):
        if doc["spec"].get("enableInTreeAutoscaling"):  # the autoscaler sidecar, which KubeRay adds to the head
            assert doc["spec"]["autoscalerOptions"]["securityContext"]["readOnlyRootFilesystem"] is True


@pytest.mark.parametrize("path", [p for p in RENDERED if p != "base"])  # base is the overlays' template
def test_images_are_rewritten_to_a_registry(path):
    """``rayjob.finetune.yaml`` used to be applied without kustomize, so its image was never rewritten."""
    images = [c["image"] for d in rendered(path) for _, pod in pod_templates(d) for c in pod["containers"]]
    assert all(re.fullmatch(r"[\w.-]+\.\w+/[\w./-]+(:[\w.-]+|@sha256:[0-9a-f]{64})", i) for i in images), images
    assert {i.rsplit("/", 1)[1].split(":")[0] for i in images} <= {"rayft-ray", "rayft-service"}


def test_ray_version_matches_the_pinned_ray():
    import ray

    for path in RENDERED:
        for doc in rendered(path):
            if doc["kind"] in KUBERAY:
                assert doc["spec"].get("rayClusterSpec", doc["spec"])["rayVersion"] == ray.__version__


# -- the service and the Ray cluster ------------------------------------------------------------------


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


# -- monitoring --------------------------------------------------------------------------------------


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


# -- the two images ----------------------------------------------------------------------------------


def test_the_two_images_match_the_manifests_pins_and_users():
    """Not built here (no Docker engine): what can be checked of them offline is."""
    import tomllib

    import ray

    ray_image, service_image = (ROOT / "Dockerfile").read_text(), (ROOT / "Dockerfile.service").read_text()
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    # The service's image installs the light profile: no torch, no CUDA (service/ never imports torch).
    assert re.findall(r'"rayft\[(\w+)\]"', service_image) == ["service"] and not any("torch" in d for d in extras["service"])
    # The Ray nodes' image: the pinned Ray's CUDA image, by digest, and the pinned dependencies.
    (base,) = re.findall(r"^ARG RAY_BASE=(\S+)$", ray_image, re.M)
    assert base.startswith(f"rayproject/ray:{ray.__version__}-py311-cu")
    assert re.findall(r"^FROM (\S+)", ray_image, re.M) == ["${RAY_BASE}@${RAY_BASE_DIGEST}"] * 2
    for image in (ray_image, service_image):
        assert "-c constraints.txt" in image and "--no-index" in image  # the wheels built from the pins, nothing else
        (user,) = re.findall(r"^USER (\d+):(\d+)$", image, re.M)
        for path in RENDERED:
            for doc in rendered(path):
                for _, pod in pod_templates(doc):
                    assert (str(pod["securityContext"]["runAsUser"]), str(pod["securityContext"]["runAsGroup"])) == user
    ignored = (ROOT / ".dockerignore").read_text().split()
    assert {".git", ".venv", "tests"} <= set(ignored)
