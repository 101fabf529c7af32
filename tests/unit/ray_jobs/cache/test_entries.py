"""Cache entries without Ray: atomic commit under a race, LRU listing and pruning, and the dataset key."""

from __future__ import annotations

import dataclasses
import os
import shutil
import threading
import time

import pytest

from ray_jobs.cache import entries as cache
from ray_jobs.data.cache import dataset_key
from rayft.cli_cache import parse_size


def fill(root, key, size, description="x"):
    entry = cache.entry(str(root), "datasets", key)
    payload = cache.new_payload(entry)
    with open(os.path.join(payload.path, "shard.parquet"), "wb") as fh:
        fh.write(b"\0" * size)
    return cache.commit(entry, payload, {"description": description})


def test_racing_fills_leave_one_complete_entry(tmp_path):
    entry = cache.entry(str(tmp_path), "datasets", "k")
    payloads = [cache.new_payload(entry) for _ in range(8)]
    for p in payloads:
        with open(os.path.join(p.path, "shard.parquet"), "wb") as fh:
            fh.write(p.path.encode())
    winners = []
    barrier = threading.Barrier(len(payloads))

    def commit(p):
        barrier.wait()
        winners.append(cache.commit(entry, p, {"description": "race"})["payload"])

    threads = [threading.Thread(target=commit, args=(p,)) for p in payloads]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(set(winners)) == 1, "every filler is told the same winner"
    left = sorted(p.name for p in (tmp_path / "datasets" / "k").iterdir() if p.name.startswith("data-"))
    assert left == winners[:1], "losers delete their payloads"
    assert cache.manifest(entry)["payload"] == winners[0]


def test_manifest_missing_means_not_filled(tmp_path):
    entry = cache.entry(str(tmp_path), "datasets", "k")
    cache.new_payload(entry)
    assert cache.manifest(entry) is None


def test_list_orders_by_last_use_and_prune_drops_least_recent(tmp_path):
    for key in ("old", "mid", "new"):
        fill(tmp_path, key, 1000)
        time.sleep(0.02)
    cache.record_hit(cache.entry(str(tmp_path), "datasets", "old"))  # now the most recent
    entries = cache.list_entries(str(tmp_path))
    assert [e.key for e in entries] == ["old", "new", "mid"]
    assert entries[0].hits == 1 and all(e.size_bytes >= 1000 for e in entries)

    dry = cache.prune(2500, str(tmp_path), dry_run=True)
    assert [e.key for e in dry] == ["mid"] and len(cache.list_entries(str(tmp_path))) == 3
    assert [e.key for e in cache.prune(1500, str(tmp_path))] == ["mid", "new"]
    assert [e.key for e in cache.list_entries(str(tmp_path))] == ["old"]


def test_prune_removes_abandoned_fills_but_not_live_ones(tmp_path):
    fill(tmp_path, "done", 10)
    for key in ("abandoned", "filling"):
        cache.new_payload(cache.entry(str(tmp_path), "datasets", key))
    long_ago = time.time() - 2 * cache.ORPHAN_AGE_S
    for path in (tmp_path / "datasets" / "abandoned").rglob("*"):
        os.utime(path, (long_ago, long_ago))
    os.utime(tmp_path / "datasets" / "abandoned", (long_ago, long_ago))
    (next((tmp_path / "datasets" / "abandoned").iterdir()) / "part").write_bytes(b"x")
    os.utime(next((tmp_path / "datasets" / "abandoned").iterdir()) / "part", (long_ago, long_ago))
    (next((tmp_path / "datasets" / "filling").iterdir()) / "part").write_bytes(b"x")
    assert [e.key for e in cache.prune(10**9, str(tmp_path))] == ["abandoned"]


@pytest.mark.parametrize(("text", "size"), [("500M", 500 * 2**20), ("50G", 50 * 2**30), ("1.5GiB", int(1.5 * 2**30)), ("0", 0)])
def test_sizes(text, size):
    assert parse_size(text) == size


def test_dataset_key_covers_what_changes_the_tokens(tiny_spec, tmp_path):
    base, _ = dataset_key(tiny_spec)
    assert dataset_key(tiny_spec)[0] == base, "stable"

    def changed(**data):
        return dataset_key(tiny_spec.replace(data=dataclasses.replace(tiny_spec.data, **data)))[0]

    assert changed(max_seq_len=128) != base
    assert changed(packing=False) != base
    assert changed(train_on_completions_only=False) != base
    assert changed(chat_template="{{ messages }}") != base
    assert changed(max_bad_row_frac=0.5) == base, "the threshold does not change the tokens"
    assert changed(tokenize_workers=7) == base

    model = tmp_path / "model"
    shutil.copytree(tiny_spec.model.path, model)
    other_model = tiny_spec.replace(model=dataclasses.replace(tiny_spec.model, path=str(model)))
    assert dataset_key(other_model)[0] == base, "same tokenizer files, same key"
    (model / "tokenizer_config.json").write_text((model / "tokenizer_config.json").read_text().replace("<pad>", "<unk>", 1))
    assert dataset_key(other_model)[0] != base

    data = tmp_path / "train.jsonl"
    shutil.copy(tiny_spec.data.path, data)
    moved = tiny_spec.replace(data=dataclasses.replace(tiny_spec.data, path=str(data)))
    first = dataset_key(moved)[0]
    with data.open("a") as fh:
        fh.write('{"text": "one more"}\n')
    assert dataset_key(moved)[0] != first
