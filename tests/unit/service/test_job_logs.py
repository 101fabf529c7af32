"""GetJobLogs' tail of a job's log, or its lines from one on, within the API's limits (service/job_logs.py)."""

from __future__ import annotations

import pytest

from service import job_logs
from service.job_logs import since, tail


def test_the_tail_is_the_last_lines_in_order_with_the_count_of_those_before():
    log = "".join(f"line {i}\n" for i in range(10))
    assert tail(log, 3) == (["line 7", "line 8", "line 9"], 7)
    assert tail(log, 50) == ([f"line {i}" for i in range(10)], 0)
    assert tail("", 5) == ([], 0)
    assert tail("one line without its end", 5) == (["one line without its end"], 0)


def test_a_tail_stops_at_the_byte_limit_keeping_the_newest_lines(monkeypatch):
    monkeypatch.setattr(job_logs, "MAX_BYTES", 20)
    lines, before = tail("aaaa\nbbbb\ncccc\ndddd\neeee\n", 10)
    assert lines == ["bbbb", "cccc", "dddd", "eeee"] and before == 1  # 4 lines of 5 bytes each: 20


def test_a_line_over_the_length_limit_is_cut_and_says_how_much(monkeypatch):
    monkeypatch.setattr(job_logs, "MAX_LINE_CHARS", 8)
    (line,), before = tail("x" * 20 + "\n", 1)
    assert line == "xxxxxxxx... (12 characters cut)" and before == 0


def test_lines_from_one_on_follow_a_log_as_it_grows_each_line_once():
    log = "".join(f"line {i}\n" for i in range(5))
    assert since(log, 0) == ([f"line {i}" for i in range(5)], 0)
    assert since(log, 3) == (["line 3", "line 4"], 0)
    assert since(log, 5) == ([], 0)  # at the end: nothing yet
    grown = log + "line 5\n"
    assert since(grown, 5) == (["line 5"], 0)
    with pytest.raises(IndexError, match="from_line: 7 is past the log's end, its line 6"):
        since(grown, 7)
    with pytest.raises(IndexError, match="from_line"):
        since(grown, -1)


def test_lines_from_one_on_stop_at_the_limits_and_say_how_many_are_left(monkeypatch):
    monkeypatch.setattr(job_logs, "MAX_LINES", 3)
    assert since("a\nb\nc\nd\ne\n", 1) == (["b", "c", "d"], 1)
    monkeypatch.setattr(job_logs, "MAX_BYTES", 10)
    assert since("aaaa\nbbbb\ncccc\n", 0) == (["aaaa", "bbbb"], 1)  # 5 bytes each with its end
    assert since("a" * 30 + "\nb\n", 0) == (["a" * 30], 1)  # one line always goes: a follower never stalls
