"""What the service's end-to-end tests share: a real `rayft serve` process (:class:`Server`), the tiny job
they submit, and waits on what it does."""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import grpc
import pytest

from rayft.local_service import wait_ready
from rayft_contract.v1 import finetune_pb2 as pb
from rayft_contract.v1 import finetune_pb2_grpc as pb_grpc

NO_RAY = "http://127.0.0.1:9"
"""A Ray Jobs address where nothing listens: the service's Ray is unreachable."""


class Server:
    """A `rayft serve` subprocess; ``start()`` again after ``kill()`` keeps its data dir and port."""

    def __init__(self, data_dir: Path, ray_address: str, policy: Path, port: int | None = None, **env: str):
        """``port``: unset, a free one outside the OS's ephemeral range (:func:`free_port`), so that a restart finds
        it, and its watch process's beside it, still free."""
        self.data_dir, self.ray_address, self.env = data_dir, ray_address, env
        self.port = free_port(2) if port is None else port
        self.env["RAYFT_POLICY"] = str(policy)
        self.proc: subprocess.Popen | None = None

    @classmethod
    def paused(cls, data_dir: Path, policy: Path, **env: str) -> Server:
        """One that stores and queues jobs but launches none (``RAYFT_LAUNCH_PAUSED``), with no Ray behind it."""
        return cls(data_dir, NO_RAY, policy, RAYFT_LAUNCH_PAUSED="1", **env)

    def start(self) -> Server:
        env = {**os.environ, **self.env, "RAYFT_DATA_DIR": str(self.data_dir), "RAYFT_PORT": str(self.port)}
        if self.ray_address:  # none: the service starts its own (embedded) cluster
            env["RAYFT_RAY_ADDRESS"] = self.ray_address
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.log = self.data_dir / "server.log"
        start = self.log.stat().st_size if self.log.exists() else 0
        with self.log.open("a") as out:  # a file, not a pipe: an unread pipe would block the server
            self.proc = subprocess.Popen([sys.executable, "-m", "rayft", "serve"], env=env, stdout=out, stderr=subprocess.STDOUT)
        self.port = int(wait_ready(self.proc, self.log, start, 180).rsplit(":", 1)[1])
        return self

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            self.proc.wait(timeout=120)

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"


def running_ray_jobs(jobs_api: str) -> list[str]:
    from ray.job_submission import JobSubmissionClient

    jobs = JobSubmissionClient(jobs_api).list_jobs()  # also lists plain drivers (this test process): no submission id
    return [j.submission_id for j in jobs if j.submission_id and str(j.status).split(".")[-1] in ("PENDING", "RUNNING")]


def tiny_job(tiny_spec, name: str, steps: int = 10):
    """The tiny preset as a team submits it: no output.dir of its own (the service puts it under the team's root).
    One training worker: these tests are about the service, and a one-worker job runs on its own worker started at
    the connect (``ray_jobs.warm.early``), at about half the time of one on Ray Train (bench/cpu_job_start.py); two
    workers under DDP and FSDP are ``test_train_job.py``'s subject."""
    spec = tiny_spec.replace(
        name=name,
        data=dataclasses.replace(tiny_spec.data, val_fraction=0.0),
        output=dataclasses.replace(tiny_spec.output, dir="runs"),
        scaling=dataclasses.replace(tiny_spec.scaling, num_workers=1),
    )
    return spec.replace(
        train=dataclasses.replace(spec.train, max_steps=steps, log_every=2, eval_every=None, checkpoint_every=steps)
    )


def kinds(events):
    return [e.WhichOneof("payload") for e in events]


def states(events):
    return [pb.JobState.Name(e.state.state) for e in events if e.WhichOneof("payload") == "state"]


def wait_for(predicate, timeout=120.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if value := predicate():
            return value
        time.sleep(0.5)
    raise TimeoutError


def rayft_cli(*argv: str, **env: str) -> subprocess.CompletedProcess:
    """``rayft ARGV...`` as a person runs it, in a process of its own, with ``env`` over this one's environment."""
    return subprocess.run(
        [sys.executable, "-m", "rayft", *argv], capture_output=True, text=True, env={**os.environ, **env}, timeout=120
    )


_given: set[int] = set()
"""Every port :func:`free_port` gave in this process: none is given twice, though the first test's server may not have
bound it yet when the next asks."""


def free_port(count: int = 1) -> int:
    """The first of ``count`` free ports in a row, for a server the test starts: its API and its watch process's
    beside it (``service.settings``), its metrics or a probe.

    Why not one the OS picks (port 0): that comes from the ephemeral range, where every outbound connection of the
    session's Ray processes takes its local port. In one CI run (2026-12-07) such a connection took a stopped
    service's watch port while a test launched a job by hand, and the service, started again on its address, could not
    listen there; the job it left running then failed three more tests. Ports between Ray's worker ports (10002-19999)
    and the ephemeral range are taken by nobody by chance. Each pytest-xdist worker draws from its own part of them,
    so that two workers never give the same one."""
    import random
    import socket

    low_ephemeral = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    first, parts = 20_000, 4
    width = (low_ephemeral - first) // parts
    if width < 100:
        raise RuntimeError(f"the ephemeral ports start at {low_ephemeral}: no room below them for a test's servers")
    worker = int(os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw")) % parts
    for port in random.sample(range(first + worker * width, first + (worker + 1) * width - count), 50):
        ports = range(port, port + count)
        if _given.intersection(ports):
            continue
        try:
            for candidate in ports:
                with socket.socket() as probe:
                    probe.bind(("127.0.0.1", candidate))
        except OSError:
            continue
        _given.update(ports)
        return port
    raise RuntimeError(f"no {count} free ports in a row in {first}-{low_ephemeral} after 50 tries")


def scrape(port: int) -> dict[tuple[str, frozenset], float]:
    """Every sample of the service's /metrics: (name, its labels) -> value."""
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=60).read().decode()
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def sample(samples, name, **labels) -> float:
    return samples.get((name, frozenset(labels.items())), 0.0)


def assert_the_ray_dashboard_shows_no_lasting_secret(server, ray_cluster, job):
    """What anyone who reaches the Ray dashboard reads of a running job: its id, the report address and a
    launch ticket the job has already traded. No spec, no report token; the ticket opens nothing now."""
    import hashlib
    import json

    from ray.job_submission import JobSubmissionClient

    runtime_env = JobSubmissionClient(ray_cluster.jobs_api).get_job_info(job.id).runtime_env
    env = runtime_env["env_vars"]
    assert set(env) == {"RAYFT_JOB_ID", "RAYFT_TEAM", "RAYFT_REPORT_ADDRESS", "RAYFT_LAUNCH_TICKET"}
    assert env["RAYFT_TEAM"] == job.team  # a name, which picks the team's storage keys on the nodes; never a key
    assert job.spec.data.path not in json.dumps(runtime_env)
    reporting = pb_grpc.JobReportingStub(grpc.insecure_channel(server.address))
    ticket = [("authorization", f"Bearer {env['RAYFT_LAUNCH_TICKET']}")]
    mine = hashlib.sha256(b"an attacker's own token").hexdigest()
    with pytest.raises(grpc.RpcError) as info:
        reporting.ClaimJob(pb.ClaimJobRequest(job_id=job.id, report_token_sha256=mine), metadata=ticket)
    assert info.value.code() == grpc.StatusCode.PERMISSION_DENIED
    with pytest.raises(grpc.RpcError) as info:  # nor does the ticket report
        event = pb.JobEvent(progress=pb.Progress(step=1))
        reporting.Report(pb.ReportRequest(job_id=job.id, report_seq=1, event=event), metadata=ticket)
    assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED


def queued_reasons(client, job_id: str, until: str) -> list[str]:
    """The reasons the service gave, as events, for the job's wait, up to the first that contains ``until``."""
    stream = client.open_watch(job_id, timeout=180)
    reasons = []
    for event in stream:
        if event.WhichOneof("payload") == "phase" and event.phase.phase == "queued" and event.phase.detail:
            reasons.append(event.phase.detail)
            if until in event.phase.detail:
                stream.cancel()
                return reasons
    raise AssertionError(f"the job ended without {until!r}: {reasons}")
