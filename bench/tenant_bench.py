"""Does one team at its limits slow another? And how much memory do the largest allowed lists take?

    .venv/bin/python bench/tenant_bench.py            # about 2 minutes on 2 cores

Starts a real `rayft serve` on loopback with launches paused and the default per-team quotas in force
(4 active jobs, 32 watch streams per team, 1,000 in all; --team-streams changes the 32). Team "quiet" makes the same calls twice,
N times each, one after another (GetJob, ListJobs of 50, CreateJob + CancelJob), and we take p50/p99:
1. on an idle service;
2. while team "noisy" (a process of its own) sits at its limits: 4 active jobs, all its watch streams open and fed (one of its
   jobs reports 5 progress events a second, so every event goes out once per stream), a ListJobs of its
   largest page every 100 ms, and CreateJob and one stream more attempted (and refused) 10 times a second.
Then the memory: team "big" gets 500 jobs with specs at the 64 KB limit (written straight into the
store), and 16 clients list them with page_size 500 at once, in the basic view and then the full one;
the server's peak resident memory (VmHWM) is read before and after.

The server runs on one core (``--server-cores``: more; its watch process too) and both clients on the
other (the noisy one at nice 19; on a larger machine each client gets a core of its own): on 2 cores, a
client's own work would otherwise pass for the server's slowness. ``--streams-in-process`` serves WatchJob
on the API's event loop (``RAYFT_WATCH_PROCESS=0``), as before the watch process, for the comparison.

Writes bench/out/tenant_bench.json and bench/out/tenant_isolation.png. The claim to check: the quiet
team's p99 under load within 2x of idle.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import signal
import sys
import tempfile
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.service_bench import SPEC, pct, start_server  # noqa: E402
from rayft.client import Client  # noqa: E402
from rayft_contract.spec import MAX_SPEC_BYTES, FineTuneSpec  # noqa: E402
from rayft_contract.states import JobState  # noqa: E402
from rayft_contract.v1 import finetune_pb2 as pb  # noqa: E402
from rayft_contract.v1 import finetune_pb2_grpc as pb_grpc  # noqa: E402
from service import auth  # noqa: E402
from service.store import JobRecord  # noqa: E402
from service.store_sqlite import SqliteJobStore  # noqa: E402

CALLS = ("GetJob", "ListJobs", "CreateJob+CancelJob")


def quiet_calls(client: Client, job_id: str, n: int, pace_s: float = 0.0) -> dict[str, list[float]]:
    """``n`` calls of each kind; ``pace_s``: the pause after each (0: back to back)."""
    spec = FineTuneSpec.from_dict({**SPEC, "name": "quiet"})
    timings: dict[str, list[float]] = {name: [] for name in CALLS}
    for _ in range(n):
        for name, call in (
            ("GetJob", lambda: client.get(job_id)),
            ("ListJobs", lambda: client._stub.ListJobs(pb.ListJobsRequest(page_size=50), metadata=client._metadata)),  # one page
            ("CreateJob+CancelJob", lambda: client.cancel(client.submit(spec).id)),
        ):
            t0 = time.perf_counter()
            call()
            timings[name].append(time.perf_counter() - t0)
            time.sleep(pace_s)
    return timings


class Noisy:
    """Team "noisy" at every limit it has, until stopped."""

    def __init__(self, address: str, token: str, store: SqliteJobStore, streams: int):
        self.client, self.stop, self.refused, self.streams_allowed = Client(address, token), threading.Event(), 0, streams
        self.jobs = [self.client.submit(FineTuneSpec.from_dict({**SPEC, "name": f"noisy-{i}"})) for i in range(4)]
        self.report_token = auth.new_token()
        store.update(self.jobs[0].id, report_token_hash=auth.hash_token(self.report_token))
        self.address, self.threads = address, []

    def start(self) -> None:
        self.streams = [self.client.open_watch(self.jobs[0].id) for _ in range(self.streams_allowed)]
        self.threads = [threading.Thread(target=self._drain, args=(s,), daemon=True) for s in self.streams]
        self.threads += [threading.Thread(target=target, daemon=True) for target in (self._report, self._list, self._over)]
        for thread in self.threads:
            thread.start()

    def _drain(self, stream) -> None:  # noqa: ANN001
        try:
            for _ in stream:
                pass
        except grpc.RpcError:
            pass  # cancelled at the end

    def _report(self) -> None:
        stub = pb_grpc.JobReportingStub(grpc.insecure_channel(self.address))
        metadata, seq = [("authorization", f"Bearer {self.report_token}")], 1
        while not self.stop.is_set():
            event = pb.JobEvent(progress=pb.Progress(step=seq, total_steps=10**6))
            stub.Report(pb.ReportRequest(job_id=self.jobs[0].id, report_seq=seq, event=event), metadata=metadata)
            seq += 1
            time.sleep(0.2)

    def _list(self) -> None:
        while not self.stop.is_set():
            list(self.client.list(page_size=500))
            time.sleep(0.1)

    def _over(self) -> None:
        spec = FineTuneSpec.from_dict({**SPEC, "name": "noisy-more"})
        while not self.stop.is_set():
            for attempt in (
                lambda: self.client.submit(spec),
                lambda: self.client.open_watch(self.jobs[0].id),
            ):
                try:
                    attempt()
                except grpc.RpcError as exc:
                    assert exc.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, exc
                    self.refused += 1
            time.sleep(0.1)

    def close(self) -> None:
        self.stop.set()
        for stream in self.streams:
            stream.cancel()


def run_noisy(address: str, token: str, data_dir: Path, streams: int, ready, stop, refused, core) -> None:  # noqa: ANN001
    """The noisy team, in a process of its own (its stream threads would otherwise share the quiet
    client's interpreter lock), on a core of its own where there is one, else beside the quiet client
    at lower priority: see ``pin``."""
    os.nice(19)
    if core is not None:
        os.sched_setaffinity(0, {core})
    store = SqliteJobStore(data_dir / "jobs.db")
    noisy = Noisy(address, token, store, streams)
    noisy.start()
    ready.set()
    stop.wait()
    noisy.close()
    refused.value = noisy.refused
    store.close()


def tree(pid: int) -> list[int]:
    """``pid`` and every process under it (the service's watch process, multiprocessing's tracker)."""
    pids, i = [pid], 0
    while i < len(pids):
        for tid in os.listdir(f"/proc/{pids[i]}/task"):
            pids += [int(c) for c in Path(f"/proc/{pids[i]}/task/{tid}/children").read_text().split()]
        i += 1
    return pids


def pin(pid: int, cpus: set[int]) -> None:
    """Every thread of ``pid`` and of the processes under it onto ``cpus``: the server on one core, the
    clients on the other, so the clients' own work (a real noisy team runs on its own machines) does not
    pass for the server's."""
    for each in tree(pid):
        for tid in os.listdir(f"/proc/{each}/task"):
            os.sched_setaffinity(int(tid), cpus)


def largest_spec() -> dict:
    """A valid spec just under MAX_SPEC_BYTES: a 32 KB chat template, 4 KB paths, 64 long module names."""
    from rayft_contract.convert import spec_to_proto

    spec = {
        **SPEC,
        "name": "big",
        "data": {"path": "/data/" + "d" * 4000, "chat_template": "{{ messages }}" + " " * 32700},
        "model": {"path": "org/" + "m" * 4000},
    }
    modules: list[str] = []
    while True:
        trial = {**spec, "lora": {"target_modules": [*modules, "x" * 300]}}
        if len(modules) == 64 or spec_to_proto(trial).ByteSize() > MAX_SPEC_BYTES:
            return {**spec, "lora": {"target_modules": modules or ["all-linear"]}}
        modules.append("x" * 300)


def cpu_seconds(pid: int) -> float:
    """CPU seconds of ``pid`` and the processes under it (the service's watch process)."""
    total = 0
    for each in tree(pid):
        fields = Path(f"/proc/{each}/stat").read_text().rsplit(")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])  # utime + stime
    return total / os.sysconf("SC_CLK_TCK")


def peak_rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmHWM")


def summarize(timings: dict[str, list[float]]) -> dict[str, dict[str, float]]:
    return {
        name: {"p50_ms": round(1000 * pct(v, 0.5), 2), "p99_ms": round(1000 * pct(v, 0.99), 2)} for name, v in timings.items()
    }


def plot(idle: dict, noisy: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 3.6))
    x = range(len(CALLS))
    width = 0.2
    for offset, (label, data, key, color) in enumerate(
        [
            ("idle p50", idle, "p50_ms", "#9ecae1"),
            ("idle p99", idle, "p99_ms", "#3182bd"),
            ("beside a team at its limits, p50", noisy, "p50_ms", "#fdae6b"),
            ("beside a team at its limits, p99", noisy, "p99_ms", "#e6550d"),
        ]
    ):
        ax.bar([i + (offset - 1.5) * width for i in x], [data[c][key] for c in CALLS], width, label=label, color=color)
    ax.set_xticks(list(x), CALLS)
    ax.set_ylabel("latency of the quiet team's call (ms)")
    ax.set_title("rayft service: one team at its quotas, another team's calls (2 cores)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", type=int, default=300, help="quiet-team calls of each kind, per phase")
    parser.add_argument("--team-streams", type=int, default=32, help="RAYFT_MAX_STREAMS_PER_TEAM (the noisy team opens all)")
    parser.add_argument(
        "--pace-ms",
        type=float,
        default=0.0,
        help="the quiet team's pause after each call (0: back to back, which alone keeps the server's core ~90%% busy)",
    )
    parser.add_argument(
        "--server-cores",
        type=int,
        default=1,
        help="cores the server (its API and watch processes) is pinned to; the quiet client gets the next, the "
        "noisy one the next after that where the machine has it (else it shares the quiet client's, at nice 19)",
    )
    parser.add_argument(
        "--streams-in-process",
        action="store_true",
        help="RAYFT_WATCH_PROCESS=0: WatchJob on the API's own event loop, as before the watch process",
    )
    parser.add_argument("--label", default="", help="also write bench/out/tenant_bench_LABEL.json")
    args = parser.parse_args()
    out = ROOT / "bench" / "out"
    out.mkdir(exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        data_dir = Path(tmp) / "service"
        data_dir.mkdir()
        store = SqliteJobStore(data_dir / "jobs.db")
        tokens = {team: auth.new_token() for team in ("quiet", "noisy", "big")}
        for team, token in tokens.items():
            store.add_token(team, auth.hash_token(token))
        proc, address = start_server(
            data_dir,
            quotas=True,
            extra_env={
                "RAYFT_MAX_STREAMS_PER_TEAM": str(args.team_streams),
                "RAYFT_WATCH_PROCESS": "0" if args.streams_in_process else "1",
            },
        )
        cores = sorted(os.sched_getaffinity(0))
        server_cores = set(cores[: args.server_cores])
        quiet_core = cores[args.server_cores] if len(cores) > args.server_cores else None
        noisy_core = cores[args.server_cores + 1] if len(cores) > args.server_cores + 1 else quiet_core
        if quiet_core is not None:
            pin(proc.pid, server_cores)
            pin(os.getpid(), {quiet_core})  # this process, and the noisy one it forks until it moves
        try:
            quiet = Client(address, tokens["quiet"])
            anchor = quiet.submit(FineTuneSpec.from_dict({**SPEC, "name": "quiet-anchor"}))
            quiet_calls(quiet, anchor.id, 60)  # warm up, and enough jobs that every list is a full page of 50
            cpu0, t0 = cpu_seconds(proc.pid), time.monotonic()
            idle = summarize(quiet_calls(quiet, anchor.id, args.calls, args.pace_ms / 1000))
            idle_cpu = (cpu_seconds(proc.pid) - cpu0) / (time.monotonic() - t0)
            print("idle:", json.dumps(idle), f"server CPU {idle_cpu:.0%}")
            ctx = multiprocessing.get_context("fork")
            ready, stop, refused = ctx.Event(), ctx.Event(), ctx.Value("i", 0)
            noisy = ctx.Process(
                target=run_noisy,
                args=(address, tokens["noisy"], data_dir, args.team_streams, ready, stop, refused, noisy_core),
            )
            noisy.start()
            ready.wait(120)
            time.sleep(2.0)  # every stream open, the reports flowing
            cpu0, t0 = cpu_seconds(proc.pid), time.monotonic()
            loaded = summarize(quiet_calls(quiet, anchor.id, args.calls, args.pace_ms / 1000))
            loaded_cpu = (cpu_seconds(proc.pid) - cpu0) / (time.monotonic() - t0)
            stop.set()
            noisy.join(60)
            print("beside noisy:", json.dumps(loaded), f"server CPU {loaded_cpu:.0%} (noisy refused {refused.value} times)")

            body, now = largest_spec(), time.time()
            for i in range(500):
                record = JobRecord(f"ft-big-{uuid.uuid4().hex[:10]}", "big", JobState.QUEUED, body, now + i, now + i)
                store.create(record)
            before = peak_rss_mb(proc.pid)
            big = Client(address, tokens["big"])

            def page(view: int) -> int:
                request = pb.ListJobsRequest(page_size=500, view=view)
                return len(big._stub.ListJobs(request, metadata=big._metadata).jobs)

            with ThreadPoolExecutor(16) as pool:  # 16 at once, of each view
                pages = list(pool.map(page, [pb.JOB_VIEW_BASIC] * 16))
                full_pages = list(pool.map(page, [pb.JOB_VIEW_FULL] * 16))
            after = peak_rss_mb(proc.pid)
            spec_kb = len(json.dumps(body)) / 1024
            print(
                f"16 concurrent ListJobs of {spec_kb:.0f} KB specs: {pages[0]} jobs a page (basic), {full_pages[0]} "
                f"(full: a page stops at 1 MB); peak RSS {before:.0f} -> {after:.0f} MB"
            )
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=60)
            store.close()
    ratio = {c: round(loaded[c]["p99_ms"] / idle[c]["p99_ms"], 2) for c in CALLS}
    result = {
        "idle": idle,
        "beside_noisy_team": loaded,
        "p99_ratio": ratio,
        "noisy_refusals": refused.value,
        "server_cpu": {"idle": round(idle_cpu, 2), "beside_noisy_team": round(loaded_cpu, 2)},
        "largest_lists": {
            "spec_kb": round(spec_kb, 1),
            "jobs_per_page_basic": pages[0],
            "jobs_per_page_full": full_pages[0],
            "peak_rss_mb_before": round(before),
            "peak_rss_mb_after": round(after),
        },
    }
    result["team_streams"] = args.team_streams
    result["streams"] = "in the API process" if args.streams_in_process else "the watch process"
    result["server_cores"] = args.server_cores
    (out / "tenant_bench.json").write_text(json.dumps(result, indent=2))
    if args.label:
        (out / f"tenant_bench_{args.label}.json").write_text(json.dumps(result, indent=2))
    plot(idle, loaded, out / "tenant_isolation.png")
    print("p99 ratio (beside / idle):", json.dumps(ratio))


if __name__ == "__main__":
    main()
