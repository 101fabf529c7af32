"""The CLI's conventions: --version, documented exit codes, one-line errors (tracebacks only with --verbose)."""

from __future__ import annotations

import json
import subprocess
import sys
from importlib.metadata import version

import pytest

from rayft import exits
from rayft.cli import main


def rayft(*argv: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    import os

    return subprocess.run(
        [sys.executable, "-m", "rayft", *argv], capture_output=True, text=True, env={**os.environ, **(env or {})}, timeout=120
    )


def test_version_names_the_installed_package():
    done = rayft("--version")
    assert done.returncode == 0 and done.stdout.strip() == f"rayft {version('rayft')}"


def test_a_service_nobody_runs_exits_3_with_one_line(tmp_path):
    # Port 9 (discard) on loopback: nothing listens, so the call fails to connect at once.
    done = rayft("get", "ft-x", env={"RAYFT_ADDRESS": "127.0.0.1:9"})
    assert done.returncode == exits.UNREACHABLE == 3, done.stderr
    assert done.stderr.count("\n") == 1 and done.stderr.startswith("error: unreachable: UNAVAILABLE")
    assert "Traceback" not in done.stderr


def test_usage_and_spec_errors_exit_2(tmp_path, capsys):
    with pytest.raises(SystemExit) as info:
        main(["train"])  # argparse: the spec is missing
    assert info.value.code == exits.USAGE
    assert main(["check", str(tmp_path / "missing.yaml")]) == exits.USAGE


def test_a_failing_command_is_one_line_and_verbose_adds_the_traceback(tmp_path):
    adapter = tmp_path / "adapter"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text("{not json")  # damaged: nothing the CLI checks for by name
    quiet = rayft("merge", str(adapter), "--out", str(tmp_path / "out"))
    assert quiet.returncode == exits.JOB_FAILED == 1
    assert "Traceback" not in quiet.stderr and quiet.stderr.strip().splitlines()[-1].startswith("error: failed: JSONDecodeError")
    assert "--verbose" in quiet.stderr
    loud = rayft("--verbose", "merge", str(adapter), "--out", str(tmp_path / "out"))
    assert loud.returncode == 1 and "Traceback" in loud.stderr


def test_a_base_that_is_not_there_is_a_usage_error_that_names_where_it_came_from(tmp_path):
    """A path read as a hub id once failed deep in huggingface_hub ("Repo id must be in the form ..."), after the
    seconds of importing peft and transformers. Now it is exit 2 and one line naming where the base came from."""
    adapter = tmp_path / "adapter"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text(json.dumps({"base_model_name_or_path": str(tmp_path / "no-base")}))
    named = rayft("merge", str(adapter), "--out", str(tmp_path / "out"))
    assert named.returncode == exits.USAGE and named.stderr.count("\n") == 1, named.stderr
    assert named.stderr.startswith("error: the base its adapter_config.json names (--base to give another): ")
    assert f"{str(tmp_path / 'no-base')!r} is no directory here and no hub id" in named.stderr
    given = rayft("merge", str(adapter), "--out", str(tmp_path / "out"), "--base", "./typo")
    assert given.returncode == exits.USAGE and given.stderr.startswith("error: --base: './typo' is no directory here")
    assert not (tmp_path / "out").exists()


def test_tokens_are_created_listed_and_revoked_and_a_bad_team_is_refused(tmp_path):
    from service.auth import hash_token
    from service.store_sqlite import SqliteJobStore

    env = {"RAYFT_DATA_DIR": str(tmp_path)}
    for bad in (["--team", ""], ["--team", "../other"], ["--team", "vision", "--expires-in", "soon"]):
        done = rayft("token", "create", *bad, env=env)
        assert done.returncode == exits.USAGE and done.stderr.count("\n") == 1, done.stderr
    made = rayft("token", "create", "--team", "vision", "--expires-in", "30d", env=env)
    assert made.returncode == 0, made.stderr
    token = made.stdout.strip()
    token_id = hash_token(token)[:12]
    assert f"token {token_id}, team vision" in made.stderr
    listed = rayft("token", "list", env=env).stdout
    assert token_id in listed and "vision" in listed and "live" in listed and token not in listed
    assert rayft("token", "revoke", token_id, env=env).stdout.startswith(f"revoked {token_id}")
    assert "revoked" in rayft("token", "list", "--team", "vision", env=env).stdout
    assert rayft("token", "revoke", "nope", env=env).returncode == exits.USAGE
    store = SqliteJobStore(tmp_path / "jobs.db")
    assert store.team_for_token(hash_token(token)) is None  # a revoked token opens nothing
    store.close()


def test_an_operators_token_lasts_a_day_unless_told_and_is_listed_apart_from_the_teams(tmp_path):
    from service.auth import OPERATOR, hash_token
    from service.store_sqlite import SqliteJobStore

    env = {"RAYFT_DATA_DIR": str(tmp_path)}
    assert rayft("token", "create", "--operator", "--team", "vision", env=env).returncode == exits.USAGE  # one or the other
    missing = rayft("token", "create", env=env)
    assert missing.returncode == exits.USAGE and "--operator" in missing.stderr, missing.stderr
    made = rayft("token", "create", "--operator", env=env)
    assert made.returncode == 0, made.stderr
    token_id = hash_token(made.stdout.strip())[:12]
    assert f"token {token_id}, operator: every team, expires " in made.stderr
    rayft("token", "create", "--team", "vision", env=env)
    store = SqliteJobStore(tmp_path / "jobs.db")
    try:
        (operator,) = [t for t in store.tokens() if t.team == OPERATOR]
        assert operator.id == token_id and 86400 - 60 < operator.expires_at - operator.created_at <= 86400
        (team,) = [t for t in store.tokens() if t.team == "vision"]
        assert team.expires_at - team.created_at > 89 * 86400  # a team's default stays 90 days
    finally:
        store.close()
    listed = rayft("token", "list", "--operator", env=env).stdout
    assert token_id in listed and "operator" in listed and "vision" not in listed
    assert rayft("token", "revoke", token_id, env=env).stdout == f"revoked {token_id} (operator: every team)\n"


def test_a_backup_of_the_job_store_is_one_line_and_a_second_to_the_same_file_is_refused(tmp_path):
    env = {"RAYFT_DATA_DIR": str(tmp_path / "service")}
    assert rayft("token", "create", "--team", "vision", env=env).returncode == 0
    done = rayft("backup", str(tmp_path / "jobs-backup.db"), env=env)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"0 jobs, 0 events and 1 tokens in {tmp_path / 'jobs-backup.db'} (")
    again = rayft("backup", str(tmp_path / "jobs-backup.db"), env=env)
    assert again.returncode == exits.USAGE and again.stderr.startswith("error: dest: ") and again.stderr.count("\n") == 1
