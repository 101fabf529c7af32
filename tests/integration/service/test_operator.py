"""The operator's token: the platform team that answers for the service reads, watches and cancels every team's
jobs, and creates none; a team's token still reaches only its own team's."""

from __future__ import annotations

import subprocess

import grpc
import pytest

from rayft.client import Client
from tests.integration.service.harness import rayft_cli, states, tiny_job

pytestmark = [pytest.mark.integration, pytest.mark.no_ray]  # a server that launches nothing


def token_command(data_dir, *argv: str) -> subprocess.CompletedProcess:
    """``rayft token ...`` beside the running service, on its data dir, as an operator runs it."""
    return rayft_cli("token", *argv, RAYFT_DATA_DIR=str(data_dir))


def rayft_list(server, token: str, *argv: str) -> subprocess.CompletedProcess:
    """``rayft list ...`` as a person runs it, its table wide enough for whole job ids."""
    return rayft_cli("list", *argv, RAYFT_ADDRESS=server.address, RAYFT_TOKEN=token, COLUMNS="200")


def refused(call) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as info:
        call()
    return info.value


def test_an_operators_token_reads_watches_and_cancels_every_teams_jobs_and_creates_none(paused_server, tokens, tiny_spec):
    server = paused_server
    a, b = Client(server.address, tokens["team-a"]), Client(server.address, tokens["team-b"])
    job_a = a.submit(tiny_job(tiny_spec, "svc-op-a", steps=5000))
    job_b = b.submit(tiny_job(tiny_spec, "svc-op-b", steps=5000))
    made = token_command(server.data_dir, "create", "--operator")
    assert made.returncode == 0, made.stderr
    operator = Client(server.address, made.stdout.strip())

    assert [j.id for j in operator.list(page_size=1)] == [job_b.id, job_a.id]  # every team's, newest first, in pages
    table = rayft_list(server, made.stdout.strip())
    assert table.returncode == 0 and f"{job_a.id} │ team-a" in table.stdout and f"{job_b.id} │ team-b" in table.stdout, table
    newest = rayft_list(server, made.stdout.strip(), "--limit", "1")
    assert job_b.id in newest.stdout and job_a.id not in newest.stdout and "the newest 1 shown" in newest.stderr, newest
    own = rayft_list(server, tokens["team-a"], "--limit", "0")
    assert job_a.id in own.stdout and job_b.id not in own.stdout and own.stderr == "", own
    assert [(j.id, j.team) for j in operator.list(team="team-a")] == [(job_a.id, "team-a")]
    assert operator.get(job_a.id).spec.name == "svc-op-a"
    logs = refused(lambda: operator.logs(job_a.id))  # reached: it has no log because it never started, not NOT_FOUND
    assert logs.code() == grpc.StatusCode.FAILED_PRECONDITION, logs.details()

    cancelled = operator.cancel(job_b.id)
    assert cancelled.message == "cancelled by the operator" and b.get(job_b.id).message == "cancelled by the operator"
    assert states(operator.watch(job_b.id))[-1] == "CANCELLED"  # through the watch process, as a team watches
    assert f"the operator cancels job {job_b.id} of team team-b" in server.log.read_text()

    create = refused(lambda: operator.submit(tiny_job(tiny_spec, "svc-op-own")))
    assert create.code() == grpc.StatusCode.PERMISSION_DENIED and "team's token" in create.details(), create.details()
    assert {j.spec.name for j in operator.list()} == {"svc-op-a", "svc-op-b"}  # nothing was stored

    # A team's token is not widened by naming another team, and still sees its own.
    other = refused(lambda: list(a.list(team="team-b")))
    assert other.code() == grpc.StatusCode.PERMISSION_DENIED and other.details().startswith("team: "), other.details()
    assert [j.id for j in a.list(team="team-a")] == [j.id for j in a.list()] == [job_a.id]
    assert refused(lambda: a.get(job_b.id)).code() == grpc.StatusCode.NOT_FOUND

    token_id = made.stderr.split("(token ", 1)[1][:12]
    assert token_command(server.data_dir, "revoke", token_id).returncode == 0
    assert refused(lambda: operator.get(job_a.id)).code() == grpc.StatusCode.UNAUTHENTICATED
    a.cancel(job_a.id)
