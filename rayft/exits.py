"""The ``rayft`` command's exit codes, and the errors that map to them.

| code | meaning                                                                        |
|------|--------------------------------------------------------------------------------|
| 0    | success (a watched job SUCCEEDED)                                              |
| 1    | the job failed or was cancelled, or the command itself failed                  |
| 2    | usage or spec error: a bad flag, field, path or job id; the message names it   |
| 3    | the service or the Ray cluster is unreachable (or failed on its side): retry    |
| 130  | interrupted (Ctrl-C)                                                           |

Every error is one line on stderr; ``--verbose`` adds the traceback.
"""

from __future__ import annotations

from typing import Any

OK, JOB_FAILED, USAGE, UNREACHABLE, INTERRUPTED = 0, 1, 2, 3, 130

SERVICE_SIDE = ("UNAVAILABLE", "DEADLINE_EXCEEDED", "INTERNAL", "UNKNOWN", "DATA_LOSS")
"""gRPC codes that say nothing about the request itself: exit 3, worth a retry. Any other code
(INVALID_ARGUMENT, NOT_FOUND, UNAUTHENTICATED, ...) is the caller's to fix: exit 2."""


class Unreachable(RuntimeError):
    """The service or the cluster could not be reached, or failed on its side (exit 3)."""


def from_rpc_error(exc: Any) -> Exception:
    """A ``grpc.RpcError`` as the error the CLI reports: ``Unreachable`` or a ``SpecError`` naming the code."""
    from rayft_contract.spec import SpecError

    code, details = exc.code().name, exc.details() or ""
    if code in SERVICE_SIDE:
        return Unreachable(f"{code}: {details}")
    return SpecError(code, details)
