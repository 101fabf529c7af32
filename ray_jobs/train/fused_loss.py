"""Liger's fused linear cross-entropy, without its waits for the GPU, for the loss the loop asks for.

The loop asks every micro-batch for the loss summed over its label tokens and divided by the step's count
(``num_items_in_batch``), through Liger's fused linear cross-entropy (``ray_jobs.train.kernels``). Liger's own
function waits for the GPU three times a micro-batch, for nothing the summed loss uses:

- its forward counts the label tokens with ``.item()`` (``total_n_non_ignore``) to pass them to its Triton kernel,
  whose "sum" reduction does not read them; and a Triton integer argument is specialized by its value (divisible
  by 16 or not, equal to 1 or not), so a micro-batch whose count first falls the other way compiles the kernel
  again in the middle of a step (``tests/gpu/test_fused_loss.py`` shows Liger's own running a second compiled kernel
  for a count 16 divides). The 7B preset's one slow steady step, step 7 in each H100 host's first run only (Triton's
  cache on disk keeps the second kernel for later runs), ran as fast as its neighbours on a fresh host since
  (``bench/RESULTS.md``);
- its backward copies a 1.0 from the host and compares the incoming gradient with it (``torch.equal``), two waits,
  to skip a multiplication that under ``num_items_in_batch`` always runs anyway.

A wait empties the GPU's queue, so every pause of the host's after it idles the GPU (``tests/gpu/test_step_syncs.py``
lists them). This module runs the same chunked matmuls and the same Liger kernels (``liger_cross_entropy_kernel``,
``element_mul_kernel``) with a constant count and an unconditional multiplication: the same loss and gradients bit
for bit (``tests/gpu/test_fused_loss.py``). Written here because Liger has no call without them: its count is
computed unconditionally, and its token-accuracy output needs it.

It takes only the calls it computes the same: the summed loss of a frozen head with none of Liger's options (no
bias, class weights, z-loss, smoothing, soft-capping, token scaling or accuracy). Every other call, a trained head's
or one asking for its token accuracy, goes to Liger's own function unchanged. (Evaluation calls neither: in eval mode
Liger's model patches compute the logits and transformers' loss over them.)
"""

from __future__ import annotations

import functools
import inspect
import logging
from typing import Any

log = logging.getLogger(__name__)

_DEFAULTS = {
    "bias": None,
    "ce_weight": None,
    "lse_square_scale": 0.0,
    "label_smoothing": 0.0,
    "softcap": None,
    "return_z_loss": False,
    "use_token_scaling": False,
    "return_token_accuracy": False,
    "return_predicted_tokens": False,
}
"""Liger's options, at the values under which this module's loss is Liger's: a call that sets any other goes to Liger."""


def takes(weight_requires_grad: bool, arguments: dict[str, Any]) -> str:
    """Why this module leaves a call of Liger's ``liger_fused_linear_cross_entropy`` to Liger, or '' when it takes it.

    ``arguments``: the call's, by name, defaults filled in. The accumulation dtype (``accum_dtype``) concerns a
    trained head's gradient only, and the chunk budget (``chunk_mem_const``) this module follows as Liger does."""
    reduction = arguments.get("reduction", "mean")
    if reduction != "sum":
        return f"reduction {reduction!r} (the loop's is 'sum', with num_items_in_batch)"
    if weight_requires_grad:
        return "the head is trained"
    changed = [k for k, d in _DEFAULTS.items() if (arguments.get(k) is not None if d is None else arguments.get(k, d) != d)]
    return f"{', '.join(changed)} set" if changed else ""


def install() -> bool:
    """Route Liger's fused linear cross-entropy through :func:`fused_linear_cross_entropy` in this process.

    Liger's model patches compute the loss through ``liger_kernel.transformers.functional``'s function, looked up at
    each call (``loss_utils.fixed_fused_linear_cross_entropy``), so replacing that one attribute covers every model
    family Liger patches. Idempotent; ``False``, and Liger's own left in place, where that module is not laid out as
    this one expects (a Liger release that moved it)."""
    try:
        from liger_kernel.ops import fused_linear_cross_entropy as ops
        from liger_kernel.transformers import functional
        from liger_kernel.transformers.model import loss_utils
    except ImportError as e:
        log.warning("Liger's fused loss keeps its own waits: %s", e)
        return False
    current = functional.liger_fused_linear_cross_entropy
    if getattr(current, "_rayft", False):
        return True
    signature = inspect.signature(current)
    names = {"input", "weight", "target", "ignore_index", "reduction", "chunk_mem_const", *_DEFAULTS}
    kernels = ("liger_cross_entropy_kernel", "element_mul_kernel", "MAX_FUSED_SIZE", "amp_custom_fwd", "amp_custom_bwd")
    if loss_utils.F is not functional or not all(hasattr(ops, n) for n in kernels) or names - set(signature.parameters):
        log.warning("Liger's fused loss keeps its own waits: liger_kernel's layout is not the one rayft knows")
        return False

    @functools.wraps(current)  # Liger filters the model's keyword arguments by this signature: it stays Liger's
    def routed(*args: Any, **kwargs: Any) -> Any:
        bound = signature.bind(*args, **kwargs)
        bound.apply_defaults()
        a = bound.arguments
        if not a["input"].is_cuda or takes(a["weight"].requires_grad, a):
            return current(*args, **kwargs)
        return fused_linear_cross_entropy(a["input"], a["weight"], a["target"], a["ignore_index"], a["chunk_mem_const"])

    routed._rayft = True  # type: ignore[attr-defined]
    functional.liger_fused_linear_cross_entropy = routed
    log.info("Liger's fused linear cross-entropy runs without its waits for the GPU (ray_jobs.train.fused_loss)")
    return True


def fused_linear_cross_entropy(hidden: Any, weight: Any, target: Any, ignore_index: int = -100, chunk_mem_const: int = 1):
    """The summed cross-entropy of ``hidden @ weight.T`` against ``target`` (``ignore_index`` skipped), the logits
    never whole: Liger's ``reduction="sum"`` with a frozen ``weight``, and no wait for the GPU."""
    return _function().apply(hidden, weight, target, ignore_index, chunk_mem_const)


@functools.cache
def _function() -> Any:
    """The autograd function, made on first use so that importing this module needs neither torch nor Triton."""
    import torch
    import triton
    from liger_kernel.ops import fused_linear_cross_entropy as ops

    class FusedLinearCrossEntropy(torch.autograd.Function):
        @staticmethod
        @ops.amp_custom_fwd
        def forward(ctx, hidden, weight, target, ignore_index, chunk_mem_const):
            # Liger's forward (fused_linear_cross_entropy_forward) for this case, step for step: the same chunks, the
            # same matmuls into one reused buffer, the same kernel, so the same bits; only its count is a constant.
            rows, width = hidden.shape
            vocab = weight.shape[0]
            chunk = min(triton.next_power_of_2(triton.cdiv(rows, triton.cdiv(vocab, chunk_mem_const * width))), rows)
            dtype = torch.get_autocast_dtype("cuda") if torch.is_autocast_enabled() else weight.dtype
            x, w = hidden.to(dtype), weight.to(dtype)  # what autocast gives Liger's matmuls (no copy when they match)
            grads = hidden.requires_grad
            grad_hidden = torch.zeros_like(hidden) if grads else None
            losses = torch.zeros(rows, dtype=torch.float32, device=hidden.device)
            logits = torch.empty((chunk, vocab), dtype=dtype, device=hidden.device)
            for start in range(0, rows, chunk):
                end = min(start + chunk, rows)
                part = logits[: end - start]
                torch.mm(x[start:end], w.t(), out=part)
                ops.liger_cross_entropy_kernel[(end - start,)](
                    X_ptr=part,
                    X_stride=part.stride(-2),
                    Y_ptr=target[start:end].contiguous(),
                    Y_stride=1,
                    weight_ptr=None,
                    loss_ptr=losses[start:end],
                    z_loss_ptr=None,
                    loss_stride=1,
                    token_accuracy_ptr=None,
                    token_accuracy_stride=0,
                    predicted_tokens_ptr=None,
                    predicted_tokens_stride=0,
                    n_cols=vocab,
                    n_non_ignore=1,  # read by the "mean" reduction only: a constant, so no wait and one compile
                    sum_non_ignore_weight=1,
                    weight_sum=0.0,
                    ignore_index=ignore_index,
                    lse_square_scale=0.0,
                    label_smoothing=0.0,
                    reduction="sum",
                    softcap=None,
                    RETURN_Z_LOSS=False,
                    RETURN_TOKEN_ACCURACY=False,
                    RETURN_PREDICTED_TOKENS=False,
                    HAS_WEIGHT=False,
                    HAS_SOFTCAPPING=False,
                    HAS_GRADIENTS=grads,
                    BLOCK_SIZE=min(ops.MAX_FUSED_SIZE, triton.next_power_of_2(vocab)),
                    num_warps=32,
                )
                if grads and dtype == hidden.dtype:  # the kernel left the logits' gradient in their place
                    torch.mm(part, w, out=grad_hidden[start:end])
                elif grads:
                    grad_hidden[start:end] = part @ w
            ctx.save_for_backward(grad_hidden)
            return losses.sum()

        @staticmethod
        @ops.amp_custom_bwd
        def backward(ctx, grad_output):
            (grad_hidden,) = ctx.saved_tensors
            # Liger's scaling of its forward's gradient, run always: Liger skips it for a gradient of exactly 1.0
            # (the loss used as it is), where it changes nothing, and asking costs two waits.
            rows, width = grad_hidden.shape
            ops.element_mul_kernel[(rows,)](
                grad_hidden,
                grad_hidden.stride(-2),
                grad_output,
                width,
                BLOCK_SIZE=min(ops.MAX_FUSED_SIZE, triton.next_power_of_2(width)),
                X_col_stride=grad_hidden.stride(-1),
                num_warps=32,
            )
            return grad_hidden, None, None, None, None

    return FusedLinearCrossEntropy
