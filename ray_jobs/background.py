"""One call on a thread of its own, for the driver's work that can overlap its wait (trackers, the adapter's tokenizer)."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any


def in_background(fn: Callable[..., Any], *args: Any) -> Future[Any]:
    """``fn(*args)`` on a thread of its own; the returned future's ``result()`` waits for it (or raises)."""
    pool = ThreadPoolExecutor(1, thread_name_prefix=f"rayft-{fn.__name__.strip('_')}")
    try:
        return pool.submit(fn, *args)
    finally:
        pool.shutdown(wait=False)  # the thread ends with fn
