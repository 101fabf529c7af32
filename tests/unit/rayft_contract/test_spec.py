"""The job spec: every invalid field is named, typos are caught, presets load, round trips hold."""

from __future__ import annotations

import json

import pytest

from rayft_contract.spec import FineTuneSpec, SpecError
from tests.paths import PRESETS

PRESETS = sorted((PRESETS).glob("*.yaml"))
MINIMAL = {"name": "job", "model": {"path": "org/model"}, "data": {"path": "data.jsonl"}}


def spec_with(section: str | None, key: str, value: object) -> dict:
    data = json.loads(json.dumps(MINIMAL))
    if section is None:
        data[key] = value
    else:
        data.setdefault(section, {})[key] = value
    return data


INVALID = [
    (None, "name", "", "name"),
    (None, "name", "has space", "name"),
    ("model", "path", "", "model.path"),
    ("model", "dtype", "int4", "model.dtype"),
    ("model", "kernels", "triton", "model.kernels"),
    ("model", "compile", "max-autotune", "model.compile"),
    ("lora", "fused", "yes", "lora.fused"),
    ("quantization", "mode", "fp4", "quantization.mode"),
    ("quantization", "double_quant", "yes", "quantization.double_quant"),
    ("quantization", "cache", "yes", "quantization.cache"),
    ("quantization", "fp8", "yes", "quantization.fp8"),
    ("lora", "r", 0, "lora.r"),
    ("lora", "alpha", -1, "lora.alpha"),
    ("lora", "dropout", 1.0, "lora.dropout"),
    ("lora", "target_modules", [], "lora.target_modules"),
    ("lora", "modules_to_save", "lm_head", None),  # a lone string is accepted as a one-item list
    ("data", "path", "", "data.path"),
    ("data", "format", "csv", "data.format"),
    ("data", "max_seq_len", 0, "data.max_seq_len"),
    ("data", "val_fraction", 0.7, "data.val_fraction"),
    ("data", "val_path", "ftp://host/val.jsonl", "data.val_path"),
    ("train", "early_stopping_metric", "accuracy", "train.early_stopping_metric"),
    ("train", "sample_prompts", [" "], "train.sample_prompts"),
    ("output", "adapter", "first", "output.adapter"),
    ("data", "tokenize_workers", 0, "data.tokenize_workers"),
    ("data", "tokenize_batch_size", 0, "data.tokenize_batch_size"),
    ("data", "prefetch_batches", -1, "data.prefetch_batches"),
    ("data", "packing", "no", "data.packing"),
    ("data", "train_on_completions_only", 1, "data.train_on_completions_only"),
    ("train", "gradient_checkpointing", "on", "train.gradient_checkpointing"),
    ("train", "fit_memory", "auto", "train.fit_memory"),
    ("scaling", "use_gpu", "cuda", "scaling.use_gpu"),
    ("train", "max_steps", 0, "train.max_steps"),
    ("train", "epochs", 0, "train.epochs"),
    ("train", "micro_batch_size", 0, "train.micro_batch_size"),
    ("train", "global_batch_size", 6, "train.global_batch_size"),  # not a multiple of 4 x 1
    ("train", "learning_rate", 0, "train.learning_rate"),
    ("train", "learning_rate", "fast", "train.learning_rate"),
    ("train", "lr_schedule", "step", "train.lr_schedule"),
    ("train", "warmup_steps", -1, "train.warmup_steps"),
    ("train", "weight_decay", -0.1, "train.weight_decay"),
    ("train", "max_grad_norm", 0, "train.max_grad_norm"),
    ("train", "log_every", 0, "train.log_every"),
    ("train", "eval_every", 0, "train.eval_every"),
    ("train", "checkpoint_every", 0, "train.checkpoint_every"),
    ("train", "max_failures", -1, "train.max_failures"),
    ("train", "seed", 1.5, "train.seed"),
    ("data", "overlong", "wrap", "data.overlong"),
    ("data", "max_bad_row_frac", 1.5, "data.max_bad_row_frac"),
    ("data", "cache", "sometimes", "data.cache"),
    ("data", "shuffle", "always", "data.shuffle"),
    ("data", "shuffle_buffer_rows", 0, "data.shuffle_buffer_rows"),
    ("data", "shuffle_buffer_rows", 1 << 25, "data.shuffle_buffer_rows"),
    ("data", "cache_uri", "gs://bucket/cache", "data.cache_uri"),
    ("scaling", "num_workers", 0, "scaling.num_workers"),
    ("scaling", "strategy", "deepspeed", "scaling.strategy"),
    ("scaling", "cpus_per_worker", 0, "scaling.cpus_per_worker"),
    ("output", "dir", "", "output.dir"),
    ("train", "early_stopping_patience", 0, "train.early_stopping_patience"),
    ("train", "early_stopping_min_delta", -0.1, "train.early_stopping_min_delta"),
    ("train", "eval_samples", 33, "train.eval_samples"),
    ("train", "min_lr_ratio", 1.0, "train.min_lr_ratio"),
    ("tracking", "mlflow", "yes", "tracking.mlflow"),
    ("tracking", "mlflow_uri", " ", "tracking.mlflow_uri"),
    ("tracking", "experiment", "", "tracking.experiment"),
    ("tracking", "wandb", "yes", "tracking.wandb"),
    ("tracking", "wandb_project", "team/project", "tracking.wandb_project"),
    ("tracking", "wandb_mode", "disabled", "tracking.wandb_mode"),
]


@pytest.mark.parametrize(("section", "key", "value", "field"), INVALID)
def test_invalid_field_is_named(section, key, value, field):
    data = spec_with(section, key, value)
    if field is None:
        FineTuneSpec.from_dict(data)
        return
    with pytest.raises(SpecError) as info:
        FineTuneSpec.from_dict(data)
    assert info.value.field == field
    assert str(info.value).startswith(f"{field}: ")
    assert "\n" not in str(info.value)


def test_every_field_has_an_invalid_case_or_is_free_text():
    """Adding a field without a validation case here fails, so coverage cannot silently shrink."""
    covered = {field for *_, field in INVALID if field} | {f"{s}.{k}" for s, k, _, f in INVALID if s and f is None}
    free_text = {"model.revision", "model.attn_implementation", "data.chat_template", "train.seed", "train.global_batch_size"}
    spec = FineTuneSpec.from_dict(MINIMAL).to_dict()
    fields = {f"{s}.{k}" for s, v in spec.items() if isinstance(v, dict) for k in v} | {"name"}
    missing = fields - covered - free_text
    assert not missing, f"add invalid cases for {sorted(missing)}"


def test_a_validation_set_that_is_the_training_data_is_refused_and_one_of_its_own_is_held_out():
    with pytest.raises(SpecError, match="data.val_path: is data.path itself"):
        FineTuneSpec.from_dict(spec_with("data", "val_path", MINIMAL["data"]["path"]))
    none = FineTuneSpec.from_dict(spec_with("data", "val_fraction", 0.0))
    own = FineTuneSpec.from_dict({**MINIMAL, "data": {"path": "data.jsonl", "val_path": "val.jsonl", "val_fraction": 0.0}})
    assert (none.data.held_out, own.data.held_out) == (False, True)
    assert own.with_absolute_paths().data.val_path.startswith("/")


def test_early_stopping_without_evaluations_to_judge_is_refused():
    data = spec_with("train", "early_stopping_patience", 2)
    with pytest.raises(SpecError, match="train.early_stopping_patience: needs evaluations to judge"):
        FineTuneSpec.from_dict(data)


def test_typo_suggests_the_field():
    with pytest.raises(SpecError, match=r"train.lerning_rate: unknown key; did you mean 'learning_rate'\?"):
        FineTuneSpec.from_dict(spec_with("train", "lerning_rate", 1e-4))


def test_unknown_section_lists_known_keys():
    with pytest.raises(SpecError) as info:
        FineTuneSpec.from_dict(spec_with(None, "optimizer", {"name": "sgd"}))
    assert info.value.field == "optimizer"


def test_section_must_be_a_mapping():
    with pytest.raises(SpecError, match="^train: must be a mapping"):
        FineTuneSpec.from_dict(spec_with(None, "train", [1, 2]))


def test_round_trip_and_grad_accum():
    data = spec_with("train", "global_batch_size", 32)
    data["scaling"] = {"num_workers": 2}
    spec = FineTuneSpec.from_dict(data)
    assert FineTuneSpec.from_dict(spec.to_dict()) == spec
    assert spec.grad_accum_steps == 4  # 32 / (micro 4 x 2 workers)


def test_yaml_scientific_notation_without_dot(tmp_path):
    path = tmp_path / "spec.yaml"
    path.write_text("name: j\nmodel: {path: org/m}\ndata: {path: d.jsonl}\ntrain: {learning_rate: 2e-4}\n")
    assert FineTuneSpec.load(path).train.learning_rate == pytest.approx(2e-4)


def test_missing_spec_file():
    with pytest.raises(SpecError, match="does not exist"):
        FineTuneSpec.load("/nonexistent/spec.yaml")


@pytest.mark.parametrize("preset", PRESETS, ids=lambda p: p.name)
def test_presets_are_valid_and_explain_themselves(preset):
    spec = FineTuneSpec.load(preset)
    header = preset.read_text().splitlines()[0]
    assert header.startswith("# "), "a preset opens with a comment saying what it is for"
    assert spec.name


def test_relative_paths_become_absolute(tmp_path, monkeypatch, tiny):
    monkeypatch.chdir(tiny)
    spec = FineTuneSpec.from_dict(
        {"name": "j", "model": {"path": "model"}, "data": {"path": "train.jsonl"}, "output": {"dir": "not-yet"}}
    )
    resolved = spec.with_absolute_paths()
    assert resolved.model.path == str(tiny / "model")
    assert resolved.data.path == str(tiny / "train.jsonl")
    assert resolved.output.dir == str(tiny / "not-yet")
    hub = FineTuneSpec.from_dict({"name": "j", "model": {"path": "org/name"}, "data": {"path": "train.jsonl"}})
    assert hub.with_absolute_paths().model.path == "org/name"


def test_overrides_are_merged_before_validation_so_they_can_repair_a_file(tmp_path):
    base = tmp_path / "base.yaml"
    base.write_text("name: j\nmodel: {path: m}\ndata: {path: d.jsonl}\ntrain: {max_steps: 0}\n")
    with pytest.raises(SpecError, match="train.max_steps"):
        FineTuneSpec.load(base)
    assert FineTuneSpec.load(base, ["train.max_steps=5"]).train.max_steps == 5
    assert FineTuneSpec.load(base, ["train.max_steps=5", "lora.r=8"]).lora.r == 8  # a section the file lacks
    with pytest.raises(SpecError, match="did you mean"):
        FineTuneSpec.load(base, ["train.max_step=5"])
    with pytest.raises(SpecError, match="a value, not a section"):
        FineTuneSpec.load(base, ["name.x=1"])


@pytest.mark.parametrize("name", ["..", ".", ".hidden", "a/b", "../other-team", "x" * 101, "naïve", "", "-flag"])
def test_a_job_name_is_one_safe_path_component(name):
    data = spec_with("train", "max_steps", 5)
    data["name"] = name
    with pytest.raises(SpecError) as info:
        FineTuneSpec.from_dict(data)
    assert info.value.field == "name"


@pytest.mark.parametrize("name", ["tiny-cpu", "run_2026.11.30", "A1"])
def test_ordinary_job_names_are_kept(name):
    data = spec_with("train", "max_steps", 5)
    data["name"] = name
    assert FineTuneSpec.from_dict(data).name == name


@pytest.mark.parametrize(
    ("section", "key", "value", "field"),
    [
        ("scaling", "num_workers", 100000, "scaling.num_workers"),
        ("scaling", "cpus_per_worker", 10**6, "scaling.cpus_per_worker"),
        ("lora", "r", 10**9, "lora.r"),
        ("train", "learning_rate", float("inf"), "train.learning_rate"),
        ("train", "learning_rate", float("nan"), "train.learning_rate"),
        ("train", "learning_rate", "inf", "train.learning_rate"),  # YAML's spelling reaches us as a string
        ("train", "max_grad_norm", float("inf"), "train.max_grad_norm"),
        ("train", "max_steps", 10**12, "train.max_steps"),
        ("train", "seed", -1, "train.seed"),
        ("data", "max_seq_len", 10**9, "data.max_seq_len"),
        ("data", "tokenize_workers", 10**5, "data.tokenize_workers"),
        ("data", "path", "/d/" + "x" * 5000, "data.path"),
        ("data", "chat_template", "{{ x }}" * 10_000, "data.chat_template"),
        ("lora", "target_modules", [f"m{i}" for i in range(65)], "lora.target_modules"),
    ],
)
def test_values_beyond_any_real_job_are_refused_up_front(section, key, value, field):
    """Issue 10: a hostile or mistyped spec must not reach a cluster that waits forever for 100,000 workers,
    or a worker that runs out of memory on a rank of a billion."""
    with pytest.raises(SpecError) as info:
        FineTuneSpec.from_dict(spec_with(section, key, value))
    assert info.value.field == field


def test_the_largest_real_values_still_pass():
    data = spec_with("data", "chat_template", "{{ x }}" * 4000)
    data["scaling"] = {"num_workers": 1024, "use_gpu": False}
    data["lora"] = {"r": 4096}
    data["train"] = {"learning_rate": 1.0, "max_steps": 10_000_000, "seed": 2**32 - 1}
    assert FineTuneSpec.from_dict(data).scaling.num_workers == 1024
