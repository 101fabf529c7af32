"""RAYFT_TORCH_PROFILE's window on CPU: only the window's steps are profiled, on rank 0 only, and the report lists
every op by name with its time (on CPU the top-level ops stand in for GPU kernels)."""

from __future__ import annotations

import json

import pytest
import torch

from ray_jobs.observe.torch_trace import ENV, StepTrace


def steps(trace: StepTrace, n: int) -> None:
    x = torch.ones(64, 64)
    for step in range(1, n + 1):
        trace.before_step(step)
        # step 2 alone adds; the others multiply: the window's report shows which steps it saw
        x = x + 1 if step == 2 else x @ x.T / 64
        trace.after_step(step)
    trace.finish()


def test_the_window_on_rank_0_lists_each_op_of_its_steps_and_no_other(tmp_path, monkeypatch):
    monkeypatch.setenv(ENV, "2:2")
    steps(StepTrace.from_env(0, str(tmp_path)), 4)
    report = json.loads((tmp_path / "torch_profile.json").read_text())
    names = [k["name"] for k in report["top_kernels"]]
    assert (report["first_step"], report["last_step"]) == (2, 2)
    assert "aten::add" in names and "aten::mm" not in names and "aten::matmul" not in names
    assert report["kernels"] == sum(k["calls"] for k in report["top_kernels"])
    assert report["kernel_busy_s"] == pytest.approx(sum(k["s"] for k in report["top_kernels"])) and report["kernel_busy_s"] > 0
    assert report["kernel_span_s"] >= max(k["s"] for k in report["top_kernels"])


def test_other_ranks_and_an_unset_variable_profile_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv(ENV, "1:2")
    steps(StepTrace.from_env(1, str(tmp_path)), 3)
    monkeypatch.delenv(ENV)
    steps(StepTrace.from_env(0, str(tmp_path)), 3)
    assert not (tmp_path / "torch_profile.json").exists()
