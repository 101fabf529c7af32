"""WatchJob streams: capped per team and in all, served by a process of their own that comes back."""

from __future__ import annotations

import os
import re
import signal
from pathlib import Path

import grpc
import pytest

from rayft.client import Client
from rayft_contract.v1 import finetune_pb2 as pb
from rayft_contract.v1 import finetune_pb2_grpc as pb_grpc
from tests.integration.service.harness import Server, states, tiny_job, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.no_ray]  # a server that launches nothing


def test_watch_streams_are_capped_per_team_and_in_all(tmp_path, tokens, tiny_spec, policy):
    srv = Server.paused(
        tmp_path / "service",
        policy,
        RAYFT_MAX_STREAMS_PER_TEAM="3",
        RAYFT_MAX_STREAMS="5",
    ).start()
    a, b = Client(srv.address, tokens["team-a"]), Client(srv.address, tokens["team-b"])
    try:
        job_a, job_b = a.submit(tiny_job(tiny_spec, "svc-watched-a")), b.submit(tiny_job(tiny_spec, "svc-watched-b"))

        def open_stream(client, job):
            stream = client.open_watch(job.id)
            assert next(stream).seq == 1  # open: the queued job's first event has arrived
            return stream

        streams_a = [open_stream(a, job_a) for _ in range(3)]
        with pytest.raises(grpc.RpcError) as info:
            open_stream(a, job_a)
        assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and "team 'team-a'" in info.value.details()
        streams_b = [open_stream(b, job_b) for _ in range(2)]  # another team is not held back by team-a's limit
        with pytest.raises(grpc.RpcError) as info:
            open_stream(b, job_b)
        assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and "5 open watch streams" in info.value.details()
        streams_a.pop().cancel()  # a closed stream frees its place
        wait_for(lambda: _opens(a, job_a))
        for stream in streams_a + streams_b:
            stream.cancel()
    finally:
        srv.stop()


def _opens(client, job) -> bool:
    try:
        stream = client.open_watch(job.id)  # open once its first event came
    except grpc.RpcError as exc:
        assert exc.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        return False
    stream.cancel()
    return True


def watch_process(srv: Server) -> tuple[int, int]:
    """The pid and port of the server's watch process, from its newest start line in the server's log."""
    pid, port = re.findall(r"watch streams on [\d.]+:(\d+) \(pid (\d+)\)", srv.log.read_text())[-1][::-1]
    return int(pid), int(port)


def alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_streams_run_in_a_process_of_their_own_that_the_api_port_sends_watchers_to_and_that_comes_back(
    tmp_path, tokens, tiny_spec, policy
):
    srv = Server.paused(tmp_path / "service", policy).start()
    client = Client(srv.address, tokens["team-a"])
    try:
        job = client.submit(tiny_job(tiny_spec, "svc-watch-process"))
        with pytest.raises(grpc.RpcError) as info:  # the API port serves no stream, and says where they are
            next(client._stub.WatchJob(pb.WatchJobRequest(job_id=job.id), metadata=client._metadata))
        assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION and "WatchJob is served at" in info.value.details()
        pid, port = watch_process(srv)
        assert dict(info.value.trailing_metadata())["rayft-watch-address"] == f":{port}"
        assert port != srv.port and pid != srv.proc.pid
        watch_port = pb_grpc.FineTuningStub(grpc.insecure_channel(f"127.0.0.1:{port}"))
        with pytest.raises(grpc.RpcError) as info:  # the watch port serves nothing else
            watch_port.GetJob(pb.GetJobRequest(job_id=job.id), metadata=client._metadata)
        assert info.value.code() == grpc.StatusCode.UNIMPLEMENTED and "API port" in info.value.details()
        with pytest.raises(grpc.RpcError) as info:  # and wants a token
            next(watch_port.WatchJob(pb.WatchJobRequest(job_id=job.id)))
        assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
        with pytest.raises(grpc.RpcError) as info:  # another team's job does not exist there either
            Client(srv.address, tokens["team-b"]).open_watch(job.id)
        assert info.value.code() == grpc.StatusCode.NOT_FOUND

        stream = client.open_watch(job.id)  # rayft's client goes there by itself
        assert next(stream).seq == 1
        client.cancel(job.id)  # written by the API process, sent by the watch process
        assert states(stream)[-1] == "CANCELLED"

        second = client.submit(tiny_job(tiny_spec, "svc-watch-process-2"))
        seen = [next(client.open_watch(second.id))]
        os.kill(pid, signal.SIGKILL)  # the watch process dies: the API process starts another, on its port
        wait_for(lambda: watch_process(srv)[0] != pid)
        assert watch_process(srv)[1] == port
        client.cancel(second.id)
        rest = list(client.watch(second.id, after_seq=seen[-1].seq))  # the client's channel reconnects
        assert [e.seq for e in seen + rest] == list(range(1, len(rest) + 2)) and states(rest)[-1] == "CANCELLED"

        pid, _ = watch_process(srv)
        srv.kill()  # the API process dies without a word: its watch process sees its pipe close and exits
        wait_for(lambda: not alive(pid))
    finally:
        srv.stop()
    one = Server.paused(tmp_path / "service", policy, RAYFT_WATCH_PROCESS="0")
    one.start()
    try:  # RAYFT_WATCH_PROCESS=0: streams on the API's own port, as before
        client = Client(one.address, tokens["team-a"])
        job = client.submit(tiny_job(tiny_spec, "svc-streams-in-process"))
        assert next(client._stub.WatchJob(pb.WatchJobRequest(job_id=job.id), metadata=client._metadata)).seq == 1
        assert "streams in this process" in one.log.read_text().rsplit("rayft service on", 1)[1]
    finally:
        one.stop()


def test_a_long_ended_jobs_replay_has_its_progress_thinned_and_every_state_in_order(tmp_path, tokens, policy):
    """The service thins an ended job's progress once it is older than RAYFT_EVENTS_KEEP_DAYS (here 0.1 s): a watcher
    replaying it gets 100 progress reports, the first and last among them, every state change, and the end."""
    import time

    from rayft_contract.states import JobState
    from service.store import JobRecord
    from service.store_sqlite import SqliteJobStore

    store = SqliteJobStore(tmp_path / "service" / "jobs.db")
    now = time.time()
    store.create(JobRecord("ft-old", "team-a", JobState.QUEUED, {"name": "old"}, now, now))
    store.transition("ft-old", JobState.STARTING)
    store.transition("ft-old", JobState.RUNNING)
    for step in range(1, 301):
        store.append_event("ft-old", "progress", {"step": step, "total_steps": 300})
    store.transition("ft-old", JobState.SUCCEEDED)
    store.close()
    srv = Server.paused(tmp_path / "service", policy, RAYFT_EVENTS_KEEP_DAYS=str(0.1 / 86_400)).start()
    client = Client(srv.address, tokens["team-a"])
    try:
        wait_for(lambda: sum(e.WhichOneof("payload") == "progress" for e in client.watch("ft-old")) == 100)
        events = list(client.watch("ft-old"))
        steps = [e.progress.step for e in events if e.WhichOneof("payload") == "progress"]
        assert steps[0] == 1 and steps[-1] == 300 and steps == sorted(steps)
        assert states(events) == ["QUEUED", "STARTING", "RUNNING", "SUCCEEDED"]
        assert [e.seq for e in events] == sorted(e.seq for e in events) and events[-1].seq == 304
    finally:
        srv.stop()
