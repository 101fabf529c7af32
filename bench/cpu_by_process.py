"""Where a host's CPU time goes while Ray Data fills the cache: CPU seconds by process role, and the cores' clock.

Issue 14: 14 tokenizer actors on a 16-core host did 9.1-9.6x one actor, while 14 bare tokenizer processes did 13.1x
one. Each actor's busy second held 31% fewer rows than one actor's alone. The question this answers is where the
other cores went (read, re-cut and write tasks, the driver, the raylet, the object store) and how much slower each
core ran with all of them busy (all-core turbo against one core's).

``sample OUT.jsonl``: every ``--every`` seconds, each process's CPU time (``/proc/PID/stat``) with its title (Ray
sets a worker's title to the task or actor it runs: ``ray::TokenizeAndPack.__call__``, ``ray::MapBatches(read_pieces)``),
the cores' mean clock (``/proc/cpuinfo``) and the time the hypervisor gave this VM's cores to others (steal, ``/proc/stat``).
Runs until killed.

``summary OUT.jsonl``: stretches of time numbered in order, each with how many tokenizer actors were busy in it (more
than half a core each: 1, 2-7, 8 or more), and for each, CPU seconds a wall second by role, the time stolen, and the
clock. Written by hand: psutil (not in the device's image)
would give the same counters; the roles are Ray's titles, which no tool groups.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import time
from pathlib import Path

TICKS = os.sysconf("SC_CLK_TCK")
ROLES = (
    ("this sampler", ("cpu_by_process.py",)),
    ("moto's S3 server", ("moto.server",)),  # the founding story's S3, on the same host (bench/s3_data_bench.py)
    ("tokenizer actor", ("TokenizeAndPack",)),
    ("read tasks", ("read_pieces", "ReadPieces", "FromItems")),
    ("re-cut (repartition)", ("Repartition", "repartition", "split")),
    ("write tasks", ("Write", "write")),
    ("rayft's row ledger", ("RowLedger",)),
    ("Ray Data's own actors", ("_StatsActor", "AutoscalingCoordinator", "ActorLocationTracker")),
    ("idle Ray worker", ("ray::IDLE",)),
    ("other Ray worker", ("ray::",)),
    ("raylet", ("raylet",)),
    ("gcs", ("gcs_server",)),
    ("object store / dashboard / agents", ("plasma", "dashboard", "agent", "log_monitor", "monitor.py")),
    # A Ray worker process before it takes Ray's title: starting up. (Sessions before 2026-12-04's thirteenth
    # counted these as the driver; it was 0.7-0.8 of a core of workers Ray restarted mid-fill, see local_ray.)
    ("Ray worker starting (no title yet)", ("ray/_private/workers/default_worker.py",)),
    ("driver (python)", ("python", "data_bench")),
)


def role_of(title: str) -> str:
    for role, marks in ROLES:
        if any(mark in title for mark in marks):
            return role
    return "other"


def snapshot() -> dict:
    procs = {}
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
            title = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:  # the process ended between the listing and the read
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        procs[pid] = [title[:80] or stat[stat.index("(") + 1 : stat.rindex(")")], (int(fields[11]) + int(fields[12])) / TICKS]
    cpu_line = Path("/proc/stat").read_text().splitlines()[0].split()  # cpu user nice system idle iowait irq softirq steal
    steal = int(cpu_line[8]) / TICKS if len(cpu_line) > 8 else 0.0
    mhz = [float(line.split(":")[1]) for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("cpu MHz")]
    return {"t": time.time(), "procs": procs, "steal": steal, "mhz": sum(mhz) / len(mhz) if mhz else None}


def sample(out: Path, every: float) -> None:
    with out.open("a") as f:
        while True:
            f.write(json.dumps(snapshot()) + "\n")
            f.flush()
            time.sleep(every)


def summary(path: Path) -> dict:
    snaps = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    groups: dict[str, dict] = collections.defaultdict(
        lambda: {"wall_s": 0.0, "steal": 0.0, "cpu": collections.Counter(), "titles": collections.Counter(), "mhz": []}
    )
    stretch, previous = 0, None
    for before, after in zip(snaps, snaps[1:]):
        wall = after["t"] - before["t"]
        used, titles = collections.Counter(), collections.Counter()
        busy_actors = 0
        for pid, (title, cpu) in after["procs"].items():
            was, cpu_before = before["procs"].get(pid, [title, cpu])
            delta = cpu - cpu_before
            if delta <= 0:
                continue
            if title.startswith("ray::IDLE") and not was.startswith("ray::IDLE"):
                title = was  # a worker that finished its task within the interval: the time was the task's
            role = role_of(title)
            used[role] += delta
            titles[title[:60]] += delta
            busy_actors += role == "tokenizer actor" and delta / wall > 0.5
        if busy_actors == 0:
            previous = None
            continue
        kind = "1 actor busy" if busy_actors == 1 else f"{'8+' if busy_actors >= 8 else '2-7'} actors busy"
        if kind != previous:  # a new stretch: each fill's steady part is one, its start and end are short ones
            stretch, previous = stretch + 1, kind
        key = f"{stretch:02d} {kind}"
        group = groups[key]
        group["wall_s"] += wall
        group["steal"] += after.get("steal", 0.0) - before.get("steal", 0.0)
        group["cpu"].update(used)
        group["titles"].update(titles)
        if after["mhz"]:
            group["mhz"].append(after["mhz"])
    return {
        key: {
            "wall_s": round(g["wall_s"], 1),
            "cores_by_role": {role: round(cpu / g["wall_s"], 2) for role, cpu in g["cpu"].most_common()},
            "cores_in_all": round(sum(g["cpu"].values()) / g["wall_s"], 2),
            "cores_stolen_by_the_hypervisor": round(g["steal"] / g["wall_s"], 2),
            "mean_mhz": round(sum(g["mhz"]) / len(g["mhz"])) if g["mhz"] else None,
            "top_titles": {title: round(cpu / g["wall_s"], 2) for title, cpu in g["titles"].most_common(12)},
        }
        for key, g in sorted(groups.items())
        if g["wall_s"] >= 3  # the ramps between a fill's stretches
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("mode", choices=("sample", "summary"))
    parser.add_argument("path", type=Path)
    parser.add_argument("--every", type=float, default=1.0)
    args = parser.parse_args()
    if args.mode == "sample":
        sample(args.path, args.every)
    else:
        print(json.dumps(summary(args.path), indent=1))


if __name__ == "__main__":
    main()
