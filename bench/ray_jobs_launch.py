"""What Ray Jobs alone adds before a job's code runs: a bare ``python -c`` entrypoint submitted ROUNDS times to a
running cluster's Jobs API, and how long after the submit call began its Python printed the time (Ray's job
supervisor actor, its shell, the interpreter's start). The service's jobs pay this before their driver starts
(``bench/service_7b.sh``: the driver claims its spec about 3 s after CreateJob on an H100 host).

    ray start --head --num-cpus 4 --include-dashboard=true --dashboard-host=127.0.0.1
    python bench/ray_jobs_launch.py [--address http://127.0.0.1:8265] [--rounds 4]
"""

from __future__ import annotations

import argparse
import re
import sys
import time


def main() -> None:
    from ray.job_submission import JobSubmissionClient

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--address", default="http://127.0.0.1:8265")
    parser.add_argument("--rounds", type=int, default=4)
    args = parser.parse_args()
    client = JobSubmissionClient(args.address)
    for _ in range(args.rounds):
        began = time.time()
        job = client.submit_job(entrypoint=f"{sys.executable} -c 'import time; print(\"ran at\", time.time())'")
        submitted = time.time()
        while client.get_job_status(job).value not in ("SUCCEEDED", "FAILED", "STOPPED"):
            time.sleep(0.05)
        ended = time.time()
        ran = re.search(r"ran at (\d+\.\d+)", client.get_job_logs(job))
        ran_s = f"{float(ran[1]) - began:.2f} s" if ran else "(no output)"
        print(
            f"submit call {submitted - began:.2f} s; the entrypoint's Python ran {ran_s} after; "
            f"SUCCEEDED seen {ended - began:.2f} s after"
        )


if __name__ == "__main__":
    main()
