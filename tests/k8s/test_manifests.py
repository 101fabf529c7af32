"""Every manifest in k8s/ validates against KubeRay v1.7.0's CRD schemas, strictly.

The API server prunes unknown fields silently, so a typo (``shutdownAfterJobFinish``) would deploy and
be ignored. Here every object with declared properties rejects unknown keys. The CRDs are copied,
gzipped, from KubeRay v1.7.0 (``config/crd/bases``).
"""

from __future__ import annotations

import dataclasses
import functools
import gzip
from pathlib import Path

import jsonschema
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
CRDS = Path(__file__).parent / "crd"
MANIFESTS = sorted((ROOT / "k8s").glob("*.yaml"))


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


def documents() -> list[tuple[str, dict]]:
    return [(f"{p.name}#{i}", doc) for p in MANIFESTS for i, doc in enumerate(yaml.safe_load_all(p.read_text())) if doc]


@pytest.mark.parametrize("manifest", MANIFESTS, ids=lambda p: p.name)
def test_manifest_opens_with_what_it_is_for(manifest):
    lines = manifest.read_text().splitlines()
    assert lines[0].startswith("# ") and len([line for line in lines[:12] if line.startswith("#")]) >= 2


@pytest.mark.parametrize(
    ("name", "doc"),
    [d for d in documents() if d[1]["kind"] in ("RayJob", "RayCluster")],
    ids=lambda x: x if isinstance(x, str) else "",
)
def test_kuberay_objects_match_the_crd(name, doc):
    jsonschema.validate(doc, crd_schema(doc["kind"]))


def test_strict_schema_catches_a_typo():
    (_, job) = next(d for d in documents() if d[1]["kind"] == "RayJob")
    job = {**job, "spec": {**job["spec"], "shutdownAfterJobFinish": True}}
    with pytest.raises(jsonschema.ValidationError, match="shutdownAfterJobFinish"):
        jsonschema.validate(job, crd_schema("RayJob"))


def test_ray_version_matches_the_pinned_ray():
    import ray

    for _, doc in documents():
        spec = doc.get("spec", {})
        cluster = spec.get("rayClusterSpec", spec)
        if "rayVersion" in cluster:
            assert cluster["rayVersion"] == ray.__version__


def test_kustomization_lists_existing_files():
    kustomization = yaml.safe_load((ROOT / "k8s" / "kustomization.yaml").read_text())
    for resource in kustomization["resources"]:
        assert (ROOT / "k8s" / resource).is_file()


def test_service_deployment_wiring():
    docs = {d["kind"]: d for _, d in documents() if d.get("metadata", {}).get("name", "").startswith("rayft")}
    deployment, service = docs["Deployment"], docs["Service"]
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    port = next(p["containerPort"] for p in container["ports"] if p["name"] == "grpc")
    assert int(env["RAYFT_PORT"]) == port
    health_port = next(p["containerPort"] for p in container["ports"] if p["name"] == "health")
    assert int(env["RAYFT_HEALTH_PORT"]) == health_port == container["readinessProbe"]["grpc"]["port"]
    assert container["livenessProbe"]["grpc"]["port"] == health_port
    assert service["spec"]["selector"] == deployment["spec"]["selector"]["matchLabels"]
    assert env["RAYFT_REPORT_ADDRESS"] == f"{service['metadata']['name']}:{service['spec']['ports'][0]['port']}"
    cluster = next(d for _, d in documents() if d["kind"] == "RayCluster")
    assert env["RAYFT_RAY_ADDRESS"] == f"http://{cluster['metadata']['name']}-head-svc:8265"
    assert deployment["spec"]["replicas"] == 1 and deployment["spec"]["strategy"]["type"] == "Recreate"  # one SQLite writer


def test_the_service_reads_a_path_policy_that_loads_and_keeps_jobs_off_its_data_volume():
    from rayft_contract.spec import FineTuneSpec
    from service.policy import PathPolicy, PolicyDenied

    docs = {d["kind"]: d for _, d in documents() if d.get("metadata", {}).get("name", "").startswith("rayft")}
    pod = docs["Deployment"]["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    volume = next(v for v in pod["volumes"] if v["name"] == "policy")
    config = docs["ConfigMap"]
    assert volume["configMap"]["name"] == config["metadata"]["name"]
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


def test_ray_token_auth_is_on_everywhere_and_only_the_service_reaches_the_jobs_api():
    """Issue 10: the Jobs API runs anything it is given; teams must go through rayft, never around it."""
    cluster = next(d for _, d in documents() if d["kind"] == "RayCluster")
    service = next(d for _, d in documents() if d["kind"] == "Deployment")
    pods = [cluster["spec"]["headGroupSpec"]["template"], *(g["template"] for g in cluster["spec"]["workerGroupSpecs"])]
    containers = [c for pod in pods for c in pod["spec"]["containers"]] + service["spec"]["template"]["spec"]["containers"]
    for container in containers:
        env = {e["name"]: e for e in container["env"]}
        assert env["RAY_AUTH_MODE"]["value"] == "token", container["name"]
        assert env["RAY_AUTH_TOKEN"]["valueFrom"]["secretKeyRef"] == {"name": "rayft-ray-auth", "key": "auth_token"}
    (policy,) = [d for _, d in documents() if d["kind"] == "NetworkPolicy"]
    assert policy["spec"]["podSelector"]["matchLabels"] == {"ray.io/cluster": cluster["metadata"]["name"]}
    rules = policy["spec"]["ingress"]
    service_labels = service["spec"]["template"]["metadata"]["labels"]
    (from_service,) = [r for r in rules if r["from"][0]["podSelector"]["matchLabels"].items() <= service_labels.items()]
    assert from_service["ports"] == [{"protocol": "TCP", "port": 8265}]
    assert all("namespaceSelector" not in f and "ipBlock" not in f for r in rules for f in r["from"])  # nobody else
