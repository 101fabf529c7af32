"""``lora.target_modules`` and ``lora.modules_to_save`` checked against the model's weights before any cluster starts.

PEFT finds out that a LoRA names no module of the model only when a training worker has loaded the base: on the
tiny model 35 s into a job (the data prepared, the workers started), on a 7B after its load and quantization. And a
typo beside a good name (``[q_prj, v_proj]``) never fails at all: the job trains half the adapters it was asked for.
The names are in the weights' files, so the driver reads them first: each safetensors file starts with 8 bytes
giving its JSON header's length, then the header, one entry per tensor with its shape. That is two small reads a
file (ranged GETs on S3) and no import of torch. Read by hand because the ``safetensors`` package opens a whole file
(memory-mapped, local only) to list its names, and a model on S3 would be downloaded first.

The rule is PEFT's for a list of names: a module matches an entry that is its whole name or a dotted suffix of it
(``q_proj`` and ``self_attn.q_proj`` both match ``model.layers.0.self_attn.q_proj``). An entry must match a module
that holds a weight matrix (a linear layer or an embedding, which LoRA adapts), not only norms. A model stored
without safetensors files is refused (``model.path``): its weights would be a pickle. A hub model not yet
downloaded is not checked here: the worker's load says.
"""

from __future__ import annotations

import difflib
import json
import os
from typing import TYPE_CHECKING

from rayft_contract.spec import SpecError

if TYPE_CHECKING:
    from ray_jobs.storage import Location
    from rayft_contract.spec import FineTuneSpec

MAX_HEADER_BYTES = 100_000_000
"""The safetensors format's own limit on a header; a larger length says the file is not safetensors."""
ALWAYS_THERE = {"lm_head": 2}
"""Modules every causal LM has though its file may not store them: a head tied to the embeddings is saved once."""


def check(spec: FineTuneSpec) -> None:
    """Raise :class:`SpecError` naming ``lora.target_modules`` (or ``lora.modules_to_save``) when an entry matches
    no module of ``spec.model.path`` that LoRA can adapt, and naming ``model.path`` when its directory holds no
    safetensors weights: rayft loads no pickled weights (``pytorch_model.bin``), since unpickling a file can run
    code and a team may write the locations its models come from. Nothing for a hub model not downloaded yet (its
    load asks the hub for safetensors only)."""
    path = spec.model.path
    directory = model_directory(path, spec.model.revision)
    if directory is None:
        return
    files = weight_files(directory)
    if not files:
        if path.startswith("s3://") or os.path.isdir(os.path.expanduser(path)):
            raise SpecError(
                "model.path",
                f"{path!r} holds no *.safetensors weights; rayft loads no pickled weights (pytorch_model.bin), which "
                "can run code when loaded: save the model with save_pretrained(), which writes safetensors",
            )
        return  # a hub snapshot with only some of its files downloaded yet
    lora = spec.lora
    targets = () if lora.target_modules == ("all-linear",) else lora.target_modules
    if not targets and not lora.modules_to_save:
        return
    shapes = weight_ranks(directory, files)
    matrices = {module for module, rank in shapes.items() if rank >= 2}
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


def model_directory(path: str, revision: str | None = None) -> Location | None:
    """Where ``model.path``'s files are now: the directory, the S3 prefix, or a hub model's snapshot in the local hub
    cache (``None`` where it is not downloaded yet)."""
    from ray_jobs.storage import location

    if path.startswith("s3://") or os.path.isdir(os.path.expanduser(path)):
        return location(path)
    from huggingface_hub import try_to_load_from_cache

    config = try_to_load_from_cache(path, "config.json", revision=revision)
    return location(os.path.dirname(config)) if isinstance(config, str) else None


def weight_files(directory: Location) -> list[str]:
    """The paths of ``directory``'s safetensors files, in ``directory.fs``."""
    import pyarrow.fs as pafs

    listed = directory.fs.get_file_info(pafs.FileSelector(directory.path))
    return sorted(info.path for info in listed if info.type == pafs.FileType.File and info.path.endswith(".safetensors"))


def weight_ranks(directory: Location, files: list[str] | None = None) -> dict[str, int]:
    """Every module named in ``directory``'s safetensors ``files`` (all of them by default), with the most dimensions
    of its ``weight`` (0 for a module with no ``weight``, as a rotary cache); empty where there is no such file."""
    files = weight_files(directory) if files is None else files
    if not files:
        return {}
    ranks: dict[str, int] = dict(ALWAYS_THERE)
    for name in files:
        for tensor, entry in _header(directory, name).items():
            if tensor == "__metadata__" or "." not in tensor:
                continue
            module, leaf = tensor.rsplit(".", 1)
            rank = len(entry.get("shape", ())) if leaf == "weight" else 0
            ranks[module] = max(ranks.get(module, 0), rank)
    return ranks


def _header(directory: Location, path: str) -> dict:
    shown = f"{directory.uri.rstrip('/')}/{path.rsplit('/', 1)[-1]}"
    with directory.fs.open_input_file(path) as file:
        length = int.from_bytes(file.read_at(8, 0), "little")
        if not 0 < length <= MAX_HEADER_BYTES or length + 8 > file.size():
            raise SpecError("model.path", f"{shown} is not a safetensors file (a header of {length:,} bytes); re-save the model")
        try:
            return json.loads(file.read_at(length, 8))
        except ValueError:
            raise SpecError("model.path", f"{shown} has a damaged safetensors header; re-save the model") from None
