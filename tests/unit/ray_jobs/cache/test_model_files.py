"""A base model's files are checked before any cluster starts: safetensors only and whole, a tokenizer within the
embeddings, a config.json that fits the weights, and a LoRA's module names by PEFT's rule."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil

import numpy
import pytest

from ray_jobs.cache import model_files
from ray_jobs.storage import location
from rayft_contract.spec import SpecError


def lora(spec, targets=("all-linear",), save=()):
    return spec.replace(lora=dataclasses.replace(spec.lora, target_modules=tuple(targets), modules_to_save=tuple(save)))


def refused(spec) -> SpecError:
    with pytest.raises(SpecError) as info:
        model_files.check(spec)
    return info.value


def test_a_typo_beside_a_good_name_is_refused_with_the_name_it_meant(tiny_spec):
    error = refused(lora(tiny_spec, ["q_prj", "v_proj"]))
    assert error.field == "lora.target_modules"
    assert str(error).startswith("lora.target_modules: 'q_prj' names no module of the model; did you mean 'q_proj'?")
    assert "gate_proj" in str(error) and "input_layernorm" not in str(error), "it lists the layers LoRA can adapt"


def test_names_match_as_peft_matches_them_whole_or_by_a_dotted_suffix(tiny_spec):
    model_files.check(lora(tiny_spec, ["self_attn.q_proj", "model.layers.1.mlp.down_proj", "o_proj"]))
    model_files.check(lora(tiny_spec, ["lm_head"], save=["embed_tokens"]))
    assert refused(lora(tiny_spec, ["attn.q_proj"])).field == "lora.target_modules", "'attn' is not a whole name"


def test_a_name_of_a_norm_alone_is_refused_since_lora_adapts_weight_matrices(tiny_spec):
    error = refused(lora(tiny_spec, ["norm"]))
    assert "'norm' names model.norm, which holds no weight matrix" in str(error)


def test_modules_to_save_must_name_a_module_too(tiny_spec):
    error = refused(lora(tiny_spec, save=["embed_token_s"]))
    assert error.field == "lora.modules_to_save" and "did you mean 'embed_tokens'?" in str(error)


def test_a_head_tied_to_the_embeddings_and_so_not_in_the_file_can_be_named(tmp_path, tiny, tiny_spec):
    from safetensors.numpy import load_file, save_file

    model = tmp_path / "tied"
    shutil.copytree(tiny / "model", model)
    config = json.loads((model / "config.json").read_text())
    (model / "config.json").write_text(json.dumps({**config, "tie_word_embeddings": True}))
    weights = load_file(str(model / "model.safetensors"))
    save_file(
        {name: tensor for name, tensor in weights.items() if not name.startswith("lm_head")}, str(model / "model.safetensors")
    )
    assert "lm_head" not in {name.split(".")[0] for name in load_file(str(model / "model.safetensors"))}
    model_files.check(lora(tiny_spec.replace(model=dataclasses.replace(tiny_spec.model, path=str(model))), ["lm_head"]))


def test_a_file_that_is_not_safetensors_is_named(tmp_path, tiny, tiny_spec):
    model = tmp_path / "damaged"
    shutil.copytree(tiny / "model", model)
    spec = lora(tiny_spec.replace(model=dataclasses.replace(tiny_spec.model, path=str(model))), ["q_proj"])
    (model / "model.safetensors").write_bytes((10**12).to_bytes(8, "little") + b"{}")
    error = refused(spec)
    assert error.field == "model.path" and "model.safetensors is not a safetensors file" in str(error)
    (model / "model.safetensors").write_bytes((2).to_bytes(8, "little") + b"{]")
    assert "damaged safetensors header" in str(refused(spec))


def test_a_weights_file_cut_short_is_refused_before_the_load_would_fail_on_it(tmp_path, tiny, tiny_spec):
    model = tmp_path / "cut"
    shutil.copytree(tiny / "model", model)
    whole = (model / "model.safetensors").stat().st_size
    os.truncate(model / "model.safetensors", whole - 4096)
    error = refused(with_model(tiny_spec, model))  # all-linear: the headers are read for every job
    assert error.field == "model.path"
    assert f"model.safetensors holds {whole - 4096:,} bytes where its header says {whole:,}: a copy cut short" in str(error)


class Planted:
    """A pickle that runs code when loaded: it writes ``ran`` (the file named)."""

    def __init__(self, ran):
        self.ran = str(ran)

    def __reduce__(self):
        return (open, (self.ran, "w"))


def test_pickled_weights_a_team_could_plant_are_refused_and_never_loaded(tmp_path, tiny, tiny_spec):
    """A model directory with ``pytorch_model.bin`` instead of safetensors: the preflight names ``model.path``, and
    the worker's load (were the preflight skipped) looks for safetensors only, so the pickle never runs."""
    import pickle

    import torch

    from ray_jobs.train.model import load_base
    from ray_jobs.train.strategy import Single

    model, ran = tmp_path / "pickled", tmp_path / "ran"
    shutil.copytree(tiny / "model", model)
    (model / "model.safetensors").unlink()
    (model / "pytorch_model.bin").write_bytes(pickle.dumps({"model.embed_tokens.weight": Planted(ran)}))
    spec = tiny_spec.replace(model=dataclasses.replace(tiny_spec.model, path=str(model)))
    error = refused(spec)  # with all-linear too: the weights themselves are the problem
    assert error.field == "model.path" and "holds no *.safetensors weights" in str(error)
    with pytest.raises(OSError, match="safetensors"):
        load_base(spec, torch.device("cpu"), Single())
    assert not ran.exists(), "the planted pickle ran"


def test_weights_in_several_files_are_all_read(tmp_path, tiny):
    from safetensors.numpy import load_file, save_file

    model = tmp_path / "sharded"
    shutil.copytree(tiny / "model", model)
    weights = load_file(str(model / "model.safetensors"))
    (model / "model.safetensors").unlink()
    names = sorted(weights)
    for i, part in enumerate((names[: len(names) // 2], names[len(names) // 2 :])):
        save_file({name: weights[name] for name in part}, str(model / f"model-0000{i + 1}-of-00002.safetensors"))
    shapes = model_files.weight_shapes(location(str(model)))
    assert {f"{name.rsplit('.', 1)[0]}" for name in names} <= set(shapes)
    assert shapes["model.layers.1.mlp.down_proj"] == weights["model.layers.1.mlp.down_proj.weight"].shape
    assert shapes["model.norm"] == weights["model.norm.weight"].shape and len(shapes["model.norm"]) == 1


def test_a_model_on_s3_is_checked_from_its_headers_alone(s3_server, s3_requests, tiny, tiny_spec):
    import boto3

    s3 = boto3.client("s3")
    s3.create_bucket(Bucket="rayft-model-names")
    for file in (tiny / "model").iterdir():
        s3.upload_file(str(file), "rayft-model-names", f"tiny/{file.name}")
    spec = lora(tiny_spec.replace(model=dataclasses.replace(tiny_spec.model, path="s3://rayft-model-names/tiny")), ["v_prj"])
    with s3_requests() as got:
        error = refused(spec)
    assert "did you mean 'v_proj'?" in str(error)
    read = [(method, url.rsplit("/", 1)[-1]) for method, url in got if "/tiny/" in url]
    assert {name for _, name in read} == {"tokenizer.json", "config.json", "model.safetensors"}, json.dumps(got)
    assert read.count(("GET", "model.safetensors")) == 2, "the header's length, then the header: never the weights"
    assert len(got) == 1 + len(read) == 8, json.dumps(got)  # a listing, a HEAD and a GET per small file, a HEAD and two ranges


def with_model(spec, model):
    return spec.replace(model=dataclasses.replace(spec.model, path=str(model)))


def test_a_tokenizer_with_ids_past_the_embeddings_is_refused_naming_its_tokens(tmp_path, tiny, tiny_spec):
    """Special tokens added to the tokenizer, the embeddings never resized: caught before the job's first token."""
    model = tmp_path / "grown"
    shutil.copytree(tiny / "model", model)
    rows = json.loads((model / "config.json").read_text())["vocab_size"]
    tokenizer = json.loads((model / "tokenizer.json").read_text())
    added = {"single_word": False, "lstrip": False, "rstrip": False, "normalized": False, "special": True}
    tokenizer["added_tokens"] += [{"id": rows, "content": "<|tool|>", **added}, {"id": rows + 1, "content": "<|/tool|>", **added}]
    (model / "tokenizer.json").write_text(json.dumps(tokenizer))
    error = refused(with_model(tiny_spec, model))
    assert error.field == "model.path"
    assert f"its tokenizer has ids up to {rows + 1:,} (<|/tool|>, <|tool|>) but the model's embeddings hold {rows:,}" in str(
        error
    )
    assert "resize_token_embeddings" in str(error)

    from safetensors.numpy import load_file, save_file

    weights = load_file(str(model / "model.safetensors"))  # the embeddings padded past the tokenizer, as many models are
    for name in ("model.embed_tokens.weight", "lm_head.weight"):
        weights[name] = numpy.concatenate([weights[name], numpy.zeros((64, weights[name].shape[1]), weights[name].dtype)])
    save_file(weights, str(model / "model.safetensors"))
    config = json.loads((model / "config.json").read_text())
    (model / "config.json").write_text(json.dumps({**config, "vocab_size": rows + 64}))
    model_files.check(with_model(tiny_spec, model))


def test_a_unigram_tokenizer_is_counted_by_its_list_and_a_slow_one_is_left_alone(tmp_path, tiny, tiny_spec):
    model = tmp_path / "unigram"
    shutil.copytree(tiny / "model", model)
    rows = json.loads((model / "config.json").read_text())["vocab_size"]
    unigram = {"model": {"type": "Unigram", "vocab": [[f"t{i}", -1.0] for i in range(rows + 1)]}, "added_tokens": []}
    (model / "tokenizer.json").write_text(json.dumps(unigram))
    assert f"ids up to {rows:,} but" in str(refused(with_model(tiny_spec, model)))
    (model / "tokenizer.json").unlink()  # a sentencepiece tokenizer.model alone: not read here
    model_files.check(with_model(tiny_spec, model))


def a_copy_whose_config_says(tmp_path, tiny, **config) -> str:
    model = tmp_path / "copy"
    tmp_path.mkdir(parents=True, exist_ok=True)
    shutil.copytree(tiny / "model", model)
    (model / "config.json").write_text(json.dumps({**json.loads((model / "config.json").read_text()), **config}))
    return str(model)


def test_a_config_with_more_layers_than_the_weights_is_refused_before_a_load_would_train_one_from_random_values(
    tmp_path, tiny, tiny_spec
):
    error = refused(with_model(tiny_spec, a_copy_whose_config_says(tmp_path, tiny, num_hidden_layers=3)))
    assert error.field == "model.path"
    assert "config.json has 3 layers (num_hidden_layers) but its weights hold 2 (model.layers.0-1), so layer 2 would" in str(
        error
    )
    error = refused(with_model(tiny_spec, a_copy_whose_config_says(tmp_path / "4", tiny, num_hidden_layers=4)))
    assert "so layer 2 and on would train from random values" in str(error)


def test_weights_of_layers_past_the_configs_count_are_left_to_the_workers_load_report(tmp_path, tiny, tiny_spec):
    """Some models ship a layer their load skips by transformers' own rule (DeepSeek-V3's multi-token prediction
    layer); the worker's :func:`check_loaded` knows those rules, the headers do not."""
    model_files.check(with_model(tiny_spec, a_copy_whose_config_says(tmp_path, tiny, num_hidden_layers=1)))


def test_a_head_said_not_tied_must_be_in_the_files(tmp_path, tiny, tiny_spec):
    from safetensors.numpy import load_file, save_file

    model = a_copy_whose_config_says(tmp_path, tiny, tie_word_embeddings=False)
    weights = load_file(f"{model}/model.safetensors")
    save_file({name: tensor for name, tensor in weights.items() if not name.startswith("lm_head")}, f"{model}/model.safetensors")
    error = refused(with_model(tiny_spec, model))
    assert error.field == "model.path" and "(tie_word_embeddings: false) but the weights hold no lm_head" in str(error)


def test_a_load_that_left_a_weight_random_or_dropped_one_is_refused_and_quantization_state_is_not_counted():
    model_files.check_loaded({"missing_keys": set(), "unexpected_keys": {"model.layers.0.mlp.up_proj.weight.absmax"}}, "m")
    with pytest.raises(SpecError) as info:
        model_files.check_loaded(
            {
                "missing_keys": {f"model.layers.2.{name}.weight" for name in ("mlp.up_proj", "self_attn.q_proj")}
                | {"lm_head.weight"},
                "unexpected_keys": {"model.layers.3.self_attn.o_proj.bias", "model.layers.3.self_attn.o_proj.weight.absmax"},
            },
            "m",
        )
    assert str(info.value).startswith(
        "model.path: 'm': config.json does not fit the weights: 3 not in its files (lm_head.weight, model.layers.2.*); "
        "1 not in the model (model.layers.3.*)"
    )


def test_a_config_whose_mlp_is_wider_than_the_weights_is_refused_in_the_first_second_not_after_the_data(
    tmp_path, tiny, tiny_spec
):
    config = json.loads((tiny / "model" / "config.json").read_text())
    wider = config["intermediate_size"] + 8
    error = refused(with_model(tiny_spec, a_copy_whose_config_says(tmp_path, tiny, intermediate_size=wider)))
    assert error.field == "model.path"
    assert (
        f"config.json gives model.layers.0.mlp.gate_proj the shape [{wider}, {config['hidden_size']}] "
        f"(intermediate_size, hidden_size) but its weights hold [{wider - 8}, {config['hidden_size']}]"
    ) in str(error)


def test_the_sizes_of_a_base_stored_quantized_are_not_measured(tmp_path, tiny, tiny_spec):
    config = json.loads((tiny / "model" / "config.json").read_text())
    model = a_copy_whose_config_says(
        tmp_path, tiny, hidden_size=config["hidden_size"] // 2, quantization_config={"quant_method": "bitsandbytes"}
    )
    model_files.check(with_model(tiny_spec, model))  # packed 4-bit weights have other shapes than the config's
