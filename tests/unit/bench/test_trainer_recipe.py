"""bench/trainer_recipe.py, the Trainer baseline of issue 12, counts what its steps trained, and bench/compare_trainer.py
sets rayft's runs against it. Run on the CPU with the tiny model: the same loop and counters as on a GPU, no 4-bit."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from bench.compare_trainer import Row, ahead_from, table
from bench.compare_trainer import main as compare
from bench.trainer_recipe import TrainerRun, TrainerStep
from rayft_contract.phases import Phase
from rayft_contract.records import Efficiency, JobSummary, Timing
from tests.paths import REPO


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from ray_jobs.tiny import ensure_tiny_assets

    return ensure_tiny_assets(str(tmp_path_factory.mktemp("tiny")))


def recipe(tiny, out, *flags: str) -> TrainerRun:
    done = subprocess.run(
        [sys.executable, "bench/trainer_recipe.py", f"{tiny}/model", f"{tiny}/train.jsonl", str(out), "--no-quant", *flags],
        cwd=REPO, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return TrainerRun.from_json(out.read_text())


def test_one_example_a_micro_batch_has_no_padding_and_each_token_its_own_context(tiny, tmp_path):
    run = recipe(tiny, tmp_path / "one.json", "--steps", "3", "--micro-batch", "1", "--accumulation", "1", "--warmup", "1")
    assert [s.step for s in run.steps] == [1, 2, 3]
    for s in run.steps:
        assert s.tokens == s.processed > 0
        assert s.attn_ctx == s.tokens * (s.tokens + 1) // 2
        assert s.loss is not None and s.seconds > 0
    assert run.padding_frac == 0
    assert run.time_to_first_step_s > 0 and run.mfu is None and not run.quantized


def test_batches_padded_to_the_longest_count_only_their_real_tokens(tiny, tmp_path):
    run = recipe(tiny, tmp_path / "four.json", "--steps", "2")
    for s in run.steps:  # four micro-batches of four examples of different lengths
        assert 0 < s.tokens < s.processed and s.processed % 4 == 0
        assert s.tokens < s.attn_ctx
    assert 0 < run.padding_frac < 1


def test_the_steady_figures_leave_out_the_warm_up_steps():
    steps = (TrainerStep(1, 10.0, 100, 200, 1000, 5.0, 2.0), TrainerStep(2, 1.0, 1000, 1200, 1000, 0.1, 1.9),
             TrainerStep(3, 1.0, 3000, 3100, 1000, 0.1, 1.8))  # fmt: skip
    run = TrainerRun("r", steps, 1, 4, 4, 2048, 12.0, 3.0, 1e6, (1e6, 2e6, 4e6), True)
    assert run.steady_tokens_per_s == 2000
    assert run.mfu == pytest.approx(3.0)  # (2e6 + 4e6) FLOPs over 2 s against a 1e6 peak
    assert run.data_wait_frac == pytest.approx(0.1)
    assert run.padding_frac == pytest.approx(1 - 4100 / 4500)
    assert TrainerRun.from_json(run.to_json()) == run


def test_the_table_gives_each_rayft_run_its_ratio_to_the_trainer(tmp_path, capsys):
    trainer = TrainerRun("trainer", (TrainerStep(1, 2.0, 1000, 2000, 1, 0.0, 2.0), TrainerStep(2, 1.0, 1400, 2800, 1, 0.1, 1.9)),
                         1, 4, 4, 2048, 40.0, 20.0, None, (0.0, 0.0), True)  # fmt: skip
    (tmp_path / "trainer.json").write_text(trainer.to_json())
    for name, tps, first in (("cold", 11_200, 70.0), ("warm", 11_340, 30.0)):
        (tmp_path / name).mkdir()
        summary = JobSummary(
            name=f"preset-{name}", steady_tokens_per_s=tps, time_to_first_step_s=first, mfu=0.6, gpu_mem_peak_gb=81.5,
            efficiency=Efficiency(steady_steps=10, step_time_s=2.0, padding_frac=0.001),
            timing=Timing(phases={Phase.DATA_WAIT.value: 0.2}),
        )  # fmt: skip
        (tmp_path / name / "summary.json").write_text(json.dumps(summary.to_dict()))
    compare([str(tmp_path / "vs.png"), str(tmp_path / "trainer.json"), f"cold={tmp_path / 'cold'}", f"warm={tmp_path / 'warm'}"])
    rows = {line.split(" | ")[0].strip("| "): line for line in capsys.readouterr().out.splitlines() if line.startswith("| ")}
    assert "| 1,400 | 1.0x | - | 20.0 | 10.0% | 50.0% | 40.0 | - |" in rows["Trainer"]
    # 11,200 tokens/s from 70 s catches 1,400 from 40 s at (11,200 x 70 - 1,400 x 40) / 9,800 = 74.3 s
    assert "| 11,200 | 8.0x | 60.0% | 81.5 | 1.0% | 0.1% | 70.0 | 74 s |" in rows["rayft cold"]
    assert "| 11,340 | 8.1x |" in rows["rayft warm"] and rows["rayft warm"].endswith("| 30.0 | 0 s |")  # sooner and faster
    assert (tmp_path / "vs.png").stat().st_size > 0


def test_a_run_slower_than_the_trainer_is_never_ahead_of_it():
    trainer = Row("Trainer", "", 1400.0, None, None, 0.0, 0.5, 40.0)
    assert ahead_from(trainer, Row("slow", "", 1000.0, None, None, 0.0, 0.0, 10.0)) is None
    assert ahead_from(trainer, Row("late", "", 2800.0, None, None, 0.0, 0.0, 80.0)) == pytest.approx(120.0)


def test_a_run_that_never_reached_a_step_has_no_catch_up_time_in_the_table():
    rows = [Row("Trainer", "", 1400.0, None, None, 0.0, 0.5, 40.0), Row("rayft failed", "", 0.0, None, None, 0.0, 0.0, None)]
    assert table(rows).splitlines()[3].endswith("| - | - |")
