"""The training order over cached files: a pure function of (seed, epoch), exact on resume."""

from __future__ import annotations

import itertools
import threading

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest

from ray_jobs.data.order import ROW_ID, CachedOrder, CacheFile, WindowReader, worker_batches

SIZES = (37, 5, 50, 21, 12)


@pytest.fixture
def files(tmp_path):
    """Five Parquet files of a split; each row's ``value`` is its index in the split's natural order."""
    out, at = [], 0
    for i, size in enumerate(SIZES):
        path = tmp_path / f"part-{i}.parquet"
        pq.write_table(pa.table({"value": np.arange(at, at + size)}), path)
        out.append(CacheFile(str(path), size))
        at += size
    return tuple(out)


def order_of(files, **changes):
    return CachedOrder(**{"fs": pafs.LocalFileSystem(), "files": files, "seed": 7, "shuffle": True, "window_rows": 40, **changes})


def epoch_rows(order, epoch, world=2, micro=4, start_batch=0):
    tables = [order.read(w) for w in order.windows(epoch, world, micro, start_batch)]
    values = pa.concat_tables(tables).column("value").to_pylist()
    assert values == pa.concat_tables(tables).column(ROW_ID).to_pylist()  # row ids name the rows read
    return values


def test_an_epoch_reads_every_kept_row_once_in_whole_global_batches(files):
    order = order_of(files)
    rows = epoch_rows(order, 0)
    assert order.rows == sum(SIZES) == 125
    assert len(rows) == order.rows_per_epoch(2, 4) == 120  # 15 global batches of 8; 5 random rows wait
    assert len(set(rows)) == len(rows) and set(rows) <= set(range(125))


def test_each_epoch_has_its_own_order_and_the_same_seed_gives_the_same_one(files):
    order = order_of(files)
    first, second = epoch_rows(order, 0), epoch_rows(order, 1)
    assert first != second
    assert first == epoch_rows(order_of(files), 0)  # a pure function of (seed, epoch): every worker agrees
    assert first != epoch_rows(order_of(files, seed=8), 0)


def test_a_sorted_split_is_spread_over_the_whole_epoch(files):
    """Rows 0-61 and 62-124 stand for two sorted halves: both appear in each quarter of the epoch."""
    rows = epoch_rows(order_of(files, window_rows=60), 0)
    for quarter in np.array_split(np.array(rows), 4):
        assert (quarter < 62).any() and (quarter >= 62).any(), rows


def test_resuming_at_a_batch_reads_on_from_exactly_that_row(files):
    order = order_of(files)
    full = epoch_rows(order, 1)
    for start_batch in (0, 1, 5, 6, 14):
        assert epoch_rows(order, 1, start_batch=start_batch) == full[start_batch * 8 :]
    assert order.windows(1, 2, 4, start_batch=15) == []  # the epoch is done


def test_a_resume_skips_whole_windows_without_reading_them(files):
    order = order_of(files)
    windows = order.windows(0, 2, 4)
    later = order.windows(0, 2, 4, start_batch=10)  # 80 rows trained
    assert [w.index for w in later] == [w.index for w in windows][-len(later) :] and len(later) < len(windows)
    before = sum(w.skip + w.keep for w in windows[: len(windows) - len(later)])  # windows never read again
    assert before <= 80 and later[0].skip == 80 - before
    assert [w.skip for w in later[1:]] == [0] * (len(later) - 1)


def test_shuffle_off_trains_in_the_data_order_every_epoch(files):
    order = order_of(files, shuffle=False)
    assert epoch_rows(order, 0) == list(range(120)) == epoch_rows(order, 3)
    assert order.permutation(order.windows(0, 2, 4)[0]) is None


def test_a_window_is_at_least_the_buffer_size_in_whole_files(files):
    order = order_of(files, window_rows=40)
    for window in order.windows(0, 1, 1)[:-1]:  # the last takes what is left
        assert sum(SIZES[i] for i in window.files) >= 40
    assert sorted(i for w in order.windows(0, 1, 1) for i in w.files) == list(range(5))


def rows_of(batches, n):
    """The first ``n`` items of ``worker_batches``: ``(epoch, batches done, the batch's values)``."""
    return [(epoch, done, batch["value"].tolist()) for epoch, done, batch in itertools.islice(batches, n)]


def test_read_here_each_rank_gets_its_share_of_every_global_batch_in_the_epochs_order(files):
    """Global batches of 8 span windows (40+ rows, not a multiple of 8), and two epochs follow each other."""
    order = order_of(files)
    expected = epoch_rows(order, 0) + epoch_rows(order, 1)
    ranks = [rows_of(worker_batches(order, 0, 0, 2, rank, 4, {}, direct=True), 30) for rank in (0, 1)]
    assert [(e, d) for e, d, _ in ranks[0]] == [(0, d) for d in range(1, 16)] + [(1, d) for d in range(1, 16)]
    read = [v for (_, _, a), (_, _, b) in zip(*ranks) for pair in zip(a, b) for v in pair]
    assert read == expected  # rank r takes every world-th row of each global batch, from row r


def test_read_here_a_resume_reads_on_from_the_batch_it_stopped_at(files):
    order = order_of(files)
    full = rows_of(worker_batches(order, 1, 0, 2, 1, 4, {}, direct=True), 15)
    for start_batch in (1, 5, 14):
        resumed = rows_of(worker_batches(order, 1, start_batch, 2, 1, 4, {}, direct=True), 15 - start_batch)
        assert resumed == full[start_batch:]


def test_read_here_rows_come_as_long_tensors_with_their_row_ids(files):
    import torch

    (_, _, batch), *_ = itertools.islice(worker_batches(order_of(files), 0, 0, 1, 0, 4, {}, direct=True), 1)
    assert set(batch) == {"value", ROW_ID}
    assert all(t.dtype == torch.long and t.shape == (4,) for t in batch.values())
    assert batch["value"].tolist() == batch[ROW_ID].tolist()


def test_the_reader_reads_its_first_window_before_the_first_batch_is_asked_for(files):
    """So the worker's first batch is read while its model loads."""
    started = threading.Event()

    class Watched(CachedOrder):
        def read(self, window):
            started.set()
            return super().read(window)

    order = Watched(fs=pafs.LocalFileSystem(), files=files, seed=7, shuffle=True, window_rows=40)
    reader = WindowReader(order, 0, 0, 2, 4)
    try:
        assert started.wait(timeout=60), "no window read began"
        assert reader.windows_read == 0  # nothing was asked of it yet
    finally:
        reader.close()


def test_closing_the_batches_ends_the_readers_thread(files):
    batches = worker_batches(order_of(files), 0, 0, 2, 0, 4, {}, direct=True)
    next(batches)
    assert any(t.name.startswith("rayft-window-reader") for t in threading.enumerate())
    batches.close()
    assert not any(t.name.startswith("rayft-window-reader") for t in threading.enumerate())
