"""ray_jobs/node_gpus.py: this node's GPUs, read with nvidia-smi (a stand-in script here: this machine has no GPU)."""

from __future__ import annotations

import os

import pytest

from ray_jobs import node_gpus


def test_the_copy_takes_a_gpu_no_process_holds_and_only_among_those_the_node_lets_it_see():
    listing = """0, GPU-aaa, 81234, 143771
1, GPU-bbb, 4, 143771
2, GPU-ccc, 0, 143771
3, GPU-ddd, 512, 143771
"""
    assert node_gpus.pick_idle(listing, None) == "GPU-ccc", "the least used of the idle ones"
    assert node_gpus.pick_idle(listing, "1,3") == "GPU-bbb", "indices in CUDA_VISIBLE_DEVICES"
    assert node_gpus.pick_idle(listing, "GPU-ddd") == "GPU-ddd", "or UUIDs"
    assert node_gpus.pick_idle(listing, "0") is None, "another job's GPU is never used"
    assert node_gpus.pick_idle(listing, "") is None, "a process Ray gave no GPU to sees none"
    busy = "0, GPU-aaa, 9000, 143771\n"  # over 5% in use: someone's process
    assert node_gpus.pick_idle(busy, None) is None


@pytest.mark.parametrize("listing, model", [("NVIDIA H200\nNVIDIA H200\n", "NVIDIA-H200"), ("", "cpu")])
def test_the_gpu_model_names_one_path_component(listing, model, tmp_path, monkeypatch):
    smi = tmp_path / "nvidia-smi"
    smi.write_text(f"#!/bin/sh\nprintf '{listing}'\n")
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    assert node_gpus.gpu_model() == model
