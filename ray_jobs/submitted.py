"""Entrypoint of a job the rayft service submitted to Ray (``python -m ray_jobs.submitted``).

Reads what the service put in the job's environment (``RAYFT_JOB_ID``, ``RAYFT_SPEC``,
``RAYFT_REPORT_ADDRESS``, ``RAYFT_REPORT_TOKEN``), runs the job on the cluster it runs in, and
reports every event back. A failure is reported with its reason before the job exits non-zero, so
the service can say why.
"""

from __future__ import annotations

import json
import logging
import os
import sys

from ray_jobs.report import Reporter
from rayft_contract.events import Event
from rayft_contract.spec import FineTuneSpec


def main() -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    reporter = Reporter(os.environ["RAYFT_REPORT_ADDRESS"], os.environ["RAYFT_JOB_ID"], os.environ["RAYFT_REPORT_TOKEN"])
    try:
        from ray_jobs.run import run

        spec = FineTuneSpec.from_dict(json.loads(os.environ["RAYFT_SPEC"]))
        result = run(spec, address="auto", on_event=reporter)
        logging.info("adapter: %s", result.adapter_dir)
        return 0
    except Exception as exc:
        reason = f"{type(exc).__name__}: {exc}".splitlines()[0][:1000]
        reporter(Event("failure", {"errors": {"job": reason}}))
        logging.exception("job failed")
        return 1
    finally:
        reporter.close()


if __name__ == "__main__":
    sys.exit(main())
