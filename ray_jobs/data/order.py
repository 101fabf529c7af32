"""The order training rows come in: shuffled per epoch from ``train.seed``, the same after a resume.

With the dataset cache (the default) the training split is a list of Parquet files of packed rows
whose row counts the cache manifest records. An epoch's order is a pure function of
``(train.seed, epoch)``:

1. the files are put in a random order (``shuffle`` off: the entry's own order, which is the data's);
2. consecutive files are grouped into *windows* of at least ``data.shuffle_buffer_rows`` rows;
3. the rows of each window are shuffled together (off: kept in order);
4. the epoch keeps its first ``M`` rows, the largest multiple of ``world x micro_batch_size`` (the
   random rows past it are dropped for this epoch only, as ``DistributedSampler(drop_last=True)``);
5. global batch ``b`` is rows ``[b*G, (b+1)*G)`` with ``G = world x micro_batch_size``; worker ``r``
   takes every ``world``-th row of it, from row ``r``.

So every worker knows, with no coordination, which rows it trains on at any step, and a resumed run
(``TrainState.epoch``, ``batches_in_epoch``) reads on from exactly the row where it stopped: windows
already trained are never read again, and only the rest of the window it stopped in is skipped.

How well it mixes: any two rows of one window are in uniformly random relative order, and windows
come in a uniformly random order, so a dataset sorted by source, task, length or date is spread over
the whole epoch at the granularity of one window. A cache file holds at least 512 packed rows, so a
window is one file when ``shuffle_buffer_rows`` is below that, and the whole epoch when the dataset
fits in one window (a full shuffle).

Why by hand and not ``Dataset.random_shuffle``: Ray's per-epoch reseeding counts executions of the
dataset (``RandomSeedConfig(reseed_after_execution=True)``), which start again from 0 in a resumed run,
so epoch 3 after a resume would repeat epoch 0's order. A global shuffle also reads and moves the whole
split before the first step. Here each epoch is a small Ray Data plan (one read task per window,
ahead of the trainer, in order), built in the worker for the position it resumes at.

Each worker reads every row of the epoch and keeps its ``1/world`` share: the read is cheap beside a
training step (the 7B preset trained at 11,180 tokens/s on an H200, 5.5 rows of 2,048 tokens per
second per GPU), and it keeps the split exact and independent of task timing, which Ray Data's
``streaming_split`` does not promise.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import json
import warnings
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from rayft_contract.spec import FineTuneSpec

ROW_ID = "row_id"
"""Column added to every row read through an order: the row's index in the split's natural order."""


@dataclasses.dataclass(frozen=True)
class CacheFile:
    path: str
    """Inside the payload's filesystem."""
    rows: int


@dataclasses.dataclass(frozen=True)
class Window:
    """One read task: files read together, their rows (maybe shuffled) and the slice of them kept."""

    epoch: int
    index: int
    files: tuple[int, ...]
    """Indices into :attr:`CachedOrder.files`."""
    rows: int
    """Rows in those files."""
    skip: int
    """Rows of the window (after shuffling) already trained, or beyond the epoch's end."""
    keep: int
    """Rows kept from ``skip`` on."""

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self))

    @classmethod
    def from_json(cls, text: str) -> Window:
        fields = json.loads(text)
        return cls(**{**fields, "files": tuple(fields["files"])})


@dataclasses.dataclass(frozen=True)
class CachedOrder:
    """Everything a worker needs to read its rows of the cached training split, epoch by epoch."""

    fs: Any
    """pyarrow filesystem of the cache entry (local or S3)."""
    files: tuple[CacheFile, ...]
    seed: int
    shuffle: bool
    window_rows: int
    node_id: str | None = None
    """A local cache lives on the driver's node: read tasks are pinned there."""

    @property
    def rows(self) -> int:
        return int(self._offsets[-1])

    @functools.cached_property
    def _offsets(self) -> np.ndarray:
        """Where each file's rows start in the split's natural order (the row ids), and the total."""
        return np.cumsum([0] + [f.rows for f in self.files])

    def rows_per_epoch(self, world: int, micro_batch_size: int) -> int:
        """``M``: the rows each epoch trains on, a whole number of global batches."""
        global_batch = world * micro_batch_size
        return self.rows // global_batch * global_batch

    def windows(self, epoch: int, world: int, micro_batch_size: int, start_batch: int = 0) -> list[Window]:
        """The read tasks of ``epoch``, from global batch ``start_batch`` on."""
        order = np.arange(len(self.files))
        if self.shuffle:
            order = np.random.default_rng([self.seed, epoch]).permutation(len(self.files))
        least = self.window_rows if self.shuffle else 1  # off: a window per file, nothing to mix
        groups: list[list[int]] = []
        filled = least
        for i in order.tolist():
            if filled >= least:
                groups.append([])
                filled = 0
            groups[-1].append(i)
            filled += self.files[i].rows
        end = self.rows_per_epoch(world, micro_batch_size)
        done = start_batch * world * micro_batch_size
        out, at = [], 0
        for index, group in enumerate(groups):
            size = sum(self.files[i].rows for i in group)
            skip, stop = max(done - at, 0), min(end - at, size)
            if stop > skip:
                out.append(Window(epoch, index, tuple(group), size, skip, stop - skip))
            at += size
        return out

    def permutation(self, window: Window) -> np.ndarray | None:
        """The order of a window's rows (``None``: as read)."""
        if not self.shuffle:
            return None
        return np.random.default_rng([self.seed, window.epoch, window.index]).permutation(window.rows)

    def read(self, window: Window) -> Any:
        """The kept rows of one window, as a pyarrow table with :data:`ROW_ID`."""
        import pyarrow as pa
        import pyarrow.parquet as pq

        tables, ids = [], []
        for i in window.files:
            table = pq.read_table(self.files[i].path, filesystem=self.fs)
            tables.append(table)
            ids.append(np.arange(self._offsets[i], self._offsets[i] + table.num_rows, dtype=np.int64))
        table = pa.concat_tables(tables).append_column(ROW_ID, pa.array(np.concatenate(ids)))
        order = self.permutation(window)
        if order is not None:
            table = table.take(pa.array(order))
        return table.slice(window.skip, window.keep)

    def read_all(self) -> Any:
        """Every row in the split's natural order, as one pyarrow table (for a small split: evaluation)."""
        return self.read(Window(0, 0, tuple(range(len(self.files))), self.rows, 0, self.rows)).drop_columns([ROW_ID])

    def readable_here(self) -> bool:
        """Whether this process can open the files itself: a remote store, or the local cache's own node."""
        if self.node_id is None:
            return True
        import ray

        return ray.get_runtime_context().get_node_id() == self.node_id

    def dataset(self, epoch: int, world: int, micro_batch_size: int, start_batch: int = 0) -> Any:
        """A Ray dataset of ``epoch``'s rows from global batch ``start_batch`` on, in order."""
        import ray.data

        windows = self.windows(epoch, world, micro_batch_size, start_batch)
        items = [{"window": w.to_json()} for w in windows]
        ds = ray.data.from_items(items, override_num_blocks=max(len(items), 1))
        ds.context.execution_options.preserve_order = True  # the order is the point
        remote_args: dict[str, Any] = {}
        if self.node_id is not None:
            from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

            remote_args["scheduling_strategy"] = NodeAffinitySchedulingStrategy(self.node_id, soft=False)
        with warnings.catch_warnings():  # remote args are deprecated in 2.60 but still the only way to pin a task
            warnings.simplefilter("ignore", DeprecationWarning)
            return ds.map_batches(_ReadWindows(self), batch_size=1, batch_format="pyarrow", **remote_args)


class _ReadWindows:
    """Ray Data UDF: a batch of window descriptions -> their rows."""

    def __init__(self, order: CachedOrder):
        self.order = order

    def __call__(self, batch: Any) -> Any:
        import pyarrow as pa

        return pa.concat_tables([self.order.read(Window.from_json(w)) for w in batch.column("window").to_pylist()])


def micro_batches(
    spec: FineTuneSpec, order: CachedOrder | None, shard: Any, state: Any, device: Any, rank: int, world: int, multiple: int
) -> Iterator[dict[str, Any]]:
    """This worker's micro-batches over epochs, from where ``state`` (the loop's ``TrainState``) stands, which
    it keeps up to date, so a checkpoint records the position and a resume reads on from there. ``order``: the
    cache's training split, whose first window is read from this call on (:class:`WindowReader`), beside the
    model load; ``None`` streams from ``shard``, Ray Train's ``train`` shard. Each batch keeps a multiple of
    ``multiple`` columns (:func:`~ray_jobs.data.packing.shape_multiple`, for the attention the model runs)."""
    import torch

    options = {
        "prefetch_batches": spec.data.prefetch_batches,
        "dtypes": torch.long,
        "device": "cpu",  # the loop copies each micro-batch itself, timed as host-to-device
        "pin_memory": device.type == "cuda",
    }
    if order is not None:
        batches = worker_batches(order, state.epoch, state.batches_in_epoch, world, rank, spec.train.micro_batch_size, options)
        return _cached(batches, state, multiple)
    return _streamed(spec, shard, state, rank, options, multiple)


def _cached(batches: Iterator[tuple[int, int, dict[str, Any]]], state: Any, multiple: int) -> Iterator[dict[str, Any]]:
    from ray_jobs.data.packing import trim_padding

    for epoch, done, batch in batches:
        state.epoch, state.batches_in_epoch = epoch, done
        yield trim_padding(batch, multiple)


def _streamed(
    spec: FineTuneSpec, shard: Any, state: Any, rank: int, options: dict[str, Any], multiple: int
) -> Iterator[dict[str, Any]]:
    """Streaming: the tokenizers' output order varies with their timing, so a resume skips the same number of
    micro-batches, not the same rows; the buffer's seed changes every epoch."""
    from ray_jobs.data.packing import trim_padding

    data = spec.data
    for epoch in itertools.count(state.epoch):
        seen = 0
        batches = shard.iter_torch_batches(
            batch_size=spec.train.micro_batch_size,
            drop_last=True,
            local_shuffle_buffer_size=data.shuffle_buffer_rows if data.shuffle else None,
            local_shuffle_seed=stream_seed(spec.train.seed, epoch, rank) if data.shuffle else None,
            **options,
        )
        for index, batch in enumerate(batches):
            seen += 1
            if epoch == state.epoch and index < state.batches_in_epoch:
                continue
            state.epoch, state.batches_in_epoch = epoch, index + 1
            yield trim_padding(batch, multiple)
        if seen == 0:
            raise RuntimeError(
                "the training split gave this worker no full micro-batch: add data, or lower train.micro_batch_size or scaling.num_workers"
            )
        state.epoch, state.batches_in_epoch = epoch + 1, 0


def worker_batches(
    order: CachedOrder,
    epoch: int,
    start_batch: int,
    world: int,
    rank: int,
    micro_batch_size: int,
    iter_options: dict[str, Any],
    direct: bool | None = None,
) -> Iterator[tuple[int, int, dict[str, Any]]]:
    """``(epoch, batches done in it, micro-batch)`` for worker ``rank``, forever, from the given position.

    ``direct`` (default: whether this process can open the files, :meth:`CachedOrder.readable_here`) reads
    the windows here with a :class:`WindowReader`, which starts at once, before the first batch is asked
    for; otherwise they come through a Ray Data plan pinned to the cache's node. Both give the same batches."""
    global_batch = world * micro_batch_size
    if order.rows_per_epoch(world, micro_batch_size) == 0:
        raise RuntimeError(
            f"the training split packs into {order.rows} rows, fewer than one global batch of {global_batch} "
            "(micro_batch_size x num_workers): add data, or lower train.micro_batch_size or scaling.num_workers"
        )
    if order.readable_here() if direct is None else direct:
        reader = WindowReader(order, epoch, start_batch, world, micro_batch_size)
        return _direct_batches(reader, start_batch, world, rank, iter_options)
    return _ray_data_batches(order, epoch, start_batch, world, rank, micro_batch_size, iter_options)


def _ray_data_batches(
    order: CachedOrder, epoch: int, start_batch: int, world: int, rank: int, micro_batch_size: int, iter_options: dict[str, Any]
) -> Iterator[tuple[int, int, dict[str, Any]]]:
    global_batch = world * micro_batch_size
    while True:
        batches = order.dataset(epoch, world, micro_batch_size, start_batch).iter_torch_batches(
            batch_size=global_batch, drop_last=True, **iter_options
        )
        for done, batch in enumerate(batches, start=start_batch + 1):
            yield epoch, done, {k: v[rank::world].contiguous() for k, v in batch.items()}
        epoch, start_batch = epoch + 1, 0


class WindowReader:
    """The windows of every epoch from a position, read in this process on one thread, one window ahead of
    the trainer: ``(epoch, the window's kept rows as numpy columns)``.

    Why not Ray Data for a cache this process can open: the plan (``from_items`` and a read UDF) starts an
    executor in the worker before the first row comes. In the 7B preset's warm start on an H200 the first
    batch came 12 s after the model load, in series with it (issue 12). A cache hit is plain Parquet here,
    so the worker reads it itself, and the first window's read starts when the reader is made, beside the
    model load. pyarrow's Parquet read releases the GIL, so the thread does not hold up the loop."""

    def __init__(self, order: CachedOrder, epoch: int, start_batch: int, world: int, micro_batch_size: int):
        from concurrent.futures import ThreadPoolExecutor

        self.order, self.world, self.micro = order, world, micro_batch_size
        self.windows_read = 0
        self._windows = self._all_windows(epoch, start_batch)
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="rayft-window-reader")
        self._next = self._submit()

    def _all_windows(self, epoch: int, start_batch: int) -> Iterator[tuple[int, Window]]:
        while True:
            yield from ((epoch, w) for w in self.order.windows(epoch, self.world, self.micro, start_batch))
            epoch, start_batch = epoch + 1, 0

    def _submit(self) -> tuple[int, Any]:
        epoch, window = next(self._windows)
        return epoch, self._pool.submit(lambda: _columns(self.order.read(window)))

    def __iter__(self) -> Iterator[tuple[int, dict[str, np.ndarray]]]:
        """Each window in turn; the next one is read while this one is used."""
        try:
            while True:
                epoch, future = self._next
                columns = future.result()
                self.windows_read += 1
                self._next = self._submit()
                yield epoch, columns
        finally:
            self.close()

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)


def _columns(table: Any) -> dict[str, np.ndarray]:
    """A table of packed rows as numpy: a row column (a list, or Ray Data's tensor type over one) as
    ``(rows, seq_len)``, a scalar column as ``(rows,)``."""
    import pyarrow as pa

    out = {}
    for name in table.column_names:
        column = table.column(name).combine_chunks()
        if isinstance(column.type, pa.ExtensionType):
            column = column.storage
        kind = column.type
        if pa.types.is_list(kind) or pa.types.is_large_list(kind) or pa.types.is_fixed_size_list(kind):
            out[name] = column.flatten().to_numpy().reshape(len(column), -1)
        else:
            out[name] = column.to_numpy()
    return out


def _direct_batches(
    reader: WindowReader, start_batch: int, world: int, rank: int, iter_options: dict[str, Any]
) -> Iterator[tuple[int, int, dict[str, Any]]]:
    """The reader's windows cut into global batches (a batch may span two windows of an epoch, and an epoch
    holds whole batches), and this rank's rows of each as tensors, as ``iter_torch_batches`` gives them."""
    import torch

    global_batch, pin = world * reader.micro, iter_options.get("pin_memory", False)
    dtype = iter_options.get("dtypes", torch.long)
    now, done, held = None, start_batch, {}
    for epoch, columns in reader:
        if now is not None and epoch != now:
            done = 0  # a new epoch starts at its first batch (and nothing is held: epochs hold whole batches)
        now = epoch
        if held:
            columns = {k: np.concatenate([held[k], v]) for k, v in columns.items()}
        rows = len(next(iter(columns.values())))
        whole = rows // global_batch * global_batch
        for at in range(0, whole, global_batch):
            done += 1
            batch = {}
            for k, v in columns.items():
                # A copy (Arrow's arrays are read-only) of this rank's rows: every world-th, from its rank.
                tensor = torch.tensor(v[at + rank : at + global_batch : world], dtype=dtype)
                batch[k] = tensor.pin_memory() if pin else tensor
            yield epoch, done, batch
        held = {k: v[whole:] for k, v in columns.items()} if whole < rows else {}


def stream_seed(seed: int, epoch: int, rank: int) -> int:
    """Streaming mode's shuffle-buffer seed for one worker's epoch (a new order each epoch)."""
    return int(np.random.SeedSequence([seed, epoch, rank]).generate_state(1)[0])
