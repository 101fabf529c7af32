"""The adapter out of the last checkpoint: beside it the tokenizer it trained with, and its base named as the spec
names it (the driver's last phase, :func:`ray_jobs.run.run`)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from rayft_contract.spec import FineTuneSpec


def adapter_tokenizer(model_dir: str, spec: FineTuneSpec) -> Any:
    """The tokenizer saved beside the adapter: the driver's copy of the base's (``model_dir``), with the chat
    template it trained with. Loaded during training: on the 7B preset the driver's export took 10.7 s,
    transformers' import and this load among it, in front of the user's summary (issue 12)."""
    from transformers import AutoTokenizer

    from ray_jobs.data.template import ChatEncoder

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    tokenizer.chat_template = ChatEncoder(tokenizer, spec.data.chat_template).template  # the one it trained with
    return tokenizer


def export(checkpoint: Any, spec: FineTuneSpec, tokenizer: Any, target: Path) -> None:
    """Copy the final adapter out of the last checkpoint, with ``tokenizer`` (:func:`adapter_tokenizer`)
    beside it, naming its base as the spec does.

    PEFT records the directory the base was loaded from: for an ``s3://`` model that is a node's cache
    directory, for a hub id a snapshot inside one machine's hub cache, neither of which exists where the
    adapter is used next (another machine, vLLM, a hub upload, ``rayft merge``). The spec's ``model.path``
    (with its revision) is what names the base everywhere."""
    exported = [target]
    with checkpoint.as_directory() as directory:
        saved = Path(directory)
        if (saved / "best_adapter").is_dir():  # an earlier step had the best evaluation (ray_jobs.train.best)
            # output.adapter picks adapter/; the other is kept beside it, named for what it is
            chosen, kept, kept_as = (
                ("best_adapter", "adapter", "last_adapter")
                if spec.output.adapter == "best"
                else ("adapter", "best_adapter", "best_adapter")
            )
            shutil.copytree(saved / chosen, target, dirs_exist_ok=True)
            shutil.copytree(saved / kept, target.parent / kept_as, dirs_exist_ok=True)
            exported.append(target.parent / kept_as)
        else:
            shutil.copytree(saved / "adapter", target, dirs_exist_ok=True)
    for adapter in exported:
        config_file = adapter / "adapter_config.json"
        config = json.loads(config_file.read_text())
        config["base_model_name_or_path"] = spec.model.path
        config["revision"] = spec.model.revision
        config_file.write_text(json.dumps(config, indent=2, sort_keys=True))
        tokenizer.save_pretrained(adapter)
