"""ray_jobs.observe.tracking: what the driver's trackers cost before the workers start."""

from __future__ import annotations

import subprocess
import sys
import textwrap

from tests.paths import PRESETS

PRESET = PRESETS / "tiny_cpu.yaml"


def test_opening_the_trackers_imports_neither_tensorboardx_nor_torch_until_the_fit_starts(tmp_path):
    """tensorboardX imports torch, 3.5 s that held the driver's connect back on an H200 host: the writer opens at the
    fit's start (``open_tensorboard``), and the first report finds it. A fresh interpreter, as the driver is."""
    probe = textwrap.dedent(
        f"""
        import sys
        from pathlib import Path
        from ray_jobs.observe.tracking import Trackers
        from rayft_contract.records import Progress
        from rayft_contract.spec import FineTuneSpec

        trackers = Trackers.open(FineTuneSpec.load({str(PRESET)!r}), Path({str(tmp_path)!r}), "team-a")
        print(sorted(m for m in ("tensorboardX", "torch") if m in sys.modules))
        trackers.open_tensorboard()
        trackers.add(Progress(1, 4, loss=2.5))
        print(sorted(m for m in ("tensorboardX", "torch") if m in sys.modules))
        trackers.finish(None)
        """
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    before, after = out.stdout.split("\n")[:2]
    assert before == "[]" and "tensorboardX" in after
    (events,) = (tmp_path / "tensorboard").glob("events.out.tfevents.*")
    assert events.stat().st_size > 0, "the first report's scalars were written"
