"""The only mapping between protobuf messages and rayft's Python types (spec, state, event).

The job's reporter, the service and the CLI all go through here, so an event kind or a field added
to the proto is mapped once.
"""

from __future__ import annotations

import json
from typing import Any

from rayft_contract.events import Event, EventKind
from rayft_contract.records import Failure, Finding, JobPhase, Progress, StateChange
from rayft_contract.spec import FineTuneSpec
from rayft_contract.states import JobState
from rayft_contract.v1 import finetune_pb2 as pb

PROGRESS_FIELDS = [f.name for f in pb.Progress.DESCRIPTOR.fields]
"""The wire ``Progress`` is a subset of :class:`~rayft_contract.records.Progress`, field for field (a test checks)."""


def message_to_dict(message: Any) -> dict[str, Any]:
    """Plain Python values; ``optional`` fields only when set (unset spec fields take the spec's defaults)."""
    out: dict[str, Any] = {}
    for field in message.DESCRIPTOR.fields:
        value = getattr(message, field.name)
        if field.message_type is not None and field.message_type.GetOptions().map_entry:
            out[field.name] = dict(value)
        elif field.is_repeated:
            if len(value):
                out[field.name] = list(value)
        elif field.message_type is not None:
            if message.HasField(field.name):
                out[field.name] = message_to_dict(value)
        elif not field.has_presence or message.HasField(field.name):
            out[field.name] = value
    return out


def spec_from_proto(message: pb.FineTuneSpec) -> FineTuneSpec:
    """Validated spec; raises ``SpecError`` naming the bad field."""
    return FineTuneSpec.from_dict(message_to_dict(message))


def spec_to_proto(spec: FineTuneSpec | dict[str, Any]) -> pb.FineTuneSpec:
    data = spec.to_dict() if isinstance(spec, FineTuneSpec) else spec
    message = pb.FineTuneSpec()
    _fill(message, data)
    return message


def _fill(message: Any, data: dict[str, Any]) -> None:
    for key, value in data.items():
        if value is None:
            continue
        field = message.DESCRIPTOR.fields_by_name[key]
        if field.is_repeated:
            getattr(message, key).extend(value)
        elif field.message_type is not None:
            getattr(message, key).SetInParent()  # an empty section stays present
            _fill(getattr(message, key), value)
        else:
            setattr(message, key, value)


def state_to_proto(state: JobState) -> int:
    return pb.JobState.Value(state.value)


def state_from_proto(value: int) -> JobState:
    return JobState(pb.JobState.Name(value))


def event_to_proto(event: Event, job_id: str = "", seq: int = 0) -> pb.JobEvent:
    """One event as its ``JobEvent`` payload (``job_id`` and ``seq`` are the service's to set)."""
    message = pb.JobEvent(job_id=job_id, seq=seq, time=event.time)
    data = event.data
    if event.kind == "state":
        change = StateChange.from_dict(data)
        message.state.CopyFrom(pb.StateChange(state=state_to_proto(JobState(change.state)), message=change.message))
    elif event.kind == "progress":
        message.progress.CopyFrom(progress_to_proto(Progress.from_dict(data)))
    elif event.kind == "phase":
        phase = JobPhase.from_dict(data)
        message.phase.CopyFrom(pb.Phase(phase=phase.phase, detail=phase.detail))
    elif event.kind == "failure":
        message.failure.CopyFrom(pb.Failure(errors=Failure.from_dict(data).errors))
    elif event.kind == "diagnosis":
        finding = Finding.from_dict(data)
        message.diagnosis.CopyFrom(pb.Diagnosis(kind=finding.kind, message=finding.message, cost_s=finding.cost_s))
    elif event.kind == "summary":
        message.summary.CopyFrom(pb.Summary(json=json.dumps(data, default=str)))
    else:
        raise ValueError(f"{event.kind!r} events do not leave the job")
    return message


def event_from_proto(message: pb.JobEvent) -> Event:
    """The event a ``JobEvent`` carries (raises ``ValueError`` on an empty payload)."""
    kind: EventKind | None = message.WhichOneof("payload")
    if kind == "state":
        data = StateChange(state_from_proto(message.state.state).value, message.state.message).to_dict()
    elif kind == "progress":
        data = message_to_dict(message.progress) | {"checkpoint": message.progress.checkpoint}
    elif kind == "phase":
        data = {"phase": message.phase.phase, "detail": message.phase.detail}  # what the wire carries of a JobPhase
    elif kind == "failure":
        data = Failure(dict(message.failure.errors)).to_dict()
    elif kind == "diagnosis":
        data = message_to_dict(message.diagnosis)
    elif kind == "summary":
        data = json.loads(message.summary.json)
    else:
        raise ValueError("the event has no payload")
    return Event(kind, data, message.time)


def progress_to_proto(progress: Progress) -> pb.Progress:
    """What a watcher sees of a worker's report: the proto's fields (the records' field names), with the ETA
    from the step time when the job has not set it."""
    eta = progress.eta_s
    if eta is None and progress.step_time_s and progress.total_steps:
        eta = (progress.total_steps - progress.step) * progress.step_time_s
    values = {name: getattr(progress, name) for name in PROGRESS_FIELDS if name != "eta_s"}
    return pb.Progress(**{k: v for k, v in values.items() if v is not None}, eta_s=eta)
