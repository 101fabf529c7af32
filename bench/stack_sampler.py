"""Every thread of a training worker, sampled with py-spy as often as a dump returns: where each thread was, whether
it was running, and which one held the GIL, each sample stamped with the host's clock.

    python3 bench/stack_sampler.py OUT.jsonl.gz --match '^ray::(WarmWorker|RayTrainWorker)' [--every 0.05] [--for 600]

Waits for a process whose command line's first word matches ``--match`` (a regular expression), then samples each one
that matches until none is left, ``--for`` seconds or ``--samples`` samples pass, or it is killed (SIGTERM). One JSON
line a sample: ``{"t": epoch s, "took": s, "pid": ..., "threads": [{"name", "active", "gil", "frames":
["file:function", ... innermost first]}]}``; a thread that is idle and does not hold the GIL keeps only its name, so a
sample stays a few kB. ``bench/host_steps.py`` sets the samples beside the job's steps.

Why not ``py-spy record``: its speedscope and raw files drop when a sample was taken and whether its thread was
running, and its chrome trace joins a thread's samples across the times it slept (py-spy 0.4.3). A ``dump --json`` has
both, with the GIL's holder. On an H100's host a dump of the 7B worker took 14 ms (the median), so a step of 3.5 s got
36-50 samples; ``--nonblocking`` leaves the worker running while it is read, so the sampler does not make the pauses it
looks for, and one dump in five failed there because a stack changed under the read (counted, not kept).
"""

from __future__ import annotations

import argparse
import gzip
import json
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path


def py_spy() -> str:
    """py-spy beside this Python (a venv's), on the PATH, or in the device bundle's unpacked site (/tmp/site)."""
    beside = Path(sys.executable).with_name("py-spy")
    if beside.is_file():
        return str(beside)
    found = shutil.which("py-spy") or next((str(p) for p in Path("/tmp/site").rglob("py-spy") if p.is_file()), None)
    if found is None:
        raise SystemExit("py-spy not found: GPU_EXTRA=py-spy ../shared/device/make-bundle.sh puts it in the bundle")
    return found


def matching(pattern: str) -> list[int]:
    """The processes whose first word of their command line matches ``pattern``: a Ray worker's title
    (``ray::WarmWorker.run``), never a shell or this sampler that only carries the pattern as an argument."""
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            first = cmdline.read_bytes().split(b"\0")[0].decode(errors="replace")
        except OSError:  # it ended between the listing and the read
            continue
        if re.search(pattern, first):
            found.append(int(cmdline.parent.name))
    return sorted(found)


def compact(thread: dict) -> dict:
    """One thread of a dump, frames only where it ran or held the GIL."""
    kept = {"name": thread.get("thread_name") or str(thread["thread_id"]), "active": thread["active"], "gil": thread["owns_gil"]}
    if thread["active"] or thread["owns_gil"]:
        kept["frames"] = [f"{f['short_filename']}:{f['name']}" for f in thread["frames"]]
    return kept


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--match", required=True, help="a regular expression the first word of their command line matches")
    parser.add_argument("--every", type=float, default=0.05, help="seconds between the starts of two samples, at least")
    parser.add_argument("--for", dest="limit", type=float, default=600.0, help="seconds to sample, at most")
    parser.add_argument("--samples", type=int, default=None, help="samples to take, at most")
    args = parser.parse_args()
    spy, until = py_spy(), time.time() + args.limit
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # a kill ends the file whole: the gzip stream is closed
    pids: list[int] = []
    while not pids and time.time() < until:
        pids = matching(args.match)
        time.sleep(0.2)
    print(f"sampling {pids} ({args.match})", flush=True)
    samples = failed = 0
    with gzip.open(args.out, "wt") as out:
        while pids and time.time() < until and (args.samples is None or samples < args.samples):
            started = time.time()
            for pid in pids:
                before = time.time()
                done = subprocess.run(
                    [spy, "dump", "--pid", str(pid), "--nonblocking", "--json"], capture_output=True, text=True, check=False
                )
                after = time.time()
                if done.returncode != 0:  # the process ended, or a stack changed under the read: counted, not kept
                    failed += 1
                    continue
                threads = [compact(t) for t in json.loads(done.stdout)]
                out.write(json.dumps({"t": (before + after) / 2, "took": after - before, "pid": pid, "threads": threads}) + "\n")
                samples += 1
            time.sleep(max(0.0, args.every - (time.time() - started)))
            pids = matching(args.match)
    print(f"{samples} samples, {failed} failed dumps -> {args.out}", flush=True)


if __name__ == "__main__":
    main()
