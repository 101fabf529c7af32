"""What preparing a job's data and model cost, as typed records (see ``rayft_contract.records``): the dataset
cache's fill and its times, the model fetch, the data's quality. Made by the driver (``ray_jobs.data.cache``,
``ray_jobs.cache.models``, ``ray_jobs.data.quality``); read in the summary (:class:`~rayft_contract.records.JobSummary`),
by the CLI and the benchmarks.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

from rayft_contract._record import Record
from rayft_contract.phases import Phase


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


@dataclasses.dataclass(frozen=True)
class FillTimes(Record):
    """Where a dataset cache fill's time went (``ray_jobs.data.cache``).

    The fill streams: files are read, templated, tokenized, packed and written at once, so its wall time
    is cut where the stream starts and ends, at the first and the last batch a tokenizer finished. The
    three ``*_s`` add up to the fill's wall time, and are rows of the job's phase table
    (:attr:`PHASES`). Inside the stream, the ``*_busy_s`` say what each stage cost, summed over the
    tasks and actors that ran it (so they may add up to more than the wall time): the stage with the
    most busy seconds per CPU it had is the one that set the pace."""

    start_s: float
    """From the fill's start to the first tokenizer task's start: the tokenizer actors start, the first rows
    are read and cut into tokenizer batches. Nothing is tokenized yet: the fill's fixed cost."""
    stream_s: float
    """From the first tokenizer task's start to the last tokenized batch: read, template, tokenize and pack,
    streamed."""
    write_s: float
    """From the last tokenized batch to the entry committed: the last Parquet files, the manifest."""
    read_busy_s: float = 0.0
    template_busy_s: float = 0.0
    """Rows parsed and put in the chat template (no tokenizer)."""
    tokenize_busy_s: float = 0.0
    pack_busy_s: float = 0.0
    workers: int = 0
    """Tokenizer actors."""
    actors_ready_s: float = 0.0
    """From the fill's start until the last tokenizer actor was ready (its process started, its modules
    imported, its constructor run). Tasks start on the first actors ready, so with many actors this can
    end inside the stream."""
    actor_init_s: float = 0.0
    """Inside that: the slowest actor's constructor (the tokenizer's load)."""
    first_batch_s: float = 0.0
    """From the fill's start to the first tokenized batch's end (inside the stream: the first task's rows)."""
    first_read_s: float = 0.0
    """From the fill's start to the first reading task's start (the listing, the executor's start, a worker
    process for the task), inside ``start_s``."""
    first_block_s: float = 0.0
    """From the fill's start to the first rows a reading task handed on. From there to ``start_s``, the rows
    wait for Ray Data to cut them into a tokenizer task's batch and give it to an actor."""
    readers_at_once: int = 0
    """The most reading tasks that ran at the same time (``ray_jobs.data.pipeline.ACTORS_PER_READER`` bounds them)."""

    PHASES: ClassVar[tuple[Phase, Phase, Phase]] = (Phase.DATA_FILL_START, Phase.DATA_FILL_STREAM, Phase.DATA_FILL_WRITE)
    """The phase table's rows for ``start_s``, ``stream_s`` and ``write_s``, in that order."""

    def phases(self) -> dict[str, float]:
        return {p.value: s for p, s in zip(self.PHASES, (self.start_s, self.stream_s, self.write_s))}

    def describe(self) -> str:
        busy = (
            f"read {self.read_busy_s:.1f} s, template {self.template_busy_s:.1f} s, "
            f"tokenize {self.tokenize_busy_s:.1f} s, pack {self.pack_busy_s:.1f} s"
        )
        return (
            f"start {self.start_s:.1f} s (actors ready at {self.actors_ready_s:.1f} s, constructor {self.actor_init_s:.1f} s; "
            f"first read at {self.first_read_s:.1f} s, its first rows at {self.first_block_s:.1f} s; "
            f"{_count(self.readers_at_once, 'reading task')} at most at once), "
            f"stream {self.stream_s:.1f} s (first batch done at {self.first_batch_s:.1f} s), write {self.write_s:.1f} s; "
            f"busy over {_count(self.workers, 'tokenizer actor')}: {busy}"
        )


@dataclasses.dataclass(frozen=True)
class DatasetCacheInfo(Record):
    """What preparing the data cost (``ray_jobs.data.cache``)."""

    enabled: bool
    hit: bool = False
    bytes_downloaded: int = 0
    rows_tokenized: int | None = None
    """Rows tokenized before training (0 on a hit, ``None`` when streaming: they are tokenized as it trains)."""
    key: str = ""
    uri: str = ""
    packed_rows: dict[str, int] = dataclasses.field(default_factory=dict)
    seconds: float = 0.0
    nodes: int = 0
    """The Ray nodes whose CPUs tokenized, on a fill (0 on a hit)."""
    fill: FillTimes | None = None
    """A fill's phases and busy stages (``None`` on a hit, or streaming)."""

    def describe(self) -> str:
        """One line for the progress view."""
        if not self.enabled:
            return "dataset cache off: tokenizing while training"
        if self.hit:
            return f"dataset cache hit {self.key}: 0 bytes downloaded, 0 rows tokenized"
        where = f" on {self.nodes} nodes" if self.nodes > 1 else ""
        return (
            f"dataset cache miss {self.key}: read {self.bytes_downloaded / 2**20:.1f} MiB, tokenized "
            f"{self.rows_tokenized} rows in {self.seconds:.1f} s{where}"
        )


@dataclasses.dataclass(frozen=True)
class Fetched(Record):
    """Where the base model came from (``ray_jobs.cache.models.fetch_model``)."""

    path: str
    """The model's local directory."""
    source: str
    """``local`` (used in place), ``cache`` (hit), ``download`` (miss), ``hub-cache`` or ``hub``."""
    bytes_downloaded: int = 0
    seconds: float = 0.0
    identity: str = ""
    """Which exact base this is, so an adapter stays tied to it: the hub commit, or a SHA-256 over every file's
    name and size and the config's bytes (``s3://``: as listed; local: as on disk). Not a hash of the weights'
    bytes: that would read gigabytes on every job."""

    @property
    def hit(self) -> bool:
        return self.source in ("local", "cache", "hub-cache")

    def describe(self) -> str:
        """One line for the progress view: where the model came from."""
        if self.source == "download":
            return f"downloaded {self.bytes_downloaded / 2**20:.1f} MiB into the cache in {self.seconds:.1f} s"
        return {
            "local": "local directory",
            "cache": "model cache hit",
            "hub-cache": "hub cache hit",
            "hub": "downloaded from the hub",
        }[self.source]


@dataclasses.dataclass(frozen=True)
class Caches(Record):
    dataset: DatasetCacheInfo | None = None
    model: Fetched | None = None


@dataclasses.dataclass(frozen=True, order=True)
class BadRowSample(Record):
    """One located bad row. Ordered by place in the data: file index in the listing, then line."""

    file_index: int
    """The file's position in the sorted listing of ``data.path`` (``ray_jobs.data.sources.data_files``)."""
    piece: int = 0
    """Which range of the file it was read in (``ray_jobs.data.reading.pieces_of``); 0 once ``line`` is the file's."""
    line: int = 0
    """1-based line of a JSONL file (within its piece until resolved), or row number in the other file types."""
    kind: str = dataclasses.field(default="", compare=False)
    location: str = dataclasses.field(default="", compare=False)
    """``file:line``, as a user would open it."""
    reason: str = dataclasses.field(default="", compare=False)


@dataclasses.dataclass(frozen=True)
class DataQuality(Record):
    """The bad rows of a job's data (``ray_jobs.data.quality``): counted by kind, the earliest of each located."""

    rows: int = 0
    bad_rows: int = 0
    bad_frac: float = 0.0
    bad_by_kind: dict[str, int] = dataclasses.field(default_factory=dict)
    truncated: int = 0
    examples: tuple[BadRowSample, ...] = ()
