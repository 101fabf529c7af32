"""Starting a private, local Ray cluster that listens on loopback only.

Used by ``rayft train`` without ``--address``, by ``rayft serve`` without ``--ray-address`` (the
embedded default) and by the tests. Measured facts behind each setting are in the comments.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rayft_contract.spec import FineTuneSpec


def start_local_cluster(
    num_cpus: int, dashboard: bool = False, auth_token_file: Path | None = None, object_store_memory: int | None = None
) -> dict:
    """Start (never attach to) a local cluster; return ``ray.init``'s address info, with ``temp_dir`` (its own:
    :func:`stop_local_cluster` removes it). ``object_store_memory``: bytes (Ray's default: 30% of the machine's
    memory; ``bench/spill_bench.py`` gives it less than a fill needs).

    ``auth_token_file``: turn on Ray's token auth (``RAY_AUTH_MODE=token``) with the token in that file,
    made (0600) if missing. The embedded service's cluster runs jobs for every team: without it, anyone
    on the machine who reaches its dashboard port could submit Ray jobs that run as the service's user.
    This process, Ray's daemons, job drivers and their workers all find the token through the same
    environment (``RAY_AUTH_TOKEN_PATH``), and so does the service's Jobs API client.

    - ``address="local"``: a bare ``ray.init()`` would attach to any cluster already on the machine.
    - Ray binds the machine's external address unless both ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`` and
      ``_node_ip_address="127.0.0.1"`` are set.
    - Its own temp dir, with the cluster's address in ``<temp dir>/ray_current_cluster``: see
      :func:`_publish_address`.
    - Ray 2.60 turns token auth on by default. Without ``auth_token_file`` it is off: a cluster that
      lives for one ``rayft train`` or one test session, on loopback.
    - Ray Train's settings: :func:`train_settings`.
    - Ray runs its workers at nice 15 (``worker_niceness``), behind everything else on the machine. On a
      dedicated Ray node that only favours the raylet; on a shared machine (a laptop, a CI runner) any
      busy process starves the job: with two ``yes > /dev/null`` beside it, a 41 s tiny job took 11 min
      here. A local cluster runs its workers at the machine's normal priority.
    - Ray keeps a node's idle workers only up to its free CPUs (``num_workers_soft_limit``) and kills the rest
      after a second idle. A cache fill's tokenizer actors hold nearly every CPU, so its reading, re-cut and
      writing tasks (a quarter CPU each) lost their workers between tasks, and each next task waited for a new
      Python process. Two 60,000-row fills with 2 actors here started 20-24 workers and killed 8-12 idle; on
      the H200 host, 0.7-0.8 of a core went to worker processes not yet titled (starting) while 14 actors
      ran. A local cluster keeps up to ``max(num_cpus, 8)`` idle workers (here: 14 started, none killed; at
      ``num_cpus``, 3, it still killed 3). An idle worker that ran a fill's task holds about 190 MB (RSS), and
      a job's are gone when it ends. ``k8s/base/raycluster.yaml`` sets 8.
    - The dashboard agent (which runs Ray Jobs) listens on a port the OS picks, not Ray's fixed 52365:
      see :func:`_any_free_agent_port`.
    """
    import tempfile

    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    if auth_token_file is not None:
        _ensure_token(auth_token_file)
        os.environ["RAY_AUTH_MODE"] = "token"
        os.environ["RAY_AUTH_TOKEN_PATH"] = str(auth_token_file)
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    train_settings()
    os.environ.setdefault("RAY_worker_niceness", "0")
    os.environ.setdefault("RAY_num_workers_soft_limit", str(max(num_cpus, 8)))
    import ray

    temp_dir = tempfile.mkdtemp(prefix="ray-", dir="/tmp")  # short: Ray's socket paths must stay < 108 chars
    # Registered (once) after ``import ray`` registered Ray's own shutdown, so it runs first: atexit is last in,
    # first out, and Ray's shutdown does not wait for the processes it stops.
    atexit.unregister(_remove_at_exit)
    atexit.register(_remove_at_exit)
    _owned.add(temp_dir)
    with _any_free_agent_port(), _kept_if_it_fails(temp_dir):
        context = ray.init(
            address="local",
            num_cpus=num_cpus,
            object_store_memory=object_store_memory,
            _node_ip_address="127.0.0.1",
            include_dashboard=dashboard,
            _temp_dir=temp_dir,
            dashboard_host="127.0.0.1",
            log_to_driver=False,
            logging_level=logging.WARNING,
        )
    _publish_address(context.address_info["gcs_address"], temp_dir)
    return context.address_info | {"dashboard_url": context.dashboard_url, "temp_dir": temp_dir}


def stop_local_cluster(temp_dir: str, keep_logs: bool = False) -> None:
    """Stop the cluster this process started (its daemons, then their workers) and remove its temp dir,
    unless ``keep_logs``: then it stays, and a warning says where. A cluster not stopped here is stopped and
    removed when this process exits (:func:`_remove_at_exit`).

    Ray removes none of its temp dir when it stops: its daemons' and workers' logs and the metrics agent's
    files, 2-25 MB a cluster (a test session's is the largest). Each test session, ``rayft train`` and
    ``rayft serve`` left one in /tmp, and this project's machine held 179 of them after one day of work.
    The processes are waited for first (``wait_for_processes``; Ray bounds the wait), so none is still
    writing into the folder as it goes.
    """
    import shutil

    import ray

    _owned.discard(temp_dir)
    ray.shutdown(wait_for_processes=True)
    if keep_logs:
        logging.getLogger(__name__).warning("the local Ray cluster's logs are kept in %s", temp_dir)
    else:
        shutil.rmtree(temp_dir, ignore_errors=True)


_owned: set[str] = set()
"""The temp dirs of the clusters this process started and has not stopped with :func:`stop_local_cluster`."""


def _remove_at_exit() -> None:
    for temp_dir in list(_owned):
        stop_local_cluster(temp_dir)


@contextlib.contextmanager
def _kept_if_it_fails(temp_dir: str) -> Iterator[None]:
    """A cluster that fails to start keeps its temp dir: its daemons' logs say why."""
    try:
        yield
    except BaseException:
        _owned.discard(temp_dir)
        raise


def _publish_address(gcs_address: str, temp_dir: str) -> None:
    """Write the cluster's address where its Jobs API looks for it: ``<temp dir>/ray_current_cluster``.

    The job supervisor tells each driver which cluster to join by resolving ``"auto"`` in the cluster's
    temp dir. Only ``ray start`` writes that file; ``ray.init`` does not, and then ``"auto"`` takes
    *any* Ray GCS running on the machine (the first of a set, so it varies from run to run). With a
    second cluster beside this one (``rayft serve`` beside a test session, two services), a job
    submitted here sometimes ran its driver on the other cluster: found as the intermittent failure
    of the embedded-cluster service test (``_QueueActor`` of this job's driver created on the other
    cluster). Ray's own writer is used so the file's name and format stay Ray's (2.60 is pinned).
    """
    from ray._private.utils import write_ray_address

    write_ray_address(gcs_address, temp_dir)


def _ensure_token(path: Path) -> None:
    import secrets

    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return
    with os.fdopen(fd, "w") as out:
        out.write(secrets.token_hex(32))


@contextlib.contextmanager
def _any_free_agent_port() -> Iterator[None]:
    """Let the OS pick the dashboard agent's port while ``ray.init`` starts a cluster.

    ``ray start`` takes ``--dashboard-agent-listen-port``, but ``ray.init`` cannot set it: every
    cluster it starts binds 52365. A second local cluster on the machine (a test session beside
    ``rayft serve``, two test sessions, a demo during the tests) then runs without a Jobs API: every
    submission fails with "No available agent to submit job", found when two suites shared this
    machine. Ray itself resolves a port of 0 (the agent reports the port it bound), so the default is
    set to 0 for the duration of the call. Nothing in Ray's public API does this, hence the patch;
    Ray is pinned to 2.60, and ``tests/integration`` runs a second cluster beside the session's.
    """
    import inspect

    from ray._private import parameter

    init = parameter.RayParams.__init__
    with_defaults = [p.name for p in inspect.signature(init).parameters.values() if p.default is not inspect.Parameter.empty]
    index = with_defaults.index("dashboard_agent_listen_port")
    saved = init.__defaults__
    init.__defaults__ = (*saved[:index], 0, *saved[index + 1 :])
    try:
        yield
    finally:
        init.__defaults__ = saved


def train_settings() -> None:
    """Ray Train's settings for every job, on any cluster, set in the driver: Ray Train passes them on to
    the controller and the workers it starts.

    - ``RAY_TRAIN_V2_ENABLED=1``: an empty value would silently select Train V1.
    - The controller polls its workers every ``RAY_TRAIN_HEALTH_CHECK_INTERVAL_S`` (Ray's default 2 s),
      and each poll takes one report per worker: reports still queued when a worker dies are lost, and
      the controller sees the workers start and finish up to a poll late. rayft polls every 0.25 s unless
      the cluster says otherwise (its KubeRay manifests set 0.5 s on every pod). It was set for local
      clusters only, so a job on any other running cluster (``ray start``, ``--address``) polled every 2 s.
    """
    os.environ["RAY_TRAIN_V2_ENABLED"] = "1"
    os.environ.setdefault("RAY_TRAIN_HEALTH_CHECK_INTERVAL_S", "0.25")


def connect(address: str | None, spec: FineTuneSpec | None = None) -> None:
    """Attach to ``address``, or start a local cluster bound to loopback (sized for ``spec``'s workers). A driver that
    reads data calls :func:`quiet_ray_data` next; not here, where importing Ray Data would come before what a job
    starts first (``ray_jobs.run``: its early worker)."""
    train_settings()
    import ray

    if ray.is_initialized():
        return
    if address:
        ray.init(address=address, log_to_driver=False, logging_level=logging.WARNING)
        return
    # Over-subscribe CPUs: the training workers reserve theirs, Ray Data's tokenizers need the rest.
    workers = spec.scaling.num_workers * spec.scaling.cpus_per_worker if spec is not None else 0
    start_local_cluster(num_cpus=(os.cpu_count() or 2) + workers)  # it lives, and goes, with this process


def quiet_ray_data() -> None:
    """Ray Data's per-operator progress logs would bury the progress bar; its logs stay in the cluster's. Imports Ray
    Data (and pandas): 0.25 s on the 2-core machine."""
    import ray.data

    ray.data.DataContext.get_current().enable_progress_bars = False
    logging.getLogger("ray.data").setLevel(logging.WARNING)
