"""The k8s tests' view of k8s/: each kustomization rendered once (``kubectl kustomize``), its objects, KubeRay's
CRD schemas made strict, and every pod template an object makes."""

from __future__ import annotations

import functools
import gzip
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.paths import REPO

K8S = REPO / "k8s"
CRDS = Path(__file__).parent / "crd"
KUBERNETES = "1.32.0"
"""The Kubernetes version the core kinds are checked against (kubectl here is 1.32)."""
RENDERED = ["base", "overlays/dev", "overlays/prod", "jobs/finetune", "kueue"]
"""Every kustomization one applies (``monitoring`` is a Component, rendered inside ``overlays/prod``)."""
KUBERAY = {"RayCluster", "RayJob"}
UNCHECKED = {"PodMonitor", "PrometheusRule", "ResourceFlavor", "ClusterQueue", "LocalQueue", "WorkloadPriorityClass"}
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
