"""The Ray Data read on the session cluster: large files cut into pieces, every row counted once (ray_jobs.data.reading, ray_jobs.data.pipeline)."""

from __future__ import annotations

import dataclasses

import pytest

from ray_jobs.data import reading
from ray_jobs.data.pipeline import new_ledger, tokenize
from ray_jobs.data.preflight import data_inputs
from ray_jobs.tiny import write_dataset_with_bad_rows

pytestmark = pytest.mark.integration


def test_a_file_larger_than_a_piece_is_read_by_several_tasks_and_each_row_counted_once_at_its_line(
    ray_cluster, tiny_spec, tmp_path, monkeypatch
):
    path = tmp_path / "big.jsonl"
    bad_at = write_dataset_with_bad_rows(path, rows=1500, bad=40)
    spec = tiny_spec.replace(
        data=dataclasses.replace(tiny_spec.data, path=str(path), val_fraction=0.0, max_bad_row_frac=0.1, overlong="drop")
    )
    size = path.stat().st_size
    monkeypatch.setattr(reading, "PIECE_BYTES", size // 6)  # the driver plans the pieces: 7 ranges of this file
    inputs = data_inputs(spec)
    assert inputs.files.sizes == (size,)

    ledger = new_ledger(spec.data, fail_early=False)
    records = reading.read_records(inputs.files, spec.data.path, ledger).take_all()
    assert len({r["piece"] for r in records}) == 7, "seven ranges, each a task of its own"
    lines_of = ray_get(ledger.lines_by_piece.remote())
    assert sum(n for n, _ in lines_of.values()) == 1500
    starts = {p: sum(lines_of[(0, q)][0] for q in range(p)) for p in range(7)}
    file_lines = sorted(starts[r["piece"]] + r["line"] for r in records)
    assert file_lines == list(range(1, 1501)), "every line once, none lost at a cut, none read twice"
    text = path.read_text().splitlines()
    assert all(text[starts[r["piece"]] + r["line"] - 1] == r["record"] for r in records)

    # Through the tokenizers, the bad rows are located at the file's own lines, as a reader would open it.
    ledger = new_ledger(spec.data, fail_early=False)
    tokenize(spec.data, inputs, spec.model.path, None, ("train",), ledger).materialize()
    report = ray_get(ledger.get.remote())
    assert report.rows == 1500 and report.bad_rows == 40
    for kind in set(bad_at.values()):
        expected = sorted(line for line, k in bad_at.items() if k == kind)[:5]
        found = [e for e in report.examples if e.kind == kind]
        assert [e.line for e in found] == expected and all(e.piece == 0 for e in found), (kind, found)
        assert [e.location for e in found] == [f"{path}:{line}" for line in expected]


def test_a_fill_reads_its_pieces_a_few_tasks_at_once_however_many_there_are(ray_cluster, tiny_spec, tmp_path, monkeypatch):
    """Seven pieces, one tokenizer actor: at most two reading tasks at once (``ACTORS_PER_READER``), each piece a
    task of a slow store (``Chaos.read_delay_s``), and every row still read once. Unbounded, a new job's fill
    started a worker process, and Ray Data's imports in it, for every piece at once beside the actors'."""
    from ray_jobs.chaos import Chaos
    from ray_jobs.data import pipeline as data_module
    from ray_jobs.tiny import write_dataset

    path = write_dataset(tmp_path / "rows.jsonl", rows=700, seed=5)
    spec = tiny_spec.replace(data=dataclasses.replace(tiny_spec.data, path=str(path), val_fraction=0.0, tokenize_workers=1))
    monkeypatch.setattr(reading, "PIECE_BYTES", path.stat().st_size // 6)
    inputs = data_inputs(spec)
    assert len(reading.pieces_of(inputs.files)) == 7
    assert data_module.ACTORS_PER_READER == 8, "one actor: the least, two reading tasks at once"

    ledger = new_ledger(spec.data, fail_early=False)
    chaos = Chaos(read_delay_s=1.0)
    tokenize(spec.data, inputs, spec.model.path, None, ("train",), ledger, chaos).materialize()
    clock = ray_get(ledger.clock.remote())
    assert 1 <= clock.readers_at_once <= 2, clock
    assert ray_get(ledger.get.remote()).rows == 700
    assert sum(n for n, _ in ray_get(ledger.lines_by_piece.remote()).values()) == 700, "seven pieces, each told"


def ray_get(ref):
    import ray

    return ray.get(ref)


def test_parquet_and_jsonl_of_the_same_rows_give_the_same_cache_entry(ray_cluster, tiny_spec, tmp_path, monkeypatch):
    """Both files are larger than a piece: the JSONL is read in byte ranges, the Parquet by runs of row groups."""
    import json

    import pyarrow as pa
    import pyarrow.parquet as pq

    from ray_jobs.data.cache import prepare
    from ray_jobs.tiny import write_dataset

    jsonl = write_dataset(tmp_path / "rows.jsonl", rows=600, seed=3)
    parquet = tmp_path / "rows.parquet"
    table = pa.Table.from_pylist([json.loads(line) for line in jsonl.read_text().splitlines()])
    pq.write_table(table, parquet, row_group_size=50)  # 12 row groups
    monkeypatch.setattr(reading, "PIECE_BYTES", parquet.stat().st_size // 4)
    entries = {}
    for path in (jsonl, parquet):
        data = dataclasses.replace(tiny_spec.data, path=str(path), cache_uri=str(tmp_path / f"cache-{path.suffix[1:]}"))
        assert len(reading.pieces_of(data_inputs(tiny_spec.replace(data=data)).files)) > 1, "read by several tasks"
        prepared = prepare(tiny_spec.replace(data=data))
        rows = prepared.order.dataset(0, world=1, micro_batch_size=1).take_all()
        entries[path.suffix] = (prepared.cache.packed_rows, prepared.quality_report().rows, _rows(rows))
    assert entries[".jsonl"] == entries[".parquet"], "the same rows, templated, tokenized and packed the same"
    assert entries[".jsonl"][1] == 600


def test_a_validation_set_of_its_own_is_the_eval_split_and_every_row_of_the_data_trains(ray_cluster, tiny_spec, tmp_path):
    """data.val_path in another format (alpaca, Parquet) than data.path (chat, JSONL): its rows, and only
    they, are evaluated on; no row of data.path is held out by val_fraction; a bad row in it is located there."""
    import json

    import pyarrow as pa
    import pyarrow.parquet as pq

    from ray_jobs.data.cache import prepare
    from ray_jobs.tiny import write_dataset

    train = write_dataset(tmp_path / "train.jsonl", rows=600, seed=3)
    held = [
        json.loads(line)["messages"] for line in write_dataset(tmp_path / "held.jsonl", rows=40, seed=4).read_text().splitlines()
    ]
    val_rows = [{"instruction": m[-2]["content"], "output": m[-1]["content"]} for m in held]
    val_rows[7]["output"] = " "  # an empty answer: a bad row, at row 8 of the validation file
    val = tmp_path / "val.parquet"
    pq.write_table(pa.Table.from_pylist(val_rows), val)
    data = dataclasses.replace(
        tiny_spec.data,
        path=str(train),
        val_path=str(val),
        val_fraction=0.2,
        max_bad_row_frac=0.1,
        cache_uri=str(tmp_path / "cache"),
    )
    prepared = prepare(tiny_spec.replace(data=data))

    quality = prepared.quality_report()
    assert quality.rows == 640 and quality.bad_rows == 1
    (bad,) = quality.examples
    assert bad.location == f"{val}:8" and bad.file_index == 1
    trained = prepared.order.dataset(0, world=1, micro_batch_size=1).sum("num_examples")
    evaluated = sum(prepared.eval_split.read_all().column("num_examples").to_pylist())
    assert (trained, evaluated) == (600, 39), "every data.path row trains (val_fraction unused); the eval split is val_path's"

    other = tmp_path / "other.parquet"
    pq.write_table(pa.Table.from_pylist(val_rows[:20]), other)
    again = prepare(tiny_spec.replace(data=dataclasses.replace(data, val_path=str(other))))
    assert not again.cache.hit and again.cache.key != prepared.cache.key, "another validation set is another entry"


def _rows(rows):
    columns = ("input_ids", "labels", "position_ids", "num_tokens")
    return sorted(tuple(tuple(map(int, r[c])) if hasattr(r[c], "__len__") else int(r[c]) for c in columns) for r in rows)


def test_a_cache_entry_read_here_gives_the_batches_ray_data_gives(ray_cluster, tiny_spec, tmp_path):
    """The worker reads a cache it can open itself (no Ray Data executor before its first batch): the same
    rows, columns, dtypes and positions as the Ray Data plan, for each rank, across an epoch's end."""
    import itertools

    import torch

    from ray_jobs.data.cache import prepare
    from ray_jobs.data.order import worker_batches

    # Tokenizer tasks of 256 rows (8 batches of 32): several of them, so the entry is several files.
    data = dataclasses.replace(tiny_spec.data, cache_uri=str(tmp_path / "cache"), shuffle_buffer_rows=16, tokenize_batch_size=32)
    order = prepare(tiny_spec.replace(data=data)).order
    per_epoch = order.rows_per_epoch(2, 2) // 4
    assert len(order.files) > 1 and per_epoch >= 2, "several files, and more than one batch an epoch"
    options = {"dtypes": torch.long, "device": "cpu", "pin_memory": False, "prefetch_batches": 1}
    for rank in (0, 1):
        direct, through_ray = (
            list(itertools.islice(worker_batches(order, 0, 1, 2, rank, 2, options, direct=way), per_epoch + 2))
            for way in (True, False)
        )
        assert [(e, d) for e, d, _ in direct] == [(e, d) for e, d, _ in through_ray]
        assert direct[-1][0] == 1, "into the second epoch"
        for (_, _, a), (_, _, b) in zip(direct, through_ray):
            assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) and a[k].dtype == b[k].dtype for k in a)
