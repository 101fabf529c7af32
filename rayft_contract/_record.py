"""The base of every typed record (``rayft_contract.records``, ``rayft_contract.data_records``): a frozen dataclass
that travels as plain JSON and is read back by attribute.

``from_dict`` ignores keys it does not know and fills fields that are missing with their defaults, so a
client reads a summary written by a newer or an older job. A field without a default is required.
"""

from __future__ import annotations

import dataclasses
import functools
import types
import typing
from typing import Any, TypeVar

R = TypeVar("R", bound="Record")


class Record:
    """``to_dict`` / ``from_dict`` for a frozen dataclass whose fields are JSON values, records, or tuples and
    dicts of them (nested records are built from their own dicts)."""

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)  # type: ignore[call-overload]

    @classmethod
    def from_dict(cls: type[R], data: dict[str, Any]) -> R:
        hints = _hints(cls)
        known = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
        return cls(**{name: _build(hints[name], value) for name, value in data.items() if name in known})


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _build(hint: Any, value: Any) -> Any:
    """``value`` (plain JSON) as the type ``hint`` names."""
    if value is None:
        return None
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        return _build(next(a for a in args if a is not type(None)), value)
    if isinstance(hint, type) and issubclass(hint, Record):
        return value if isinstance(value, hint) else hint.from_dict(value)
    if origin is tuple:
        return tuple(_build(args[0], v) for v in value)
    if origin is dict:
        return {k: _build(args[1], v) for k, v in value.items()}
    return value
