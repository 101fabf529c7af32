"""A team reads its own jobs' logs through the service (``GetJobLogs``, ``rayft logs``), and nobody else's."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import os
import shutil
import subprocess
import sys
import threading
import time

import grpc
import pytest

from rayft.client import Client
from rayft_contract.states import JobState
from rayft_contract.v1 import finetune_pb2 as pb
from rayft_contract.v1 import finetune_pb2_grpc as pb_grpc
from service.launcher import RayJobLauncher
from service.store import JobRecord
from service.store_sqlite import SqliteJobStore
from tests.integration.service.harness import states, tiny_job, wait_for

pytestmark = pytest.mark.integration


def rpc_error(call) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as info:
        call()
    return info.value


def test_a_failed_jobs_log_shows_its_traceback_to_its_team_alone_and_a_follower_gets_every_line_once(
    server, tokens, tiny, tiny_spec, ray_cluster, tmp_path
):
    """A model whose config.json names an activation transformers does not know passes the driver's checks, which
    read the files' names and shapes, and fails in the training worker's load: the job's message names the worker's
    error (not Ray Train's "Training failed due to worker errors:"), and its log has the traceback. A follower started
    before the job was on Ray reads the log as it grows and stops once the job has ended, with every line once."""
    from ray.job_submission import JobSubmissionClient

    misfit = tmp_path / "models" / "misfit"
    shutil.copytree(tiny / "model", misfit)
    config = json.loads((misfit / "config.json").read_text())
    (misfit / "config.json").write_text(json.dumps({**config, "hidden_act": "swish_typo"}))
    a, b = Client(server.address, tokens["team-a"]), Client(server.address, tokens["team-b"])
    bad = tiny_job(tiny_spec, "svc-logs")
    # No retry: it would fail the same way, one more worker start later (Ray Train's resume of a failed worker is
    # test_train_job's and test_warm_pool's subject). The job fails on its own early worker, and its message reads as
    # Ray Train's would ("rank 0: ..."): it read "KeyError: ..." before.
    bad = bad.replace(train=dataclasses.replace(bad.train, max_failures=0))
    job = a.submit(bad.replace(model=dataclasses.replace(bad.model, path=str(misfit))))
    followed: list[str] = []
    follower = threading.Thread(
        target=lambda: followed.extend(Client(server.address, tokens["team-a"]).follow_logs(job.id, poll_s=0.2))
    )
    follower.start()
    assert states(a.watch(job.id))[-1] == "FAILED"
    assert a.get(job.id).message.startswith("rank 0: KeyError: 'swish_typo'"), a.get(job.id)

    logs = a.logs(job.id)
    text = "\n".join(logs.lines)
    assert logs.job_id == job.id and logs.lines_before == 0  # a short log: all of it
    assert "job failed" in text and "Traceback (most recent call last)" in text and "swish_typo" in text
    follower.join(timeout=120)
    assert not follower.is_alive() and followed == list(logs.lines)
    ticket = JobSubmissionClient(ray_cluster.jobs_api).get_job_info(job.id).runtime_env["env_vars"]["RAYFT_LAUNCH_TICKET"]
    assert ticket not in text

    last = a.logs(job.id, tail_lines=3)
    assert list(last.lines) == list(logs.lines[-3:]) and last.lines_before == len(logs.lines) - 3

    assert rpc_error(lambda: b.logs(job.id)).code() == grpc.StatusCode.NOT_FOUND  # another team's job does not exist
    for tail in (-1, 10_001):
        error = rpc_error(lambda tail=tail: a.logs(job.id, tail_lines=tail))
        assert error.code() == grpc.StatusCode.INVALID_ARGUMENT and error.details().startswith("tail_lines:")
    assert list(a.logs(job.id, from_line=2).lines) == list(logs.lines[2:])
    for tail, start in ((0, -1), (5, 0)):
        error = rpc_error(lambda tail=tail, start=start: a.logs(job.id, tail_lines=tail, from_line=start))
        assert error.code() == grpc.StatusCode.INVALID_ARGUMENT and error.details().startswith("from_line:")
    error = rpc_error(lambda: a.logs(job.id, from_line=len(logs.lines) + 1))
    assert error.code() == grpc.StatusCode.OUT_OF_RANGE and "past the log's end" in error.details()

    env = {**os.environ, "RAYFT_ADDRESS": server.address, "RAYFT_TOKEN": tokens["team-a"]}
    cli = subprocess.run(
        [sys.executable, "-m", "rayft", "logs", job.id, "--tail", "2"], env=env, capture_output=True, text=True, timeout=120
    )
    assert cli.returncode == 0, cli.stderr
    assert cli.stdout.splitlines() == list(logs.lines[-2:])
    assert f"{len(logs.lines) - 2:,} earlier lines not shown" in cli.stderr
    cli = subprocess.run(
        [sys.executable, "-m", "rayft", "logs", job.id, "--follow"], env=env, capture_output=True, text=True, timeout=120
    )
    assert (cli.returncode, cli.stdout.splitlines()) == (0, list(logs.lines)), cli.stderr  # the job has ended: all, then done


@pytest.mark.no_ray
def test_a_job_not_yet_on_ray_has_no_log_and_says_so(paused_server, tokens, tiny_spec):
    client = Client(paused_server.address, tokens["team-a"])
    job = client.submit(tiny_job(tiny_spec, "svc-queued"))
    error = rpc_error(lambda: client.logs(job.id))
    assert error.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert f"job {job.id} is QUEUED and has not started on Ray" in error.details()


@pytest.mark.no_ray
def test_a_follower_waits_for_a_queued_job_saying_why_and_ends_when_it_is_cancelled(paused_server, tokens, tiny_spec, tmp_path):
    client = Client(paused_server.address, tokens["team-a"])
    job = client.submit(tiny_job(tiny_spec, "svc-followed"))
    heard: list[str] = []
    ended: list[BaseException] = []

    def follow() -> None:
        try:
            list(client.follow_logs(job.id, poll_s=0.1, on_wait=heard.append))
        except grpc.RpcError as exc:
            ended.append(exc)

    follower = threading.Thread(target=follow)
    follower.start()
    env = {**os.environ, "RAYFT_ADDRESS": paused_server.address, "RAYFT_TOKEN": tokens["team-a"]}
    stderr = tmp_path / "follow.err"
    with stderr.open("w") as err:
        cli = subprocess.Popen([sys.executable, "-m", "rayft", "logs", job.id, "--follow"], env=env, stderr=err, text=True)
    try:
        wait_for(lambda: len(heard) >= 3 and "(waiting:" in stderr.read_text())
        client.cancel(job.id)
        follower.join(timeout=60)
        assert cli.wait(timeout=60) != 0  # cancelled before it ran: it never had a log, and the follower says so
    finally:
        cli.kill()
    assert set(heard) == {f"job {job.id} is QUEUED and has not started on Ray: it has no log (yet)"}
    (error,) = ended
    assert error.code() == grpc.StatusCode.FAILED_PRECONDITION and "is CANCELLED and has not started on Ray" in error.details()
    told = stderr.read_text().splitlines()
    assert told[0] == f"(waiting: {heard[0]})" and sum(line.startswith("(waiting:") for line in told) == 1, told
    assert f"job {job.id} is CANCELLED and has not started on Ray" in told[-1], told


class SlowLogs(RayJobLauncher):
    """The real launcher behind a Ray dashboard that is slow to give logs: each read waits for ``release``."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.release = threading.Event()
        self.waiting = 0
        self._changed = threading.Condition()

    def logs(self, submission_id):
        with self._changed:
            self.waiting += 1
            self._changed.notify_all()
        self.release.wait(timeout=120)
        return super().logs(submission_id)

    def wait_for_readers(self, n: int) -> None:
        with self._changed:
            assert self._changed.wait_for(lambda: self.waiting >= n, timeout=60), self.waiting


@contextlib.contextmanager
def service_in_this_process(settings, store, policy, launcher):
    """The service's servers on an event loop of their own in a thread of this process, with ``launcher``."""
    from service.app import start

    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    service = asyncio.run_coroutine_threadsafe(start(settings, store, policy, launcher), loop).result(60)
    try:
        yield service
    finally:
        asyncio.run_coroutine_threadsafe(service.stop(5), loop).result(60)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()


def a_launched_job(store: SqliteJobStore, team: str, ray_submission_id: str) -> str:
    now = time.time()
    job, _ = store.create(JobRecord(f"ft-{team}", team, JobState.QUEUED, {"name": "logs"}, now, now))
    store.transition(job.id, JobState.STARTING)
    store.update(job.id, ray_submission_id=ray_submission_id)
    return job.id


def settings_for(tmp_path, policy, ray_address: str, **more):
    from service.settings import ServiceSettings

    return ServiceSettings(
        port=0,
        data_dir=tmp_path / "service",
        ray_address=ray_address,
        policy_file=policy,
        watch_process=False,
        launch_paused=True,
        **more,
    )


@pytest.mark.parametrize("ray", ["unreachable", "without the job"])
def test_a_log_that_ray_cannot_give_now_or_ever_says_which(ray, ray_cluster, tmp_path, tokens, policy):
    """Ray down: UNAVAILABLE, worth a retry. Ray up but without the job (a cluster replaced since): NOT_FOUND,
    and the job's events remain."""
    from service.policy import load_for
    from tests.integration.service.harness import NO_RAY

    store = SqliteJobStore(tmp_path / "service" / "jobs.db")
    job_id = a_launched_job(store, "team-a", "raysubmit_gone")
    settings = settings_for(tmp_path, policy, NO_RAY if ray == "unreachable" else ray_cluster.jobs_api)
    launcher = RayJobLauncher(settings.ray_address, sys.executable)
    with service_in_this_process(settings, store, load_for(settings), launcher) as service:
        with grpc.insecure_channel(f"127.0.0.1:{service.port}") as channel:  # not rayft's client: no retries, one answer
            reads = pb_grpc.FineTuningStub(channel)
            metadata = [("authorization", f"Bearer {tokens['team-a']}")]
            error = rpc_error(lambda: reads.GetJobLogs(pb.GetJobLogsRequest(job_id=job_id), metadata=metadata, timeout=60))
    store.close()
    if ray == "unreachable":
        assert error.code() == grpc.StatusCode.UNAVAILABLE and "try again" in error.details()
    else:
        assert error.code() == grpc.StatusCode.NOT_FOUND and "Ray no longer holds the log" in error.details()


def test_a_team_reads_two_logs_at_once_and_a_slow_ray_never_holds_up_another_teams_reads(ray_cluster, tmp_path, tokens, policy):
    """Each read takes a thread of the service while Ray sends the log: a team's third read at once is refused,
    and another team's read goes on."""
    from ray.job_submission import JobSubmissionClient

    from service.policy import load_for

    ray_jobs = JobSubmissionClient(ray_cluster.jobs_api)
    ray_job = ray_jobs.submit_job(entrypoint="echo one line from the job")
    while not ray_jobs.get_job_status(ray_job).is_terminal():
        time.sleep(0.2)
    store = SqliteJobStore(tmp_path / "service" / "jobs.db")
    for team in ("team-a", "team-b"):  # a job of each team, launched as this Ray job
        a_launched_job(store, team, ray_job)
    settings = settings_for(tmp_path, policy, ray_cluster.jobs_api, max_log_reads_per_team=2)
    launcher = SlowLogs(ray_cluster.jobs_api, sys.executable)
    with service_in_this_process(settings, store, load_for(settings), launcher) as service:
        a, b = (Client(f"127.0.0.1:{service.port}", tokens[team]) for team in ("team-a", "team-b"))
        reads = [threading.Thread(target=lambda: results.append(a.logs("ft-team-a"))) for _ in range(2)]
        results: list = []
        for read in reads:
            read.start()
        launcher.wait_for_readers(2)
        refused = rpc_error(lambda: a.logs("ft-team-a"))
        assert refused.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert refused.details() == "team 'team-a' has 2 log reads in flight, its limit: wait for one to end"
        reads.append(threading.Thread(target=lambda: results.append(b.logs("ft-team-b"))))
        reads[-1].start()
        launcher.wait_for_readers(3)  # team-b's read reached Ray while team-a's two wait
        launcher.release.set()
        for read in reads:
            read.join(timeout=60)
        assert sorted(r.job_id for r in results) == ["ft-team-a", "ft-team-a", "ft-team-b"]
        assert all("one line from the job" in r.lines for r in results), results  # among Ray's own lines
        assert "one line from the job" in a.logs("ft-team-a").lines  # the team's reads are free again
    store.close()
