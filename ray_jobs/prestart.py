"""Worker processes for a fill, started for its job before Ray Data asks for them (issue 14). A TRIAL, reverted in
the commit after this one: on the H200 host it saved nothing (bench/RESULTS.md, bench/fill_prestart_h200.json).

Why it was tried: a job's tasks and actors run only in worker processes of that job, so every service job's fill
waits for new ones. On the 16-core H200 host a process took 1.2-1.6 s to start before it ran anything, then 2.3-3.1 s
to import Ray Data, and the fill's first tokenizer task began 5.1-5.6 s in (``bench/fill_start.py``). The raylet can
start processes for a job ahead of its requests: a task or actor of that job and runtime environment then takes one,
and Ray starts no other for it while one is starting (seen on 2 cores: two prestarted processes, two actors, two
processes in all).

How: the raylet's ``PrestartWorkers`` call, which Ray 2.60 has in its gRPC API but not in its Python one, made the
way Ray's own ``ray._private.internal_api`` calls its raylet (its channel carries the cluster's token).
"""

from __future__ import annotations

import logging
from typing import Any

log = logging.getLogger(__name__)

KEEP_ALIVE_S = 30
"""How long a prestarted process waits for work before Ray may end it (a fill's actors ask within about a second)."""
ENABLED = True
"""``bench/fill_start.py --prestart=0,1`` turns it off to measure what it saves."""


def prestart(count: int) -> int:
    """Start up to ``count`` worker processes for this job on this node now, never more than the node's CPUs.
    Returns how many it asked the raylet for: 0 when off, nothing was asked for, or this Ray has no such call."""
    if not ENABLED or count < 1:
        return 0
    import ray

    try:
        import grpc
        from ray._private.grpc_utils import init_grpc_channel
        from ray.core.generated import common_pb2, node_manager_pb2, node_manager_pb2_grpc

        request_type = node_manager_pb2.PrestartWorkersRequest
        stub_type = node_manager_pb2_grpc.NodeManagerServiceStub
    except (ImportError, AttributeError) as missing:  # another Ray: the fill starts its processes as before
        log.info("no worker prestart in this Ray (%s): the fill's processes start when it asks", missing)
        return 0
    here = ray.get_runtime_context().get_node_id()
    node = next(n for n in ray.nodes() if n["NodeID"] == here)
    count = min(count, int(node["Resources"].get("CPU", 0)))
    if count < 1:
        return 0
    worker: Any = ray._private.worker.global_worker.core_worker  # no public call gives the job's runtime env info
    request = request_type(
        language=common_pb2.PYTHON,
        job_id=worker.get_current_job_id().binary(),
        runtime_env_info=worker.get_job_config().runtime_env_info,  # tasks of the job inherit it: the same hash
        keep_alive_duration_secs=KEEP_ALIVE_S,
        num_workers=count,
    )
    channel = init_grpc_channel(f"{node['NodeManagerAddress']}:{node['NodeManagerPort']}")
    try:
        stub_type(channel).PrestartWorkers(request, timeout=5)
    except grpc.RpcError as failed:  # the raylet refused or is gone: the fill starts its processes as before
        log.warning("worker prestart failed (%s): the fill's processes start when it asks", failed.code())
        return 0
    finally:
        channel.close()
    return count
