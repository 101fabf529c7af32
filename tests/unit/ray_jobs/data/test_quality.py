"""Bad rows: each kind is recognised and located; the threshold decides skip or fail."""

from __future__ import annotations

import dataclasses
import json
import random

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from ray_jobs.data.pipeline import TokenizeAndPack
from ray_jobs.data.quality import MAX_EXAMPLES, BadRow, DataQualityError, QualityReport, RowLedger, StageSeconds
from ray_jobs.data.reading import split_records
from ray_jobs.tiny import BAD_LINES, write_dataset_with_bad_rows


@pytest.fixture
def encoder(tiny_spec):
    data = dataclasses.replace(tiny_spec.data, overlong="drop", max_seq_len=256)
    return TokenizeAndPack(tiny_spec.model.path, None, data, "chat", ("train",), ledger=None)


@pytest.mark.parametrize("kind", list(BAD_LINES))
def test_each_bad_kind_is_named(encoder, kind):
    with pytest.raises(BadRow) as info:
        encoder.encode(BAD_LINES[kind], QualityReport())
    assert info.value.kind == kind


def test_overlong_rows_are_truncated_and_counted_by_default(encoder):
    truncating = TokenizeAndPack.__new__(TokenizeAndPack)
    truncating.__dict__.update(encoder.__dict__, data=dataclasses.replace(encoder.data, overlong="truncate"))
    report = QualityReport()
    ids, _ = truncating.encode(BAD_LINES["too_long"], report)
    assert len(ids) > 256 and report.truncated == 1 and report.bad_rows == 0


@pytest.mark.parametrize(
    ("line", "kind"),
    [
        ("[1, 2]", "unparsable"),
        (json.dumps({"messages": "hello"}), "missing_field"),
        (json.dumps({"messages": [{"role": "robot", "content": "x"}]}), "missing_field"),
        (json.dumps({"messages": [{"role": "user", "content": "only a question"}]}), "empty_completion"),
    ],
)
def test_more_bad_shapes(encoder, line, kind):
    with pytest.raises(BadRow) as info:
        encoder.encode(line, QualityReport())
    assert info.value.kind == kind


def test_report_skips_below_the_threshold_and_fails_above_naming_the_lines(tmp_path, encoder):
    path = tmp_path / "mixed.jsonl"
    bad_at = write_dataset_with_bad_rows(path, rows=400, bad=20)  # 5%
    report = QualityReport()
    for record in split_records({"path": str(path), "bytes": path.read_bytes()}, "json"):
        report.rows += 1
        try:
            encoder.encode(record["record"], report)
        except BadRow as bad:
            report.record(bad, record["source"], record["file"], 0, record["line"])

    assert report.rows == 400 and report.bad_rows == 20
    assert dict(report.bad) == {k: list(bad_at.values()).count(k) for k in set(bad_at.values())}
    report.check(0.06)  # 5% <= 6%: skipped
    with pytest.raises(DataQualityError) as info:
        report.check(0.01)
    first = min(bad_at)
    assert f"mixed.jsonl:{first} ({bad_at[first]}" in str(info.value)
    assert "20 of 400 rows are bad (5.0%" in str(info.value)
    assert "data.max_bad_row_frac" in str(info.value)


def test_report_keeps_a_few_examples_per_kind_and_round_trips():
    report, part = QualityReport(), QualityReport(rows=100)
    for i in range(9):
        part.record(BadRow("unparsable", "x"), "f", 0, 0, i)
    report.add(part)
    report.add(part)
    assert report.bad["unparsable"] == 18 and len(report.examples) == 5
    assert QualityReport.from_dict(report.to_dict()).to_dict() == report.to_dict()


def test_the_ledger_reports_the_earliest_rows_in_file_order_whatever_order_blocks_arrive_in():
    """Ray Data finishes blocks in any order; "First:" must still name the first bad rows of the data."""
    kinds = ["unparsable", "missing_field", "empty_completion", "too_long"]
    files = ["a.jsonl", "b.jsonl", "c.jsonl"]  # listing order
    rng = random.Random(0)
    bad = [(f, line, rng.choice(kinds)) for f in range(3) for line in rng.sample(range(1, 400), 12)]
    expected = {kind: sorted((f, line) for f, line, k in bad if k == kind)[:MAX_EXAMPLES] for kind in kinds}
    reports = set()
    for _ in range(20):
        blocks = [bad[i : i + 4] for i in range(0, len(bad), 4)]
        rng.shuffle(blocks)
        ledger = RowLedger(max_frac=1.0)
        for block in blocks:
            part = QualityReport(rows=100)
            for f, line, kind in rng.sample(block, len(block)):
                part.record(BadRow(kind, "why"), files[f], f, 0, line)
            ledger.add(part)
        report = ledger.get()
        for kind in kinds:
            assert [(e.file_index, e.line) for e in report.examples if e.kind == kind] == expected[kind]
        reports.add(report.describe(0.0))
    assert len(reports) == 1, "the same rows give the same report, whatever the block order"
    first = min(bad)
    assert f"First: {files[first[0]]}:{first[1]} ({first[2]}: why)" in reports.pop()


def test_records_carry_file_and_line(tmp_path):
    jsonl = b'{"a": 1}\n\n{"a": 2}\nnot json\n'
    rows = split_records({"path": "s3://b/x.jsonl.gz", "bytes": jsonl}, "json")
    assert [(r["line"], r["record"]) for r in rows] == [(1, '{"a": 1}'), (3, '{"a": 2}'), (4, "not json")]
    rows = split_records({"path": "b/y.jsonl", "bytes": jsonl}, "json", order={"b/x.jsonl": 0, "b/y.jsonl": 1})
    assert {r["file"] for r in rows} == {1}, "a record knows its file's place in the listing"
    rows = split_records({"path": "x.json", "bytes": b'[{"a": 1}, {"a": 2}]'}, "json")
    assert [json.loads(r["record"]) for r in rows] == [{"a": 1}, {"a": 2}]
    rows = split_records({"path": "x.csv", "bytes": b"prompt,completion\nhi,42\n"}, "csv")
    assert json.loads(rows[0]["record"]) == {"prompt": "hi", "completion": "42"}  # text stays text
    sink = pa.BufferOutputStream()
    pq.write_table(pa.table({"text": ["a", "b"]}), sink)
    rows = split_records({"path": "x.parquet", "bytes": sink.getvalue().to_pybytes()}, "parquet")
    assert [(r["line"], json.loads(r["record"])) for r in rows] == [(1, {"text": "a"}), (2, {"text": "b"})]


def test_a_bad_row_read_in_a_later_piece_is_located_at_its_files_own_line():
    """A large file is read in ranges (ray_jobs.data.reading.pieces_of); each range's task tells the ledger its lines."""
    ledger = RowLedger(max_frac=1.0)
    part = QualityReport(rows=10)
    part.record(BadRow("unparsable", "why"), "big.jsonl", 0, 2, 5)  # line 5 of the third range
    part.record(BadRow("unparsable", "why"), "big.jsonl", 0, 0, 9)  # line 9 of the first
    ledger.add(part)
    ledger.add_lines(0, 2, 40, 2_000)
    assert "(line 5 after byte 2000)" in ledger.get().examples[1].location, "earlier ranges not counted yet"
    ledger.add_lines(0, 0, 100, 0)
    ledger.add_lines(0, 1, 90, 1_000)
    assert [(e.piece, e.line, e.location) for e in ledger.get().examples] == [(0, 9, "big.jsonl:9"), (0, 195, "big.jsonl:195")]


def test_the_ledger_counts_the_most_reading_tasks_that_ran_at_once():
    """Spans that only touch (one task ended as the next began) never ran at once."""
    ledger = RowLedger(max_frac=1.0)
    assert ledger.readers_at_once() == 0, "no reading task yet"
    for span in [(0.0, 2.0), (1.0, 3.0), (2.0, 4.0), (5.0, 6.0), (3.5, 5.5)]:
        ledger.add_busy(StageSeconds(read=0.1), span)
    assert ledger.readers_at_once() == 2
    ledger.add_busy(StageSeconds(read=0.1), (1.5, 2.5))
    assert ledger.readers_at_once() == 3, "1.5-2.0 ran the first, second and this one"
    assert ledger.clock().readers_at_once == 3
    assert ledger.clock().busy.read == pytest.approx(0.6)
