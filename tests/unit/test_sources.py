"""Data sources without Ray: compressed files, CSV, directories and globs, and clear errors."""

from __future__ import annotations

import gzip
import json

import pytest
import zstandard

from ray_jobs.sources import data_files, file_type, peek_columns
from ray_jobs.spec import SpecError

ROWS = [{"prompt": f"p{i}", "completion": f"c{i}"} for i in range(3)]
JSONL = "".join(json.dumps(r) + "\n" for r in ROWS).encode()


@pytest.mark.parametrize(
    ("name", "kind"),
    [
        ("a.jsonl", ".jsonl"),
        ("a.jsonl.gz", ".jsonl"),
        ("a.json.zst", ".json"),
        ("a.csv.gz", ".csv"),
        ("a.parquet", ".parquet"),
        ("a.txt", ""),
        ("README", ""),
    ],
)
def test_file_type_sees_through_compression(name, kind):
    assert file_type(name) == kind


@pytest.mark.parametrize("name", ["train.jsonl.gz", "train.jsonl.zst", "train.csv", "train.parquet"])
def test_each_file_type_peeks_its_columns(tmp_path, name):
    path = tmp_path / name
    if name.endswith(".gz"):
        path.write_bytes(gzip.compress(JSONL))
    elif name.endswith(".zst"):
        path.write_bytes(zstandard.ZstdCompressor().compress(JSONL))
    elif name.endswith(".csv"):
        path.write_text("prompt,completion\n" + "".join(f"{r['prompt']},{r['completion']}\n" for r in ROWS))
    else:
        import pyarrow as pa
        import pyarrow.parquet as pq

        pq.write_table(pa.Table.from_pylist(ROWS), path)
    files = data_files(str(path))
    assert files.paths == [str(path)]
    assert peek_columns(files) == ["prompt", "completion"]


def test_directories_and_globs(tmp_path):
    for i in range(3):
        (tmp_path / "shards" / f"part-{i}.jsonl.gz").parent.mkdir(exist_ok=True)
        (tmp_path / "shards" / f"part-{i}.jsonl.gz").write_bytes(gzip.compress(JSONL))
    (tmp_path / "shards" / "notes.txt").write_text("ignored")
    assert len(data_files(str(tmp_path / "shards")).paths) == 3
    assert [p.rsplit("/", 1)[1] for p in data_files(str(tmp_path / "shards" / "part-[01].jsonl.gz")).paths] == [
        "part-0.jsonl.gz",
        "part-1.jsonl.gz",
    ]


@pytest.mark.parametrize(
    ("setup", "needle"),
    [
        (lambda d: None, "does not exist"),
        (lambda d: [(d / "x").mkdir(), (d / "x" / "a.txt").write_text("t")], "holds no"),
        (lambda d: (d / "x").write_text("t"), "unsupported file type"),
        (
            lambda d: [(d / "x").mkdir(), (d / "x" / "a.jsonl").write_text("{}"), (d / "x" / "b.csv").write_text("a\n")],
            "mixes file types",
        ),
    ],
)
def test_bad_paths_say_what_is_wrong(tmp_path, setup, needle):
    setup(tmp_path)
    with pytest.raises(SpecError, match=needle) as info:
        data_files(str(tmp_path / "x"))
    assert info.value.field == "data.path"
