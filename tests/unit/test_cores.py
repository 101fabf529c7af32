"""Tokenizer actors on cores of their own: each claimer a different core, none where the cores are not Ray's."""

from __future__ import annotations

import multiprocessing
import os

import pytest

from ray_jobs.cores import claim_core

CORES = sorted(os.sched_getaffinity(0))
pytestmark = pytest.mark.skipif(len(CORES) < 2, reason="pinning needs at least two cores")


def _claimer(lock_dir, node_cpus, claimed, release):
    from ray_jobs import cores

    core = cores.claim_core(node_cpus, lock_dir)
    claimed.put((core, sorted(os.sched_getaffinity(0))))
    release.wait(60)


def _start(ctx, lock_dir, node_cpus):
    claimed, release = ctx.Queue(), ctx.Event()
    proc = ctx.Process(target=_claimer, args=(lock_dir, node_cpus, claimed, release))
    proc.start()
    return proc, claimed.get(timeout=60), release


def test_claimers_take_different_cores_and_a_core_is_free_again_when_its_process_ends(tmp_path):
    ctx = multiprocessing.get_context("spawn")
    running = [_start(ctx, tmp_path, len(CORES)) for _ in CORES]
    try:
        got = [core for _, (core, _), _ in running]
        assert sorted(got) == CORES, "one core each, every core taken"
        assert all(affinity == [core] for _, (core, affinity), _ in running), "each process runs on its core alone"
        extra, (core, affinity), extra_release = _start(ctx, tmp_path, len(CORES))
        assert core is None and affinity == CORES, "every core held: the next one is not pinned"
        extra_release.set()
        extra.join(60)
        first, _, first_release = running[0]
        first_release.set()
        first.join(60)  # its lock goes with the process, however the process ends
        again, (core, _), again_release = _start(ctx, tmp_path, len(CORES))
        assert core == got[0]
        again_release.set()
        again.join(60)
    finally:
        for proc, _, release in running:
            release.set()
            proc.join(60)


def test_nothing_is_pinned_where_the_process_may_run_on_more_cores_than_the_node_gave_ray(tmp_path):
    """A pod under a CPU quota sees every core of its host: pinning there would stack jobs on the same cores."""
    assert claim_core(node_cpus=len(CORES) - 1, lock_dir=tmp_path) is None
    assert sorted(os.sched_getaffinity(0)) == CORES and not list(tmp_path.iterdir())
