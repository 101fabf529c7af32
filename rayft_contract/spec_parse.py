"""Reading typed configuration from plain mappings (YAML, JSON, the wire): the limits every spec value keeps, the
error that names a field by its dotted path, and the field-by-field build with a "did you mean" for unknown keys.

The spec (``rayft_contract.spec``) and other typed configuration files (the service's path policy) are read with
:func:`parse`. Standard library only (PyYAML, lazily, for ``--set`` overrides): every client imports it.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import math
import types
import typing
from typing import Any, Literal

MAX_SPEC_BYTES = 64 * 1024
"""A spec's size on the wire. Real specs are 1-3 KB; the service refuses bigger ones at the API, so one
team's megabyte spec can neither reach Ray's Jobs API (which rejects about 1 MB) nor bloat every list."""
MAX_TEXT_CHARS = 4096
"""Characters in any string field (paths, names, revisions): PATH_MAX on Linux."""
LONG_TEXT_CHARS = {"data.chat_template": 32 * 1024}
"""Fields that hold text rather than a name: a Jinja chat template runs to a few KB."""
MAX_LIST_ITEMS = 64
"""Entries in a list field (``lora.target_modules``): models have a handful of distinct linear names."""


class SpecError(ValueError):
    """A spec field holds a value rayft cannot run. ``field`` is its dotted path."""

    def __init__(self, field: str, message: str):
        self.field = field
        super().__init__(f"{field}: {message}")


def check(ok: bool, name: str, message: str) -> None:
    if not ok:
        raise SpecError(name, message)


def positive(value: int | float | None, name: str, *, allow_none: bool = False, at_most: float | None = None) -> None:
    """``0 < value <= at_most``. The upper bounds are far above any real job; they exist so a typo or a
    hostile spec (``num_workers: 100000``, ``lora.r: 1e9``) is refused up front, not by a cluster that
    waits forever for resources or a worker that runs out of memory an hour in."""
    if value is None and allow_none:
        return
    check(value is not None and value > 0, name, f"must be > 0, got {value!r}")
    if at_most is not None:
        check(value <= at_most, name, f"must be at most {at_most:g}, got {value!r}")  # type: ignore[operator]


def apply_override(data: dict[str, Any], item: str) -> None:
    """Apply one ``section.key=value`` to a spec's raw mapping."""
    import yaml

    key, sep, raw = item.partition("=")
    if not sep or not key:
        raise SpecError("--set", f"expected KEY=VALUE, got {item!r}")
    node: Any = data
    *parents, leaf = key.split(".")
    for part in parents:
        node = node.setdefault(part, {})
        if not isinstance(node, dict):
            raise SpecError(key, f"{part!r} is a value, not a section")
    try:
        node[leaf] = yaml.safe_load(raw)
    except yaml.YAMLError as exc:
        raise SpecError(key, f"cannot parse {raw!r}: {exc}") from None


def parse(cls: type, data: Any, prefix: str = "") -> Any:
    """Build the frozen dataclass ``cls`` from a plain mapping, field by field: unknown keys get a "did
    you mean", values are checked against the field types, errors name the dotted path after ``prefix``.
    Other typed configuration files (the service's path policy) are read with it too."""
    return _build(cls, data, prefix)


def to_plain(obj: Any) -> Any:
    if dataclasses.is_dataclass(obj):
        return {f.name: to_plain(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, tuple):
        return list(obj)
    return obj


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    """A section's field types, resolved once: resolving them was a third of a spec's parse, which the
    service does at every CreateJob (measured with py-spy beside bench/tenant_bench.py)."""
    return typing.get_type_hints(cls)


def _build(cls: type, data: Any, prefix: str) -> Any:
    where = prefix.rstrip(".") or "spec"
    if not isinstance(data, dict):
        raise SpecError(where, f"must be a mapping, got {type(data).__name__}")
    hints = _hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    kwargs: dict[str, Any] = {}
    for key, value in data.items():
        if key not in fields:
            close = difflib.get_close_matches(str(key), list(fields), n=1)
            hint = f"; did you mean '{close[0]}'?" if close else f"; known keys: {', '.join(fields)}"
            raise SpecError(f"{prefix}{key}", f"unknown key{hint}")
        kwargs[key] = _coerce(hints[key], value, f"{prefix}{key}")
    try:
        return cls(**kwargs)
    except TypeError as exc:  # pragma: no cover - guarded by _coerce
        raise SpecError(where, str(exc)) from None


def _coerce(hint: Any, value: Any, name: str) -> Any:
    """Check a YAML/JSON value against a field's type; build nested sections."""
    if dataclasses.is_dataclass(hint):
        return _build(hint, value, prefix=f"{name}.")
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        (inner,) = [a for a in args if a is not type(None)]
        return _coerce(inner, value, name)
    if origin is Literal:
        if value not in args:
            raise SpecError(name, f"must be one of {list(args)}, got {value!r}")
        return value
    if origin is tuple:
        if isinstance(value, str):
            value = [value]
        if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) for v in value):
            raise SpecError(name, f"must be a list of strings, got {value!r}")
        if len(value) > MAX_LIST_ITEMS or any(len(v) > MAX_TEXT_CHARS for v in value):
            raise SpecError(name, f"must hold at most {MAX_LIST_ITEMS} names of at most {MAX_TEXT_CHARS} characters")
        return tuple(value)
    if hint is bool:
        if not isinstance(value, bool):
            raise SpecError(name, f"must be true or false, got {value!r}")
        return value
    if hint is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise SpecError(name, f"must be an integer, got {value!r}")
        return value
    if hint is float:
        if isinstance(value, str):  # YAML 1.1 reads "2e-4" (no dot) as a string
            try:
                value = float(value)
            except ValueError:
                pass
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise SpecError(name, f"must be a finite number, got {value!r}")
        return float(value)
    if hint is str:
        if not isinstance(value, str):
            raise SpecError(name, f"must be a string, got {value!r}")
        limit = LONG_TEXT_CHARS.get(name, MAX_TEXT_CHARS)
        if len(value) > limit:
            raise SpecError(name, f"is {len(value)} characters, over the limit of {limit}")
        return value
    return value  # pragma: no cover - every spec field type is handled above
