"""Service settings: auth can be off only on loopback; env and flags."""

from __future__ import annotations

from pathlib import Path

import pytest

from rayft_contract.channel import watch_target
from service.auth import bearer, hash_token, new_token
from service.settings import QUOTAS, ServiceSettings


@pytest.mark.parametrize("host", ["127.0.0.1", "localhost", "::1"])
def test_auth_off_on_loopback(host):
    assert ServiceSettings(host=host, auth=False).auth is False


@pytest.mark.parametrize("host", ["0.0.0.0", "10.1.2.3"])
def test_auth_off_elsewhere_is_refused(host):
    with pytest.raises(ValueError, match="loopback"):
        ServiceSettings(host=host, auth=False)


def test_from_env_and_flags(monkeypatch, tmp_path):
    monkeypatch.setenv("RAYFT_PORT", "6000")
    monkeypatch.setenv("RAYFT_AUTH", "0")
    monkeypatch.setenv("RAYFT_DATA_DIR", str(tmp_path))
    settings = ServiceSettings.from_env(port=7000)
    assert (settings.port, settings.auth, settings.data_dir) == (7000, False, tmp_path)


def test_tokens_hash_and_bearer_parsing():
    token = new_token()
    assert token.startswith("rft_") and hash_token(token) != token and len(hash_token(token)) == 64
    assert bearer([("authorization", f"Bearer {token}")]) == token
    assert bearer([("authorization", "Basic abc")]) is None and bearer([]) is None


def test_the_store_and_the_launch_key_are_readable_by_the_services_user_alone(tmp_path):
    import stat

    from service.auth import launch_ticket, service_key, ticket_matches
    from service.store_sqlite import SqliteJobStore

    data_dir = tmp_path / "svc"
    SqliteJobStore(data_dir / "jobs.db").close()
    key = service_key(data_dir)
    mode = lambda p: stat.S_IMODE(p.stat().st_mode)  # noqa: E731
    assert (mode(data_dir), mode(data_dir / "jobs.db"), mode(data_dir / "launch.key")) == (0o700, 0o600, 0o600)
    assert service_key(data_dir) == key  # made once, then read
    assert launch_ticket(key, "ft-1") == launch_ticket(key, "ft-1")  # every launch of a job carries the same
    assert launch_ticket(key, "ft-2") != launch_ticket(key, "ft-1") != launch_ticket(b"another key", "ft-1")
    assert ticket_matches(key, "ft-1", launch_ticket(key, "ft-1")) and not ticket_matches(key, "ft-2", launch_ticket(key, "ft-1"))
    assert not ticket_matches(key, "ft-1", None)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"host": "0.0.0.0"}, "plaintext only on loopback"),
        ({"tls_cert": Path("c.pem")}, "give both"),
        ({"tls_client_ca": Path("ca.pem")}, "mutual TLS needs the service's own certificate"),
    ],
)
def test_tls_settings_that_would_leak_or_cannot_work_are_refused(kwargs, message):
    with pytest.raises(ValueError, match=message):
        ServiceSettings(**kwargs)


def test_a_non_loopback_service_with_a_certificate_is_fine():
    settings = ServiceSettings(host="0.0.0.0", tls_cert=Path("c.pem"), tls_key=Path("k.pem"))
    assert settings.tls and settings.auth


@pytest.mark.parametrize(
    ("value", "auth", "paused"),
    [("0", False, False), ("no", False, False), ("FALSE", False, False), ("1", True, True), ("", True, False)],
)
def test_on_off_variables_read_alike_and_an_empty_one_keeps_its_default(monkeypatch, value, auth, paused):
    monkeypatch.setenv("RAYFT_AUTH", value)
    monkeypatch.setenv("RAYFT_LAUNCH_PAUSED", value)
    settings = ServiceSettings.from_env()
    assert (settings.auth, settings.launch_paused) == (auth, paused)


def test_cluster_gpus_is_a_count_of_zero_or_more(monkeypatch):
    monkeypatch.setenv("RAYFT_CLUSTER_GPUS", "8")
    assert ServiceSettings.from_env().cluster_gpus == 8
    with pytest.raises(ValueError, match="RAYFT_CLUSTER_GPUS"):
        ServiceSettings(cluster_gpus=-1)


def test_the_watch_port_defaults_beside_the_api_port_and_never_on_the_report_port():
    assert ServiceSettings(port=50051).resolved_watch_port == 50052
    assert ServiceSettings(port=50051, report_port=50052).resolved_watch_port == 50053
    assert ServiceSettings(port=0).resolved_watch_port == 0  # the API's picked: so is this one
    assert ServiceSettings(port=50051, watch_port=7000).resolved_watch_port == 7000


@pytest.mark.parametrize(
    ("api", "advertised", "target"),
    [
        ("rayft.example:443", ":50053", "rayft.example:50053"),
        ("[::1]:50051", ":50052", "[::1]:50052"),
        ("localhost", ":50052", "localhost:50052"),
        ("10.0.0.1:50051", "watch.example:443", "watch.example:443"),  # RAYFT_WATCH_ADDRESS, as given
    ],
)
def test_a_watch_address_of_a_port_alone_is_on_the_host_the_client_dialed(api, advertised, target):
    assert watch_target(api, advertised) == target


def test_the_warm_pool_settings_go_to_every_job_and_a_negative_one_is_refused_by_name(monkeypatch):
    monkeypatch.setenv("RAYFT_WARM_WORKERS", "1")
    monkeypatch.setenv("RAYFT_WARM_IDLE_S", "120")
    settings = ServiceSettings.from_env(auth=False)
    assert settings.job_env == {"RAYFT_WARM_WORKERS": "1", "RAYFT_WARM_IDLE_S": "120.0"}
    assert ServiceSettings(auth=False).job_env == {}, "off unless the operator turns it on: nothing more in a job's environment"
    with pytest.raises(ValueError, match=r"RAYFT_WARM_WORKERS, RAYFT_WARM_IDLE_S\): 0 or more, not -1"):
        ServiceSettings(auth=False, warm_workers=-1)


@pytest.mark.parametrize(("name", "variable", "least"), [(name, *rest) for name, rest in QUOTAS.items()])
def test_a_limit_below_its_least_or_not_a_number_is_refused_by_its_variable(monkeypatch, name, variable, least):
    monkeypatch.setenv(variable, str(least - 1))
    with pytest.raises(ValueError, match=rf"\({variable}\): {least} or more, not {least - 1}$"):
        ServiceSettings.from_env(auth=False)
    monkeypatch.setenv(variable, "two")
    with pytest.raises(ValueError, match=rf"^{variable}: a whole number, not 'two'$"):
        ServiceSettings.from_env(auth=False)
    monkeypatch.setenv(variable, "3")
    assert getattr(ServiceSettings.from_env(auth=False), name) == 3
