"""The API's answers to bad and large input: the right status, a message that names the field, nothing
stored; idempotent creates and paged lists."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import grpc
import pytest

from rayft.client import Client
from rayft_contract.convert import message_to_dict, spec_to_proto
from rayft_contract.states import JobState
from rayft_contract.v1 import finetune_pb2 as pb
from service.store import JobRecord
from service.store_sqlite import SqliteJobStore
from tests.integration.service.harness import tiny_job

pytestmark = [pytest.mark.integration, pytest.mark.no_ray]  # a server that launches nothing


def test_a_megabyte_spec_is_refused_at_the_api_and_nothing_is_stored(paused_server, tokens, tiny_spec):
    a = Client(paused_server.address, tokens["team-a"])
    body = tiny_job(tiny_spec, "svc-huge").to_dict()
    for size, code in ((1_000_000, grpc.StatusCode.INVALID_ARGUMENT), (3_000_000, grpc.StatusCode.RESOURCE_EXHAUSTED)):
        body["data"]["chat_template"] = "x" * size  # past the client's own check, as a hostile client sends it
        with pytest.raises(grpc.RpcError) as info:
            a._stub.CreateJob(pb.CreateJobRequest(spec=spec_to_proto(body)), metadata=a._metadata)
        assert info.value.code() == code, info.value.details()
    body["data"]["chat_template"] = "x" * 1_000_000
    with pytest.raises(grpc.RpcError) as info:
        a._stub.CreateJob(pb.CreateJobRequest(spec=spec_to_proto(body)), metadata=a._metadata)
    assert info.value.details().startswith("spec: ") and "over the limit of 65536" in info.value.details()
    assert list(a.list()) == []


def test_idempotent_creates_list_filter_and_errors(paused_server, tokens, tiny_spec):
    server = paused_server
    client = Client(server.address, tokens["team-b"])
    spec = tiny_job(tiny_spec, "svc-once", steps=5000)
    with ThreadPoolExecutor(max_workers=50) as pool:
        jobs = list(pool.map(lambda _: client.submit(spec, idempotency_key="nightly-1"), range(50)))
    assert len({j.id for j in jobs}) == 1
    with pytest.raises(grpc.RpcError) as info:
        client.submit(spec.replace(name="svc-other"), idempotency_key="nightly-1")
    assert info.value.code() == grpc.StatusCode.ALREADY_EXISTS
    client.cancel(jobs[0].id)

    second = client.submit(spec.replace(name="svc-second"))
    assert [j.id for j in client.list(page_size=1)] == [second.id, jobs[0].id]  # newest first, across pages
    assert [j.id for j in client.list(states=["CANCELLED"])] == [jobs[0].id]
    client.cancel(second.id)

    bad = spec.to_dict()
    bad["train"]["global_batch_size"] = 6  # not a multiple of 4 x 2 workers; the client's spec would refuse it
    with pytest.raises(grpc.RpcError) as info:
        client._stub.CreateJob(pb.CreateJobRequest(spec=spec_to_proto(bad)), metadata=client._metadata)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "spec.train.global_batch_size" in info.value.details()
    with pytest.raises(grpc.RpcError) as info:
        client.get("ft-missing")
    assert info.value.code() == grpc.StatusCode.NOT_FOUND


def test_lists_leave_specs_out_unless_asked_and_bad_filters_are_invalid_argument(paused_server, tokens, tiny_spec):
    client = Client(paused_server.address, tokens["team-a"])
    job = client.submit(tiny_job(tiny_spec, "svc-listed"))
    (basic,) = client.list()
    assert basic.spec.name == "svc-listed" and not basic.spec.HasField("model") and basic.state == pb.QUEUED
    (full,) = client.list(full=True)
    assert full.spec == client.get(job.id).spec and full.spec.model.path == tiny_spec.model.path
    for request, field in (
        (pb.ListJobsRequest(states=[99]), "states"),
        (pb.ListJobsRequest(page_token="ft-not-a-job"), "page_token"),
        (pb.ListJobsRequest(page_size=501), "page_size"),
    ):
        with pytest.raises(grpc.RpcError) as info:
            client._stub.ListJobs(request, metadata=client._metadata)
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT and info.value.details().startswith(f"{field}: ")
    client.cancel(job.id)


def test_full_lists_stop_each_page_at_a_megabyte_and_every_job_comes_once_in_order(paused_server, tokens, tiny_spec):
    body = {**tiny_spec.to_dict(), "data": {**tiny_spec.to_dict()["data"], "chat_template": "{{ messages }}" + " " * 20_000}}
    store, now = SqliteJobStore(paused_server.data_dir / "jobs.db"), time.time()
    for i in range(70):  # written straight into the store: 1.4 MB of specs, more than one page
        store.create(JobRecord(f"ft-listed-{i:03d}", "team-a", JobState.QUEUED, {**body, "name": f"l{i}"}, now + i, now + i))
    store.close()
    client = Client(paused_server.address, tokens["team-a"])
    pages, token = [], ""
    while True:
        request = pb.ListJobsRequest(page_size=500, page_token=token, view=pb.JOB_VIEW_FULL)
        response = client._stub.ListJobs(request, metadata=client._metadata)
        pages.append(response.jobs)
        if not (token := response.next_page_token):
            break
    assert len(pages) == 2 and all(sum(j.ByteSize() for j in page) <= 1024 * 1024 for page in pages)
    assert len(pages[0]) > 32  # one page read from the store in more than one piece
    assert [j.id for page in pages for j in page] == [f"ft-listed-{i:03d}" for i in reversed(range(70))]
    assert all(len(j.spec.data.chat_template) > 20_000 for page in pages for j in page)  # whole specs
    basic = client._stub.ListJobs(pb.ListJobsRequest(page_size=50), metadata=client._metadata)
    assert len(basic.jobs) == 50 and basic.next_page_token == basic.jobs[-1].id and basic.jobs[0].spec.name == "l69"


def proto_values(field):
    from hypothesis import strategies as st

    if field.type == field.TYPE_STRING:
        return st.one_of(st.text(max_size=12), st.sampled_from(["bfloat16", "nf4", "chat", "cosine", "ddp", "", "org/model"]))
    if field.type == field.TYPE_INT64:
        return st.integers(-5, 5000)
    if field.type == field.TYPE_DOUBLE:
        return st.floats(allow_nan=True, allow_infinity=True, width=64)
    return st.booleans()


def spec_messages():
    """Protos of random sections with random (type-correct) values for random subsets of fields."""
    from hypothesis import strategies as st

    sections = {f.name: f.message_type for f in pb.FineTuneSpec.DESCRIPTOR.fields if f.message_type}

    def section(descriptor):
        fields = {
            f.name: (st.lists(proto_values(f), max_size=2) if f.is_repeated else proto_values(f)) for f in descriptor.fields
        }
        return st.fixed_dictionaries({}, optional=fields)

    return st.fixed_dictionaries(
        {},
        optional={
            "name": proto_values(pb.FineTuneSpec.DESCRIPTOR.fields_by_name["name"]),
            **{name: section(d) for name, d in sections.items()},
        },
    )


def test_generated_invalid_specs_get_invalid_argument_never_internal(paused_server, tokens):
    server = paused_server
    from hypothesis import HealthCheck, assume, given, settings

    from rayft_contract.spec import FineTuneSpec, SpecError

    client = Client(server.address, tokens["team-a"])

    @settings(
        max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.filter_too_much]
    )
    @given(data=spec_messages())
    def check(data):
        message = spec_to_proto(data)
        try:  # what the server receives (an empty repeated field reads as unset on the wire)
            FineTuneSpec.from_dict(message_to_dict(message))
            assume(False)  # valid by chance: not what this test feeds
        except SpecError as exc:
            expected = exc.field
        with pytest.raises(grpc.RpcError) as info:
            client._stub.CreateJob(pb.CreateJobRequest(spec=message), metadata=client._metadata, timeout=60)
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT, info.value.details()
        assert info.value.details().startswith(f"spec.{expected}: ")

    check()
    assert list(client.list()) == []  # nothing was stored


def test_a_dry_run_checks_a_spec_as_a_create_would_and_stores_nothing(tokens, tiny_spec, tmp_path, policy):
    """`rayft submit --dry-run` (CreateJob's validate_only): the same answers as a create, for a bad field, a path
    the team's policy does not allow and a good spec, whose output it names; it stores nothing, so a team at its
    active-jobs quota can still check a spec."""
    import dataclasses

    import yaml

    from tests.integration.service.harness import Server, rayft_cli

    server = Server.paused(tmp_path / "service", policy, RAYFT_MAX_ACTIVE_JOBS="1").start()
    try:
        a = Client(server.address, tokens["team-a"])
        good = tiny_job(tiny_spec, "svc-dry")
        checked = a.validate(good)
        assert checked.id == "" and checked.team == "team-a" and checked.spec.name == "svc-dry"
        assert checked.spec.output.dir == f"{tmp_path}/outputs/team-a/{{job_id}}"
        assert list(a.list()) == []

        outside = good.replace(data=dataclasses.replace(good.data, path="/etc/passwd"))
        for spec, code, field in (
            (outside, grpc.StatusCode.PERMISSION_DENIED, "spec.data.path"),
            (
                good.to_dict() | {"train": {**good.to_dict()["train"], "learning_rate": 5.0}},
                grpc.StatusCode.INVALID_ARGUMENT,
                "spec.train.learning_rate",
            ),
        ):
            request = pb.CreateJobRequest(spec=spec_to_proto(spec), validate_only=True)
            with pytest.raises(grpc.RpcError) as info:
                a._stub.CreateJob(request, metadata=a._metadata)
            assert info.value.code() == code and info.value.details().startswith(field), info.value.details()

        job = a.submit(good)  # the team's one active job: a create is refused now, a check is not
        with pytest.raises(grpc.RpcError) as info:
            a.submit(tiny_job(tiny_spec, "svc-dry-2"))
        assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        spec_file = tmp_path / "job.yaml"
        spec_file.write_text(yaml.safe_dump(tiny_job(tiny_spec, "svc-dry-cli").to_dict()))
        done = rayft_cli("submit", str(spec_file), "--dry-run", RAYFT_ADDRESS=server.address, RAYFT_TOKEN=tokens["team-a"])
        assert done.returncode == 0, done.stderr
        assert (
            done.stdout
            == f"the service would take it: team team-a, output {tmp_path}/outputs/team-a/{{job_id}} (nothing was created)\n"
        )
        assert [j.id for j in a.list()] == [job.id]  # nothing more was stored
        a.cancel(job.id)
    finally:
        server.stop()
