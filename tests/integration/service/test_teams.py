"""Safe to share: each team reaches only its own jobs and the locations its policy allows, runs within its
quotas, takes turns for GPUs, and cannot forge a job's reports; the embedded cluster needs its token."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from pathlib import Path

import grpc
import pytest

from rayft.client import Client
from rayft_contract.convert import spec_to_proto
from rayft_contract.v1 import finetune_pb2 as pb
from rayft_contract.v1 import finetune_pb2_grpc as pb_grpc
from service import auth
from service.store_sqlite import SqliteJobStore
from tests.integration.service.harness import NO_RAY, Server, queued_reasons, running_ray_jobs, states, tiny_job, wait_for

pytestmark = pytest.mark.integration


@pytest.mark.no_ray
def test_teams_are_isolated_and_tokens_required(paused_server, tokens, tiny_spec):
    server = paused_server
    a, b = Client(server.address, tokens["team-a"]), Client(server.address, tokens["team-b"])
    job = a.submit(tiny_job(tiny_spec, "svc-private", steps=5000))
    for call in (lambda: b.get(job.id), lambda: b.cancel(job.id), lambda: list(b.watch(job.id))):
        with pytest.raises(grpc.RpcError) as info:
            call()
        assert info.value.code() == grpc.StatusCode.NOT_FOUND
    assert [j.id for j in b.list()] == []
    for client in (Client(server.address, token=None), Client(server.address, "rft_wrong")):
        with pytest.raises(grpc.RpcError) as info:
            client.get(job.id)
        assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
    a.cancel(job.id)


@pytest.mark.no_ray
def test_a_team_reaches_only_the_locations_its_policy_allows(paused_server, tokens, tiny_spec, tiny, tmp_path):
    """The attacks of issue 10, each refused with PERMISSION_DENIED naming the field, and nothing stored."""
    a = Client(paused_server.address, tokens["team-a"])
    job = tiny_job(tiny_spec, "svc-policy")

    def section(name, **values):
        return job.replace(**{name: dataclasses.replace(getattr(job, name), **values)})

    attacks = {
        "data.path": [
            section("data", path="/etc/passwd"),
            section("data", path=f"{tiny}/../../../etc/passwd"),  # escapes an allowed prefix by '..'
            section("data", path=f"{tiny}-evil/train.jsonl"),  # shares the prefix's text, not its directory
            section("data", path="http://169.254.169.254/latest/meta-data/"),  # the cloud metadata endpoint
            section("data", path=str(tmp_path / "service" / "jobs.db")),  # the service's own database
        ],
        "model.path": [section("model", path="/"), section("model", path="org/some-model")],  # no hub ids allowed
        "output.dir": [
            section("output", dir="/etc"),
            section("output", dir=str(tmp_path / "service")),
            section("output", dir=f"{tmp_path}/outputs/team-b"),  # another team's root
        ],
        "data.cache_uri": [section("data", cache_uri="s3://another-teams-bucket/cache")],
    }
    for field, specs in attacks.items():
        for spec in specs:
            with pytest.raises(grpc.RpcError) as info:
                a.submit(spec)
            assert info.value.code() == grpc.StatusCode.PERMISSION_DENIED, (field, info.value.details())
            assert info.value.details().startswith(f"spec.{field}: "), info.value.details()
    with pytest.raises(grpc.RpcError) as info:  # past the client's own check, as a hostile client would send it
        a._stub.CreateJob(pb.CreateJobRequest(spec=spec_to_proto({**job.to_dict(), "name": ".."})), metadata=a._metadata)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT and info.value.details().startswith("spec.name: ")
    assert list(a.list()) == []  # nothing was stored

    inside = a.submit(section("output", dir=f"{tmp_path}/outputs/team-a/nightly"))  # a folder of its own root
    assert inside.spec.output.dir == f"{tmp_path}/outputs/team-a/nightly/{inside.id}"
    a.cancel(inside.id)


@pytest.mark.no_ray
def test_a_shared_service_will_not_start_without_a_path_policy(tmp_path):
    env = {**os.environ, "RAYFT_DATA_DIR": str(tmp_path), "RAYFT_RAY_ADDRESS": NO_RAY, "RAYFT_PORT": "0"}
    env.pop("RAYFT_POLICY", None)
    done = subprocess.run([sys.executable, "-m", "rayft", "serve"], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    assert "policy" in done.stderr and "Traceback" not in done.stderr


@pytest.mark.no_ray
def test_a_forged_report_far_ahead_is_refused_and_the_jobs_reports_still_land(paused_server, tokens, tiny_spec, tmp_path):

    a = Client(paused_server.address, tokens["team-a"])
    job = a.submit(tiny_job(tiny_spec, "svc-forged"))
    report_token = auth.new_token()  # as if minted at launch, and stolen
    store = SqliteJobStore(tmp_path / "service" / "jobs.db")
    store.update(job.id, report_token_hash=auth.hash_token(report_token))
    store.close()
    reporting = pb_grpc.JobReportingStub(grpc.insecure_channel(paused_server.address))
    metadata = [("authorization", f"Bearer {report_token}")]

    def report(seq: int, step: int):
        event = pb.JobEvent(progress=pb.Progress(step=step, total_steps=10))
        return reporting.Report(pb.ReportRequest(job_id=job.id, report_seq=seq, event=event), metadata=metadata)

    with pytest.raises(grpc.RpcError) as info:
        report(10**12, 999)
    assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION and "expected 1" in info.value.details()
    assert report(1, 1).stored and not report(1, 1).stored  # the job's own first report, then its retry
    assert report(2, 2).stored
    a.cancel(job.id)
    assert [e.progress.step for e in a.watch(job.id) if e.WhichOneof("payload") == "progress"] == [1, 2]


def test_the_embedded_ray_cluster_runs_jobs_with_token_auth_and_refuses_callers_without_it(tmp_path, tokens, tiny_spec, policy):
    """`rayft serve` without --ray-address starts its own Ray cluster with Ray's token auth on: its Jobs
    API refuses a caller without the token (anyone else on the machine), while the service's jobs run. The
    cluster stops with the service, and its files in /tmp go with it."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_AUTH")}
    srv = Server(tmp_path / "service", "", policy).start()  # no Ray address: the embedded cluster (auth forced on)
    try:
        started = srv.log.read_text().split("embedded Ray cluster at ", 1)[1]
        ray_url, ray_files = started.split()[0], Path(started.split("its files in ", 1)[1].split(")")[0])
        assert ray_files.is_dir()
        token_file = tmp_path / "service" / "ray_auth_token"
        assert oct(token_file.stat().st_mode & 0o777) == "0o600"
        outsider = subprocess.run(
            [sys.executable, "-c", f"from ray.job_submission import JobSubmissionClient as C; C({ray_url!r}).list_jobs()"],
            env={**env, "RAY_AUTH_MODE": "disabled"},
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert outsider.returncode != 0 and ("401" in outsider.stderr or "uthenticat" in outsider.stderr), outsider.stderr[-2000:]
        client = Client(srv.address, tokens["team-a"])
        job = client.submit(tiny_job(tiny_spec, "svc-embedded", steps=2))
        assert states(client.watch(job.id))[-1] == "SUCCEEDED", (client.get(job.id).message, srv.log.read_text()[-3000:])
        insider = {**env, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(token_file)}
        listed = subprocess.run(
            [
                sys.executable,
                "-c",
                f"from ray.job_submission import JobSubmissionClient as C; print([j.submission_id for j in C({ray_url!r}).list_jobs()])",
            ],
            env=insider,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert job.id in listed.stdout, listed.stderr[-2000:]
        srv.stop()
        assert srv.proc.returncode == 0 and not ray_files.exists(), srv.log.read_text()[-3000:]
    finally:
        srv.stop()


def test_a_job_the_cluster_can_never_place_is_refused_at_create_and_an_autoscaling_one_queues(
    ray_cluster, tmp_path, tokens, policy, tiny_spec
):
    """The session cluster has 4 CPUs and no GPU: a GPU job, or 8 workers of 1 CPU, would wait in Ray for ever."""
    job = tiny_job(tiny_spec, "svc-capacity")
    gpu = job.replace(scaling=dataclasses.replace(job.scaling, use_gpu=True))
    wide = job.replace(scaling=dataclasses.replace(job.scaling, num_workers=8, cpus_per_worker=1))
    srv = Server(tmp_path / "service", ray_cluster.jobs_api, policy, RAYFT_MAX_RUNNING_JOBS="0").start()
    try:
        a = Client(srv.address, tokens["team-a"])
        for spec, field in ((gpu, "scaling.use_gpu"), (wide, "scaling.num_workers")):
            with pytest.raises(grpc.RpcError) as info:
                a.submit(spec)
            assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION, info.value.details()
            assert info.value.details().startswith(f"spec.{field}: "), info.value.details()
        assert list(a.list()) == []  # nothing was stored
    finally:
        srv.stop()
    # With an autoscaler the nodes running now are not the limit: the job is stored (and would wait for a node).
    srv = Server(tmp_path / "service", ray_cluster.jobs_api, policy, RAYFT_CLUSTER_AUTOSCALES="1", RAYFT_MAX_RUNNING_JOBS="0")
    srv.start()
    try:
        a = Client(srv.address, tokens["team-a"])
        queued = a.submit(gpu)
        assert queued.state == pb.QUEUED
        a.cancel(queued.id)
    finally:
        srv.stop()


def test_a_team_runs_at_most_its_quota_at_once_and_its_next_job_waits_its_turn(ray_cluster, tmp_path, tokens, tiny_spec, policy):
    srv = Server(tmp_path / "service", ray_cluster.jobs_api, policy, RAYFT_MAX_RUNNING_JOBS="1").start()
    a, b = Client(srv.address, tokens["team-a"]), Client(srv.address, tokens["team-b"])
    try:
        first, second = (a.submit(tiny_job(tiny_spec, f"svc-turn-{i}", steps=5000)) for i in (1, 2))
        other = b.submit(tiny_job(tiny_spec, "svc-other-team", steps=5000))
        wait_for(lambda: b.get(other.id).state != pb.QUEUED)
        # The pass that launched team-b's job went past team-a's older second job first, and left it.
        assert a.get(second.id).state == pb.QUEUED and a.get(first.id).state != pb.QUEUED
        a.cancel(first.id)
        wait_for(lambda: a.get(second.id).state != pb.QUEUED)  # its turn
        a.cancel(second.id)
        b.cancel(other.id)
        wait_for(lambda: not running_ray_jobs(ray_cluster.jobs_api), timeout=120)
    finally:
        srv.stop()


def test_a_gpu_job_launches_when_its_gpus_are_free_and_teams_take_turns(ray_cluster, tmp_path, tokens, tiny_spec, policy):
    """The session cluster has no GPU. Told it may hold one (``RAYFT_CLUSTER_GPUS``, as for an autoscaling
    cluster), the service launches one GPU job (which waits in Ray for a node) and holds the others back,
    each with its reason in its events; when the GPU is given back, the next goes to the team that came first
    among those holding none."""
    srv = Server(tmp_path / "service", ray_cluster.jobs_api, policy, RAYFT_CLUSTER_AUTOSCALES="1", RAYFT_CLUSTER_GPUS="1").start()
    a, b = Client(srv.address, tokens["team-a"]), Client(srv.address, tokens["team-b"])

    def gpu_job(name):
        spec = tiny_job(tiny_spec, name, steps=5000)
        return spec.replace(scaling=dataclasses.replace(spec.scaling, use_gpu=True, num_workers=1))

    try:
        first = a.submit(gpu_job("svc-gpu-a1"))
        wait_for(lambda: a.get(first.id).state != pb.QUEUED)
        other_team, second = b.submit(gpu_job("svc-gpu-b1")), a.submit(gpu_job("svc-gpu-a2"))
        assert queued_reasons(b, other_team.id, "free") == ["waiting for 1 GPU; 0 free"]
        assert queued_reasons(a, second.id, "first in line") == [
            f"waiting for 1 GPU: {other_team.id} (team-b, 1 GPU) is first in line"
        ]
        assert a.get(second.id).state == b.get(other_team.id).state == pb.QUEUED
        a.cancel(first.id)  # its GPU is free: team-b's job came first of the two teams holding none
        wait_for(lambda: b.get(other_team.id).state != pb.QUEUED)
        assert queued_reasons(a, second.id, "free")[-1] == "waiting for 1 GPU; 0 free"
        assert a.get(second.id).state == pb.QUEUED
        for client, job in ((b, other_team), (a, second)):
            client.cancel(job.id)
        wait_for(lambda: not running_ray_jobs(ray_cluster.jobs_api), timeout=120)
    finally:
        srv.stop()


def test_jobs_that_cannot_read_their_data_or_name_no_module_fail_in_the_drivers_checks(server, tokens, tiny_spec, tmp_path):
    client = Client(server.address, tokens["team-a"])
    no_data = tiny_job(tiny_spec, "svc-no-data")
    no_data = no_data.replace(data=dataclasses.replace(no_data.data, path=str(tmp_path / "data" / "missing.jsonl")))
    typo = tiny_job(tiny_spec, "svc-lora-typo")
    typo = typo.replace(lora=dataclasses.replace(typo.lora, target_modules=("q_prj", "v_proj")))
    jobs = [client.submit(no_data), client.submit(typo)]
    events = {job.id: list(client.watch(job.id)) for job in jobs}
    assert [states(events[job.id])[-1] for job in jobs] == ["FAILED", "FAILED"]
    reason = client.get(jobs[0].id).message
    assert "data.path" in reason and "missing.jsonl" in reason  # the job's own preflight error, verbatim
    failure = [e.failure for e in events[jobs[0].id] if e.WhichOneof("payload") == "failure"]
    assert "does not exist" in failure[-1].errors["job"]
    reason = client.get(jobs[1].id).message
    assert "lora.target_modules: 'q_prj' names no module of the model; did you mean 'q_proj'?" in reason
    phases = {e.phase.phase for job in jobs for e in events[job.id] if e.WhichOneof("payload") == "phase"}
    assert not phases & {"connect", "data", "training"}, f"both failed before reaching Ray: {phases}"


@pytest.mark.no_ray
def test_per_team_limit_on_active_jobs(tmp_path, tokens, tiny_spec, policy):
    srv = Server.paused(tmp_path / "service", policy, RAYFT_MAX_ACTIVE_JOBS="2").start()
    try:
        a, b = Client(srv.address, tokens["team-a"]), Client(srv.address, tokens["team-b"])
        first = a.submit(tiny_job(tiny_spec, "q1"))
        a.submit(tiny_job(tiny_spec, "q2"), idempotency_key="q2")
        with pytest.raises(grpc.RpcError) as info:
            a.submit(tiny_job(tiny_spec, "q3"))
        assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert a.submit(tiny_job(tiny_spec, "q2"), idempotency_key="q2").spec.name == "q2"  # a retry is not a new job
        b.submit(tiny_job(tiny_spec, "other-team"))  # the limit is per team
        a.cancel(first.id)
        a.submit(tiny_job(tiny_spec, "q3"))  # room again
    finally:
        srv.stop()
