"""The fine-tuning job spec: one typed description shared by the CLI, the service and the job.

A spec is a tree of frozen dataclasses. Every field has a default and a docstring, and each
dataclass validates itself in ``__post_init__``: a bad value raises :class:`SpecError` naming the
field by its dotted path (``train.max_steps``) and saying how to fix it. ``FineTuneSpec.from_dict``
rejects unknown keys (with a "did you mean" hint), so a typo never silently falls back to a default.

The sections are in ``rayft_contract.spec_sections``, the field-by-field reading and the limits in
``rayft_contract.spec_parse``; this module is the spec's public face and names them all. Standard library only
(PyYAML, lazily, to read ``.yaml`` files): the service and every client import this module, so it must stay light.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rayft_contract.spec_parse import MAX_SPEC_BYTES, SpecError, apply_override, check, parse, to_plain
from rayft_contract.spec_sections import (
    DataSpec,
    LoraSpec,
    ModelSpec,
    OutputSpec,
    QuantizationSpec,
    ScalingSpec,
    TrackingSpec,
    TrainSpec,
)

__all__ = [
    "MAX_SPEC_BYTES",
    "DataSpec",
    "FineTuneSpec",
    "LoraSpec",
    "ModelSpec",
    "OutputSpec",
    "QuantizationSpec",
    "ScalingSpec",
    "SpecError",
    "TrackingSpec",
    "TrainSpec",
    "parse",
]


@dataclass(frozen=True)
class FineTuneSpec:
    """A complete LoRA/QLoRA fine-tuning job."""

    name: str = ""
    """Job name: 1-100 ASCII letters, digits, '-', '_' and '.', starting with a letter or digit; also the run
    directory's name (so never ``..``)."""
    model: ModelSpec = field(default_factory=ModelSpec)
    quantization: QuantizationSpec = field(default_factory=QuantizationSpec)
    lora: LoraSpec = field(default_factory=LoraSpec)
    data: DataSpec = field(default_factory=DataSpec)
    train: TrainSpec = field(default_factory=TrainSpec)
    scaling: ScalingSpec = field(default_factory=ScalingSpec)
    output: OutputSpec = field(default_factory=OutputSpec)
    tracking: TrackingSpec = field(default_factory=TrackingSpec)

    def __post_init__(self) -> None:
        # A path component of its own: never "." or "..", never hidden, never a separator (it names the run directory).
        ok = re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}", self.name) is not None
        check(
            ok,
            "name",
            f"must be 1-100 ASCII letters, digits, '-', '_' or '.', starting with a letter or digit, got {self.name!r}",
        )
        per_step = self.train.micro_batch_size * self.scaling.num_workers
        gbs = self.train.global_batch_size
        check(
            gbs is None or gbs % per_step == 0,
            "train.global_batch_size",
            f"must be a multiple of micro_batch_size x num_workers = {per_step}, got {gbs}",
        )
        if self.quantization.mode != "none":
            check(
                self.model.dtype != "float32" or not self.scaling.use_gpu,
                "model.dtype",
                "4-bit/8-bit bases compute in bfloat16 or float16 on GPU; set model.dtype or quantization.mode: none",
            )
        if self.quantization.fp8:
            check(
                self.lora.fused and self.quantization.mode in ("nf4", "none"),
                "quantization.fp8",
                "runs in lora.fused's forward over an nf4 or unquantized base: set lora.fused: true and quantization.mode: "
                "nf4 or none, or quantization.fp8: false",
            )
            check(
                self.scaling.strategy != "fsdp" or self.scaling.num_workers == 1,
                "quantization.fp8",
                "keeps each worker's whole base in FP8, which FSDP shards: use scaling.strategy: ddp, or quantization.fp8: false",
            )
        if self.train.early_stopping_patience is not None:
            check(
                self.train.eval_every is not None and self.data.held_out,
                "train.early_stopping_patience",
                "needs evaluations to judge: set train.eval_every, and data.val_path or data.val_fraction > 0",
            )
        check(
            self.model.attn_implementation != "flex_attention" or self.scaling.use_gpu,
            "model.attn_implementation",
            "flex_attention has no backward on CPU: set scaling.use_gpu: true, or model.attn_implementation: auto",
        )
        check(
            self.model.kernels != "liger" or self.scaling.use_gpu,
            "model.kernels",
            "liger's Triton kernels need GPUs: set scaling.use_gpu: true, or model.kernels: auto (off on CPU)",
        )

    @property
    def grad_accum_steps(self) -> int:
        """Micro-batches per optimizer step on each worker."""
        per_step = self.train.micro_batch_size * self.scaling.num_workers
        return (self.train.global_batch_size or per_step) // per_step

    @property
    def run_dir(self) -> str:
        """``{output.dir}/{name}``: the adapter, summary and Ray Train storage live here."""
        return f"{self.output.dir.rstrip('/')}/{self.name}"

    # -- serialisation -------------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        return to_plain(self)

    def digest(self) -> str:
        """SHA-256 of the spec's canonical JSON: equal specs, equal digests (idempotent submits, the run a
        checkpoint belongs to)."""
        import hashlib

        return hashlib.sha256(json.dumps(self.to_dict(), sort_keys=True).encode()).hexdigest()

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> FineTuneSpec:
        return parse(cls, data)

    @classmethod
    def load(cls, path: str | Path, overrides: Sequence[str] = ()) -> FineTuneSpec:
        """Read a spec from a ``.yaml``/``.yml`` or ``.json`` file, with ``section.key=value`` overrides
        (values parsed as YAML) merged into the file's mapping before it is validated: an override can
        repair a base file, and a typo in one gets the same "did you mean" as one in the file."""
        p = Path(path)
        if not p.is_file():
            raise SpecError("spec", f"file {str(p)!r} does not exist")
        text = p.read_text()
        if p.suffix in (".yaml", ".yml"):
            import yaml

            data = yaml.safe_load(text)
        else:
            data = json.loads(text)
        if not isinstance(data, dict):
            raise SpecError("spec", f"{p} must hold a mapping of sections (model, data, train, ...)")
        for item in overrides:
            apply_override(data, item)
        return cls.from_dict(data)

    def replace(self, **sections: Any) -> FineTuneSpec:
        """A copy with whole fields or sections swapped: ``spec.replace(train=...)``."""
        return dataclasses.replace(self, **sections)

    def with_absolute_paths(self, output: bool = True) -> FineTuneSpec:
        """Local paths made absolute: Ray workers do not share the submitting process's directory.
        Remote URIs and hub ids (``org/name``, not a local directory) stay as they are. ``output=False``
        leaves a relative ``output.dir`` for the service to place."""

        def absolute(path: str, always: bool = False) -> str:
            local = Path(path).expanduser()
            return str(local.resolve()) if "://" not in path and (always or local.exists()) else path

        return self.replace(
            model=dataclasses.replace(self.model, path=absolute(self.model.path)),
            data=dataclasses.replace(
                self.data,
                path=absolute(self.data.path, always=True),  # globs too
                val_path=absolute(self.data.val_path, always=True) if self.data.val_path else "",
            ),
            output=dataclasses.replace(self.output, dir=absolute(self.output.dir, always=True) if output else self.output.dir),
        )
