"""Bad rows: counted by kind, skipped below a threshold, fatal above it, never dropped silently.

Kinds (``BAD_ROW_KINDS``):

| kind               | a row that ...                                                     |
|--------------------|--------------------------------------------------------------------|
| `unparsable`       | is not valid JSON, or not a JSON object                            |
| `missing_field`    | lacks a field its format needs, or holds the wrong type there      |
| `empty_completion` | has nothing to train on: an empty answer (or empty text)           |
| `too_long`         | is longer than ``data.max_seq_len`` with ``data.overlong: drop``   |

Rows cut to ``max_seq_len`` under ``data.overlong: truncate`` are kept and counted as ``truncated``
(not bad). The tokenizer actors add their counts to one :class:`RowLedger` actor per job; the
driver reads the report once the dataset is tokenized. The job fails when bad rows exceed
``data.max_bad_row_frac`` of all rows, with a report naming the first few (file:line and why).

"First" means first in the data, not first to arrive: Ray Data tokenizes blocks in any order, so each
sample carries its place (the file's index in the listing, then the line) and every report keeps the
earliest :data:`MAX_EXAMPLES` of each kind by that place. The same rows give the same report however
the blocks were scheduled.
"""

from __future__ import annotations

import dataclasses
import itertools
import time
from collections import Counter
from typing import Any

from rayft_contract.data_records import BadRowSample, DataQuality

BAD_ROW_KINDS = ("unparsable", "missing_field", "empty_completion", "too_long")
MAX_EXAMPLES = 5
"""Locations kept per kind."""
MIN_ROWS_FOR_EARLY_FAIL = 500
"""While streaming (no cache), fail early only once this many rows back the estimate."""


class BadRow(ValueError):
    """One row that cannot be trained on; ``kind`` is one of ``BAD_ROW_KINDS``."""

    def __init__(self, kind: str, message: str):
        super().__init__(message)
        self.kind = kind


class DataQualityError(RuntimeError):
    """Too many bad rows; the message is the report."""


@dataclasses.dataclass
class QualityReport:
    rows: int = 0
    """Rows read (both splits)."""
    bad: Counter = dataclasses.field(default_factory=Counter)
    """Bad rows by kind."""
    truncated: int = 0
    examples: list[BadRowSample] = dataclasses.field(default_factory=list)
    """The earliest bad rows of each kind (at most :data:`MAX_EXAMPLES` each), in data order."""

    def add(self, other: QualityReport) -> None:
        self.rows += other.rows
        self.bad.update(other.bad)
        self.truncated += other.truncated
        self._keep_earliest(other.examples)

    def record(self, bad: BadRow, source: str, file_index: int, piece: int, line: int) -> None:
        """One bad row at ``line`` of ``piece`` of the file ``source`` (the ``file_index``-th of the listing)."""
        self.bad[bad.kind] += 1
        self._keep_earliest([BadRowSample(file_index, piece, line, bad.kind, f"{source}:{line}", str(bad))])

    def resolved(self, lines: dict[tuple[int, int], tuple[int, int]]) -> QualityReport:
        """This report with every example's line counted from its file's start. ``lines``: (file, piece) ->
        (lines in that piece, its first byte), as the reading tasks reported them. A piece whose earlier
        pieces have not all reported (a job failing early, mid-read) is located by its byte offset instead."""
        examples = []
        for e in self.examples:
            if e.piece == 0:
                examples.append(e)
                continue
            before = [lines.get((e.file_index, p)) for p in range(e.piece)]
            source = e.location.rsplit(":", 1)[0]
            if None in before:
                start = lines.get((e.file_index, e.piece), (0, "?"))[1]
                location = f"{source} (line {e.line} after byte {start})"
                examples.append(dataclasses.replace(e, location=location))
                continue
            line = sum(count for count, _ in before) + e.line  # type: ignore[misc]
            examples.append(dataclasses.replace(e, piece=0, line=line, location=f"{source}:{line}"))
        return dataclasses.replace(self, examples=sorted(examples))

    def _keep_earliest(self, new: list[BadRowSample]) -> None:
        kept: Counter = Counter()
        merged = []
        for sample in sorted([*self.examples, *new]):
            kept[sample.kind] += 1
            if kept[sample.kind] <= MAX_EXAMPLES:
                merged.append(sample)
        self.examples = merged

    @property
    def bad_rows(self) -> int:
        return sum(self.bad.values())

    @property
    def bad_frac(self) -> float:
        return self.bad_rows / self.rows if self.rows else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "rows": self.rows,
            "bad_rows": self.bad_rows,
            "bad_frac": self.bad_frac,
            "bad_by_kind": {k: self.bad[k] for k in BAD_ROW_KINDS if self.bad[k]},
            "truncated": self.truncated,
            "examples": [e.to_dict() for e in self.examples],
        }

    def summary(self) -> DataQuality:
        """The summary's record of it."""
        return DataQuality.from_dict(self.to_dict())

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> QualityReport:
        examples = [BadRowSample.from_dict(e) for e in data["examples"]]
        return cls(data["rows"], Counter(data["bad_by_kind"]), data["truncated"], examples)

    def check(self, max_frac: float) -> None:
        """Raise :class:`DataQualityError` when the bad share is over ``max_frac``."""
        if self.bad_frac > max_frac:
            raise DataQualityError(self.describe(max_frac))

    def describe(self, max_frac: float) -> str:
        kinds = ", ".join(f"{n} {k}" for k, n in self.to_dict()["bad_by_kind"].items())
        where = "; ".join(f"{e.location} ({e.kind}: {e.reason})" for e in self.examples[:MAX_EXAMPLES])
        return (
            f"data.path: {self.bad_rows} of {self.rows} rows are bad ({self.bad_frac:.1%}, over data.max_bad_row_frac "
            f"{max_frac:.1%}): {kinds}. First: {where}. Fix the rows, or raise data.max_bad_row_frac to skip them"
        )


@dataclasses.dataclass
class StageSeconds:
    """Busy seconds of a fill's stages, as one reading task or one tokenizer batch measured them; the ledger
    sums them (``rayft_contract.records.FillTimes`` says what each stage covers)."""

    read: float = 0.0
    template: float = 0.0
    tokenize: float = 0.0
    pack: float = 0.0

    def add(self, other: StageSeconds) -> None:
        for f in dataclasses.fields(self):
            setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))


@dataclasses.dataclass(frozen=True)
class FillClock:
    """What the ledger saw of a fill's stream: when the first tokenizer task began, when the first and the
    last tokenized batch came (``time.time()``; ``None`` before any), and the stages' busy seconds."""

    first_task_ts: float | None
    first_batch_ts: float | None
    last_batch_ts: float | None
    busy: StageSeconds
    actors_ready_ts: float | None = None
    """When the last tokenizer actor finished its constructor."""
    actor_init_s: float = 0.0
    """The slowest constructor: the tokenizer's load (and the model fetch on a new node)."""
    first_read_ts: float | None = None
    """When the first reading task began (``ray_jobs.data.reading``)."""
    first_block_ts: float | None = None
    """When a reading task first handed on rows."""
    readers_at_once: int = 0
    """The most reading tasks that ran at the same time."""


class RowLedger:
    """One per job, as a Ray actor: the tokenizer actors add their counts after each batch."""

    def __init__(self, max_frac: float):
        self.report = QualityReport()
        self.max_frac = max_frac
        self.busy = StageSeconds()
        self.first_task_ts: float | None = None
        self.first_batch_ts: float | None = None
        self.last_batch_ts: float | None = None
        self.actors_ready_ts: float | None = None
        self.actor_init_s = 0.0
        self.first_read_ts: float | None = None
        self.first_block_ts: float | None = None
        self.lines: dict[tuple[int, int], tuple[int, int]] = {}
        """(file, piece) -> (its lines, its first byte), from the reading tasks (``ray_jobs.data.reading``)."""
        self.nodes: set[str] = set()
        """The Ray nodes the tokenizer actors run on (each tells once, when it starts)."""
        self.read_spans: list[tuple[float, float]] = []
        """When each reading task ran (``time.time()``, its first line to its last)."""

    def add_node(self, node_id: str, init_s: float = 0.0) -> None:
        """A tokenizer actor is ready, on ``node_id``, after a constructor of ``init_s`` seconds."""
        self.nodes.add(node_id)
        self.actors_ready_ts = time.time()
        self.actor_init_s = max(self.actor_init_s, init_s)

    def reading(self, ts: float, handed_on: bool) -> None:
        """A reading task began at ``ts`` (``handed_on``: handed on its first rows then)."""
        if handed_on:
            self.first_block_ts = ts if self.first_block_ts is None else min(self.first_block_ts, ts)
        else:
            self.first_read_ts = ts if self.first_read_ts is None else min(self.first_read_ts, ts)

    def node_count(self) -> int:
        return len(self.nodes)

    def add_lines(self, file_index: int, piece: int, lines: int, start: int) -> None:
        self.lines[(file_index, piece)] = (lines, start)

    def lines_by_piece(self) -> dict[tuple[int, int], tuple[int, int]]:
        return dict(self.lines)

    def add(self, part: QualityReport, busy: StageSeconds | None = None, began_ts: float | None = None) -> bool:
        """Fold in one tokenized batch's counts (and what its stages cost; ``began_ts``: when its task began);
        True when the share of bad rows is already clearly over the limit."""
        self.last_batch_ts = time.time()
        self.first_batch_ts = self.first_batch_ts or self.last_batch_ts
        began = self.last_batch_ts if began_ts is None else began_ts
        self.first_task_ts = began if self.first_task_ts is None else min(self.first_task_ts, began)
        self.report.add(part)
        if busy is not None:
            self.busy.add(busy)
        return self.report.rows >= MIN_ROWS_FOR_EARLY_FAIL and self.report.bad_frac > self.max_frac

    def add_busy(self, busy: StageSeconds, span: tuple[float, float] | None = None) -> None:
        """A reading task's seconds (``ray_jobs.data.reading``), and when it ran."""
        self.busy.add(busy)
        if span is not None:
            self.read_spans.append(span)

    def readers_at_once(self) -> int:
        """The most reading tasks that ran at the same time."""
        edges = sorted([(start, 1) for start, _ in self.read_spans] + [(end, -1) for _, end in self.read_spans])
        return max(itertools.accumulate(step for _, step in edges), default=0)

    def clock(self) -> FillClock:
        return FillClock(
            self.first_task_ts,
            self.first_batch_ts,
            self.last_batch_ts,
            dataclasses.replace(self.busy),
            self.actors_ready_ts,
            self.actor_init_s,
            self.first_read_ts,
            self.first_block_ts,
            self.readers_at_once(),
        )

    def get(self) -> QualityReport:
        return self.report.resolved(self.lines)
