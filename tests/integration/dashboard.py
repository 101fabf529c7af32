"""What the Ray dashboard of the session's cluster shows, read over its HTTP API as a browser would."""

from __future__ import annotations

import json
import urllib.request


def train_view_runs(ray_cluster, name: str) -> list[dict]:
    """The dashboard Train view's runs named ``name``, oldest first, each with its attempts and their workers."""
    url = f"{ray_cluster.jobs_api}/api/train/v2/runs/v1"
    runs = json.loads(urllib.request.urlopen(url, timeout=30).read())["train_runs"]
    return sorted((r for r in runs if r["name"] == name), key=lambda r: r["start_time_ns"])
