"""ray_jobs/storage.py: every S3 filesystem a job makes signs with its own team's keys, where it has them."""

from __future__ import annotations

import pytest

from ray_jobs.storage import s3_filesystem, team_credentials


def signing_keys(fs) -> tuple[str, str, str]:
    """The keys a pyarrow S3 filesystem signs with, as it hands them to another process (Ray pickles it)."""
    _, (options,) = fs.__reduce__()
    return options["access_key"], options["secret_key"], options["session_token"]


@pytest.fixture
def teams(tmp_path, monkeypatch):
    """Two teams' Secrets mounted the way k8s/base/raycluster.yaml mounts them: a folder per team, a file per key."""
    for team, key in (("vision", "AKVISION"), ("speech", "AKSPEECH")):
        (tmp_path / team).mkdir()
        (tmp_path / team / "AWS_ACCESS_KEY_ID").write_text(key + "\n")  # a trailing newline, as `echo` leaves it
        (tmp_path / team / "AWS_SECRET_ACCESS_KEY").write_text(f"secret-of-{team}")
    monkeypatch.setenv("RAYFT_TEAM_CREDENTIALS_DIR", str(tmp_path))
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKNODE")  # the node's own identity, which a team's keys replace
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "secret-of-the-node")
    monkeypatch.setenv("AWS_REGION", "us-east-1")
    return tmp_path


def test_a_job_signs_with_its_own_teams_keys_and_never_another_teams(teams, monkeypatch):
    monkeypatch.setenv("RAYFT_TEAM", "vision")
    assert signing_keys(s3_filesystem()) == ("AKVISION", "secret-of-vision", "")
    monkeypatch.setenv("RAYFT_TEAM", "speech")
    assert signing_keys(s3_filesystem()) == ("AKSPEECH", "secret-of-speech", "")


def test_a_session_token_is_used_when_the_secret_holds_one(teams, monkeypatch):
    (teams / "vision" / "AWS_SESSION_TOKEN").write_text("session-1")
    monkeypatch.setenv("RAYFT_TEAM", "vision")
    assert signing_keys(s3_filesystem()) == ("AKVISION", "secret-of-vision", "session-1")


def test_without_a_team_folder_or_outside_the_service_the_usual_chain_signs(teams, monkeypatch):
    monkeypatch.setenv("RAYFT_TEAM", "audio")  # no Secret for this team
    assert team_credentials() == {}
    monkeypatch.delenv("RAYFT_TEAM")  # `rayft train` on one's own cluster
    assert team_credentials() == {}
    assert signing_keys(s3_filesystem())[0] is None  # no keys given: pyarrow's default chain reads AWS_* itself


@pytest.mark.parametrize("team", ["..", "../vision", "a/b", "."])
def test_a_team_name_that_would_leave_the_credentials_folder_is_refused(teams, monkeypatch, team):
    monkeypatch.setenv("RAYFT_TEAM", team)
    with pytest.raises(ValueError, match="one path component"):
        team_credentials()


def test_half_a_secret_fails_loudly_instead_of_signing_as_the_node(teams, monkeypatch):
    (teams / "vision" / "AWS_SECRET_ACCESS_KEY").unlink()
    monkeypatch.setenv("RAYFT_TEAM", "vision")
    with pytest.raises(ValueError, match="AWS_SECRET_ACCESS_KEY"):
        s3_filesystem()
