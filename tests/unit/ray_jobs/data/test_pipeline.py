"""The tokenizer actor's UDF: several tokenizer batches in one task pack exactly as one batch a task did."""

from __future__ import annotations

import dataclasses

import numpy as np
import pyarrow as pa

from ray_jobs.data.pipeline import BATCHES_PER_TASK, TOKEN_COLUMNS, TokenizeAndPack
from ray_jobs.tiny import write_dataset_with_bad_rows


def records(path, rows: int) -> pa.Table:
    lines = path.read_text().splitlines()[:rows]
    n = len(lines)
    return pa.table(
        {"source": [str(path)] * n, "file": [0] * n, "piece": [0] * n, "line": list(range(1, n + 1)), "record": lines}
    )


def test_a_task_of_several_batches_packs_each_batch_as_a_task_of_its_own_would(tiny_spec, tmp_path):
    path = tmp_path / "mixed.jsonl"
    write_dataset_with_bad_rows(path, rows=200, bad=10)
    data = dataclasses.replace(tiny_spec.data, tokenize_batch_size=16, val_fraction=0.2, max_seq_len=256)
    udf = TokenizeAndPack(tiny_spec.model.path, None, data, "chat", ("train", "eval"), ledger=None)
    task = records(path, 16 * BATCHES_PER_TASK - 5)  # the last batch is short, as the stream's last is
    together = udf(task)
    alone = [udf(task.slice(k, 16)) for k in range(0, task.num_rows, 16)]
    for column in [*TOKEN_COLUMNS, "split"]:
        expected = np.concatenate([a[column] for a in alone])
        assert np.array_equal(together[column], expected), column
    assert set(together["split"]) == {"train", "eval"}
    # Packing is per batch: one batch of all the rows packs tighter, so the test would notice a task packed whole.
    whole = dataclasses.replace(data, tokenize_batch_size=task.num_rows)
    one_batch = TokenizeAndPack(tiny_spec.model.path, None, whole, "chat", ("train", "eval"), ledger=None)(task)
    assert len(one_batch["num_tokens"]) < len(together["num_tokens"])


def test_a_task_runs_with_the_garbage_collector_paused_and_turns_it_back_on_even_when_it_fails(tiny_spec, tmp_path):
    import gc

    import pytest

    from ray_jobs.chaos import Chaos

    path = tmp_path / "chat.jsonl"
    write_dataset_with_bad_rows(path, rows=40, bad=0)
    seen = []

    class Watching(Chaos):
        def slow_tokenizer(self):
            seen.append(gc.isenabled())

    udf = TokenizeAndPack(tiny_spec.model.path, None, tiny_spec.data, "chat", ("train",), ledger=None, chaos=Watching())
    assert gc.isenabled()
    udf(records(path, 40))
    assert seen and not any(seen) and gc.isenabled()

    class Failing(Chaos):
        def slow_tokenizer(self):
            raise RuntimeError("injected")

    udf.chaos = Failing()
    with pytest.raises(RuntimeError, match="injected"):
        udf(records(path, 40))
    assert gc.isenabled()
