"""The service's path policy: what a team may read, where it writes (service/policy.py)."""

from __future__ import annotations

import pytest

from rayft_contract.spec import FineTuneSpec, SpecError
from service.policy import PathPolicy, PolicyDenied, is_hub_id, normalize, within

DEFAULT = {
    "output_root": "s3://outputs/{team}",
    "data": ["/srv/data/{team}", "s3://datasets/shared/"],
    "models": ["/srv/models"],
    "hub_models": ["meta-llama/*"],
    "cache": ["s3://cache/{team}"],
    "tracking": ["https://mlflow.internal/"],
}


def spec(**sections) -> FineTuneSpec:
    base = {"name": "job", "model": {"path": "/srv/models/tiny"}, "data": {"path": "/srv/data/vision/train.jsonl"}}
    for key, value in sections.items():
        base[key] = {**base.get(key, {}), **value}
    return FineTuneSpec.from_dict(base)


@pytest.fixture
def policy(tmp_path) -> PathPolicy:
    return PathPolicy.from_dict({"default": DEFAULT, "teams": {"nlp": {"hub_models": ["*"]}}}, protected=(tmp_path / "svc",))


def test_a_job_writes_under_its_teams_root_and_its_own_id(policy):
    assert policy.apply("vision", spec(), "ft-1").output.dir == "s3://outputs/vision/ft-1"
    nested = policy.apply("vision", spec(output={"dir": "s3://outputs/vision/nightly/"}), "ft-2")
    assert nested.output.dir == "s3://outputs/vision/nightly/ft-2"


@pytest.mark.parametrize(
    ("field", "section", "value"),
    [
        ("data.path", "data", {"path": "/etc/shadow"}),
        ("data.path", "data", {"path": "/srv/data/vision/../nlp/train.jsonl"}),  # another team's data, by '..'
        ("data.path", "data", {"path": "/srv/data/visionary/x.jsonl"}),  # a prefix of the text, not of the path
        ("data.path", "data", {"path": "relative/train.jsonl"}),
        ("data.path", "data", {"path": "s3://datasets/shared/../private/x"}),
        ("data.path", "data", {"path": "http://169.254.169.254/latest/meta-data"}),
        ("data.path", "data", {"path": "s3://datasets/sharedx/a.jsonl"}),
        ("data.val_path", "data", {"val_path": "/srv/data/nlp/val.jsonl"}),  # another team's validation set
        ("model.path", "model", {"path": "mistralai/Mistral-7B"}),
        ("model.path", "model", {"path": "/srv/modelsx/tiny"}),
        ("output.dir", "output", {"dir": "s3://outputs/nlp"}),
        ("output.dir", "output", {"dir": "/tmp/anywhere"}),
        ("data.cache_uri", "data", {"cache_uri": "s3://cache/nlp"}),
        ("tracking.mlflow_uri", "tracking", {"mlflow": True, "mlflow_uri": "http://169.254.169.254/"}),
        ("tracking.mlflow_uri", "tracking", {"mlflow": True, "mlflow_uri": "https://mlflow.internal.evil.com"}),
    ],
)
def test_locations_outside_the_allow_lists_are_denied_naming_the_field(policy, field, section, value):
    with pytest.raises(PolicyDenied) as info:
        policy.apply("vision", spec(**{section: value}), "ft-1")
    assert info.value.field == field


def test_a_tracking_server_must_be_one_the_operator_named_and_the_runs_own_store_always_is(policy):
    named = policy.apply("vision", spec(tracking={"mlflow": True, "mlflow_uri": "https://mlflow.internal"}), "ft-1")
    assert named.tracking.mlflow_uri == "https://mlflow.internal"
    assert policy.apply("vision", spec(tracking={"mlflow": True}), "ft-1").tracking.mlflow_uri is None


def test_through_the_service_wandb_runs_offline_and_online_is_refused_naming_the_field(policy):
    offline = spec(tracking={"wandb": True})
    assert policy.apply("vision", offline, "ft-1").tracking.wandb_mode == "offline"
    with pytest.raises(PolicyDenied) as info:
        policy.apply("vision", spec(tracking={"wandb": True, "wandb_mode": "online"}), "ft-1")
    assert info.value.field == "tracking.wandb_mode" and "offline" in str(info.value)


def test_hub_models_match_the_teams_patterns(policy):
    assert policy.apply("vision", spec(model={"path": "meta-llama/Llama-3-8B"}), "ft-1").model.path == "meta-llama/Llama-3-8B"
    assert policy.apply("nlp", spec(model={"path": "mistralai/Mistral-7B"}, data={"path": "/srv/data/nlp/x"}), "ft-1")


def test_the_services_data_directory_is_out_of_reach_whatever_the_lists_say(tmp_path):
    open_policy = PathPolicy.from_dict(
        {"default": {"output_root": "/outputs/{team}", "data": ["/"], "models": ["/"]}}, protected=(tmp_path / "svc",)
    )
    assert open_policy.apply("a", spec(data={"path": "/srv/x.jsonl"}), "ft-1")
    for path in (str(tmp_path / "svc" / "jobs.db"), str(tmp_path), "/"):  # the directory, inside it, or above it
        with pytest.raises(PolicyDenied, match="data directory"):
            open_policy.apply("a", spec(data={"path": path}), "ft-1")


def test_a_team_entry_replaces_the_default_fields_it_names(policy):
    nlp = policy.for_team("nlp")
    assert nlp.hub_models == ("*",) and nlp.data == ("/srv/data/nlp", "s3://datasets/shared/")


def test_without_a_default_an_unlisted_team_may_run_nothing(tmp_path):
    policy = PathPolicy.from_dict({"teams": {"a": DEFAULT}})
    with pytest.raises(PolicyDenied, match="team 'b'"):
        policy.apply("b", spec(), "ft-1")


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ({"default": {"output_rot": "/o"}}, "did you mean 'output_root'"),
        ({"default": {"data": ["/d"]}}, "default.output_root: is required"),
        ({"teams": {"a": {"output_root": "/o", "data": "relative"}}}, "teams.a.data"),
        ({"default": {"output_root": "{svc}/outputs"}}, "lies in the service's data directory"),
        ({"defaults": {}}, "must be a mapping with `default`"),
    ],
)
def test_a_bad_policy_file_is_refused_naming_the_entry(tmp_path, raw, message):
    svc = tmp_path / "svc"
    if "default" in raw and "output_root" in raw["default"]:
        raw["default"]["output_root"] = raw["default"]["output_root"].replace("{svc}", str(svc))
    with pytest.raises(SpecError, match=message):
        PathPolicy.from_dict(raw, protected=(svc,))


def test_normalize_and_within_work_by_whole_segments():
    assert normalize("/a/b/../c/./d", "f") == "/a/c/d"
    assert normalize("S3://bucket//x/", "f") == "s3://bucket/x"
    assert within("/a/b", "/a") and within("/a", "/a/") and not within("/ab", "/a")
    assert within("/anything", "/")
    assert is_hub_id("org/name") and is_hub_id("gpt2")
    assert not is_hub_id("/abs") and not is_hub_id("../up") and not is_hub_id("a/b/c") and not is_hub_id("s3://x/y")


def test_one_persons_service_uses_paths_as_given_and_places_only_a_relative_output(tmp_path):
    policy = PathPolicy.single_user(tmp_path / "svc")
    anywhere = spec(data={"path": "/anywhere/x.jsonl"}, output={"dir": "/my/runs"})
    assert policy.apply("default", anywhere, "ft-1") == anywhere
    placed = policy.apply("default", spec(), "ft-1").output.dir
    assert placed == f"{(tmp_path / 'svc').resolve()}/outputs/default/ft-1"
