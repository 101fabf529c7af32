"""The cluster's compiled kernels (ray_jobs.train.kernel_store, and compile_ahead's task that writes and reads them): a new
node's first job takes what another node compiled, the store is signed as the node and never as a team, and a store
that fails loses nothing but the sharing. What a node saves by it is a GPU's measure (bench/startup_7b.sh, NODE)."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ray_jobs.train import kernel_store
from tests.paths import REPO


def compiled_spec(tiny_spec, tmp_path: Path) -> Path:
    """The tiny preset as a one-GPU job whose layers are compiled (on CPU only a compiled layer has kernels to keep)."""
    spec = tiny_spec.replace(
        model=dataclasses.replace(tiny_spec.model, compile=True),
        data=dataclasses.replace(tiny_spec.data, max_seq_len=64),
        scaling=dataclasses.replace(tiny_spec.scaling, use_gpu=True, num_workers=1),
    )
    spec_file = tmp_path / "spec.json"
    spec_file.write_text(json.dumps(spec.to_dict()))
    return spec_file


def python_on(node: Path, args: list[str], store: Path | None) -> subprocess.CompletedProcess:
    """A fresh process, as a node's would be: its own cache root, the cluster's store where there is one."""
    env = {"PATH": os.environ["PATH"], "HOME": str(node), "RAYFT_CACHE_DIR": str(node / "cache")}
    if store is not None:
        env[kernel_store.ENV] = str(store)
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, env=env, cwd=REPO)


def test_a_new_node_takes_the_kernels_another_node_compiled_and_its_first_step_compiles_nothing(tiny_spec, tmp_path):
    """Three processes, as three of the cluster's would be: node A's copy compiles and keeps its kernels in the store;
    node B's task, on an empty compile cache, takes them instead of compiling; node B's job then misses no graph."""
    spec_file = compiled_spec(tiny_spec, tmp_path)
    store = tmp_path / "store"

    def on_node(node: str, code: str, store_uri: Path | None = store) -> str:
        prelude = (  # no torch here: the probes' processes import what they use, as the probe's task does (0.3 s, not 4)
            "import json; from ray_jobs.train import compile_ahead; from rayft_contract.spec import FineTuneSpec; "
            f"spec = FineTuneSpec.load({str(spec_file)!r}); "
        )
        done = python_on(tmp_path / node, ["-c", prelude + code], store_uri)
        assert done.returncode == 0, done.stderr[-3000:]
        return done.stdout.strip().splitlines()[-1]

    said = on_node("node-a", "print(compile_ahead._ahead_on_node(spec, device='cpu'))")
    assert "compiled ahead on cpu" in said and "kept for other nodes" in said, said
    assert [p.name for p in store.iterdir()] and all(f.name == "cpu.bin" for f in store.glob("*/*")), "key/gpu model"

    assert on_node("node-b", "print(compile_ahead.kernels_at(spec))") == "store", "the probe: the early worker stays"
    assert on_node("node-c", "print(repr(compile_ahead.kernels_at(spec)))", None) == "''", "no store: a copy"
    # No device given: had it compiled, it would have looked for a GPU this machine lacks and said so.
    took = on_node("node-b", "print(compile_ahead._ahead_on_node(spec))")
    assert "took the kernels" in took and "inductor" in took, took
    assert on_node("node-b", "print(compile_ahead.kernels_at(spec))") == "node", "marked: the next job asks nothing"

    job = on_node(
        "node-b",
        "import torch; from ray_jobs.train import one_layer; r = one_layer.first_steps(spec, torch.device('cpu'), whole=True); "
        "print(json.dumps([r.cache_hits, r.cache_misses]))",
    )
    hits, misses = json.loads(job)
    assert hits > 0 and misses == 0, f"the job's first step on node B: {hits} graphs from the store, {misses} compiled"
    assert "already kept" in on_node(
        "node-b", "from ray_jobs.train import kernel_store; print(kernel_store.publish(compile_ahead._key_on_node(spec), b'x'))"
    )


def test_an_operator_keeps_a_preset_s_kernels_before_any_job_whatever_the_node_s_cache_holds(tiny_spec, tmp_path):
    """``--keep``'s task: even the cluster's first job of a shape then takes its kernels. It compiles in a scratch
    cache of its own, so every kernel is compiled and kept, and the node's own caches stay as they were."""
    spec_file = compiled_spec(tiny_spec, tmp_path)
    code = (
        "from ray_jobs.train import compile_ahead; from rayft_contract.spec import FineTuneSpec; "
        f"print(compile_ahead._keep_on_node(FineTuneSpec.load({str(spec_file)!r}), device='cpu'))"
    )
    node = tmp_path / "gpu-node"

    def keep(store: Path | None) -> str:
        done = python_on(node, ["-c", code], store)
        assert done.returncode == 0, done.stderr[-3000:]
        return done.stdout.strip().splitlines()[-1]

    assert "RAYFT_KERNELS_URI is not set on this node" in keep(None)
    assert "kept for other nodes" in keep(tmp_path / "store")
    assert len(list((tmp_path / "store").glob("*/cpu.bin"))) == 1
    assert not (node / "cache" / "compile").exists(), "nothing compiled into the node's cache"
    assert "already keeps" in keep(tmp_path / "store")


def test_the_store_is_signed_as_the_node_and_never_with_the_job_s_team_s_keys(tmp_path, monkeypatch):
    """A team's keys write only what the team may; the kernels, which torch loads and runs, are the operator's."""
    (tmp_path / "vision").mkdir()
    (tmp_path / "vision" / "AWS_ACCESS_KEY_ID").write_text("AKVISION")
    (tmp_path / "vision" / "AWS_SECRET_ACCESS_KEY").write_text("secret-of-vision")
    monkeypatch.setenv("RAYFT_TEAM_CREDENTIALS_DIR", str(tmp_path))
    monkeypatch.setenv("RAYFT_TEAM", "vision")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKNODE")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "secret-of-the-node")
    monkeypatch.setenv("AWS_REGION", "us-east-1")
    monkeypatch.setenv(kernel_store.ENV, "s3://operator/kernels")
    kept = kernel_store.entry("k" * 24)
    assert kept is not None and kept.path == f"operator/kernels/{'k' * 24}/cpu.bin"
    _, (options,) = kept.fs.__reduce__()
    assert "AKVISION" not in (options["access_key"], options["secret_key"]) and options["secret_key"] != "secret-of-vision"


def test_kernels_kept_in_s3_are_read_back_whole_and_kept_once(s3_server, monkeypatch):
    import boto3

    boto3.client("s3").create_bucket(Bucket="operator-kernels")
    monkeypatch.setenv(kernel_store.ENV, "s3://operator-kernels/rayft")
    key, first = "a" * 24, kernel_store.Kernels(b"\x00kernels" * 1000, b"a tar")
    assert not kernel_store.has(key) and kernel_store.read(key) is None
    assert "kept for other nodes in s3://operator-kernels/rayft" in kernel_store.publish(key, first)
    assert kernel_store.has(key) and kernel_store.read(key) == first
    assert "already kept" in kernel_store.publish(key, kernel_store.Kernels(b"other")), "the first node's copy stays"
    assert kernel_store.read(key) == first
    alone = "b" * 24  # a copy that compiled no Triton kernel of its own keeps the one file
    kernel_store.publish(alone, kernel_store.Kernels(b"only"))
    assert kernel_store.read(alone) == kernel_store.Kernels(b"only", b"")


def test_without_a_store_or_with_one_that_fails_a_node_compiles_its_own_and_nothing_fails(tmp_path, monkeypatch):
    monkeypatch.delenv(kernel_store.ENV, raising=False)
    assert kernel_store.entry("k" * 24) is None and not kernel_store.has("k" * 24)
    assert "RAYFT_KERNELS_URI unset" in kernel_store.publish("k" * 24, kernel_store.Kernels(b"x"))
    blocked = tmp_path / "a-file"
    blocked.write_text("not a directory")
    monkeypatch.setenv(kernel_store.ENV, str(blocked / "store"))  # under a file: nothing can be made there
    assert not kernel_store.has("k" * 24) and kernel_store.read("k" * 24) is None
    said = kernel_store.publish("k" * 24, kernel_store.Kernels(b"x", b"y"))
    assert said.startswith("not kept for other nodes (") and "Error" in said, said


def test_a_local_store_is_written_beside_and_renamed_so_no_part_file_is_ever_left(tmp_path, monkeypatch):
    monkeypatch.setenv(kernel_store.ENV, str(tmp_path / "store"))
    kernel_store.publish("b" * 24, kernel_store.Kernels(b"y" * 4096, b"t"))
    files = sorted(p for p in (tmp_path / "store").rglob("*") if p.is_file())
    assert [f.name for f in files] == ["cpu.bin", "cpu.triton.tar"] and files[0].read_bytes() == b"y" * 4096


def test_triton_kernels_outside_inductor_travel_as_a_tar_of_the_entries_the_copy_added(tmp_path, monkeypatch):
    """Liger's @triton.jit kernels are in Triton's cache, not in torch's Mega-Cache."""
    compiled = tmp_path / "node-a"
    monkeypatch.setenv("TRITON_CACHE_DIR", str(compiled))
    (compiled / "OLD").mkdir(parents=True)
    before = kernel_store.triton_entries()
    for name in ("HASH1", "HASH2"):
        (compiled / name).mkdir()
        (compiled / name / "kernel.cubin").write_bytes(name.encode() * 10)
        (compiled / name / "kernel.json").write_text("{}")
    assert kernel_store.triton_entries() - before == {"HASH1", "HASH2"}
    tar = kernel_store.pack_triton(kernel_store.triton_entries() - before)
    fresh = tmp_path / "node-b"
    monkeypatch.setenv("TRITON_CACHE_DIR", str(fresh))
    assert kernel_store.unpack_triton(tar) == 4
    assert sorted(str(p.relative_to(fresh)) for p in fresh.rglob("*") if p.is_file()) == [
        "HASH1/kernel.cubin",
        "HASH1/kernel.json",
        "HASH2/kernel.cubin",
        "HASH2/kernel.json",
    ]
    assert (fresh / "HASH2" / "kernel.cubin").read_bytes() == b"HASH2" * 10
    assert kernel_store.pack_triton(set()) == b"" and kernel_store.unpack_triton(b"") == 0


def _tar_of(*members: tuple[str, bytes | str]) -> bytes:
    """A tar with a file (bytes) or a symbolic link (str: its target) per member."""
    import io
    import tarfile

    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as tar:
        for name, what in members:
            info = tarfile.TarInfo(name)
            if isinstance(what, str):
                info.type, info.linkname = tarfile.SYMTYPE, what
                tar.addfile(info)
            else:
                info.size = len(what)
                tar.addfile(info, io.BytesIO(what))
    return out.getvalue()


@pytest.mark.parametrize("member", [("../outside.so", b"evil"), ("HASH/link", "/etc/passwd"), ("HASH/up", "../../x")])
def test_a_tar_that_would_write_or_link_outside_triton_s_cache_is_refused(member, tmp_path, monkeypatch):
    import tarfile

    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "cache"))
    with pytest.raises(tarfile.FilterError):
        kernel_store.unpack_triton(_tar_of(member))
    assert not (tmp_path / "outside.so").exists() and not any(p.is_symlink() for p in tmp_path.rglob("*"))


def test_an_absolute_name_in_the_tar_lands_inside_triton_s_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "cache"))
    assert kernel_store.unpack_triton(_tar_of(("/tmp/rayft-absolute.so", b"evil"))) == 1
    assert (tmp_path / "cache" / "tmp" / "rayft-absolute.so").exists() and not Path("/tmp/rayft-absolute.so").exists()
