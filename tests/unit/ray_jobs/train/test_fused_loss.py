"""Which calls of Liger's fused linear cross-entropy rayft's takes (the loop's summed loss over a frozen head), and
that without Liger nothing is replaced. That the loss and gradients are Liger's bit for bit, and that it neither
waits for the GPU nor compiles again for a new label count, is checked on a GPU: tests/gpu/test_fused_loss.py."""

from __future__ import annotations

import logging
import subprocess
import sys

import pytest

from ray_jobs.train.fused_loss import takes

LOOP_CALL = {"reduction": "sum", "ignore_index": -100, "softcap": None, "accum_dtype": None, "return_token_accuracy": False}
"""What Liger's model patches pass for the loop's loss (``num_items_in_batch`` given), defaults aside."""


def test_the_loop_s_summed_loss_over_a_frozen_head_is_taken():
    assert takes(False, LOOP_CALL) == ""


def test_a_mean_loss_or_a_trained_head_stays_liger_s():
    assert takes(False, {**LOOP_CALL, "reduction": "mean"}).startswith("reduction 'mean'")
    assert takes(True, LOOP_CALL) == "the head is trained"


@pytest.mark.parametrize(
    "option, value",
    [
        ("bias", object()),
        ("ce_weight", object()),
        ("softcap", 30.0),
        ("label_smoothing", 0.1),
        ("lse_square_scale", 1e-4),
        ("return_z_loss", True),
        ("use_token_scaling", True),
        ("return_token_accuracy", True),
        ("return_predicted_tokens", True),
    ],
)
def test_any_of_liger_s_options_sends_the_call_to_liger_naming_it(option, value):
    assert takes(False, {**LOOP_CALL, option: value}) == f"{option} set"


def test_the_accumulation_dtype_and_chunk_budget_do_not_change_whose_loss_it_is():
    assert takes(False, {**LOOP_CALL, "accum_dtype": "float32", "chunk_mem_const": 4}) == ""


def test_importing_it_needs_neither_torch_nor_triton():
    code = "import sys, ray_jobs.train.fused_loss; print(sorted({'torch', 'triton'} & set(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_without_liger_nothing_is_replaced_and_the_log_says_why(caplog, monkeypatch):
    from ray_jobs.train.fused_loss import install

    monkeypatch.setitem(sys.modules, "liger_kernel.ops", None)  # Liger absent, also where it is installed
    with caplog.at_level(logging.WARNING, logger="ray_jobs.train.fused_loss"):
        assert install() is False
    assert "keeps its own waits" in caplog.text and "liger_kernel" in caplog.text
