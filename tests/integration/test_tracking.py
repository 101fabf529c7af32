"""Live tracking (ray_jobs/tracking.py): TensorBoard files grow while the job runs, and the MLflow run (real
mlflow, the run's own file store) holds the job's parameters, tags and every reported metric."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import pytest

from ray_jobs.run import run

pytestmark = pytest.mark.integration


def test_tensorboard_is_live_and_mlflow_has_the_jobs_metrics_and_parameters(ray_cluster, tiny_spec):
    spec = tiny_spec.replace(
        name="tiny-tracked",
        train=dataclasses.replace(tiny_spec.train, max_steps=20, log_every=2, eval_every=10, checkpoint_every=20),
        tracking=dataclasses.replace(tiny_spec.tracking, mlflow=True),
    )
    run_dir = Path(spec.output.dir) / spec.name
    seen_while_running = []

    def on_event(event):
        if event.kind == "progress" and event.data.get("step") == 10 and "loss" in event.data:
            files = list((run_dir / "tensorboard").glob("events.out.tfevents.*"))
            seen_while_running.append(sum(f.stat().st_size for f in files))

    summary = run(spec, on_event=on_event).summary
    assert seen_while_running and seen_while_running[0] > 0, "TensorBoard had the first steps before the job ended"

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
