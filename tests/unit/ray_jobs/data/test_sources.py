"""Data sources without Ray: compressed files, CSV, directories and globs, and clear errors."""

from __future__ import annotations

import gzip
import json

import pytest
import zstandard

from ray_jobs.data.sources import data_files, file_type, peek_columns
from rayft_contract.spec import SpecError

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


@pytest.fixture
def hub_cache(tmp_path, monkeypatch):
    """A Hugging Face hub cache laid out as the hub client writes it, offline: nothing is fetched."""
    import huggingface_hub.constants as hub

    monkeypatch.setattr(hub, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr(hub, "HF_HUB_OFFLINE", True)

    def add(repo_type, repo_id, files):
        root = tmp_path / "hub" / f"{repo_type}s--{repo_id.replace('/', '--')}"
        (root / "refs").mkdir(parents=True)
        (root / "refs" / "main").write_text("0" * 40)
        for name, body in files.items():
            path = root / "snapshots" / ("0" * 40) / name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(body)
        return root / "snapshots" / ("0" * 40)

    return add


def test_hub_dataset_comes_from_the_hub_cache(hub_cache):
    snapshot = hub_cache("dataset", "acme/counting", {"data/train.jsonl": JSONL, "README.md": b"# card"})
    files = data_files("hf://datasets/acme/counting")
    assert files.paths == [str(snapshot / "data/train.jsonl")]
    assert peek_columns(files) == ["prompt", "completion"]
    assert data_files("hf://datasets/acme/counting/data/train.jsonl").paths == files.paths


def test_hub_dataset_missing_offline_names_the_field(hub_cache):
    with pytest.raises(SpecError, match=r"^data.path: hub dataset 'acme/absent' is not in the hub cache"):
        data_files("hf://datasets/acme/absent")


def test_hub_model_hits_the_hub_cache(hub_cache):
    from ray_jobs.cache.models import fetch_model

    snapshot = hub_cache("model", "acme/tiny", {"config.json": b"{}"})
    fetched = fetch_model("acme/tiny")
    assert (fetched.path, fetched.source, fetched.bytes_downloaded) == (str(snapshot), "hub-cache", 0)
    assert fetched.identity == "hub commit " + "0" * 40, "the summary ties the adapter to the exact snapshot"


def test_a_model_path_that_is_no_directory_and_no_hub_id_names_the_field(tmp_path):
    from ray_jobs.cache.models import fetch_model

    with pytest.raises(SpecError, match=r"^model.path: '/no/such/model' is no directory here and no hub id"):
        fetch_model("/no/such/model")
    with pytest.raises(SpecError, match=r"^--base: '\./typo' is no directory here and no hub id"):
        fetch_model("./typo", field="--base")


def test_a_local_base_is_identified_by_its_files_and_config(tmp_path):
    from ray_jobs.cache.models import fetch_model

    (tmp_path / "config.json").write_text('{"hidden_size": 64}')
    (tmp_path / "model.safetensors").write_bytes(b"x" * 10)
    first = fetch_model(str(tmp_path)).identity
    assert first.startswith("files sha256:") and fetch_model(str(tmp_path)).identity == first
    (tmp_path / "model.safetensors").write_bytes(b"x" * 11)  # re-saved weights of another size
    second = fetch_model(str(tmp_path)).identity
    (tmp_path / "config.json").write_text('{"hidden_size": 128}')
    assert len({first, second, fetch_model(str(tmp_path)).identity}) == 3
