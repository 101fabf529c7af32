"""Each row layout maps to chat turns; unknown layouts name the columns found."""

from __future__ import annotations

import pytest

from ray_jobs.data.formats import BadRowError, Turn, UnknownFormatError, detect_format, to_text, to_turns


@pytest.mark.parametrize(
    ("row", "fmt", "turns"),
    [
        ({"instruction": "Add", "input": "1 2", "output": "3"}, "alpaca", [Turn("user", "Add\n\n1 2"), Turn("assistant", "3")]),
        (
            {"instruction": "Hi", "output": "Hello", "system": "Be kind"},
            "alpaca",
            [Turn("system", "Be kind"), Turn("user", "Hi"), Turn("assistant", "Hello")],
        ),
        (
            {
                "messages": [
                    {"role": "system", "content": "S"},
                    {"role": "user", "content": "U"},
                    {"role": "assistant", "content": "A"},
                ]
            },
            "chat",
            [Turn("system", "S"), Turn("user", "U"), Turn("assistant", "A")],
        ),
        (
            {"conversations": [{"from": "system", "value": "S"}, {"from": "human", "value": "U"}, {"from": "gpt", "value": "A"}]},
            "sharegpt",
            [Turn("system", "S"), Turn("user", "U"), Turn("assistant", "A")],
        ),
        ({"prompt": "P", "completion": "C"}, "prompt_completion", [Turn("user", "P"), Turn("assistant", "C")]),
    ],
)
def test_formats_map_to_turns(row, fmt, turns):
    assert detect_format(row) == fmt
    assert to_turns(row, fmt) == turns


def test_text_format():
    assert detect_format({"text": "hello", "id": 3}) == "text"
    assert to_text({"text": "hello"}) == "hello"


def test_unknown_format_lists_columns_and_formats():
    with pytest.raises(UnknownFormatError) as info:
        detect_format(["question", "answer"])
    message = str(info.value)
    assert "['answer', 'question']" in message
    for name in ("alpaca", "chat", "sharegpt", "prompt_completion", "text"):
        assert name in message
    assert "data.format" in message


@pytest.mark.parametrize(
    ("row", "fmt", "needle"),
    [
        ({"instruction": "x"}, "alpaca", "'output'"),
        ({"prompt": "p", "completion": None}, "prompt_completion", "'completion'"),
        ({"messages": []}, "chat", "'messages'"),
        ({"messages": [{"role": "robot", "content": "x"}]}, "chat", "role"),
        ({"conversations": [{"from": "alien", "value": "x"}]}, "sharegpt", "speaker"),
        ({"messages": [{"role": "user", "content": 5}]}, "chat", "'content'"),
    ],
)
def test_bad_rows_say_what_is_wrong(row, fmt, needle):
    with pytest.raises(BadRowError, match=needle):
        to_turns(row, fmt)
