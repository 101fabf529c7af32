"""A base model's files checked before any cluster starts: weights in safetensors, a tokenizer whose ids the
embeddings hold, and a LoRA whose module names are the model's. Each check reads a few small files or ranges
(no torch, nothing downloaded) and fails in the job's first second naming the field.

- **Safetensors only** (``model.path``). rayft loads no pickled weights (``pytorch_model.bin``): unpickling a file
  can run code, and a team may write the locations its models come from.
- **The tokenizer within the embeddings** (``model.path``). A tokenizer with ids the model's ``vocab_size`` does
  not reach (special tokens added, the embeddings never resized) makes the embedding lookup index past its
  table: an IndexError in the worker on a CPU, a "device-side assert" that poisons the CUDA context on a GPU,
  both after the data is prepared and the base loaded.
- **LoRA names** (``lora.target_modules``, ``lora.modules_to_save``). PEFT finds out that a LoRA names no module of
  the model only when a training worker has loaded the base: on the tiny model 35 s into a job, on a 7B after its
  load and quantization. And a typo beside a good name (``[q_prj, v_proj]``) never fails at all: the job trains
  half the adapters it was asked for (PEFT 0.21 warns of nothing). The names are in the weights' files: each
  safetensors file starts with 8 bytes giving its JSON header's length, then the header, one entry per tensor
  with its shape: two small reads a file (ranged GETs on S3). Read by hand because the ``safetensors`` package
  opens a whole file (memory-mapped, local only) to list its names, and a model on S3 would be downloaded first.
  The rule is PEFT's for a list of names: a module matches an entry that is its whole name or a dotted suffix of
  it (``q_proj`` and ``self_attn.q_proj`` both match ``model.layers.0.self_attn.q_proj``). An entry must match a
  module that holds a weight matrix (a linear layer or an embedding, which LoRA adapts), not only norms.

- **A config.json that fits the weights** (``model.path``). transformers builds the model from ``config.json`` and
  fills it from the files: a weight the files lack is given random values, one the model lacks is dropped, and
  either only prints a load report in the worker's log (transformers 5.24, checked here: a config.json with one
  layer more trains a random layer; one layer fewer drops the last). Here every layer of ``num_hidden_layers``
  must be in the headers, and an untied head must be in the files; in the worker, :func:`check_loaded`
  refuses any load that reports such weights, whatever their cause. A weight whose shape differs transformers
  refuses itself, but only in the worker after the data is prepared: the embeddings' and MLPs' shapes are
  measured here, by the names most decoders give them.

- **Whole weight files** (``model.path``). Each file's size must be what its header says (8 bytes, the header, the
  last tensor's end), as safetensors itself checks at load: a copy cut short fails here, not in the worker.

A hub model not yet downloaded is not checked here (its load asks the hub for safetensors only).
"""

from __future__ import annotations

import difflib
import json
import os
import re
from collections.abc import Collection
from typing import TYPE_CHECKING, Any

from rayft_contract.spec import SpecError

if TYPE_CHECKING:
    from ray_jobs.storage import Location
    from rayft_contract.spec import FineTuneSpec

MAX_HEADER_BYTES = 100_000_000
"""The safetensors format's own limit on a header; a larger length says the file is not safetensors."""
ALWAYS_THERE: dict[str, tuple[int, ...]] = {"lm_head": (-1, -1)}
"""Modules every causal LM has though its file may not store them (a head tied to the embeddings is saved once),
each a matrix of a size not known here."""


def check(spec: FineTuneSpec) -> None:
    """Raise :class:`SpecError` naming the field when ``spec.model.path`` fails a check above."""
    path = spec.model.path
    directory = model_directory(path, spec.model.revision)
    if directory is None:
        return
    files = weight_files(directory)
    if not files:
        if _names_a_directory(path):
            raise SpecError(
                "model.path",
                f"{path!r} holds no *.safetensors weights; rayft loads no pickled weights (pytorch_model.bin), which "
                "can run code when loaded: save the model with save_pretrained(), which writes safetensors",
            )
        return  # a hub snapshot with only some of its files downloaded yet
    config = _json(directory, "config.json", path)
    check_tokenizer(directory, path, config)
    shapes = weight_shapes(directory, files)  # every header read, and each file's size checked against it
    check_config(config, path, shapes)
    check_lora(spec, shapes)


def _json(directory: Location, name: str, path: str) -> dict:
    """``directory``'s JSON file ``name``; empty where there is none."""
    try:
        return json.loads(directory.child(name).read_bytes())
    except FileNotFoundError:
        return {}
    except ValueError as exc:
        raise SpecError("model.path", f"{path!r}: its {name} is not JSON ({exc})") from None


def check_config(config: dict, path: str, shapes: dict[str, tuple[int, ...]]) -> None:
    """``config.json`` against the weights' modules and shapes (:func:`weight_shapes`): every one of ``num_hidden_layers``
    in the layers numbered ``<stack>.layers.N`` (where the weights hold one such stack: not beside a vision tower;
    layers past the count are left to :func:`check_loaded`, as DeepSeek-V3 ships a layer its load skips), a
    head said not to be tied to the embeddings (``tie_word_embeddings: false``) in the files (a model saved with a
    tied head holds it once, as the embeddings), and the sizes of the embeddings and of the MLPs by the names most
    decoders give them (:data:`SIZES`). A base whose files are quantized is not measured."""
    layers = config.get("num_hidden_layers")
    stacks: dict[str, set[int]] = {}
    for module in shapes:
        if found := _LAYER.match(module):
            stacks.setdefault(found["stack"], set()).add(int(found["index"]))
    if isinstance(layers, int) and len(stacks) == 1:
        ((stack, held),) = stacks.items()
        if lacking := sorted(set(range(layers)) - held):
            raise SpecError(
                "model.path",
                f"{path!r}: config.json has {layers} layers (num_hidden_layers) but its weights hold {len(held)} "
                f"({stack}.{min(held)}-{max(held)}), so layer {lacking[0]}{' and on' if len(lacking) > 1 else ''} would "
                "train from random values; give the model its own config.json",
            )  # more layers than the config's are left to the worker's check: a model may ship some it never loads
    heads = [module for module in shapes if module == "lm_head" or module.endswith(".lm_head")]
    if config.get("tie_word_embeddings") is False and not heads:
        raise SpecError(
            "model.path",
            f"{path!r}: config.json says the head is not tied to the embeddings (tie_word_embeddings: false) but the "
            "weights hold no lm_head, so the model would train with a random head; set tie_word_embeddings to true "
            "if the model was saved with a tied head, or save it again",
        )
    if "quantization_config" in config:
        return
    for suffix, keys in SIZES.items():
        want = tuple(config.get(key) for key in keys)
        if not all(isinstance(n, int) for n in want):  # another model's names (a multimodal one's text_config)
            continue
        for module, shape in shapes.items():
            if not (module == suffix or module.endswith("." + suffix)) or len(shape) != len(want):
                continue
            if shape != want:
                raise SpecError(
                    "model.path",
                    f"{path!r}: config.json gives {module} the shape [{', '.join(map(str, want))}] ({', '.join(keys)}) "
                    f"but its weights hold [{', '.join(map(str, shape))}]: the training worker's load would fail on it "
                    "after the data is prepared; give the model its own config.json",
                )


SIZES = {
    "embed_tokens": ("vocab_size", "hidden_size"),
    "mlp.gate_proj": ("intermediate_size", "hidden_size"),
    "mlp.up_proj": ("intermediate_size", "hidden_size"),
    "mlp.down_proj": ("hidden_size", "intermediate_size"),
}
"""A module's name ending -> the ``config.json`` keys that give its weight's shape: Llama's names, which Mistral,
Qwen2 and Gemma share. transformers refuses such a misfit itself, but only in the worker, after the data is prepared."""


_LAYER = re.compile(r"(?P<stack>(?:.*\.)?layers)\.(?P<index>\d+)\.")


def load_pretrained(source: str, path: str, **kwargs: Any) -> Any:
    """The one way rayft loads a base: ``AutoModelForCausalLM`` from ``source``'s safetensors, never a pickle
    (``pytorch_model.bin``: a team may write where its models come from), and refused by :func:`check_loaded` where
    its load report says a weight was left random or dropped. ``path``: the model as the error names it."""
    from transformers import AutoModelForCausalLM

    model, loading = AutoModelForCausalLM.from_pretrained(source, use_safetensors=True, output_loading_info=True, **kwargs)
    check_loaded(loading, path)
    return model


def check_loaded(loading_info: dict[str, Collection[str]], path: str) -> None:
    """A worker's load as transformers reports it (``output_loading_info=True``): refused where the model got a weight
    or bias the files lack (it would train from random values) or the files hold one the model has no place for (it
    is dropped). Only ``weight`` and ``bias`` entries count: the files of a quantized base also hold quantization
    state (``weight.absmax``, ...), which transformers reads as part of each weight."""
    missing = sorted(key for key in loading_info.get("missing_keys", ()) if key.rsplit(".", 1)[-1] in _PARAMETERS)
    unexpected = sorted(key for key in loading_info.get("unexpected_keys", ()) if key.rsplit(".", 1)[-1] in _PARAMETERS)
    if not (missing or unexpected):
        return
    parts = [
        f"{len(keys)} {what} ({_grouped(keys)})"
        for keys, what in ((missing, "not in its files"), (unexpected, "not in the model"))
        if keys
    ]
    raise SpecError(
        "model.path",
        f"{path!r}: config.json does not fit the weights: {'; '.join(parts)}. The model would train with random or "
        "dropped weights; give the model its own config.json (num_hidden_layers, tie_word_embeddings, attention_bias)",
    )


_PARAMETERS = ("weight", "bias")


def _grouped(keys: list[str]) -> str:
    """Keys shortened for a message: those of one layer as ``model.layers.2.*``, at most five groups."""
    groups = list(dict.fromkeys(re.sub(r"(\.layers\.\d+)\..*", r"\1.*", key) for key in keys))
    return ", ".join(groups[:5]) + (", ..." if len(groups) > 5 else "")


def check_lora(spec: FineTuneSpec, shapes: dict[str, tuple[int, ...]]) -> None:
    """Each name of ``lora.target_modules`` and ``lora.modules_to_save`` against the modules of ``shapes``
    (:func:`weight_shapes`)."""
    lora = spec.lora
    shapes = {**ALWAYS_THERE, **shapes}
    targets = () if lora.target_modules == ("all-linear",) else lora.target_modules
    matrices = {module for module, shape in shapes.items() if len(shape) >= 2}
    for entry in targets:
        found = [module for module in shapes if module == entry or module.endswith("." + entry)]
        if not found:
            raise SpecError("lora.target_modules", f"'{entry}' names no module of the model{_hint(entry, matrices)}")
        if not any(module in matrices for module in found):
            raise SpecError(
                "lora.target_modules",
                f"'{entry}' names {found[0]}, which holds no weight matrix (a norm?){_hint(entry, matrices)}",
            )
    for entry in lora.modules_to_save:  # PEFT's rule for these is any suffix
        if not any(module.endswith(entry) for module in shapes):
            raise SpecError("lora.modules_to_save", f"'{entry}' names no module of the model{_hint(entry, set(shapes))}")


def _hint(entry: str, modules: set[str]) -> str:
    """A did-you-mean among the modules' last names, then the names themselves."""
    leaves = sorted({module.rsplit(".", 1)[-1] for module in modules})
    close = difflib.get_close_matches(entry.rsplit(".", 1)[-1], leaves, n=1)
    shown = ", ".join(leaves[:16]) + (", ..." if len(leaves) > 16 else "")
    return (f"; did you mean '{close[0]}'?" if close else ";") + f" the model has: {shown}"


def check_tokenizer(directory: Location, path: str, config: dict) -> None:
    """The highest id of ``tokenizer.json`` (its model's vocabulary and its added tokens) against ``config``'s
    ``vocab_size``; nothing where either file or the number is missing (a slow tokenizer, a hub snapshot part-way)."""
    tokenizer = _json(directory, "tokenizer.json", path)
    rows = config.get("vocab_size") or (config.get("text_config") or {}).get("vocab_size")
    vocab = (tokenizer.get("model") or {}).get("vocab") or {}
    ids = list(vocab.values()) if isinstance(vocab, dict) else [len(vocab) - 1] if vocab else []
    ids += [token["id"] for token in tokenizer.get("added_tokens") or () if isinstance(token.get("id"), int)]
    if not isinstance(rows, int) or not ids or max(ids) < rows:
        return
    beyond = sorted(token.get("content", "?") for token in tokenizer.get("added_tokens") or () if token.get("id", -1) >= rows)
    named = f" ({', '.join(beyond[:5])}{', ...' if len(beyond) > 5 else ''})" if beyond else ""
    raise SpecError(
        "model.path",
        f"{path!r}: its tokenizer has ids up to {max(ids):,}{named} but the model's embeddings hold {rows:,} "
        "(config.json vocab_size), so those tokens would index past them; resize the embeddings to the tokenizer "
        "(model.resize_token_embeddings(len(tokenizer))) and save the model again",
    )


def model_directory(path: str, revision: str | None = None) -> Location | None:
    """Where ``model.path``'s files are now: the directory, the S3 prefix, or a hub model's snapshot in the local hub
    cache (``None`` where it is not downloaded yet)."""
    from ray_jobs.storage import location

    if _names_a_directory(path):
        return location(path)
    from huggingface_hub import try_to_load_from_cache

    config = try_to_load_from_cache(path, "config.json", revision=revision)
    return location(os.path.dirname(config)) if isinstance(config, str) else None


def _names_a_directory(path: str) -> bool:
    """``model.path`` is the model's own folder (local or S3), not a hub id whose snapshot may be part-way."""
    return path.startswith("s3://") or os.path.isdir(os.path.expanduser(path))


def weight_files(directory: Location) -> list[str]:
    """The paths of ``directory``'s safetensors files, in ``directory.fs``."""
    import pyarrow.fs as pafs

    listed = directory.fs.get_file_info(pafs.FileSelector(directory.path))
    return sorted(info.path for info in listed if info.type == pafs.FileType.File and info.path.endswith(".safetensors"))


def weight_shapes(directory: Location, files: list[str] | None = None) -> dict[str, tuple[int, ...]]:
    """Every module named in ``directory``'s safetensors ``files`` (all of them by default), with the shape of its
    ``weight`` (``()`` for a module with no ``weight``, as a rotary cache); empty where there is no such file."""
    files = weight_files(directory) if files is None else files
    shapes: dict[str, tuple[int, ...]] = {}
    for name in files:
        for tensor, entry in _header(directory, name).items():
            if tensor == "__metadata__" or "." not in tensor:
                continue
            module, leaf = tensor.rsplit(".", 1)
            if leaf == "weight" or module not in shapes:
                shapes[module] = tuple(entry.get("shape", ())) if leaf == "weight" else ()
    return shapes


def _header(directory: Location, path: str) -> dict:
    shown = f"{directory.uri.rstrip('/')}/{path.rsplit('/', 1)[-1]}"
    with directory.fs.open_input_file(path) as file:
        length = int.from_bytes(file.read_at(8, 0), "little")
        if not 0 < length <= MAX_HEADER_BYTES or length + 8 > file.size():
            raise SpecError("model.path", f"{shown} is not a safetensors file (a header of {length:,} bytes); re-save the model")
        try:
            header = json.loads(file.read_at(length, 8))
            end = max((entry["data_offsets"][1] for name, entry in header.items() if name != "__metadata__"), default=0)
        except (ValueError, KeyError, IndexError, TypeError):
            raise SpecError("model.path", f"{shown} has a damaged safetensors header; re-save the model") from None
        if 8 + length + end != file.size():  # safetensors' own check, which the worker's load would fail on
            raise SpecError(
                "model.path",
                f"{shown} holds {file.size():,} bytes where its header says {8 + length + end:,}: a copy cut short "
                "or added to; copy the model again",
            )
        return header
