"""ray_jobs.train.attention_mask: flex attention's mask for packed rows, made by the job as transformers makes it."""

from __future__ import annotations

import torch
from torch.nn.attention.flex_attention import BlockMask, create_mask

from ray_jobs.train.attention_mask import examples, mask_for, model_inputs, packed_block_mask


def positions_of(*lengths: int) -> torch.Tensor:
    return torch.cat([torch.arange(n) for n in lengths])


def test_an_example_starts_wherever_a_position_does_not_follow_the_one_before():
    rows = torch.stack([positions_of(3, 2, 4), positions_of(9)])
    assert examples(rows).tolist() == [[0, 0, 0, 1, 1, 2, 2, 2, 2], [0] * 9]


def test_the_mask_is_the_one_transformers_makes_from_the_same_positions():
    """Token by token against transformers' own mask for packed rows (its SDPA form: the same mask functions, dense),
    with two examples and right padding in one row and a single example in the other."""
    from transformers import LlamaConfig
    from transformers.masking_utils import create_causal_mask

    config = LlamaConfig(hidden_size=16, num_attention_heads=2, num_hidden_layers=1, vocab_size=32)
    config._attn_implementation = "sdpa"
    position_ids = torch.stack([positions_of(100, 120, 36), positions_of(256)])
    theirs = create_causal_mask(
        config=config, inputs_embeds=torch.zeros(2, 256, 16), attention_mask=None, cache=None, position_ids=position_ids
    )
    ours = packed_block_mask(position_ids)
    assert isinstance(ours, BlockMask) and ours.shape == (2, 1, 256, 256)
    dense = create_mask(ours.mask_mod, 2, 1, 256, 256, device="cpu")
    assert theirs is not None and theirs.shape == dense.shape
    assert torch.equal(dense, theirs)
    assert dense[0, 0, 150, 99].item() is False and dense[0, 0, 150, 100].item() is True, "no token sees another example"


def test_blocks_no_example_spans_are_skipped():
    """What flex attention is for: three examples of one 128-token block each attend only within their own block."""
    mask = packed_block_mask(positions_of(128, 128, 128).expand(1, -1))
    assert torch.equal(mask.to_dense()[0, 0].bool(), torch.eye(3, dtype=torch.bool))


def test_the_model_gets_ids_positions_and_labels_and_a_block_mask_only_under_flex_attention():
    batch = {
        "input_ids": torch.ones(2, 128, dtype=torch.long),
        "position_ids": positions_of(64, 64).expand(2, -1),
        "labels": torch.ones(2, 128, dtype=torch.long),
        "num_tokens": torch.tensor([128, 128]),
    }
    sdpa = model_inputs(batch, "sdpa")
    assert sorted(sdpa) == ["input_ids", "labels", "position_ids"], "under SDPA transformers makes the mask, as before"
    flex = model_inputs(batch, "flex_attention")
    assert sorted(flex) == ["attention_mask", "input_ids", "labels", "position_ids"]
    assert isinstance(flex["attention_mask"], BlockMask) and flex["attention_mask"].shape == (2, 1, 128, 128)


def test_only_flex_attention_gets_the_jobs_mask():
    positions = positions_of(64, 64).expand(1, -1)
    assert mask_for(positions, "sdpa") is None and mask_for(positions, "eager") is None
    assert isinstance(mask_for(positions, "flex_attention"), BlockMask)
