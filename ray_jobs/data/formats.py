"""Dataset row layouts, and their mapping to one shape: a list of chat turns.

| format              | columns                                                    |
|---------------------|------------------------------------------------------------|
| `alpaca`            | `instruction`, `output`, optional `input` and `system`     |
| `chat`              | `messages`: `[{"role": ..., "content": ...}]` (OpenAI)     |
| `sharegpt`          | `conversations`: `[{"from": "human"/"gpt"/"system", "value": ...}]` |
| `prompt_completion` | `prompt`, `completion`                                     |
| `text`              | `text` (plain language modelling, every token trained)     |

Every format but `text` becomes a list of ``Turn``s with roles ``system``, ``user`` and ``assistant``;
the chat template (``ray_jobs.data.template``) renders them and decides which tokens are trained.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, NamedTuple


class Turn(NamedTuple):
    role: str
    content: str


class UnknownFormatError(ValueError):
    """The columns match no known layout."""


class BadRowError(ValueError):
    """A row lacks a field its format needs, or holds the wrong type."""


FORMAT_COLUMNS: dict[str, tuple[str, ...]] = {
    "chat": ("messages",),
    "sharegpt": ("conversations",),
    "alpaca": ("instruction", "output"),
    "prompt_completion": ("prompt", "completion"),
    "text": ("text",),
}
"""Columns that identify each format, in detection order."""

_SHAREGPT_ROLES = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant", "system": "system"}


def detect_format(columns: Iterable[str]) -> str:
    """The format whose identifying columns are all present; raises with the columns found."""
    cols = set(columns)
    for name, needed in FORMAT_COLUMNS.items():
        if cols.issuperset(needed):
            return name
    accepted = "; ".join(f"{name} ({', '.join(needed)})" for name, needed in FORMAT_COLUMNS.items())
    raise UnknownFormatError(
        f"cannot tell the dataset format from its columns {sorted(cols)}; "
        f"accepted formats: {accepted}. Rename the columns or set data.format"
    )


def to_turns(row: Mapping[str, Any], fmt: str) -> list[Turn]:
    """Map one row of ``fmt`` (not ``text``) to chat turns."""
    if fmt == "alpaca":
        user = _text(row, "instruction")
        extra = row.get("input")
        if extra:
            user = f"{user}\n\n{extra}"
        turns = [Turn("user", user), Turn("assistant", _text(row, "output"))]
        return ([Turn("system", row["system"])] if row.get("system") else []) + turns
    if fmt == "prompt_completion":
        return [Turn("user", _text(row, "prompt")), Turn("assistant", _text(row, "completion"))]
    if fmt == "chat":
        return [Turn(_role(m.get("role"), m), _content(m, "content")) for m in _messages(row, "messages")]
    if fmt == "sharegpt":
        turns = []
        for m in _messages(row, "conversations"):
            role = _SHAREGPT_ROLES.get(str(m.get("from")))
            if role is None:
                raise BadRowError(f"conversations: unknown speaker {m.get('from')!r}; expected {sorted(_SHAREGPT_ROLES)}")
            turns.append(Turn(role, _content(m, "value")))
        return turns
    raise UnknownFormatError(f"{fmt!r} is not a chat format")


def to_text(row: Mapping[str, Any]) -> str:
    return _text(row, "text")


def _text(row: Mapping[str, Any], key: str) -> str:
    value = row.get(key)
    if not isinstance(value, str):
        raise BadRowError(f"field {key!r} must be a string, got {type(value).__name__}")
    return value


def _messages(row: Mapping[str, Any], key: str) -> list[Mapping[str, Any]]:
    value = row.get(key)
    if value is None or isinstance(value, (str, bytes)) or len(value) == 0:
        raise BadRowError(f"field {key!r} must be a non-empty list of turns")
    return list(value)


def _role(role: Any, message: Mapping[str, Any]) -> str:
    if role not in ("system", "user", "assistant"):
        raise BadRowError(f"messages: role must be system, user or assistant, got {role!r}")
    return role


def _content(message: Mapping[str, Any], key: str) -> str:
    value = message.get(key)
    if not isinstance(value, str):
        raise BadRowError(f"turn field {key!r} must be a string, got {type(value).__name__}")
    return value
