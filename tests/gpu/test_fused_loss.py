"""On a CUDA GPU: rayft's route through Liger's fused linear cross-entropy (``ray_jobs.train.fused_loss``) gives Liger's
loss and gradients bit for bit, never waits for the GPU, and runs one compiled kernel whatever the label count.
Which calls it takes is ``tests/unit/ray_jobs/train/test_fused_loss.py``."""

from __future__ import annotations

import warnings

import pytest

pytestmark = pytest.mark.gpu

ROWS, WIDTH, VOCAB = 4096, 256, 32000
"""Many chunks (Liger's budget: 64 rows of the 32k vocabulary at this width), as the 7B preset's 8 of 1,024 rows."""


def _liger():
    """Liger's own function, also after ``fused_loss.install()`` replaced it in this process."""
    from liger_kernel.transformers import functional

    f = functional.liger_fused_linear_cross_entropy
    return getattr(f, "__wrapped__", f)


def _inputs(labels: int, seed: int = 0):
    """Hidden states, a frozen bf16 head and targets with ``labels`` label tokens (the rest ignored, -100)."""
    import torch

    gen = torch.Generator(device="cuda").manual_seed(seed)
    hidden = torch.randn(ROWS, WIDTH, device="cuda", dtype=torch.bfloat16, generator=gen)
    head = torch.randn(VOCAB, WIDTH, device="cuda", dtype=torch.bfloat16, generator=gen) / WIDTH**0.5
    target = torch.randint(0, VOCAB, (ROWS,), device="cuda", generator=gen)
    target[labels:] = -100
    return hidden, head, target


def _loss_and_grad(loss_fn, hidden, head, target, scale):
    import torch

    x = hidden.clone().requires_grad_()
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss = loss_fn(x, head, target) * scale
    loss.backward()
    return loss.detach(), x.grad


@pytest.mark.parametrize("scale", [1.0, 1 / 3001], ids=["the-loss-as-it-is", "divided-by-num-items"])
def test_the_loss_and_gradients_are_liger_s_bit_for_bit(scale):
    import torch

    from ray_jobs.train.fused_loss import fused_linear_cross_entropy

    hidden, head, target = _inputs(labels=3001)
    theirs = _loss_and_grad(lambda x, w, t: _liger()(x, w, t, reduction="sum"), hidden, head, target, scale)
    ours = _loss_and_grad(fused_linear_cross_entropy, hidden, head, target, scale)
    assert torch.equal(ours[0], theirs[0]), (ours[0], theirs[0])
    assert torch.equal(ours[1], theirs[1]), (ours[1] - theirs[1]).abs().max()


def test_nothing_in_its_forward_or_backward_waits_for_the_gpu_where_liger_s_own_does():
    import torch

    from ray_jobs.train.fused_loss import fused_linear_cross_entropy

    def waits(loss_fn) -> list[str]:
        hidden, head, target = _inputs(labels=3001)
        _loss_and_grad(loss_fn, hidden, head, target, 1.0)  # compiles first
        scale = torch.tensor(1 / 3001, device="cuda")
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("warn")
        try:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                _loss_and_grad(loss_fn, hidden, head, target, scale)
        finally:
            torch.cuda.set_sync_debug_mode("default")
        return [f"{w.filename}:{w.lineno}: {w.message}" for w in caught if "synchroniz" in str(w.message)]

    assert waits(fused_linear_cross_entropy) == []
    assert len(waits(lambda x, w, t: _liger()(x, w, t, reduction="sum"))) >= 2, "the check sees Liger's own waits"


def test_a_label_count_divisible_by_16_runs_the_same_kernel_where_liger_s_own_runs_another_compiled_for_it():
    """Triton specializes an integer argument by whether 16 divides it: Liger passes its kernel the label count, so
    the first micro-batch whose count 16 divides compiles the kernel again, in the middle of a step. Which compiled
    kernel ran is told by Triton's launch hook (the GPU function's handle), whichever test compiled it first."""
    import torch

    triton = pytest.importorskip("triton")
    if not hasattr(triton, "knobs"):
        pytest.skip("this Triton has no launch hooks in triton.knobs (3.4 and later)")
    from ray_jobs.train.fused_loss import fused_linear_cross_entropy

    launched: set[int] = set()

    def hook(metadata) -> None:
        data = metadata.get()
        if data["name"] == "liger_cross_entropy_kernel":
            launched.add(data["function"])

    def kernels_run(loss_fn) -> int:
        launched.clear()
        for labels in (3001, 3008):  # 16 divides 3,008
            _loss_and_grad(loss_fn, *_inputs(labels), 1.0)
        torch.cuda.synchronize()
        return len(launched)

    runtime = triton.knobs.runtime
    chain = runtime.launch_enter_hook
    if hasattr(chain, "add"):  # a HookChain (Triton 3.5 and later)
        chain.add(hook)
    else:
        runtime.launch_enter_hook = hook
    try:
        ours = kernels_run(fused_linear_cross_entropy)
        theirs = kernels_run(lambda x, w, t: _liger()(x, w, t, reduction="sum"))
    finally:
        if hasattr(chain, "remove"):
            chain.remove(hook)
        else:
            runtime.launch_enter_hook = chain
    assert ours == 1
    assert theirs == 2, "Liger's own specializes on the count (the reason rayft's passes a constant)"


def test_once_installed_a_model_s_loss_goes_through_it_and_a_trained_head_s_through_liger_s(tiny_spec):
    import torch

    from ray_jobs.train import fused_loss
    from ray_jobs.train.kernels import apply, choose
    from ray_jobs.train.model import apply_lora, autocast, load_base
    from ray_jobs.train.strategy import Single
    from tests.gpu.test_kernels import qlora_gpu

    spec = qlora_gpu(tiny_spec)
    base = load_base(spec, torch.device("cuda"), Single())
    apply(base, choose(spec, "cuda", base.config.model_type))  # installs the route
    model = apply_lora(base, spec)
    model.train()  # Liger skips the logits, and fuses the loss, in training only
    calls = []
    original = fused_loss.fused_linear_cross_entropy
    fused_loss.fused_linear_cross_entropy = lambda *a: calls.append(a) or original(*a)
    try:
        ids = torch.randint(5, base.config.vocab_size, (2, 64), device="cuda")
        with autocast(spec, torch.device("cuda")):
            out = model(input_ids=ids, labels=ids, num_items_in_batch=torch.tensor(126, device="cuda"))
        out.loss.backward()
        assert len(calls) == 1 and torch.isfinite(out.loss)
        head = base.lm_head.weight
        head.requires_grad_(True)  # as lora.modules_to_save: [lm_head] trains it
        with autocast(spec, torch.device("cuda")):
            model(input_ids=ids, labels=ids, num_items_in_batch=torch.tensor(126, device="cuda")).loss.backward()
        assert len(calls) == 1 and head.grad is not None
    finally:
        fused_loss.fused_linear_cross_entropy = original
