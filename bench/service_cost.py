"""What one call costs the service: its CPU time per GetJob, per refused CreateJob and WatchJob (a team at its
quotas), and per event sent to a watch stream.

    .venv/bin/python bench/service_cost.py            # about 1 minute on 2 cores

A real `rayft serve` on loopback (launches paused, the default quotas), pinned to one core and this client
to the other. Each figure is the server process's CPU seconds (utime + stime, from /proc) over N calls,
divided by N: a cost, not a latency, so it does not depend on what else the machine runs. Writes
bench/out/service_cost.json.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

import grpc

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.service_bench import SPEC, start_server  # noqa: E402
from bench.tenant_bench import cpu_seconds, pin  # noqa: E402
from rayft.client import Client  # noqa: E402
from rayft_contract.spec import FineTuneSpec  # noqa: E402
from rayft_contract.v1 import finetune_pb2 as pb  # noqa: E402
from rayft_contract.v1 import finetune_pb2_grpc as pb_grpc  # noqa: E402
from service import auth  # noqa: E402
from service.store_sqlite import SqliteJobStore  # noqa: E402

CALLS = 300
STREAMS = 32
EVENTS = 200


def per_call_ms(pid: int, call, n: int = CALLS) -> float:  # noqa: ANN001
    for _ in range(20):
        call()  # warm up
    before = cpu_seconds(pid)
    for _ in range(n):
        call()
    return 1000 * (cpu_seconds(pid) - before) / n


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        data_dir = Path(tmp) / "service"
        data_dir.mkdir()
        store = SqliteJobStore(data_dir / "jobs.db")
        token = auth.new_token()
        store.add_token("team", auth.hash_token(token))
        proc, address = start_server(data_dir, quotas=True)
        if len(os.sched_getaffinity(0)) >= 2:
            pin(proc.pid, {0})
            pin(os.getpid(), {1})
        try:
            client = Client(address, token)
            jobs = [client.submit(FineTuneSpec.from_dict({**SPEC, "name": f"j{i}"})) for i in range(4)]  # the quota
            more = FineTuneSpec.from_dict({**SPEC, "name": "more"})
            open_streams = [client.open_watch(jobs[0].id) for _ in range(STREAMS)]  # the quota
            delivered = [0]

            def drain(stream) -> None:  # noqa: ANN001
                try:
                    for _ in stream:
                        delivered[0] += 1
                except grpc.RpcError:
                    pass  # cancelled at the end

            for stream in open_streams:
                threading.Thread(target=drain, args=(stream,), daemon=True).start()

            def refused(call) -> None:  # noqa: ANN001
                try:
                    call()
                except grpc.RpcError as exc:
                    assert exc.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, exc
                    return
                raise AssertionError("not refused")

            result = {
                "GetJob": per_call_ms(proc.pid, lambda: client.get(jobs[1].id)),
                "CreateJob refused (team at its active-job quota)": per_call_ms(
                    proc.pid, lambda: refused(lambda: client.submit(more))
                ),
                "WatchJob refused (team at its stream quota)": per_call_ms(
                    proc.pid, lambda: refused(lambda: client.open_watch(jobs[0].id))
                ),
            }
            report_token = auth.new_token()
            store.update(jobs[0].id, report_token_hash=auth.hash_token(report_token))
            reporter = pb_grpc.JobReportingStub(grpc.insecure_channel(address))
            seq = iter(range(1, 10**9))

            def report() -> None:
                n = next(seq)
                event = pb.JobEvent(progress=pb.Progress(step=n, total_steps=10**6))
                reporter.Report(
                    pb.ReportRequest(job_id=jobs[0].id, report_seq=n, event=event),
                    metadata=[("authorization", f"Bearer {report_token}")],
                )

            time.sleep(1.0)  # every stream connected
            sent = delivered[0]
            per_event = per_call_ms(proc.pid, report, EVENTS)
            time.sleep(1.0)  # the last events out
            result[f"Report of one event, fanned out to {STREAMS} streams"] = per_event
            result["events delivered to the streams (warm-up included)"] = delivered[0] - sent
            for stream in open_streams:
                stream.cancel()
        finally:
            proc.terminate()
            proc.wait(30)
            store.close()
    for name, value in result.items():
        print(f"{name}: {value:.2f} ms of server CPU" if isinstance(value, float) else f"{name}: {value}")
    out = ROOT / "bench" / "out"
    out.mkdir(exist_ok=True)
    (out / "service_cost.json").write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
