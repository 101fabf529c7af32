"""Entrypoint of a job the rayft service submitted to Ray (``python -m ray_jobs.submitted``).

Reads what the service put in the job's environment (``RAYFT_JOB_ID``, ``RAYFT_REPORT_ADDRESS``,
``RAYFT_LAUNCH_TICKET``), claims its spec from the service with the ticket (binding a report token
made here: ``ray_jobs.report.claim``), runs the job on the cluster it runs in, and reports every event
back. A failure is reported with its reason before the job exits non-zero, so the service can say why; its
traceback is in the job's log, which the team reads through the service (``GetJobLogs``).
"""

from __future__ import annotations

import logging
import os
import sys
from typing import NoReturn

from ray_jobs.report import ClaimRefused, Reporter, claim, report_tls
from rayft_contract.events import Event
from rayft_contract.records import Failure


def main() -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    address, job_id, tls = os.environ["RAYFT_REPORT_ADDRESS"], os.environ["RAYFT_JOB_ID"], report_tls(dict(os.environ))
    try:
        claimed = claim(address, job_id, os.environ.pop("RAYFT_LAUNCH_TICKET"), tls)
    except ClaimRefused as exc:  # nowhere to report to: Ray's record of the job carries the reason
        logging.error("%s", exc)
        return 1
    logging.info("job %s of team %s: its spec claimed from the service", job_id, claimed.team)  # when the job began
    reporter = Reporter(address, job_id, claimed.token, tls)
    try:
        from ray_jobs.run import run

        result = run(claimed.spec, address="auto", on_event=reporter, owner=claimed.team)
        logging.info("adapter: %s", result.adapter_dir)
        return 0
    except Exception as exc:
        logging.exception("job failed")  # the traceback, in the job's log (GetJobLogs) before its team hears of it
        reporter(Event("failure", Failure({"job": Failure.reason_of(exc)}).to_dict()))
        return 1
    finally:
        reporter.close()


def exit_now(code: int) -> NoReturn:
    """End the driver with ``code`` once the job is over, without the interpreter's teardown.

    A job's team hears SUCCEEDED only when Ray sees its driver end. After the job's last event, the driver spent
    2.4-2.9 s on 2 cores ending (py-spy, ``TINY=1 bash bench/service_7b.sh``): 0.4 s in ``ray.shutdown`` and the
    rest in Python's own teardown of torch, transformers, Ray and the rest of what the job imported, with no Python
    frame left to run. Everything the job writes is written and reported by then (``Reporter.close`` waits for the
    service to take the last event), so the driver flushes what it logged and printed, leaves Ray, and ends.
    """
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    if "ray" in sys.modules:
        import ray

        ray.shutdown()  # the driver leaves the cluster as it would at exit
    os._exit(code)


if __name__ == "__main__":
    exit_now(main())
