"""Run the rayft service as a child process on loopback (the demo's embedded setup).

    with local_service(Path(".rayft/service")) as address:
        Client(address).submit(spec)

The child owns a local Ray cluster (no ``--ray-address``) and runs without auth, which the service
allows on loopback only. Its log goes to ``data_dir/server.log``.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

READY = "rayft service listening on "


@contextlib.contextmanager
def local_service(data_dir: Path, timeout_s: float = 120.0) -> Iterator[str]:
    data_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    log = data_dir / "server.log"
    offset = log.stat().st_size if log.exists() else 0
    env = {**os.environ, "RAYFT_HOST": "127.0.0.1", "RAYFT_PORT": "0", "RAYFT_AUTH": "0", "RAYFT_DATA_DIR": str(data_dir)}
    env.pop("RAYFT_RAY_ADDRESS", None)
    with log.open("a") as out:
        proc = subprocess.Popen([sys.executable, "-m", "rayft", "serve"], env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        yield wait_ready(proc, log, offset, timeout_s)
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()


def wait_ready(proc: subprocess.Popen, log: Path, offset: int, timeout_s: float) -> str:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for line in log.read_text()[offset:].splitlines():
            if line.startswith(READY):
                return line[len(READY) :].strip()
        if proc.poll() is not None:
            break
        time.sleep(0.2)
    raise RuntimeError(f"the rayft service did not start; see {log}:\n{log.read_text()[offset:][-2000:]}")
