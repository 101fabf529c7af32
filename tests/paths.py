"""Where the repository's files are, for a test at any depth of the tree."""

from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PRESETS = REPO / "ray_jobs" / "presets"
