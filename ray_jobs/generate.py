"""Answers from a base model with a trained adapter on top (``rayft generate``): greedy, on CPU or one GPU.

The base is the one the adapter names (``base_model_name_or_path``, the spec's ``model.path``), fetched
through the model cache like a job's, so an adapter trained on an ``s3://`` or hub base answers from a
fresh directory. The prompt is rendered with the chat template saved beside the adapter (the one the
job trained with), up to the assistant's header, exactly as training masked it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ray_jobs.data.formats import Turn
from ray_jobs.data.template import ChatEncoder
from rayft_contract.spec import SpecError


def adapter_dir(path: str | Path) -> Path:
    """``path`` itself, or ``path/adapter`` for a run directory; raises ``SpecError`` for neither."""
    for candidate in (Path(path), Path(path) / "adapter"):
        if (candidate / "adapter_config.json").is_file():
            return candidate
    raise SpecError("adapter", f"{str(path)!r} holds no adapter_config.json; point it at RUN or RUN/adapter")


def base_of(adapter: Path, base: str | None = None) -> tuple[str, str]:
    """``(name, local directory)`` of the adapter's base: ``base``, or the one the adapter names (with its
    revision), fetched through the model cache (a local directory as it is; ``s3://`` and hub ids cached)."""
    from ray_jobs.cache.models import fetch_model

    saved = json.loads((adapter / "adapter_config.json").read_text())
    name = base or saved["base_model_name_or_path"]
    field = "--base" if base else "the base its adapter_config.json names (--base to give another)"
    return name, fetch_model(name, None if base else saved.get("revision"), field=field).path


def load(adapter: Path, base: str | None = None) -> tuple[Any, Any]:
    """``(model, tokenizer)``: the base (``base``, or the one the adapter names) with the adapter, in eval mode."""
    name, local = base_of(adapter, base)  # a base that is not there is said before the imports' seconds

    import torch
    from peft import PeftModel
    from transformers import AutoTokenizer

    from ray_jobs.cache.model_files import load_pretrained

    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    model = load_pretrained(local, name, dtype=dtype, device_map={"": device})
    return PeftModel.from_pretrained(model, adapter).eval(), AutoTokenizer.from_pretrained(adapter)


def prompt_ids(tokenizer: Any, prompt: str, system: str | None = None) -> list[int]:
    turns = ([Turn("system", system)] if system else []) + [Turn("user", prompt)]
    return ChatEncoder(tokenizer).prompt_ids(turns)


def answer(model: Any, tokenizer: Any, ids: list[int], max_new_tokens: int = 64) -> str:
    """The greedy continuation of ``ids`` up to the end of the turn, as text."""
    import torch

    ends = {tokenizer.eos_token_id, tokenizer.convert_tokens_to_ids("<|im_end|>")} - {None, tokenizer.unk_token_id}
    inputs = torch.tensor([ids], device=model.device)
    with torch.no_grad():
        out = model.generate(
            input_ids=inputs,
            attention_mask=torch.ones_like(inputs),
            max_new_tokens=max_new_tokens,
            do_sample=False,
            eos_token_id=sorted(ends) or None,
            pad_token_id=tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id,
        )
    return tokenizer.decode(out[0, len(ids) :], skip_special_tokens=True).strip()
