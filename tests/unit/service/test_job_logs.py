"""GetJobLogs' tail of a job's log within the API's limits (service/job_logs.py)."""

from __future__ import annotations

from service import job_logs
from service.job_logs import tail


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
