"""The fused-kernel choice: on only where Liger can run, off elsewhere with the reason, refused when asked for
where it cannot run. (That the kernels train the same model is checked on a GPU: tests/gpu/test_kernels.py.)"""

from __future__ import annotations

import dataclasses
import importlib.util

import pytest
import torch

from ray_jobs.train import kernels
from rayft_contract.spec import FineTuneSpec, SpecError


def with_kernels(spec: FineTuneSpec, setting: str, *, use_gpu: bool = True) -> FineTuneSpec:
    return spec.replace(
        model=dataclasses.replace(spec.model, kernels=setting),
        scaling=dataclasses.replace(spec.scaling, use_gpu=use_gpu),
    )


def test_auto_trains_without_kernels_on_a_cpu_worker_and_says_why(tiny_spec):
    choice = kernels.choose(with_kernels(tiny_spec, "auto", use_gpu=False), "cpu", "llama")
    assert not choice.enabled
    assert choice.describe() == "none (Liger's Triton kernels need a CUDA GPU, this worker has cpu)"


def test_none_turns_them_off_even_where_they_could_run(tiny_spec):
    choice = kernels.choose(with_kernels(tiny_spec, "none"), "cuda", "llama")
    assert not choice.enabled and choice.reason == "model.kernels is none"


def test_liger_asked_for_on_a_cpu_worker_fails_naming_the_field(tiny_spec):
    with pytest.raises(SpecError) as err:
        kernels.choose(with_kernels(tiny_spec, "liger"), "cpu", "llama")
    assert err.value.field == "model.kernels" and "CUDA GPU" in str(err.value)


def test_a_spec_asking_for_liger_without_gpus_is_refused_before_it_runs(tiny_spec):
    with pytest.raises(SpecError) as err:
        with_kernels(tiny_spec, "liger", use_gpu=False)
    assert err.value.field == "model.kernels" and "scaling.use_gpu" in str(err.value)


@pytest.mark.skipif(importlib.util.find_spec("liger_kernel") is not None, reason="liger-kernel is installed here")
def test_auto_on_a_gpu_without_liger_installed_trains_without_it(tiny_spec):
    choice = kernels.choose(with_kernels(tiny_spec, "auto"), "cuda", "llama")
    assert not choice.enabled and "liger-kernel is not installed" in choice.reason


def test_kernels_that_are_off_leave_the_model_untouched():
    model = torch.nn.Linear(2, 2)
    forward = model.forward
    kernels.apply(model, kernels.KernelChoice((), "model.kernels is none"))
    assert model.forward == forward
