"""k8s/: every kustomization renders, and what it renders validates offline, strictly, and scans clean.

- Core kinds against the Kubernetes JSON schemas (``kubernetes-validate``, strict: unknown fields fail).
- RayCluster/RayJob against KubeRay v1.7.0's CRDs (copied, gzipped, from ``config/crd/bases``), made
  strict the same way: the API server prunes unknown fields silently, so a typo
  (``shutdownAfterJobFinish``) would deploy and be ignored.
- The Prometheus Operator's and Kueue's kinds have no schema here: their wiring is checked instead
  (what they select exists, what they name is defined: `test_monitoring_and_queues.py`).
- checkov on every rendering, with no failure left: each accepted finding is a ``checkov.io/skipN``
  annotation on its object, with its reason.
- The pod hardening checkov cannot see inside KubeRay's kinds, checked on every pod template here.
- The two images (not built here) against the manifests' pins and users.
"""

from __future__ import annotations

import json
import re
import subprocess

import jsonschema
import kubernetes_validate
import pytest
import yaml

from tests.k8s.rendering import (
    K8S,
    KUBERAY,
    KUBERNETES,
    RENDERED,
    UNCHECKED,
    crd_schema,
    every_object,
    objects,
    one,
    pod_templates,
    rendered,
)
from tests.paths import REPO


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
    checkov = REPO / ".venv" / "checkov" / "bin" / "checkov"
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


# -- the two images ----------------------------------------------------------------------------------


def test_the_two_images_match_the_manifests_pins_and_users():
    """Not built here (no Docker engine): what can be checked of them offline is."""
    import tomllib

    import ray

    ray_image, service_image = (REPO / "Dockerfile").read_text(), (REPO / "Dockerfile.service").read_text()
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
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
    ignored = (REPO / ".dockerignore").read_text().split()
    assert {".git", ".venv", "tests"} <= set(ignored)
