"""How fast the rayft service answers CreateJob, and how many WatchJob streams one process holds.

    .venv/bin/python bench/service_bench.py                      # about 3 minutes on 2 cores
    .venv/bin/python bench/service_bench.py --streams 100,500 --creates 200

Starts a real `rayft serve` process on loopback (SQLite in a temp dir) with launches paused
(RAYFT_LAUNCH_PAUSED=1): jobs are validated, stored and queued but none runs, so this measures the
service, not Ray. Then:
1. CreateJob latency, sequential and from 16 concurrent clients (p50/p99).
2. For each stream count K: K concurrent WatchJob streams on one job, while a fake job reports 20
   progress events (5 a second) through JobReporting; delay = when a stream received an event minus
   when the report was sent. A count "holds" if every stream got every event and p99 delay < 1 s.
Writes bench/out/service_bench.json and bench/out/service_streams.png.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from rayft.client import Client  # noqa: E402
from rayft.local_service import wait_ready  # noqa: E402
from rayft_contract.spec import FineTuneSpec  # noqa: E402
from rayft_contract.v1 import finetune_pb2 as pb  # noqa: E402
from rayft_contract.v1 import finetune_pb2_grpc as pb_grpc  # noqa: E402
from service import auth  # noqa: E402
from service.store_sqlite import SqliteJobStore  # noqa: E402

SPEC = {"model": {"path": "org/model"}, "data": {"path": "/data/train.jsonl"}, "train": {"max_steps": 10}}
REPORT_SEQ = itertools.count(1)


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


def start_server(data_dir: Path, quotas: bool = False, extra_env: dict[str, str] | None = None) -> tuple[subprocess.Popen, str]:
    """``quotas``: the service's default per-team quotas; without, limits so high that this bench measures
    the process's own capacity. ``extra_env``: more RAYFT_* settings."""
    policy = data_dir / "policy.yaml"  # the bench's specs read /data and the hub id org/model
    policy.write_text(f"default: {{output_root: '{data_dir.parent}/outputs/{{team}}', data: [/data], hub_models: ['org/*']}}\n")
    env = {
        **os.environ,
        "RAYFT_POLICY": str(policy),
        "RAYFT_DATA_DIR": str(data_dir),
        "RAYFT_PORT": "0",
        "RAYFT_LAUNCH_PAUSED": "1",
        "RAYFT_RAY_ADDRESS": "http://127.0.0.1:9",
    }
    if not quotas:
        env.update(RAYFT_MAX_ACTIVE_JOBS="1000000", RAYFT_MAX_STREAMS="1000000", RAYFT_MAX_STREAMS_PER_TEAM="1000000")
    env.update(extra_env or {})
    log = data_dir / "server.log"
    with log.open("w") as out:
        proc = subprocess.Popen([sys.executable, "-m", "rayft", "serve"], env=env, stdout=out, stderr=subprocess.STDOUT)
    return proc, wait_ready(proc, log, 0, 60)


def bench_creates(address: str, token: str, n: int) -> dict:
    client = Client(address, token)

    def create(i: int) -> float:
        t0 = time.perf_counter()
        client.submit(FineTuneSpec.from_dict({**SPEC, "name": f"bench-{i}-{time.time_ns()}"}))
        return time.perf_counter() - t0

    for i in range(20):
        create(i)  # warm up
    sequential = [create(i) for i in range(n)]
    with ThreadPoolExecutor(16) as pool:
        t0 = time.perf_counter()
        concurrent = list(pool.map(create, range(n)))
        wall = time.perf_counter() - t0
    ms = lambda xs, q: round(1000 * pct(xs, q), 2)  # noqa: E731
    return {
        "sequential_p50_ms": ms(sequential, 0.5),
        "sequential_p99_ms": ms(sequential, 0.99),
        "concurrent16_p50_ms": ms(concurrent, 0.5),
        "concurrent16_p99_ms": ms(concurrent, 0.99),
        "concurrent16_creates_per_s": round(n / wall, 1),
        "n": n,
    }


async def bench_streams(address: str, token: str, job_id: str, job_token: str, k: int, events: int = 20) -> dict:
    metadata = [("authorization", f"Bearer {token}")]
    sent: dict[int, float] = {}
    delays: list[float] = []
    received = [0] * k
    finding = Client(address, token)  # the API port names where streams are served (the watch process)
    finding.open_watch(job_id).cancel()
    watch_address = finding.watch_address
    finding.close()
    async with grpc.aio.insecure_channel(address) as channel, grpc.aio.insecure_channel(watch_address) as watch_channel:
        stub, watch_stub = pb_grpc.FineTuningStub(channel), pb_grpc.FineTuningStub(watch_channel)
        start_seq = (await stub.GetJob(pb.GetJobRequest(job_id=job_id), metadata=metadata)).last_seq
        ready = asyncio.Semaphore(0)

        async def watch(i: int) -> None:
            call = watch_stub.WatchJob(pb.WatchJobRequest(job_id=job_id, after_seq=start_seq), metadata=metadata)
            ready.release()
            try:
                await follow(i, call)
            except (grpc.aio.AioRpcError, asyncio.CancelledError):
                pass  # cancelled at the end, or by the 30 s limit: counted as incomplete

        async def follow(i: int, call) -> None:
            async for event in call:
                if event.WhichOneof("payload") == "progress" and event.progress.step in sent:
                    delays.append(time.perf_counter() - sent[event.progress.step])
                    received[i] += 1
                    if received[i] == events:
                        call.cancel()
                        return

        tasks = [asyncio.create_task(watch(i)) for i in range(k)]
        for _ in range(k):
            await ready.acquire()
        await asyncio.sleep(1.0)  # let every stream reach the server
        reporter = pb_grpc.JobReportingStub(channel)
        for _ in range(events):
            tag = next(REPORT_SEQ)  # the service takes only the next number: one count across all rounds
            sent[tag] = time.perf_counter()
            request = pb.ReportRequest(
                job_id=job_id, report_seq=tag, event=pb.JobEvent(progress=pb.Progress(step=tag, total_steps=events))
            )
            await reporter.Report(request, metadata=[("authorization", f"Bearer {job_token}")])
            await asyncio.sleep(0.2)
        done, pending = await asyncio.wait(tasks, timeout=30)
        for task in pending:
            task.cancel()
    complete = sum(r == events for r in received)
    return {
        "streams": k,
        "complete_streams": complete,
        "events_per_stream": events,
        "delay_p50_ms": round(1000 * pct(delays, 0.5), 1) if delays else None,
        "delay_p99_ms": round(1000 * pct(delays, 0.99), 1) if delays else None,
        "delay_max_ms": round(1000 * max(delays), 1) if delays else None,
        "holds": complete == k and bool(delays) and pct(delays, 0.99) < 1.0,
    }


def plot(results: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ks = [r["streams"] for r in results]
    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.plot(ks, [r["delay_p50_ms"] for r in results], "o-", label="p50")
    ax.plot(ks, [r["delay_p99_ms"] for r in results], "s-", label="p99")
    ax.axhline(1000, color="red", linestyle="--", linewidth=1, label="1 s budget")
    ax.set_xlabel("concurrent WatchJob streams (one server process)")
    ax.set_ylabel("event delay (ms)")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_title("rayft service: event delay vs. open streams (2-core machine)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--creates", type=int, default=300)
    parser.add_argument("--streams", default="10,100,500,1000,2000,4000")
    args = parser.parse_args()
    out = ROOT / "bench" / "out"
    out.mkdir(exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        data_dir = Path(tmp)
        store = SqliteJobStore(data_dir / "jobs.db")
        token = auth.new_token()
        store.add_token("bench", auth.hash_token(token))
        proc, address = start_server(data_dir)
        try:
            creates = bench_creates(address, token, args.creates)
            print("CreateJob:", json.dumps(creates))
            job = Client(address, token).submit(FineTuneSpec.from_dict({**SPEC, "name": "bench-watch"}))
            job_token = auth.new_token()
            store.update(job.id, report_token_hash=auth.hash_token(job_token))
            streams = []
            for k in [int(x) for x in args.streams.split(",")]:
                result = asyncio.run(bench_streams(address, token, job.id, job_token, k))
                print("WatchJob:", json.dumps(result))
                streams.append(result)
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=60)
            store.close()
    (out / "service_bench.json").write_text(json.dumps({"create_job": creates, "watch_streams": streams}, indent=2))
    plot(streams, out / "service_streams.png")
    held = [r["streams"] for r in streams if r["holds"]]
    print(f"most streams held with p99 delay < 1 s: {max(held) if held else 0}; median create {creates['sequential_p50_ms']} ms")


if __name__ == "__main__":
    main()
