"""Bad input gets a one-line error naming the fix, before any cluster starts."""

from __future__ import annotations

import json

import pytest

from rayft.cli import main

SPEC = """\
name: bad-input
model: {{path: {model}}}
data: {{path: {data}, max_seq_len: {max_seq_len}}}
scaling: {{use_gpu: false}}
quantization: {{mode: none}}
{extra}
"""


@pytest.fixture
def write_spec(tmp_path, tiny):
    def write(model=None, data=None, max_seq_len=64, extra=""):
        path = tmp_path / "spec.yaml"
        path.write_text(
            SPEC.format(model=model or tiny / "model", data=data or tiny / "train.jsonl", max_seq_len=max_seq_len, extra=extra)
        )
        return str(path)

    return write


def run_cli(capsys, *argv):
    code = main(list(argv))
    err = capsys.readouterr().err.strip()
    return code, err


@pytest.mark.parametrize("command", ["train", "check"])
@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [
        ({"data": "/nonexistent/train.jsonl"}, "data.path: dataset file '/nonexistent/train.jsonl' does not exist"),
        ({"model": "/nonexistent/model"}, "model.path: model directory '/nonexistent/model' does not exist"),
        ({"max_seq_len": 0}, "data.max_seq_len: must be >= 8"),
        ({"extra": "train: {max_stpes: 10}"}, "train.max_stpes: unknown key; did you mean 'max_steps'?"),
        ({"extra": "lora: {target_modules: [q_prj, v_proj]}"}, "lora.target_modules: 'q_prj' names no module of the model"),
    ],
)
def test_bad_input_is_one_line_before_ray(write_spec, capsys, monkeypatch, command, kwargs, needle):
    import ray_jobs.local_ray

    def no_cluster(*args, **kwargs):
        raise AssertionError("bad input reached the Ray connection")

    monkeypatch.setattr(ray_jobs.local_ray, "connect", no_cluster)
    code, err = run_cli(capsys, command, write_spec(**kwargs))
    assert code == 2
    assert err.startswith(f"error: {needle}") and "\n" not in err


def test_a_validation_set_is_listed_after_the_data_in_its_own_format(tiny, tmp_path):
    from ray_jobs.data.preflight import data_inputs
    from rayft_contract.spec import FineTuneSpec

    val = tmp_path / "val.jsonl"
    val.write_text(json.dumps({"instruction": "count", "output": "one two"}) + "\n")
    spec = FineTuneSpec.from_dict(
        {"name": "v", "model": {"path": str(tiny / "model")}, "data": {"path": str(tiny / "train.jsonl"), "val_path": str(val)}}
    )
    inputs = data_inputs(spec)
    assert (inputs.format, inputs.val.format) == ("chat", "alpaca")
    assert inputs.val.files.first_index == len(inputs.files.paths)  # its bad rows have file indices of their own
    assert inputs.bytes == sum(s for _, s, _ in inputs.identity) + val.stat().st_size


def test_a_missing_validation_set_is_named(write_spec, tmp_path, capsys):
    code, err = run_cli(capsys, "check", write_spec(), "--set", f"data.val_path={tmp_path}/nope.jsonl")
    assert code == 2 and err.startswith(f"error: data.val_path: dataset file '{tmp_path}/nope.jsonl' does not exist"), err


def test_unknown_format_lists_columns(write_spec, tmp_path, capsys):
    data = tmp_path / "qa.jsonl"
    data.write_text(json.dumps({"question": "q", "answer": "a"}) + "\n")
    code, err = run_cli(capsys, "check", write_spec(data=data))
    assert code == 2 and "\n" not in err
    assert "data.format: cannot tell the dataset format from its columns ['answer', 'question']" in err


def test_model_dir_without_config(write_spec, tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    code, err = run_cli(capsys, "check", write_spec(model=tmp_path / "empty"))
    assert code == 2 and "has no config.json" in err


def test_set_overrides_and_good_spec_passes(write_spec, capsys):
    assert main(["check", write_spec(), "--set", "train.max_steps=5"]) == 0
    assert "ok: bad-input" in capsys.readouterr().out
    code, err = run_cli(capsys, "check", write_spec(), "--set", "train.max_steps=0")
    assert code == 2 and err == "error: train.max_steps: must be > 0, got 0"
