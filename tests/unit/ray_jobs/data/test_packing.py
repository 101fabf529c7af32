"""Packing: exact row lengths, no token lost, positions reset per example, no cross-example attention."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ray_jobs.data.packing import SHAPE_MULTIPLE, pack, shape_multiple, trim_padding
from ray_jobs.data.template import IGNORE_INDEX

PAD = 0


def examples_strategy():
    example = st.lists(st.integers(1, 999), min_size=1, max_size=40).map(
        lambda ids: (ids, [i if i % 3 else IGNORE_INDEX for i in ids])
    )
    return st.lists(example, min_size=0, max_size=30)


def split_examples(rows: dict, r: int) -> list[tuple[int, int]]:
    """``(start, end)`` of each example in row ``r``, from the position ids."""
    n = int(rows["num_tokens"][r])
    starts = [i for i in range(n) if rows["position_ids"][r, i] == 0]
    return list(zip(starts, starts[1:] + [n]))


@settings(max_examples=200, deadline=None)
@given(examples=examples_strategy(), seq_len=st.integers(8, 64), packing=st.booleans())
def test_no_token_lost_and_rows_exact(examples, seq_len, packing):
    rows = pack(examples, seq_len, PAD, packing=packing)
    n_rows = len(rows["num_tokens"])
    for key in ("input_ids", "labels", "position_ids"):
        assert rows[key].shape == (n_rows, seq_len)
    expected = Counter(t for ids, _ in examples for t in ids[:seq_len])
    got = Counter(int(t) for r in range(n_rows) for t in rows["input_ids"][r, : rows["num_tokens"][r]])
    assert got == expected
    assert rows["num_examples"].sum() == len(examples)
    assert rows["num_truncated"].sum() == sum(len(ids) > seq_len for ids, _ in examples)
    if not packing:
        assert (rows["num_examples"] == 1).all()
    for r in range(n_rows):
        n = rows["num_tokens"][r]
        assert (rows["input_ids"][r, n:] == PAD).all() and (rows["labels"][r, n:] == IGNORE_INDEX).all()
        for start, end in split_examples(rows, r):
            assert list(rows["position_ids"][r, start:end]) == list(range(end - start))
            assert rows["labels"][r, start] == IGNORE_INDEX  # never predicted from the previous example


def test_labels_follow_their_tokens():
    rows = pack([([5, 6, 7], [IGNORE_INDEX, 6, 7]), ([8, 9], [8, 9])], seq_len=8, pad_id=PAD)
    assert rows["input_ids"].tolist() == [[5, 6, 7, 8, 9, 0, 0, 0]]
    assert rows["labels"].tolist() == [[IGNORE_INDEX, 6, 7, IGNORE_INDEX, 9] + [IGNORE_INDEX] * 3]
    assert rows["position_ids"].tolist() == [[0, 1, 2, 0, 1, 0, 1, 2]]


def test_first_fit_decreasing_fills_rows():
    lengths = [6, 5, 4, 3, 2, 2]  # 22 tokens fit exactly 3 rows of 8 at best
    rows = pack([(list(range(1, n + 1)), list(range(1, n + 1))) for n in lengths], seq_len=8, pad_id=PAD)
    assert len(rows["num_tokens"]) == 3


def test_trim_padding_keeps_the_longest_row():
    rows = pack([([1, 2, 3], [1, 2, 3]), ([4], [4])], seq_len=16, pad_id=PAD, packing=False)
    trimmed = trim_padding(rows, multiple=1)
    assert trimmed["input_ids"].shape == (2, 3)
    assert trimmed["num_tokens"].tolist() == [3, 1]


def test_trimmed_batches_come_in_few_shapes_and_never_cut_a_real_token():
    import random

    rng = random.Random(0)
    shapes = set()
    for _ in range(200):
        examples = [list(range(1, rng.randint(2, 60))) for _ in range(rng.randint(1, 6))]
        rows = pack([(e, e) for e in examples], seq_len=64, pad_id=PAD, packing=False)
        trimmed = trim_padding(rows, multiple=16)
        width = trimmed["input_ids"].shape[1]
        shapes.add(width)
        assert width % 16 == 0 and width >= rows["num_tokens"].max()
        assert (trimmed["input_ids"] == rows["input_ids"][:, :width]).all()
    assert shapes <= {16, 32, 48, 64} and len(shapes) > 1


def test_a_row_narrower_than_the_multiple_is_kept_whole():
    rows = pack([([1, 2, 3], [1, 2, 3])], seq_len=8, pad_id=PAD, packing=False)
    assert trim_padding(rows)["input_ids"].shape == (1, 8)


def test_packed_rows_do_not_attend_across_examples(tiny, tokenizer):
    """Logits of each example inside a packed row equal its logits when run alone."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny / "model", attn_implementation="sdpa").eval()
    texts = ["count from golf by 2", "alpha bravo charlie delta echo", "mike"]
    examples = [(tokenizer(t)["input_ids"], tokenizer(t)["input_ids"]) for t in texts]
    rows = pack(examples, seq_len=64, pad_id=tokenizer.pad_token_id)
    assert rows["num_examples"].tolist() == [3]
    ids = torch.tensor(rows["input_ids"], dtype=torch.long)
    pos = torch.tensor(rows["position_ids"], dtype=torch.long)
    with torch.no_grad():
        packed = model(input_ids=ids, position_ids=pos, use_cache=False).logits[0]
        for start, end in split_examples(rows, 0):
            alone = model(input_ids=ids[:, start:end], use_cache=False).logits[0]
            np.testing.assert_allclose(alone.numpy(), packed[start:end].numpy(), atol=1e-5)
        # Without the position-id reset the same row does attend across examples.
        flat = model(input_ids=ids, position_ids=torch.arange(64)[None], use_cache=False).logits[0]
        start, end = split_examples(rows, 0)[1]
        assert not np.allclose(flat[start:end].numpy(), packed[start:end].numpy(), atol=1e-3)


@pytest.mark.parametrize("seq_len", [8, 13])
def test_long_examples_are_truncated_and_counted(seq_len):
    rows = pack([(list(range(1, 30)), list(range(1, 30)))], seq_len=seq_len, pad_id=PAD)
    assert rows["num_tokens"].tolist() == [seq_len]
    assert rows["num_truncated"].tolist() == [1]


def test_flex_attention_keeps_whole_rows_so_one_width_compiles_once():
    rows = pack([([1, 2, 3], [1, 2, 3])], seq_len=512, pad_id=PAD, packing=True)
    assert trim_padding(rows, shape_multiple("flex_attention", 512))["input_ids"].shape == (1, 512)
    assert trim_padding(rows, shape_multiple("sdpa", 512))["input_ids"].shape == (1, SHAPE_MULTIPLE)


def test_the_placeholder_rows_that_compile_ahead_have_the_job_s_shape_under_each_attention(tiny_spec):
    import torch

    from ray_jobs.data.packing import SHAPE_MULTIPLE, rows_of_job_shape

    flex = rows_of_job_shape(tiny_spec, vocab=320, attention="flex_attention", device=torch.device("cpu"))
    rows, width = tiny_spec.train.micro_batch_size, tiny_spec.data.max_seq_len
    assert flex["input_ids"].shape == flex["position_ids"].shape == flex["labels"].shape == (rows, width)
    assert int(flex["input_ids"].max()) < 320 and torch.equal(flex["labels"], flex["input_ids"])
    assert flex["position_ids"][0, width // 2] == 0 and flex["position_ids"][0, -1] == width - width // 2 - 1  # 2 examples
    sdpa = rows_of_job_shape(tiny_spec, vocab=320, attention="sdpa", device=torch.device("cpu"))
    assert sdpa["input_ids"].shape == (rows, SHAPE_MULTIPLE)
