"""The model's inputs for a packed micro-batch, flex attention's block mask made by the job instead of transformers.

Given only ``position_ids``, transformers finds the examples in each packed row and, before it makes the mask, asks
whether any row holds more than one (``masking_utils.find_packed_sequence_indices``: ``.all()`` of a GPU tensor, read
on the host). That read waits for the GPU to finish everything queued, once a forward: on an H100,
``tests/gpu/test_step_syncs.py`` found it in every micro-batch of the 7B preset's set-up (``bench/RESULTS.md``). The job
packs its rows, so it needs no answer: it makes the mask on the GPU from the same ``position_ids``, and transformers
takes a ready 4-D mask as it is. The mask is the one transformers makes: causal, and no token sees another example's;
an example starts wherever a position does not follow the one before it (the packer restarts them at 0,
``ray_jobs.data.packing``), and a row's padding is one more example that no label reads.

Under SDPA (CPU, or a GPU without packing) the model gets no mask and transformers makes its own, as before: there the
check is a CPU read or the row is one example.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch
    from torch.nn.attention.flex_attention import BlockMask

MODEL_KEYS = ("input_ids", "position_ids", "labels")
"""What the model takes from a packed micro-batch; its other fields (``num_tokens``) are the loop's counts."""


def examples(position_ids: torch.Tensor) -> torch.Tensor:
    """Each token's example in its row, counted from 0: a new one wherever the position does not follow the last
    (transformers' reading of packed rows)."""
    import torch

    before_first = position_ids[:, :1] - 1
    return (torch.diff(position_ids, prepend=before_first, dim=-1) != 1).cumsum(-1)


def packed_block_mask(position_ids: torch.Tensor) -> BlockMask:
    """Flex attention's block mask for packed rows ``[rows, width]``: causal within each example, nothing across.
    Made on ``position_ids``' device with nothing read back to the host; compiled there on a GPU, as transformers
    compiles its own (eager on CPU, where flex attention is not run for training)."""
    from torch.nn.attention.flex_attention import create_block_mask

    example = examples(position_ids)

    def causal_in_one_example(batch: Any, head: Any, q: Any, kv: Any) -> Any:
        return (kv <= q) & (example[batch, q] == example[batch, kv])

    rows, width = position_ids.shape
    return create_block_mask(
        causal_in_one_example,
        B=rows,
        H=None,
        Q_LEN=width,
        KV_LEN=width,
        device=position_ids.device,
        _compile=position_ids.is_cuda,
    )


def mask_for(position_ids: torch.Tensor, attention: str) -> BlockMask | None:
    """The mask the job hands the model under ``attention``: flex attention's block mask (:func:`packed_block_mask`);
    ``None`` under any other, whose mask transformers makes."""
    return packed_block_mask(position_ids) if attention == "flex_attention" else None


def model_inputs(batch: dict[str, torch.Tensor], attention: str) -> dict[str, Any]:
    """The model's keyword arguments for one packed micro-batch on its device: ids, positions and labels (those it
    has), and under ``flex_attention`` the block mask (:func:`mask_for`)."""
    inputs: dict[str, Any] = {k: batch[k] for k in MODEL_KEYS if k in batch}
    if (mask := mask_for(batch["position_ids"], attention)) is not None:
        inputs["attention_mask"] = mask
    return inputs
