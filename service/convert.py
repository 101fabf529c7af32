"""The only mapping between protobuf messages and rayft's Python types (spec, job, event)."""

from __future__ import annotations

import json
from typing import Any

from ray_jobs.spec import FineTuneSpec
from service._gen.rayft.v1 import finetune_pb2 as pb
from service.states import JobState
from service.store import EventRecord, JobRecord

PROGRESS_FIELDS = [f.name for f in pb.Progress.DESCRIPTOR.fields]


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


def job_to_proto(job: JobRecord) -> pb.Job:
    return pb.Job(
        id=job.id,
        team=job.team,
        state=pb.JobState.Value(job.state.value),
        spec=spec_to_proto(job.spec),
        idempotency_key=job.idempotency_key,
        created_at=job.created_at,
        updated_at=job.updated_at,
        ray_submission_id=job.ray_submission_id,
        message=job.message,
        last_seq=job.last_seq,
        summary_json=json.dumps(job.summary) if job.summary else "",
    )


def state_from_proto(value: int) -> JobState:
    return JobState(pb.JobState.Name(value))


def event_to_proto(event: EventRecord) -> pb.JobEvent:
    message = pb.JobEvent(job_id=event.job_id, seq=event.seq, time=event.time)
    data = event.data
    if event.kind == "state":
        message.state.CopyFrom(pb.StateChange(state=pb.JobState.Value(data["state"]), message=data.get("message", "")))
    elif event.kind == "progress":
        message.progress.CopyFrom(pb.Progress(**{k: data[k] for k in PROGRESS_FIELDS if data.get(k) is not None}))
    elif event.kind == "phase":
        message.phase.CopyFrom(pb.Phase(phase=data["phase"], detail=data.get("detail", "")))
    elif event.kind == "failure":
        message.failure.CopyFrom(pb.Failure(errors=data["errors"]))
    elif event.kind == "diagnosis":
        message.diagnosis.CopyFrom(pb.Diagnosis(**data))
    elif event.kind == "summary":
        message.summary.CopyFrom(pb.Summary(json=json.dumps(data)))
    return message


def event_from_proto(message: pb.JobEvent) -> tuple[str, dict[str, Any]]:
    """``(kind, data)`` of a reported event (the server assigns its seq)."""
    kind = message.WhichOneof("payload")
    if kind == "progress":
        return kind, message_to_dict(message.progress) | {"checkpoint": message.progress.checkpoint}
    if kind == "phase":
        return kind, {"phase": message.phase.phase, "detail": message.phase.detail}
    if kind == "failure":
        return kind, {"errors": dict(message.failure.errors)}
    if kind == "diagnosis":
        return kind, message_to_dict(message.diagnosis)
    if kind == "summary":
        return kind, json.loads(message.summary.json)
    raise ValueError(f"a job cannot report {kind!r} events")


def progress_from_metrics(metrics: dict[str, Any]) -> dict[str, Any]:
    """A Ray Train report's metrics as Progress fields, with the ETA from the step time."""
    data = {k: metrics[k] for k in PROGRESS_FIELDS if metrics.get(k) is not None}
    if metrics.get("step_time_s") and metrics.get("total_steps"):
        data["eta_s"] = (metrics["total_steps"] - metrics.get("step", 0)) * metrics["step_time_s"]
    return data
