"""Which queued jobs launch now: each team's fair share of the cluster's GPUs, and the reason each other waits.

Ray places what it is given, but Ray's own queue is first come, first served across the whole
cluster: one team that queues twenty GPU jobs ahead of another holds every GPU until all twenty have
run. So the service launches a job only when

- its team has fewer than ``max_running_per_team`` jobs launched (the quota), and
- the cluster has the GPUs it asks for, free of the jobs already launched.

Among the teams with jobs waiting, the next launch goes to the team holding the fewest GPUs (then the
fewest launched jobs, then the one whose oldest job has waited longest). Within a team, jobs go in the
order they came. A GPU job that does not fit blocks the GPU jobs behind it in that order, even smaller
ones that would fit, so a large job is never starved by a stream of small ones; CPU-only jobs need no GPU
and go on. Every job that waits has a reason (``waiting for 2 GPUs; 1 free``), which the reconciler
adds to the job's events when it changes.

Nothing here is a scheduler: the service decides only *when* to hand a job to Ray, and Ray (with
KubeRay's autoscaler) still decides *where* it runs. Ray has no per-tenant fair share of its own, and
the service already knows each job's team and size, so this is a short pure function rather than a
dependency.
"""

from __future__ import annotations

import dataclasses
from collections import Counter, defaultdict, deque
from collections.abc import Callable, Sequence

from rayft_contract.states import JobState
from service.store import JobRecord


@dataclasses.dataclass(frozen=True)
class Admission:
    launch: tuple[JobRecord, ...]
    """The queued jobs to launch now, in the order to launch them."""
    waiting: dict[str, str]
    """Every other queued job's id -> why it waits."""


def admit(
    jobs: Sequence[JobRecord],
    gpus_of: Callable[[JobRecord], int],
    *,
    max_running_per_team: int,
    cluster_gpus: float | None,
) -> Admission:
    """Decide one pass. ``jobs``: the active jobs (queued and launched), oldest first. ``gpus_of``: the GPUs a job
    asks for. ``cluster_gpus``: the GPUs jobs may hold at once (``None``: no GPU limit, Ray's queue is the wait)."""
    launched = [j for j in jobs if j.state is not JobState.QUEUED]
    held = Counter[str]()
    running = Counter(j.team for j in launched)
    for job in launched:
        held[job.team] += gpus_of(job)
    free = None if cluster_gpus is None else cluster_gpus - sum(held.values())
    queues: dict[str, deque[JobRecord]] = defaultdict(deque)
    for job in jobs:
        if job.state is JobState.QUEUED:
            queues[job.team].append(job)
    launch: list[JobRecord] = []
    waiting: dict[str, str] = {}
    first_blocked: tuple[JobRecord, int] | None = None  # the GPU job at the head of the line that did not fit

    def wait_all(team: str, reason: str) -> None:
        for job in queues.pop(team):
            waiting[job.id] = reason

    while queues:
        team = min(queues, key=lambda t: (held[t], running[t], queues[t][0].created_at))
        job = queues[team][0]
        if running[team] >= max_running_per_team:
            wait_all(team, f"waiting for a turn: team {team} has {running[team]} of {max_running_per_team} jobs running")
            continue
        need = gpus_of(job)
        if need and free is not None:
            if first_blocked is not None:
                ahead, ahead_needs = first_blocked
                wait_all(team, f"waiting for {_gpus(need)}: {ahead.id} ({ahead.team}, {_gpus(ahead_needs)}) is first in line")
                continue
            if need > free:
                first_blocked = (job, need)
                wait_all(team, f"waiting for {_gpus(need)}; {free:g} free")
                continue
            free -= need
        queues[team].popleft()
        if not queues[team]:
            del queues[team]
        launch.append(job)
        running[team] += 1
        held[team] += need
    return Admission(tuple(launch), waiting)


def _gpus(n: int) -> str:
    return f"{n} GPU" if n == 1 else f"{n} GPUs"
