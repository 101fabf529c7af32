"""The proto mirrors the typed spec (fails on drift) and the generated code is current."""

from __future__ import annotations

import dataclasses
import importlib.util
import types
import typing

import pytest

from rayft_contract.convert import spec_from_proto, spec_to_proto
from rayft_contract.spec import FineTuneSpec
from rayft_contract.v1 import finetune_pb2 as pb
from tests.paths import REPO as ROOT

SCALARS = {str: "string", int: "int64", float: "double", bool: "bool"}
PROTO_TYPES = {9: "string", 3: "int64", 1: "double", 8: "bool"}  # FieldDescriptor.TYPE_*


def proto_type(field) -> str:
    return field.message_type.name if field.message_type else PROTO_TYPES[field.type]


def expected_type(hint) -> tuple[str, bool]:
    """``(proto type, repeated)`` a spec field's annotation must map to."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        (hint,) = [a for a in args if a is not type(None)]
        origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is typing.Literal:
        return SCALARS[type(args[0])], False
    if origin is tuple:
        return SCALARS[args[0]], True
    if dataclasses.is_dataclass(hint):
        return hint.__name__, False
    return SCALARS[hint], False


def sections():
    yield FineTuneSpec
    for f in dataclasses.fields(FineTuneSpec):
        hint = typing.get_type_hints(FineTuneSpec)[f.name]
        if dataclasses.is_dataclass(hint):
            yield hint


@pytest.mark.parametrize("cls", list(sections()), ids=lambda c: c.__name__)
def test_proto_mirrors_the_spec(cls):
    message = getattr(pb, cls.__name__).DESCRIPTOR
    hints = typing.get_type_hints(cls)
    assert [f.name for f in dataclasses.fields(cls)] == [f.name for f in message.fields], "same fields, same order"
    for field in message.fields:
        want, repeated = expected_type(hints[field.name])
        assert (proto_type(field), field.is_repeated) == (want, repeated), field.name
        assert field.is_repeated or field.message_type or field.has_presence, f"{field.name} must be `optional`"


def test_round_trip_and_defaults():
    spec = FineTuneSpec.from_dict(
        {
            "name": "j",
            "model": {"path": "org/m", "revision": "main"},
            "data": {"path": "d.jsonl"},
            "lora": {"modules_to_save": ["lm_head"]},
            "train": {"max_steps": 5, "learning_rate": 1e-3},
        }
    )
    assert spec_from_proto(spec_to_proto(spec)) == spec
    sparse = pb.FineTuneSpec(name="j", model=pb.ModelSpec(path="org/m"), data=pb.DataSpec(path="d.jsonl"))
    assert spec_from_proto(sparse) == FineTuneSpec.from_dict(
        {"name": "j", "model": {"path": "org/m"}, "data": {"path": "d.jsonl"}}
    )


def test_generated_code_is_current(tmp_path):
    spec = importlib.util.spec_from_file_location("generate", ROOT / "proto" / "generate.py")
    generate = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(generate)
    fresh = {p.relative_to(tmp_path / "gen"): p.read_text() for p in generate.generate(tmp_path / "gen")}
    committed = {name: (ROOT / name).read_text() if (ROOT / name).exists() else None for name in fresh}
    assert fresh == committed, "run `make proto` and commit rayft_contract/v1"


@pytest.mark.parametrize(
    ("kind", "data"),
    [
        ("phase", {"phase": "training", "detail": "dataset cache hit abc: 0 bytes downloaded, 0 rows tokenized"}),
        ("diagnosis", {"kind": "data_bound", "message": "data wait is 38% of step time: ...", "cost_s": 12.5}),
        ("failure", {"errors": {"1": "RuntimeError: boom"}}),
    ],
)
def test_job_events_survive_the_wire(kind, data):
    """What a job reports (ray_jobs.report) is what a watcher reads back (rayft_contract.convert)."""
    from rayft_contract.convert import event_from_proto, event_to_proto
    from rayft_contract.events import Event

    sent = Event(kind, data)
    received = event_from_proto(event_to_proto(sent))
    assert (received.kind, received.data, received.time) == (kind, data, sent.time)


def test_a_workers_report_reaches_a_watcher_as_the_fields_it_shows_with_the_eta():
    from rayft_contract.convert import event_from_proto, event_to_proto
    from rayft_contract.events import Event
    from rayft_contract.records import Progress, RunFacts, StepRecord

    step = StepRecord(step=40, wall=0.5, phases={"data_wait": 0.01}, tokens=100, processed=128, samples=4, attn_ctx=900)
    sent = Progress(
        step=40, total_steps=100, epoch=1, loss=1.25, learning_rate=1e-4, tokens_per_s=2000.0, step_time_s=0.5,
        checkpoint=True, facts=RunFacts(world_size=2, layout="ddp"), step_timing=(step,),
    )  # fmt: skip
    received = Progress.from_dict(event_from_proto(event_to_proto(Event("progress", sent.to_dict()))).data)
    assert (received.step, received.total_steps, received.epoch, received.loss) == (40, 100, 1, 1.25)
    assert (received.tokens_per_s, received.checkpoint, received.eta_s) == (2000.0, True, 30.0)  # 60 steps x 0.5 s
    assert received.facts is None and received.step_timing == (), "what only the driver reads stays off the wire"


def test_the_wire_progress_is_a_subset_of_the_progress_record_field_for_field():
    import typing

    from rayft_contract.records import Progress

    hints = typing.get_type_hints(Progress)
    for field in pb.Progress.DESCRIPTOR.fields:
        assert field.name in hints, f"pb.Progress.{field.name} has no field in rayft_contract.records.Progress"


def test_every_event_kind_has_its_payload_on_the_wire_and_no_other():
    from rayft_contract.events import EVENT_KINDS, REPORTABLE

    oneof = {f.name for f in pb.JobEvent.DESCRIPTOR.oneofs_by_name["payload"].fields}
    assert oneof == {"state", *REPORTABLE}
    assert set(EVENT_KINDS) - oneof == {"timing"}, "only the driver-internal timing records stay off the wire"


def test_the_proto_names_every_kind_of_diagnosis_the_job_can_send():
    import re

    from ray_jobs.observe import diagnosis

    comment = re.search(
        r"string kind = 1;\s*// (.*)", (ROOT / "proto/rayft_contract/v1/finetune.proto").read_text().split("message Diagnosis")[1]
    ).group(1)
    assert comment.split(" | ") == list(diagnosis.KINDS)
