"""Shared fixtures: the tiny model world, a spec around it, and one local Ray cluster per session.

Markers (``--strict-markers``): ``integration`` starts real parts (Ray, gRPC, S3); ``gpu`` needs CUDA
and is skipped elsewhere. ``make test`` runs unit and integration tests; GPU tests run on the device.
"""

from __future__ import annotations

import dataclasses
import gc
import json
import os
import types
import warnings
from pathlib import Path

import pytest

from rayft_contract.spec import FineTuneSpec
from tests.paths import PRESETS


def pytest_configure(config: pytest.Config) -> None:
    """moto's request recorder (``s3_requests``) writes to ``MOTO_RECORDER_FILEPATH``, read once when moto is
    first imported: point it at a temp file before any test module imports moto (default: the working dir)."""
    import tempfile

    config._rayft_moto_dir = tempfile.mkdtemp(prefix="rayft-moto-")  # type: ignore[attr-defined]
    os.environ.setdefault("MOTO_RECORDER_FILEPATH", os.path.join(config._rayft_moto_dir, "requests.jsonl"))  # type: ignore[attr-defined]


def pytest_unconfigure(config: pytest.Config) -> None:
    import shutil

    shutil.rmtree(getattr(config, "_rayft_moto_dir", ""), ignore_errors=True)
    shutil.rmtree(getattr(config, "_rayft_scopes_dir", ""), ignore_errors=True)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """GPU tests skipped off a GPU; and a test that takes the session's Ray cluster must live in ``tests/integration``,
    which ``make test`` runs in order on one worker (:func:`pytest_xdist_make_scheduler`)."""
    import importlib.util

    has_cuda = False
    if importlib.util.find_spec("torch") is not None:
        import torch

        has_cuda = torch.cuda.is_available()
    for item in items:
        if "gpu" in item.keywords and not has_cuda:
            item.add_marker(pytest.mark.skip(reason="needs a CUDA GPU (run on the device machine)"))
        if "ray_cluster" in getattr(item, "fixturenames", ()) and not _in_ray_stream(item):
            raise pytest.UsageError(
                f"{item.nodeid} takes the session's Ray cluster: move it under tests/integration/, whose tests share one,"
                " and mark it no_ray only if it takes none"
            )
    if hasattr(config, "workerinput"):  # an xdist worker: tell the scheduler which tests are the Ray tests
        listed = Path(config.workerinput[_RAY_TESTS_LIST])
        written = listed.with_suffix(f".{config.workerinput['workerid']}")
        written.write_text(json.dumps([item.nodeid for item in items if _in_ray_stream(item)]))
        written.replace(listed)  # whole, and before this worker reports its collection: the scheduler reads it then


RAY_TESTS = "tests/integration"
"""Where the tests of the session's Ray cluster live: one scope under ``make test`` (:func:`pytest_xdist_make_scheduler`)."""

_RAY_TESTS_LIST = "rayft_ray_tests_list"
"""The ``workerinput`` key of the file where a worker lists the Ray tests (:func:`_ray_tests_file`)."""


def _in_ray_stream(item: pytest.Item) -> bool:
    """A test of ``tests/integration`` not marked ``no_ray``: it takes the session's Ray cluster, or starts one of its
    own (a second cluster beside the session's, ``rayft serve``'s embedded one), which must not run beside the Ray
    tests either: run so, the embedded cluster's test took 161 s instead of 43, and a Ray test lost its metrics."""
    return item.nodeid.startswith(RAY_TESTS + "/") and item.get_closest_marker("no_ray") is None


def pytest_configure_node(node) -> None:
    """(pytest-xdist, on the controller) Where each worker lists the Ray tests (:func:`_in_ray_stream`): the controller
    collects no tests, and a node id alone does not say how its test is marked."""
    import tempfile

    config = node.config
    if not hasattr(config, "_rayft_scopes_dir"):
        config._rayft_scopes_dir = tempfile.mkdtemp(prefix="rayft-scopes-")  # type: ignore[attr-defined]
    node.workerinput[_RAY_TESTS_LIST] = str(_ray_tests_file(config))


def _ray_tests_file(config: pytest.Config) -> Path:
    """The controller's file of the Ray tests' node ids, in its temp dir (removed in :func:`pytest_unconfigure`)."""
    return Path(config._rayft_scopes_dir, "ray-tests.json")  # type: ignore[attr-defined]


def pytest_xdist_make_scheduler(config: pytest.Config, log):
    """``make test`` runs two pytest-xdist workers (``-n 2 --dist loadscope``): the Ray tests (every test of
    ``tests/integration`` not marked ``no_ray``) in one scope, so first and in order on one worker and on the one Ray
    cluster it starts, as a plain ``pytest`` run does; every other test a scope per module, on the other worker
    meanwhile, in the CPU the Ray tests leave idle (a third of their time on 2 cores: Ray's processes starting, a
    driver waiting on its workers). The ``no_ray`` tests (the service's API on a server that launches nothing, TLS
    refusals, a light client's install: about 150 s in one process) ran on the Ray tests' worker, the run's critical
    path, before. Written here because ``--dist loadgroup``, made for this, loses its groups under pytest 9.2 (xdist
    3.8 renames ``item._nodeid``, which pytest 9.2 no longer reads)."""
    from xdist.scheduler import LoadScopeScheduling

    class RayTestsInOrder(LoadScopeScheduling):
        ray_tests: frozenset[str] | None = None

        def _split_scope(self, nodeid: str) -> str:
            if self.ray_tests is None:  # called once every worker has collected, so each has written its list
                self.ray_tests = frozenset(json.loads(_ray_tests_file(config).read_text()))
            return RAY_TESTS if nodeid in self.ray_tests else nodeid.split("::", 1)[0]

        def _assign_work_unit(self, node) -> None:
            if RAY_TESTS in self.workqueue:  # the critical path goes first, whatever the other scopes' sizes
                self.workqueue.move_to_end(RAY_TESTS, last=False)
            super()._assign_work_unit(node)

    return RayTestsInOrder(config, log)


@pytest.fixture(autouse=True)
def tests_beside_the_ray_tests_take_only_the_cpu_they_leave(request: pytest.FixtureRequest):
    """Under ``make test``'s two workers, a test that is not a Ray test (:func:`_in_ray_stream`) runs at niceness 19, it
    and the processes and threads it starts: the Ray tests are the run's critical path, and the others are to fill the
    CPU they leave idle, not to slow them. At the same niceness the two workers ran ``make test`` in 1,850 s against 1,936 s in
    one process: the integration tests lost to the unit tests most of what running those beside them won. At niceness 10
    it took 1,704-1,709 s; with the ``no_ray`` tests beside the Ray tests too, 1,780 s, the Ray tests slower by 5-30 s
    each; at 19, 1,659 s. In the Ray tests' busiest seconds a test here gets about 1.5% of a core (a nice-19 thread's
    weight against a nice-0 one's), so its waits are bounds on a hang, a minute or more, never a measure of speed."""
    if os.environ.get("PYTEST_XDIST_WORKER") is None or _in_ray_stream(request.node):
        yield
        return
    before = os.getpriority(os.PRIO_PROCESS, 0)  # this thread's (Linux): what the test's threads and processes inherit
    os.setpriority(os.PRIO_PROCESS, 0, 19)
    yield
    try:
        os.setpriority(os.PRIO_PROCESS, 0, before)
    except PermissionError:  # only root may lower it again; the Ray tests' worker runs no other test before them
        pass


@pytest.fixture(autouse=True)
def release_what_a_test_left_in_reference_cycles(request: pytest.FixtureRequest):
    """Collect reference cycles after a test that left a Ray Data actor alive. A failed Ray Data execution's
    tokenizer actors live as long as anything references its dataset, and a test that caught the failure
    (``pytest.raises ... as info``) keeps its own frame, and with it the dataset, in a cycle (frame -> info ->
    exception -> traceback -> frame) until Python's cyclic GC happens to run. Seen in CI: the streaming actor of
    ``test_too_many_bad_rows_fail_with_the_report`` held one of the session cluster's 4 CPUs for 16 minutes, and
    ``test_slow_tokenizer_is_data_bound``'s reading tasks then found no CPU until its 900 s timeout. Here, checked
    with Ray's state API: that actor was alive after the test, and gone after ``gc.collect()``.

    Only then: a full collection in this process (torch, transformers and Ray loaded) takes about 0.6 s, and after
    every test it added about 7 minutes to ``make test``. The warnings summary names the tests it collected after
    (a warning, not a line of this process's own summary: under pytest-xdist a worker's summary is never shown)."""
    yield
    if "ray_cluster" in request.fixturenames and _ray_data_actors_alive():
        gc.collect()
        warnings.warn("this test left a Ray Data actor alive: reference cycles collected after it", stacklevel=1)


def _ray_data_actors_alive() -> bool:
    """Whether this process's Ray job still has a Ray Data actor (a ``MapWorker``) alive."""
    import ray
    from ray._private.state import state  # the GCS's actor table: Ray's state API needs the dashboard

    if not ray.is_initialized():
        return False
    job = ray.get_runtime_context().get_job_id()
    return any(
        "MapWorker" in actor["ActorClassName"] and actor["State"] == "ALIVE" and actor["JobID"] == job
        for actor in state.actor_table(None).values()
    )


@pytest.fixture(scope="session", autouse=True)
def cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The session's own cache root (``RAYFT_CACHE_DIR``), set before Ray or a service starts so that
    their workers inherit it: tests never read or fill the user's ``~/.cache/rayft``."""
    root = tmp_path_factory.mktemp("rayft-cache")
    saved = os.environ.get("RAYFT_CACHE_DIR")
    os.environ["RAYFT_CACHE_DIR"] = str(root)
    yield root
    if saved is None:
        os.environ.pop("RAYFT_CACHE_DIR", None)
    else:
        os.environ["RAYFT_CACHE_DIR"] = saved


@pytest.fixture(scope="session")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny BPE tokenizer + random Llama in ``model/`` and a counting dataset in ``train.jsonl``."""
    from ray_jobs.tiny import ensure_tiny_assets

    return ensure_tiny_assets(tmp_path_factory.mktemp("tiny"), rows=2000)


@pytest.fixture(scope="session")
def tokenizer(tiny: Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny / "model")


@pytest.fixture
def tiny_spec(tiny: Path, tmp_path: Path) -> FineTuneSpec:
    """The tiny CPU preset pointed at the session's tiny assets and a fresh output dir."""
    spec = FineTuneSpec.load(PRESETS / "tiny_cpu.yaml")
    return spec.replace(
        model=dataclasses.replace(spec.model, path=str(tiny / "model")),
        data=dataclasses.replace(spec.data, path=str(tiny / "train.jsonl")),
        output=dataclasses.replace(spec.output, dir=str(tmp_path / "runs")),
    )


@pytest.fixture(scope="session")
def s3_server():
    """A local S3-compatible server (moto in server mode on 127.0.0.1), reached over HTTP through the
    standard AWS variables, so boto3, pyarrow and Ray workers (which inherit them) all find it."""
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    env = {
        "AWS_ENDPOINT_URL": f"http://{host}:{port}",
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_REGION": "us-east-1",
        "AWS_DEFAULT_REGION": "us-east-1",
    }
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    yield env["AWS_ENDPOINT_URL"]
    server.stop()
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


@pytest.fixture
def s3_requests(s3_server):
    """Record every request the S3 server gets inside a ``with s3_requests() as got:`` block, from any process
    (the driver, Ray workers); ``got`` is then the list of ``(method, url)``. moto's own recorder."""
    import contextlib

    import requests

    @contextlib.contextmanager
    def recording():
        api = f"{s3_server}/moto-api/recorder"
        requests.post(f"{api}/reset-recording", timeout=10).raise_for_status()
        requests.post(f"{api}/start-recording", timeout=10).raise_for_status()
        got: list[tuple[str, str]] = []
        try:
            yield got
        finally:
            requests.post(f"{api}/stop-recording", timeout=10).raise_for_status()
            lines = requests.get(f"{api}/download-recording", timeout=10).text.splitlines()
            got.extend((e["method"], e["url"]) for e in map(json.loads, filter(None, lines)))

    return recording


@pytest.fixture(scope="session")
def ray_cluster(request, s3_server):
    """One local Ray cluster for the whole session, bound to loopback, over-subscribed to 4 CPUs
    so two CPU training workers leave room for Ray Data (on 2 cores it would otherwise deadlock).
    Started after the S3 server so its workers inherit the S3 endpoint and credentials. Its temp dir goes
    with it, unless a test failed: then Ray's logs stay, and the warnings summary says where."""
    import ray

    from ray_jobs.local_ray import start_local_cluster, stop_local_cluster

    try:
        info = start_local_cluster(num_cpus=4, dashboard=True)  # the dashboard serves the Jobs API
    except Exception as failed:  # Ray raises a bare Exception when one of its daemons dies at start
        # Seen once in a CI rehearsal (2026-12-04): Ray's dashboard process ended with SIGABRT (return code -6)
        # before it wrote a line, and every test on this cluster errored. It did not happen again in the next
        # starts here, with the same tests before it. A second start, once, in a temp dir of its own; what
        # failed first stays in the run's warnings summary, and a second failure fails the session as before.
        ray.shutdown()
        warnings.warn(f"the session's Ray cluster failed to start, started again: {failed}", stacklevel=1)
        info = start_local_cluster(num_cpus=4, dashboard=True)
    yield types.SimpleNamespace(jobs_api=f"http://{info['dashboard_url']}", gcs=info["gcs_address"])
    failed = request.session.testsfailed > 0
    if failed:
        warnings.warn(f"tests failed: the session's Ray logs are kept in {info['temp_dir']}", stacklevel=1)
    stop_local_cluster(info["temp_dir"], keep_logs=failed)
