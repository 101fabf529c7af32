"""service/admission.py: which queued jobs launch, in each team's fair share of the GPUs, and why the rest wait."""

from __future__ import annotations

from rayft_contract.states import JobState
from service.admission import admit
from service.store import JobRecord

T0 = 1_700_000_000.0


def job(name: str, team: str, gpus: int = 0, state: JobState = JobState.QUEUED, at: float = 0.0) -> JobRecord:
    return JobRecord(name, team, state, {"name": name, "gpus": gpus}, T0 + at, T0 + at)


def gpus_of(j: JobRecord) -> int:
    return j.spec["gpus"]


def decide(jobs, cluster_gpus=None, max_running=2):
    ordered = sorted(jobs, key=lambda j: j.created_at)
    admission = admit(ordered, gpus_of, max_running_per_team=max_running, cluster_gpus=cluster_gpus)
    return [j.id for j in admission.launch], admission.waiting


def test_a_team_that_queued_first_does_not_take_every_gpu_before_the_next_team():
    """Ray's queue is first come, first served: team a's four jobs ahead of b's would hold both GPUs in turn."""
    jobs = [job(f"a{i}", "a", gpus=1, at=i) for i in range(4)] + [job("b0", "b", gpus=1, at=10)]
    launch, waiting = decide(jobs, cluster_gpus=2, max_running=4)
    assert launch == ["a0", "b0"]  # one GPU each, b's job ahead of a's older ones
    assert waiting == {f"a{i}": "waiting for 1 GPU; 0 free" for i in (1, 2, 3)}


def test_the_next_gpu_goes_to_the_team_holding_fewest():
    jobs = [
        job("a-run", "a", gpus=2, state=JobState.RUNNING, at=0),
        job("b-run", "b", gpus=1, state=JobState.RUNNING, at=1),
        job("a1", "a", gpus=1, at=2),
        job("b1", "b", gpus=1, at=3),
        job("c1", "c", gpus=1, at=4),
    ]
    launch, waiting = decide(jobs, cluster_gpus=5, max_running=3)
    assert launch == ["c1", "b1"]  # c holds none, then b holds 1 (a holds 2): a waits for the last free one
    assert waiting == {"a1": "waiting for 1 GPU; 0 free"}


def test_a_large_job_is_not_starved_by_smaller_ones_behind_it_but_cpu_jobs_go_on():
    jobs = [
        job("a-run", "a", gpus=3, state=JobState.RUNNING, at=0),
        job("b-big", "b", gpus=2, at=1),
        job("c-small", "c", gpus=1, at=2),
        job("c-cpu", "c", gpus=0, at=3),
        job("d-cpu", "d", gpus=0, at=4),
    ]
    launch, waiting = decide(jobs, cluster_gpus=4, max_running=3)
    assert launch == ["d-cpu"]
    assert waiting["b-big"] == "waiting for 2 GPUs; 1 free"
    # c's small job would fit, but b's is ahead of it in the order; c's CPU job waits behind c's own first job.
    assert waiting["c-small"] == "waiting for 1 GPU: b-big (b, 2 GPUs) is first in line"
    assert waiting["c-cpu"] == waiting["c-small"]


def test_a_team_at_its_quota_waits_whatever_is_free():
    jobs = [job("a-run", "a", state=JobState.STARTING, at=0), job("a1", "a", at=1), job("a2", "a", at=2), job("b1", "b", at=3)]
    launch, waiting = decide(jobs, cluster_gpus=None, max_running=1)
    assert launch == ["b1"]
    assert waiting == {j: "waiting for a turn: team a has 1 of 1 jobs running" for j in ("a1", "a2")}


def test_without_a_gpu_limit_every_job_under_its_quota_launches_in_the_order_it_came():
    jobs = [job("a1", "a", gpus=8, at=0), job("a2", "a", gpus=8, at=1), job("b1", "b", gpus=8, at=2)]
    launch, waiting = decide(jobs, cluster_gpus=None, max_running=2)
    assert sorted(launch) == ["a1", "a2", "b1"] and launch.index("a1") < launch.index("a2") and waiting == {}


def test_jobs_launched_already_count_against_the_gpus_even_while_they_start():
    jobs = [job("a-start", "a", gpus=2, state=JobState.STARTING, at=0), job("b1", "b", gpus=1, at=1)]
    assert decide(jobs, cluster_gpus=2) == ([], {"b1": "waiting for 1 GPU; 0 free"})
    assert decide(jobs, cluster_gpus=3) == (["b1"], {})
