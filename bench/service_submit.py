"""Time to the first step through the service, as a team sees it (issue 12): a spec submitted to a running ``rayft
serve`` RUNS times, each job's events followed to its end, the warm pool's worker waited for between runs.

For each run it records when (client's clock, from the CreateJob call) the job was stored, each state and phase event
came, the first step's report came, and the job ended; and the job's own phase table, from its summary event. What
the service adds to the job's own start is the gap from CreateJob to the job's ``connect`` phase: the reconciler's
pass, Ray Jobs' supervisor and the job driver's Python start. Prints one column per run; ``--out`` writes them all.

    RAYFT_ADDRESS=127.0.0.1:50051 RAYFT_TOKEN=... python bench/service_submit.py SPEC.yaml --runs 3 \\
        [--set model.path=/models/x ...] [--warm-wait 300] [--out runs.json]

``--warm-wait S``: after each run, wait up to S seconds for the warm pool on the cluster this machine runs
(``ray.init(address="auto")``) to hold a worker whose imports are done, as ``bench/startup_7b.sh`` does: a team's
next run comes minutes later. 0 (the default) waits for nothing.
``bench/service_7b.sh`` runs it on a lent GPU against the 7B preset.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rayft.client import Client  # noqa: E402
from rayft_contract.convert import event_from_proto  # noqa: E402
from rayft_contract.phases import Phase  # noqa: E402
from rayft_contract.records import JobPhase, JobSummary, Progress, StateChange  # noqa: E402
from rayft_contract.spec import FineTuneSpec  # noqa: E402
from rayft_contract.states import JobState  # noqa: E402


@dataclasses.dataclass
class Run:
    """One submitted job, as its team saw it: seconds after the CreateJob call began."""

    name: str
    job_id: str = ""
    submitted_at: float = 0.0
    """When the CreateJob call began (Unix seconds): Ray's own times of the job (its Jobs API) compare with it."""
    created_s: float = 0.0
    marks: dict[str, float] = dataclasses.field(default_factory=dict)
    """The first time each state (``state:RUNNING``) and phase (``phase:connect``) event came."""
    first_step_s: float | None = None
    """The first report of a step (``train.log_every: 1`` makes it step 1's)."""
    first_step_stored_s: float | None = None
    """When the service stored that report (the event's ``time``): the rest, to ``first_step_s``, is the way from
    the service's store to the team's stream."""
    end_s: float | None = None
    state: str = ""
    setup: dict | None = None
    """The worker's own set-up times (``SetupTimes``, from its first report in the run's ``metrics.jsonl``, which
    this bench reads where the job wrote it: the wire does not carry them): its process's start, its imports' end,
    its base's load."""
    summary: dict | None = None
    """The job's summary event (``JobSummary``): its phase table, its own time to the first step."""
    step_s: list[float] = dataclasses.field(default_factory=list)
    """Each report's seconds a step, in order, from ``metrics.jsonl``: what a change beside training (a write, a
    compile) costs the steps it runs beside. A report carries the steps that ended before it, so with
    ``train.log_every: 1`` the first is 0 (no step ended yet) and the one at index ``i`` is step ``i``'s; the last
    step's time comes in the closing report, which has no loss and is not listed."""


def follow(client: Client, spec: FineTuneSpec) -> Run:
    run = Run(spec.name)
    run.submitted_at = began = time.time()
    job = client.submit(spec)
    run.job_id, run.created_s = job.id, time.time() - began
    for message in client.watch(job.id):
        if not message.WhichOneof("payload"):
            continue
        at = time.time() - began
        event = event_from_proto(message)
        if event.kind == "state":
            run.state = StateChange.from_dict(event.data).state
            run.marks.setdefault(f"state:{run.state}", at)
            if JobState(run.state).is_terminal:
                run.end_s = at
        elif event.kind == "phase":
            run.marks.setdefault(f"phase:{JobPhase.from_dict(event.data).phase}", at)
        elif event.kind == "progress" and run.first_step_s is None and Progress.from_dict(event.data).step >= 1:
            run.first_step_s, run.first_step_stored_s = at, message.time - began
        elif event.kind == "summary":
            run.summary = JobSummary.from_dict(event.data).to_dict()
            run.marks.setdefault("summary", at)
        if run.end_s is not None and run.summary is not None:
            break
    metrics = Path(job.spec.output.dir) / spec.name / "metrics.jsonl"
    if metrics.is_file():
        lines = metrics.read_text().splitlines()
        reports = [Progress.from_dict(e) for e in map(json.loads, lines) if e["kind"] == "progress"]
        run.setup = next((r.setup.to_dict() for r in reports if r.setup is not None), None)
        run.step_s = [round(r.step_time_s, 3) for r in reports if r.loss is not None and r.step_time_s is not None]
    return run


def wait_for_warm_worker(seconds: float) -> str:
    """The pool's state once it holds a ready worker (or the wait ran out), from a process of its own: this one
    stays off the cluster, as a team's client is."""
    done = subprocess.run(
        [sys.executable, str(Path(__file__).with_name("warm_ready.py")), str(seconds)], capture_output=True, text=True
    )
    return (done.stdout.strip().splitlines() or [done.stderr.strip()[-300:]])[-1]


def table(runs: list[Run]) -> str:
    width = max(12, *(len(r.name) + 2 for r in runs))
    lines = [f"{'seconds after CreateJob':44s}" + "".join(f"{r.name:>{width}s}" for r in runs)]

    def row(label: str, values: list[float | None]) -> None:
        lines.append(f"{label[:44]:44s}" + "".join(f"{v:{width}.1f}" if v is not None else f"{'-':>{width}s}" for v in values))

    row("job stored (CreateJob returned)", [r.created_s for r in runs])
    for mark in ("state:STARTING", "phase:connect", "state:RUNNING", "phase:training"):
        row(mark, [r.marks.get(mark) for r in runs])
    setups = [r.setup or {} for r in runs]
    for label, field in (("worker process started", "process_start_ts"), ("worker's imports done", "worker_start_ts")):
        row(label, [s[field] - r.submitted_at if s.get(field) else None for s, r in zip(setups, runs, strict=True)])
    row("  of which its base's load (s)", [s.get("model_load_s") for s in setups])
    row(
        "worker's loop began",
        [s["loop_start_ts"] - r.submitted_at if s.get("loop_start_ts") else None for s, r in zip(setups, runs, strict=True)],
    )
    row("first step stored by the service", [r.first_step_stored_s for r in runs])
    row("first step reported", [r.first_step_s for r in runs])
    row("summary (the adapter written)", [r.marks.get("summary") for r in runs])
    row("ended (SUCCEEDED: Ray's status of the driver)", [r.end_s for r in runs])
    lines.append("the job's own phase table (its summary):")
    summaries = [r.summary or {} for r in runs]
    for phase in Phase:
        values = [s.get("timing", {}).get("phases", {}).get(phase.value, 0.0) for s in summaries]
        if any(abs(v) >= 0.05 for v in values):
            row(f"  {phase.label}", values)
    row("  time to first step (the job's count)", [s.get("time_to_first_step_s") for s in summaries])
    row("  wall time (the job's count)", [s.get("wall_time_s") for s in summaries])
    lines.append(f"{'state':44s}" + "".join(f"{r.state:>{width}s}" for r in runs))
    for field in ("worker", "quantized_base"):
        words = [(s.get(field) or "-").split(":")[0].split("(")[0].strip()[: width - 1] for s in summaries]
        lines.append(f"{field.replace('_', ' '):44s}" + "".join(f"{w:>{width}s}" for w in words))
    lines.append(f"{'final loss':44s}" + "".join(f"{s.get('final_loss') or 0:{width}.4f}" for s in summaries))
    for r, s in zip(runs, summaries, strict=True):
        lines.append(f"{r.name}: quantized base: {s.get('quantized_base') or '-'}; seconds a step: {r.step_s}")
        lines.append(f"{r.name}: worker: {s.get('worker') or '-'}")  # a base loaded before the job: its seconds
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("spec")
    parser.add_argument("--set", action="append", default=[], help="spec overrides, as `rayft submit --set`")
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument(
        "--each",
        action="append",
        default=[],
        help="KEY=A,B,...: run i sets KEY to the i-th value (cycled), e.g. quantization.cache=true,false: one host, interleaved",
    )
    parser.add_argument("--warm-wait", type=float, default=0.0)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()

    each = [(key, values.split(",")) for key, values in (e.split("=", 1) for e in args.each)]
    client = Client()
    runs = []
    for number in range(1, args.runs + 1):
        varied = [f"{key}={values[(number - 1) % len(values)]}" for key, values in each]
        spec = FineTuneSpec.load(args.spec, [*args.set, *varied, f"name=service-{number}"]).with_absolute_paths(output=False)
        if varied:
            print(f"run {number}: {' '.join(varied)}", flush=True)
        run = follow(client, spec)
        runs.append(run)
        first = f"{run.first_step_s:.1f}" if run.first_step_s is not None else "-"
        print(f"run {number}: {run.job_id} {run.state}, first step {first} s after CreateJob", flush=True)
        if args.warm_wait and number < args.runs:
            waited = time.time()
            print(f"  {wait_for_warm_worker(args.warm_wait)} ({time.time() - waited:.0f} s)", flush=True)
    print(table(runs))
    if args.out:
        args.out.write_text(json.dumps([dataclasses.asdict(r) for r in runs], indent=1))
    sys.exit(0 if all(r.state == "SUCCEEDED" for r in runs) else 1)


if __name__ == "__main__":
    main()
