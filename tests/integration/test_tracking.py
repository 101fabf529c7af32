"""Live tracking (ray_jobs/observe/tracking.py): TensorBoard files grow while the job runs, and the MLflow run (real
mlflow, the run's own file store) and the W&B run (real wandb, offline) hold the job's parameters, tags and
every reported metric."""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

import pytest

from ray_jobs.run import run

pytestmark = pytest.mark.integration


def test_tensorboard_is_live_and_mlflow_and_wandb_have_the_jobs_metrics_and_parameters(ray_cluster, tiny_spec):
    spec = tiny_spec.replace(
        name="tiny-tracked",
        scaling=dataclasses.replace(tiny_spec.scaling, num_workers=1),  # the driver tracks, whichever worker trains
        train=dataclasses.replace(tiny_spec.train, max_steps=20, log_every=2, eval_every=10, checkpoint_every=20),
        tracking=dataclasses.replace(tiny_spec.tracking, mlflow=True, wandb=True),
    )
    run_dir = Path(spec.output.dir) / spec.name
    seen_while_running = []

    def on_event(event):
        if event.kind == "progress" and event.data.get("step") == 10 and "loss" in event.data:
            files = list((run_dir / "tensorboard").glob("events.out.tfevents.*"))
            seen_while_running.append(sum(f.stat().st_size for f in files))

    summary = run(spec, on_event=on_event).summary
    assert seen_while_running and seen_while_running[0] > 0, "TensorBoard had the first steps before the job ended"

    # Ray's metrics, as Prometheus scrapes them from the node's export port: tagged with the job and its team.
    series = wait_for_ray_series("ray_rayft_job_step", job_id="tiny-tracked", value=20.0)
    assert series["team"].startswith("local:")
    assert ray_series("ray_rayft_job_tokens_per_s", job_id="tiny-tracked")["value"] > 0
    assert ray_series("ray_rayft_job_loss", job_id="tiny-tracked")["value"] == pytest.approx(summary.final_loss, rel=1e-4)

    from mlflow import MlflowClient

    os.environ["MLFLOW_ALLOW_FILE_STORE"] = "true"
    client = MlflowClient(tracking_uri=(run_dir / "mlruns").resolve().as_uri())
    experiment = client.get_experiment_by_name("rayft")
    (found,) = client.search_runs([experiment.experiment_id])
    assert found.info.run_name == "tiny-tracked" and found.info.status == "FINISHED"
    assert found.data.tags["rayft.team"].startswith("local:") and found.data.tags["rayft.model"] == spec.model.path
    assert found.data.params["lora.r"] == str(spec.lora.r) and found.data.params["train.max_steps"] == "20"
    losses = client.get_metric_history(found.info.run_id, "loss")
    assert [m.step for m in losses] == list(summary.reported_steps)
    assert [m.step for m in client.get_metric_history(found.info.run_id, "eval_loss")] == [0, 10, 20]
    accuracy = client.get_metric_history(found.info.run_id, "eval_token_accuracy")
    assert [m.step for m in accuracy] == [0, 10, 20] and all(0 <= m.value <= 1 for m in accuracy)
    assert found.data.metrics["steady_tokens_per_s"] == pytest.approx(summary.steady_tokens_per_s)

    (log,) = (run_dir / "wandb").glob("offline-run-*/run-*.wandb")  # offline: no network, for `wandb sync`
    records = wandb_records(log)
    (started,) = [r.run for r in records if r.WhichOneof("record_type") == "run"]
    assert started.display_name == "tiny-tracked" and started.project == "rayft"
    assert any(t.startswith("team=local:") for t in started.tags) and f"model={spec.model.path}"[:64] in started.tags
    config = {c.key: json.loads(c.value_json) for c in started.config.update}
    assert config["lora.r"] == spec.lora.r and config["train.max_steps"] == 20
    history = [
        {_name(i): json.loads(i.value_json) for i in r.history.item} for r in records if r.WhichOneof("record_type") == "history"
    ]
    assert [h["_step"] for h in history if "loss" in h] == list(summary.reported_steps)
    assert [h["_step"] for h in history if "eval_token_accuracy" in h] == [0, 10, 20]
    summaries = [{_name(i) for i in r.summary.update} for r in records if r.WhichOneof("record_type") == "summary"]
    assert any("steady_tokens_per_s" in names for names in summaries), "the closing figures are in the run's summary"
    assert [r.exit.exit_code for r in records if r.WhichOneof("record_type") == "exit"] == [0]


DRIVER = """
import json, sys, time
from rayft_contract.spec import FineTuneSpec
from ray_jobs.run import run
from tests.integration.test_tracking import ray_series

spec = FineTuneSpec.from_dict(json.loads(open(sys.argv[1]).read()))
last, seen = spec.train.max_steps, {}

def on_event(event):
    # The gauges live as long as this driver does: look for the last step's at the summary, before the driver ends.
    if event.kind == "summary":
        deadline = time.monotonic() + 120
        while not seen and time.monotonic() < deadline:
            found = ray_series("ray_rayft_job_step", job_id=spec.name)
            if found is not None and found["value"] == last:
                seen.update(found)
            time.sleep(1)

summary = run(spec, address=sys.argv[2], on_event=on_event).summary
print(json.dumps({"seen": seen, "phases": summary.timing.phases}))
"""


def test_a_driver_that_starts_off_the_cluster_exports_its_gauges(ray_cluster, tiny_spec, tmp_path):
    """As a job through the service runs (``ray_jobs.submitted``): a process of its own that joins the cluster
    in ``run``. Its trackers open once it is on the cluster; opened before, Ray's gauges had nowhere to go."""
    import subprocess
    import sys

    spec = tiny_spec.replace(
        name="tiny-own-driver",
        scaling=dataclasses.replace(tiny_spec.scaling, num_workers=1),
        train=dataclasses.replace(tiny_spec.train, max_steps=4, log_every=2, eval_every=None, checkpoint_every=4),
    )
    (tmp_path / "spec.json").write_text(json.dumps(spec.to_dict()))
    root = Path(__file__).resolve().parents[2]
    done = subprocess.run(
        [sys.executable, "-c", DRIVER, str(tmp_path / "spec.json"), ray_cluster.gcs],
        cwd=root,
        env={**os.environ, "PYTHONPATH": str(root)},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["seen"].get("value") == 4.0 and out["seen"]["team"].startswith("local:"), out
    assert "tracking" in out["phases"]  # the wait for the trackers is in the phase table


def ray_series(name: str, **tags: str) -> dict | None:
    """The sample of ``name`` whose labels include ``tags``, from the local Ray node's Prometheus export."""
    import re
    import urllib.request

    import ray

    (port,) = {n["MetricsExportPort"] for n in ray.nodes() if n["Alive"]}
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30).read().decode()
    for line in text.splitlines():
        match = re.fullmatch(rf"{name}\{{(.*)\}} (\S+)", line)
        if match:
            labels = dict(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', match.group(1)))
            if tags.items() <= labels.items():
                return {**labels, "value": float(match.group(2))}
    return None


def wait_for_ray_series(name: str, value: float, **tags: str) -> dict:
    """Ray's agent exports what the driver set every few seconds: wait for the value, not for a time."""
    import time

    deadline, found = time.monotonic() + 120, None
    while time.monotonic() < deadline:
        found = ray_series(name, **tags)
        if found is not None and found["value"] == value:
            return found
        time.sleep(1)
    raise AssertionError(f"{name}{tags} never reached {value}: last {found}")


def _name(item) -> str:  # noqa: ANN001
    return item.key or ".".join(item.nested_key)


def wandb_records(path: Path) -> list:
    """The records of a W&B run log. wandb 0.31 has no Python reader of its own any more (its Go core reads
    the file), so this reads its LevelDB-style log: a 7-byte header, then 32 KiB blocks of records, each with a
    7-byte header (CRC, length, type: 1 whole, 2 first, 3 middle, 4 last part), holding one protobuf Record."""
    from wandb.proto import wandb_internal_pb2

    data, block = path.read_bytes(), 32 * 1024
    assert data[:4] == b":W&B", "a W&B run log"
    out, pending, pos = [], b"", 7
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # a block's tail too short for a header is padding
            pos += block - pos % block
            continue
        length, kind = int.from_bytes(data[pos + 4 : pos + 6], "little"), data[pos + 6]
        pending += data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            out.append(record)
            pending = b""
    return out
