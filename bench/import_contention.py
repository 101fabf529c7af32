"""What a new Ray worker process's imports cost on this host, alone and beside others doing the same.

    .venv/bin/python bench/import_contention.py --procs 1,2 --runs 2                    # 2 cores, about 30 s
    source .gpu/env.sh && export PYTHONPATH=$PWD:$PYTHONPATH && python3 -u bench/import_contention.py   # H200 host

Why: in a new job a fill's first tokenizer task waits for worker processes that start and import Ray Data
(``bench/fill_start.py``: 2.3-3.1 s of imports on the H200 host while 14 actors did the same). Whether that is the
imports' own cost on that host or the processes crowding each other decides the lever: fewer processes at once, or
none of ours. Each child is a bare ``python`` that imports what a fill's worker imports (``ray``, then Ray Data's
actor-pool operator, whose ``ray.data`` pulls in pandas) and reports each step's wall and CPU seconds; ``--procs``
children start at once. The wall beyond the CPU is waiting: for a core, for the disk, or for the kernel.
Writes ``--out`` (``bench/out/import_contention.json``) and prints one row per ``--procs`` value.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

OUT = Path(__file__).resolve().parent / "out"
CHILD = """
import json, sys, time
began = time.time(); cpu0 = time.process_time()
steps = {"start": (began - float(sys.argv[1]), cpu0)}
for name in sys.argv[2:]:
    w, c = time.perf_counter(), time.process_time()
    __import__(name)
    steps[name] = (time.perf_counter() - w, time.process_time() - c)
print(json.dumps(steps))
"""
MODULES = ("pandas", "ray", "ray.data._internal.execution.operators.actor_pool_map_operator")
"""pandas first, on its own: ``ray.data``'s ``__init__`` imports it ("a hard dependency"), 77% of that import here."""


def one_round(procs: int) -> list[dict[str, tuple[float, float]]]:
    spawned = time.time()
    children = [
        subprocess.Popen([sys.executable, "-c", CHILD, str(spawned), *MODULES], stdout=subprocess.PIPE, text=True)
        for _ in range(procs)
    ]
    out = []
    for child in children:
        stdout, _ = child.communicate()
        if child.returncode:
            sys.exit(f"an importing child failed ({child.returncode})")
        out.append(json.loads(stdout))
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--procs", default="1,4,8,16", help="children that import at once, in turn")
    parser.add_argument("--runs", type=int, default=3, help="rounds for each --procs value, interleaved")
    parser.add_argument("--out", default=str(OUT / "import_contention.json"))
    args = parser.parse_args()
    counts = [int(v) for v in args.procs.split(",")]
    one_round(1)  # the page cache: every later round reads the same files from memory
    rounds: dict[int, list[dict]] = {n: [] for n in counts}
    for _ in range(args.runs):
        for n in counts:
            rounds[n].extend(one_round(n))
    steps = ["start", *MODULES]
    print(f"{os.cpu_count()} CPUs; seconds per child, median (max) wall / median CPU")
    print("at once | " + " | ".join(s.split(".")[-1] for s in steps) + " | all")
    table = {}
    for n, children in rounds.items():
        cells, row = [], {}
        for step in steps:
            walls = [c[step][0] for c in children]
            cpus = [c[step][1] for c in children]
            row[step] = {"wall_median": statistics.median(walls), "wall_max": max(walls), "cpu_median": statistics.median(cpus)}
            cells.append(f"{statistics.median(walls):.2f} ({max(walls):.2f}) / {statistics.median(cpus):.2f}")
        total = [sum(c[s][0] for s in steps) for c in children]
        row["all_wall_median"] = statistics.median(total)
        table[n] = row
        print(f"{n:7d} | " + " | ".join(cells) + f" | {statistics.median(total):.2f}")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(
        json.dumps({"cpus": os.cpu_count(), "modules": MODULES, "runs": args.runs, "table": table}, indent=2)
    )


if __name__ == "__main__":
    main()
