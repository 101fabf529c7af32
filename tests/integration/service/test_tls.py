"""TLS on the API: with and without client certificates, no plaintext off loopback, and a job's own
reports over TLS while teams use mutual TLS."""

from __future__ import annotations

import os
import subprocess
import sys

import grpc
import pytest

from rayft.client import Client
from rayft_contract.v1 import finetune_pb2 as pb
from rayft_contract.v1 import finetune_pb2_grpc as pb_grpc
from tests.integration.service.harness import Server, free_port, states, tiny_job

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def certs(tmp_path_factory):
    """A throwaway CA (trustme), the service's certificate for 127.0.0.1, a team client's, and a stranger's
    signed by another CA."""
    import types

    import trustme

    root = tmp_path_factory.mktemp("tls")
    ca, other_ca = trustme.CA(), trustme.CA()
    paths = {"ca": root / "ca.pem"}
    ca.cert_pem.write_to_path(paths["ca"])
    for name, cert in (
        ("server", ca.issue_cert("localhost", "127.0.0.1")),
        ("client", ca.issue_cert("team-a.clients.rayft.example")),
        ("stranger", other_ca.issue_cert("team-a.clients.rayft.example")),
    ):
        paths[f"{name}_key"], paths[f"{name}_cert"] = root / f"{name}.key", root / f"{name}.pem"
        cert.private_key_pem.write_to_path(paths[f"{name}_key"])
        cert.cert_chain_pems[0].write_to_path(paths[f"{name}_cert"])
    return types.SimpleNamespace(**paths)


def tls_env(certs, mutual: bool) -> dict[str, str]:
    env = {"RAYFT_TLS_CERT": str(certs.server_cert), "RAYFT_TLS_KEY": str(certs.server_key), "RAYFT_REPORT_TLS_CA": str(certs.ca)}
    if mutual:
        env["RAYFT_TLS_CLIENT_CA"] = str(certs.ca)
    return env


def client_tls(certs, who: str | None = "client"):
    from rayft_contract.channel import TlsConfig

    if who is None:
        return TlsConfig(enabled=True, ca=certs.ca.read_bytes())
    key, cert = getattr(certs, f"{who}_key"), getattr(certs, f"{who}_cert")
    return TlsConfig(enabled=True, ca=certs.ca.read_bytes(), cert=cert.read_bytes(), key=key.read_bytes())


@pytest.mark.no_ray
def test_tls_with_and_without_client_certificates_and_no_plaintext_off_loopback(tmp_path, tokens, tiny_spec, policy, certs):
    from rayft_contract.channel import PlaintextRefused, TlsConfig, channel

    token = tokens["team-a"]
    job = tiny_job(tiny_spec, "svc-tls")

    def refused(tls: TlsConfig) -> grpc.StatusCode:
        """One call through the client's channel (``rayft_contract.channel``), without ``Client``'s retries of
        UNAVAILABLE: five attempts over about 7 s, three times here, to learn what the first attempt said."""
        stub = pb_grpc.FineTuningStub(channel(srv.address, tls))
        with pytest.raises(grpc.RpcError) as info:
            stub.ListJobs(pb.ListJobsRequest(), metadata=[("authorization", f"Bearer {token}")], timeout=60)
        return info.value.code()

    def claim(address: str) -> grpc.StatusCode:
        reporting = pb_grpc.JobReportingStub(grpc.secure_channel(address, client_tls(certs, None).credentials()))
        with pytest.raises(grpc.RpcError) as info:  # through TLS without a client certificate, to the ticket check
            reporting.ClaimJob(pb.ClaimJobRequest(job_id=created.id), metadata=[("authorization", "Bearer rftl_x")], timeout=60)
        return info.value.code()

    # TLS: a client that trusts the CA works; a plaintext one does not get through. Jobs report on a port
    # of their own (RAYFT_REPORT_PORT, which k8s/overlays/prod opens to the Ray pods alone), not on the API's.
    report_port = free_port()
    srv = Server.paused(
        tmp_path / "service",
        policy,
        RAYFT_REPORT_PORT=str(report_port),
        **tls_env(certs, mutual=False),
    )
    srv.start()
    try:
        created = Client(srv.address, token, tls=client_tls(certs, None)).submit(job)
        assert created.state == pb.QUEUED
        assert refused(TlsConfig()) == grpc.StatusCode.UNAVAILABLE
        assert srv.log.read_text().rsplit("jobs report to ", 1)[1].split(";")[0] == f"127.0.0.1:{report_port}"
        assert claim(f"127.0.0.1:{report_port}") == grpc.StatusCode.UNAUTHENTICATED
        assert claim(srv.address) == grpc.StatusCode.UNIMPLEMENTED
    finally:
        srv.stop()

    # Mutual TLS: only a certificate the client CA signed gets in; jobs report on a port of their own.
    probe_port = free_port()
    srv = Server.paused(
        tmp_path / "service",
        policy,
        RAYFT_HEALTH_PORT=str(probe_port),
        **tls_env(certs, mutual=True),
    )
    srv.start()
    try:
        # The probe port (for Kubernetes, whose gRPC probes cannot speak TLS) answers health in plaintext, and nothing else.
        from grpc_health.v1 import health_pb2, health_pb2_grpc

        probe = grpc.insecure_channel(f"127.0.0.1:{probe_port}")
        answer = health_pb2_grpc.HealthStub(probe).Check(health_pb2.HealthCheckRequest(service="rayft.v1.FineTuning"), timeout=60)
        assert answer.status == health_pb2.HealthCheckResponse.SERVING
        with pytest.raises(grpc.RpcError) as info:
            pb_grpc.FineTuningStub(probe).ListJobs(pb.ListJobsRequest(), metadata=[("authorization", f"Bearer {token}")])
        assert info.value.code() == grpc.StatusCode.UNIMPLEMENTED
        assert [j.id for j in Client(srv.address, token, tls=client_tls(certs)).list()] == [created.id]
        assert refused(client_tls(certs, None)) == grpc.StatusCode.UNAVAILABLE
        assert refused(client_tls(certs, "stranger")) == grpc.StatusCode.UNAVAILABLE
        report_address = srv.log.read_text().rsplit("jobs report to ", 1)[1].split(";")[0]
        assert report_address != srv.address
        assert claim(report_address) == grpc.StatusCode.UNAUTHENTICATED
    finally:
        srv.stop()

    # Plaintext off loopback: the service will not listen, the client will not send.
    env = {**os.environ, "RAYFT_HOST": "0.0.0.0", "RAYFT_DATA_DIR": str(tmp_path / "plain"), "RAYFT_POLICY": str(policy)}
    done = subprocess.run([sys.executable, "-m", "rayft", "serve"], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "plaintext only on loopback" in done.stderr and done.stderr.count("\n") == 1
    with pytest.raises(PlaintextRefused):
        Client("10.1.2.3:50051", token, tls=TlsConfig())


def test_a_job_claims_and_reports_over_tls_while_teams_use_mutual_tls(ray_cluster, tmp_path, tokens, tiny_spec, policy, certs):
    import json

    from ray.job_submission import JobSubmissionClient

    srv = Server(tmp_path / "service", ray_cluster.jobs_api, policy, **tls_env(certs, mutual=True)).start()
    try:
        client = Client(srv.address, tokens["team-a"], tls=client_tls(certs))
        job = client.submit(tiny_job(tiny_spec, "svc-over-tls", steps=4))
        events = list(client.watch(job.id))
        assert states(events) == ["QUEUED", "STARTING", "RUNNING", "SUCCEEDED"], srv.log.read_text()[-3000:]
        assert [e.progress.step for e in events if e.WhichOneof("payload") == "progress"] == [2, 4]
        runtime_env = JobSubmissionClient(ray_cluster.jobs_api).get_job_info(job.id).runtime_env
        assert (
            runtime_env["env_vars"]["RAYFT_REPORT_TLS"] == "1"
            and "BEGIN CERTIFICATE" in runtime_env["env_vars"]["RAYFT_REPORT_CA"]
        )
        assert "PRIVATE KEY" not in json.dumps(runtime_env)  # a CA certificate is public; no key goes to Ray
    finally:
        srv.stop()
