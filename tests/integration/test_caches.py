"""Fetch once, tokenize once: the dataset and model caches against a real S3 API and local Ray.

The data is gzipped JSONL in a moto S3 bucket with 0.5% bad rows, and the model is a tiny Llama
saved to S3. Everything is asserted from the jobs' counters, never from timing.
"""

from __future__ import annotations

import dataclasses
import gzip
import json
import shutil
import threading
from pathlib import Path

import pytest

from ray_jobs.cache import entries as cache
from ray_jobs.data.cache import prepare
from ray_jobs.data.preflight import data_inputs
from ray_jobs.data.quality import DataQualityError
from ray_jobs.run import run
from ray_jobs.tiny import write_dataset_with_bad_rows
from rayft.cli import main

pytestmark = pytest.mark.integration


def replace(spec, section, **changes):
    return spec.replace(**{section: dataclasses.replace(getattr(spec, section), **changes)})


@pytest.fixture(scope="module")
def bucket(s3_server, tiny, tmp_path_factory):
    """``s3://rayft-cache/``: ``data/part-{0,1}.jsonl.gz`` (1000 rows, 5 bad) and ``models/tiny/``."""
    import boto3

    s3 = boto3.client("s3")
    s3.create_bucket(Bucket="rayft-cache")
    path = tmp_path_factory.mktemp("bad") / "train.jsonl"
    bad_at = write_dataset_with_bad_rows(path, rows=1000, bad=5)
    lines = path.read_bytes().splitlines(keepends=True)
    parts = [gzip.compress(b"".join(lines[:500])), gzip.compress(b"".join(lines[500:]))]
    for i, body in enumerate(parts):
        s3.put_object(Bucket="rayft-cache", Key=f"data/part-{i}.jsonl.gz", Body=body)
    model_bytes = 0
    for file in (tiny / "model").iterdir():
        s3.upload_file(str(file), "rayft-cache", f"models/tiny/{file.name}")
        model_bytes += file.stat().st_size
    return {"data_bytes": sum(map(len, parts)), "model_bytes": model_bytes, "bad_at": bad_at}


def data_requests(requests: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """The requests that touched the bucket's ``data/`` prefix (listings, HEADs and GETs of its files)."""
    return sorted((m, u) for m, u in requests if "data" in u and "models" not in u)


def test_second_run_downloads_and_tokenizes_nothing_and_looks_its_inputs_up_once(
    ray_cluster, bucket, tiny_spec, s3_requests, tmp_path
):
    spec = replace(tiny_spec, "model", path="s3://rayft-cache/models/tiny")
    spec = replace(spec, "data", path="s3://rayft-cache/data/", overlong="drop")
    spec = replace(spec, "train", max_steps=4, log_every=2, checkpoint_every=4, eval_every=None)
    # One worker, its own started at the connect, as a one-GPU job's; the hits are still one a job (below).
    spec = replace(spec, "scaling", num_workers=1)

    cold = run(spec.replace(name="cold")).summary
    assert cold.worker.startswith("early: "), cold.worker
    data, model = cold.caches.dataset, cold.caches.model
    assert (data.hit, data.bytes_downloaded, data.rows_tokenized) == (False, bucket["data_bytes"], 1000)
    assert (model.source, model.bytes_downloaded) == ("download", bucket["model_bytes"])
    # The fill's own phases are rows of the phase table, as measured: start, stream and write.
    fill = data.fill
    assert fill is not None and fill.workers == spec.data.tokenize_workers
    assert {k: cold.timing.phases[k] for k in fill.phases()} == fill.phases() and fill.start_s > 0, cold.timing.phases
    assert min(fill.read_busy_s, fill.template_busy_s, fill.tokenize_busy_s, fill.pack_busy_s) > 0, fill
    quality = cold.data_quality
    assert quality.bad_rows == 5 and quality.bad_by_kind == {
        "unparsable": 2,
        "missing_field": 1,
        "empty_completion": 1,
        "too_long": 1,
    }
    line, kind = next(iter(bucket["bad_at"].items()))
    where = {(e.kind, e.location) for e in quality.examples}
    assert (kind, f"s3://rayft-cache/data/part-0.jsonl.gz:{line}") in where, where
    assert cold.steps == 4
    # The adapter names its base as the spec did, not the node's cache directory it was loaded from, so it
    # loads anywhere the bucket is reachable: `rayft merge` finds the base by that name.
    adapter = Path(cold.adapter_dir)
    assert json.loads((adapter / "adapter_config.json").read_text())["base_model_name_or_path"] == spec.model.path
    assert main(["merge", str(adapter), "--out", str(tmp_path / "merged")]) == 0
    assert (tmp_path / "merged" / "config.json").is_file()

    def model_hits() -> int:
        return next(
            e.hits for e in cache.list_entries() if e.kind == "models" and "s3://rayft-cache/models/tiny" in e.description
        )

    hits_before = model_hits()
    with s3_requests() as job:
        warm = run(spec.replace(name="warm")).summary
    with s3_requests() as one_look:
        data_inputs(spec)
    # The whole job (preflight, cache key, dataset hit, training, export) touched the data exactly as one
    # look-up does: one listing, one peek at the first row, one size check. It used to list it 7 times.
    assert data_requests(job) == data_requests(one_look) and data_requests(job), (job, one_look)
    assert model_hits() == hits_before + 1, "one hit per job, not one per process"
    data, model = warm.caches.dataset, warm.caches.model
    assert (data.hit, data.bytes_downloaded, data.rows_tokenized) == (True, 0, 0)
    assert data.fill is None and all(warm.timing.phases[k] == 0 for k in cold.caches.dataset.fill.phases())
    assert data.key == cold.caches.dataset.key
    assert (model.source, model.bytes_downloaded) == ("cache", 0)
    assert model.identity == cold.caches.model.identity != "", "the same base, named the same way"
    assert warm.data_quality == quality, "the entry keeps the report of the rows it skipped"
    assert warm.steps == 4 and warm.tokens > 0


def test_a_change_in_the_key_misses_and_racing_fills_share_one_entry(ray_cluster, tiny_spec, tmp_path, capsys):
    data = tmp_path / "train.jsonl"
    shutil.copy(tiny_spec.data.path, data)
    spec = replace(tiny_spec, "data", path=str(data), cache_uri=str(tmp_path / "cache"))

    first = prepare(spec).cache
    assert (first.hit, first.rows_tokenized) == (False, 2000)
    again = prepare(spec).cache
    assert (again.hit, again.rows_tokenized, again.key) == (True, 0, first.key)

    longer = prepare(replace(spec, "data", max_seq_len=384)).cache
    assert not longer.hit and longer.key != first.key

    model = tmp_path / "model"
    shutil.copytree(tiny_spec.model.path, model)
    config = model / "tokenizer_config.json"
    config.write_text(config.read_text().replace('"model_max_length"', '"padding_side": "left", "model_max_length"', 1))
    retokenized = prepare(replace(spec, "model", path=str(model))).cache
    assert not retokenized.hit and retokenized.rows_tokenized == 2000

    racing = replace(spec, "data", cache_uri=str(tmp_path / "race"))
    results: list = []
    threads = [threading.Thread(target=lambda: results.append(prepare(racing))) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(results) == 2, "both fills succeed"
    entries = list((tmp_path / "race" / "datasets").iterdir())
    assert len(entries) == 1
    payloads = [p for p in entries[0].iterdir() if p.name.startswith("data-")]
    assert len(payloads) == 1, "the loser removed its copy"
    rows = [r.order.dataset(0, world=1, micro_batch_size=1).count() for r in results]  # every row, read back
    assert rows[0] == rows[1] == results[0].cache.packed_rows["train"] > 0

    assert main(["cache", "list", "--root", str(tmp_path / "race")]) == 0
    assert entries[0].name[:8] in capsys.readouterr().out


def test_shared_s3_cache_prefix(ray_cluster, s3_server, tiny_spec):
    import boto3

    boto3.client("s3").create_bucket(Bucket="rayft-shared-cache")
    spec = replace(tiny_spec, "data", cache_uri="s3://rayft-shared-cache/team-a")
    cold, warm = prepare(spec), prepare(spec)
    assert not cold.cache.hit and warm.cache.hit and warm.cache.rows_tokenized == 0
    assert warm.cache.uri.startswith("s3://rayft-shared-cache/team-a/datasets/")
    assert warm.order.dataset(0, world=1, micro_batch_size=1).count() == cold.cache.packed_rows["train"]


def test_too_many_bad_rows_fail_with_the_report(ray_cluster, tiny_spec, tmp_path):
    path = tmp_path / "mixed.jsonl"
    bad_at = write_dataset_with_bad_rows(path, rows=1000, bad=50)  # 5%
    spec = replace(tiny_spec, "data", path=str(path), overlong="drop", cache_uri=str(tmp_path / "cache"))
    with pytest.raises(DataQualityError) as info:
        run(spec)
    message = str(info.value)
    assert "50 of 1000 rows are bad (5.0%, over data.max_bad_row_frac 1.0%)" in message
    assert f"mixed.jsonl:{min(bad_at)} ({bad_at[min(bad_at)]}" in message
    assert not any(Path(tmp_path / "cache" / "datasets").glob("*/entry.json")), "no entry for a failed fill"

    streaming = prepare(replace(spec, "data", cache=False))
    with pytest.raises(Exception, match=r"rows are bad .* over data.max_bad_row_frac"):
        streaming.datasets["train"].materialize()


TWO_NODES = """
import json, os, sys
os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
os.environ["RAY_AUTH_MODE"] = "disabled"
import ray
from ray.cluster_utils import Cluster

from rayft_contract.spec import FineTuneSpec

# Two raylets on this machine, 4 logical CPUs each: room for both actors on the first, where Ray Data spreads
# them over both (its default for actor pools); the dashboard agents on ports the OS picks.
node = {"num_cpus": 4, "node_ip_address": "127.0.0.1", "dashboard_agent_listen_port": 0}
cluster = Cluster(initialize_head=True, head_node_args={**node, "include_dashboard": False, "resources": {"first": 1}})
cluster.add_node(**node, resources={"second": 1})
ray.init(address=cluster.address, log_to_driver=False)
cluster.wait_for_nodes()
spec = FineTuneSpec.from_dict(json.loads(sys.argv[1]))


def prepared(spec):
    from ray_jobs.data.cache import prepare

    info = prepare(spec).cache
    return {"node": ray.get_runtime_context().get_node_id(), "hit": info.hit, "nodes": info.nodes,
            "rows_tokenized": info.rows_tokenized, "bytes_downloaded": info.bytes_downloaded}


first = prepared(spec)  # this driver, on the first node
second = ray.get(ray.remote(num_cpus=0, resources={"second": 0.01})(prepared).remote(spec))  # a job on the other
print(json.dumps({"first": first, "second": second}))
ray.shutdown()
cluster.shutdown()
"""


def test_a_fill_uses_both_nodes_and_a_job_on_the_other_node_tokenizes_nothing(bucket, tiny_spec):
    """Issue 14: two raylets on this machine (the one test with a cluster of its own: the session's has one
    node). The tokenizer actors spread over both, the entry goes to the shared s3:// cache, and the same data
    prepared from the second node is a hit: 0 rows tokenized, 0 bytes read."""
    import subprocess
    import sys

    spec = replace(tiny_spec, "data", path="s3://rayft-cache/data/", cache_uri="s3://rayft-cache/two-nodes", tokenize_workers=2)
    spec = replace(spec, "model", path="s3://rayft-cache/models/tiny")
    done = subprocess.run(
        [sys.executable, "-c", TWO_NODES, json.dumps(spec.to_dict())], capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    first, second = result["first"], result["second"]
    assert first["node"] != second["node"]
    assert not first["hit"] and first["rows_tokenized"] == 1000 and first["nodes"] == 2
    assert second == {**second, "hit": True, "rows_tokenized": 0, "bytes_downloaded": 0, "nodes": 0}
