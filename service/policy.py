"""What each team may read and where it writes: the service's path policy, enforced at CreateJob.

The operator writes it (``rayft serve --policy FILE`` or ``RAYFT_POLICY``)::

    default:                                  # every team not named under `teams`
      output_root: "s3://rayft-outputs/{team}"  # quoted: YAML reads a bare {...} as a mapping
      data: [s3://datasets/shared/]           # prefixes data.path may lie under
      models: [/models/]                      # prefixes model.path may lie under
      hub_models: []                          # hub ids (fnmatch patterns) model.path may name
      cache: [s3://rayft-cache/]              # prefixes data.cache_uri may lie under (unset: the node's cache)
      tracking: [https://mlflow.internal]     # MLflow URIs tracking.mlflow_uri may name, exactly (unset: the run's own store)
    teams:
      vision:                                 # a team's entry replaces the default's fields it names
        data: [s3://datasets/vision/, s3://datasets/shared/]

``{team}`` in any entry becomes the calling team. A location is allowed when, after its ``.`` and
``..`` are resolved (``/data/../etc`` is ``/etc``), it equals an allowed prefix or lies under it by whole
path segments (``/data`` allows ``/data/x``, not ``/database``). Local paths must be absolute: they
are read on the cluster's nodes, not where the client runs. No team may read or write the service's own
data directory, and link-local hosts (cloud metadata endpoints such as ``169.254.169.254``) are refused
whatever the policy says.

Without a policy file the service runs open only where it runs for one person (auth off, loopback):
the spec's paths are used as given, as ``rayft train`` uses them. With auth on it needs a policy.

Hand-written because no library judges "is this URI inside that prefix" for both local paths and
object-store URIs; the rules are the few above.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import ipaddress
import os
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rayft_contract.spec import FineTuneSpec, SpecError, parse

if TYPE_CHECKING:
    from service.settings import ServiceSettings


class PolicyDenied(SpecError):
    """The spec names a location its team may not use: ``PERMISSION_DENIED``, naming the field."""


@dataclasses.dataclass(frozen=True)
class TeamPolicy:
    """One team's locations (after ``{team}`` is filled in)."""

    output_root: str = ""
    """Local directory or ``s3://`` prefix; every job of the team writes under ``{output_root}/{job id}``."""
    data: tuple[str, ...] = ()
    """Prefixes ``data.path`` may lie under."""
    models: tuple[str, ...] = ()
    """Prefixes ``model.path`` may lie under (local model directories, ``s3://``)."""
    hub_models: tuple[str, ...] = ()
    """fnmatch patterns of hub ids ``model.path`` may name (``meta-llama/*``; ``*`` for any)."""
    cache: tuple[str, ...] = ()
    """Prefixes ``data.cache_uri`` may lie under; an unset cache_uri (the node's own cache) is always allowed."""
    tracking: tuple[str, ...] = ()
    """MLflow tracking URIs ``tracking.mlflow_uri`` may name, compared whole: a job reaches that server from the
    cluster's network. Unset (the file store in the job's own run directory) is always allowed."""

    def for_team(self, team: str) -> TeamPolicy:
        fill = lambda text: text.replace("{team}", team)  # noqa: E731
        return TeamPolicy(
            output_root=fill(self.output_root),
            data=tuple(map(fill, self.data)),
            models=tuple(map(fill, self.models)),
            hub_models=tuple(map(fill, self.hub_models)),
            cache=tuple(map(fill, self.cache)),
            tracking=tuple(map(fill, self.tracking)),
        )


@dataclasses.dataclass(frozen=True)
class PathPolicy:
    default: TeamPolicy | None
    """For teams not listed; ``None``: an unlisted team may run nothing."""
    teams: dict[str, TeamPolicy]
    protected: tuple[str, ...] = ()
    """Locations no team reaches whatever the allow-lists say: the service's data directory."""
    enforce: bool = True
    """False for one person's service (auth off, no policy file): paths are used as given, and only a
    relative ``output.dir`` is placed, under ``{data_dir}/outputs/{team}/{job id}``."""

    @classmethod
    def single_user(cls, data_dir: Path) -> PathPolicy:
        root = TeamPolicy(output_root=f"{Path(data_dir).resolve()}/outputs/{{team}}")
        return cls(default=root, teams={}, enforce=False)

    @classmethod
    def load(cls, path: str | Path, protected: tuple[str | Path, ...] = ()) -> PathPolicy:
        """Read and check a policy file; raises ``SpecError`` naming the bad entry."""
        import yaml

        p = Path(path)
        try:
            raw = yaml.safe_load(p.read_text()) or {}
        except (OSError, yaml.YAMLError) as exc:
            raise SpecError("policy", f"cannot read {str(p)!r}: {exc}") from None
        return cls.from_dict(raw, protected)

    @classmethod
    def from_dict(cls, raw: Any, protected: tuple[str | Path, ...] = ()) -> PathPolicy:
        if not isinstance(raw, dict) or set(raw) - {"default", "teams"}:
            raise SpecError("policy", "must be a mapping with `default` and/or `teams` (see service/policy.py)")
        default = parse(TeamPolicy, raw["default"], "default.") if raw.get("default") is not None else None
        teams_raw = raw.get("teams") or {}
        if not isinstance(teams_raw, dict):
            raise SpecError("teams", "must map team names to their entries")
        base = dataclasses.asdict(default) if default else {}
        teams = {str(name): parse(TeamPolicy, {**base, **(entry or {})}, f"teams.{name}.") for name, entry in teams_raw.items()}
        policy = cls(default, teams, tuple(str(Path(p).resolve()) for p in protected))
        for name, entry in [("default", default), *teams.items()]:
            if entry is not None:
                policy._check_entry(name, entry.for_team(name if name != "default" else "team"))
        return policy

    def _check_entry(self, name: str, entry: TeamPolicy) -> None:
        where = name if name == "default" else f"teams.{name}"
        if not entry.output_root:
            raise SpecError(f"{where}.output_root", "is required: the directory or s3:// prefix the team's jobs write under")
        for field, values in (
            ("output_root", [entry.output_root]),
            ("data", entry.data),
            ("models", entry.models),
            ("cache", entry.cache),
        ):
            for value in values:
                location = normalize(value, f"{where}.{field}")
                for guarded in self.protected:  # a prefix above it is fine: apply() refuses the data directory itself
                    if within(location, guarded):
                        raise SpecError(f"{where}.{field}", f"{value!r} lies in the service's data directory {guarded}")

    def for_team(self, team: str) -> TeamPolicy:
        entry = self.teams.get(team, self.default)
        if entry is None:
            raise PolicyDenied("team", f"the policy allows team {team!r} no locations: the operator adds it under `teams`")
        return entry.for_team(team)

    def apply(self, team: str, spec: FineTuneSpec, job_id: str) -> FineTuneSpec:
        """The spec the job runs: its output moved under ``{output_root}/{job id}``, every location it reads
        checked. Raises ``PolicyDenied`` (the field, the value, what is allowed) or ``SpecError``."""
        entry = self.for_team(team)
        if not self.enforce:
            if "://" in spec.output.dir or spec.output.dir.startswith("/"):
                return spec
            return spec.replace(output=dataclasses.replace(spec.output, dir=f"{entry.output_root}/{job_id}"))
        self._allowed("data.path", spec.data.path, entry.data)
        if spec.data.val_path:
            self._allowed("data.val_path", spec.data.val_path, entry.data)
        if spec.data.cache_uri is not None:
            self._allowed("data.cache_uri", spec.data.cache_uri, entry.cache)
        if spec.tracking.wandb and spec.tracking.wandb_mode == "online":
            raise PolicyDenied(
                "tracking.wandb_mode",
                "online W&B is not available through the service (its API key would sit in the job's environment, "
                "where other teams can read it): use offline, which writes the run to the run directory's wandb/ "
                "for `wandb sync`",
            )
        uri = spec.tracking.mlflow_uri
        if uri is not None and uri.rstrip("/") not in {t.rstrip("/") for t in entry.tracking}:
            allowed = ", ".join(entry.tracking) or "none (leave it unset: the run's own file store)"
            raise PolicyDenied("tracking.mlflow_uri", f"{uri!r} is not allowed for team {team!r}; allowed: {allowed}")
        model = spec.model.path
        if is_hub_id(model):
            if not any(fnmatch.fnmatchcase(model, pattern) for pattern in entry.hub_models):
                allowed = ", ".join(entry.hub_models) or "none"
                raise PolicyDenied(
                    "model.path", f"hub model {model!r} is not allowed for team {team!r}; allowed hub ids: {allowed}"
                )
        else:
            self._allowed("model.path", model, entry.models)
        root = normalize(entry.output_root, "output_root")
        given = spec.output.dir
        if "://" in given or given.startswith("/"):  # a place under the team's root; relative ones mean the root
            self._allowed("output.dir", given, (entry.output_root,))
            root = normalize(given, "output.dir")
        output = dataclasses.replace(spec.output, dir=f"{root.rstrip('/')}/{job_id}")
        return spec.replace(output=output)

    def _allowed(self, field: str, value: str, prefixes: tuple[str, ...]) -> None:
        location = normalize(value, field)
        for guarded in self.protected:
            if within(location, guarded) or within(guarded, location):
                raise PolicyDenied(field, f"{value!r} is inside the service's own data directory; no job may use it")
        if not any(within(location, normalize(prefix, field)) for prefix in prefixes):
            allowed = ", ".join(prefixes) or "none (ask the operator to allow a location)"
            raise PolicyDenied(field, f"{value!r} is outside what this team may use; allowed: {allowed}")


def load_for(settings: ServiceSettings) -> PathPolicy:
    """The policy the service enforces; not enforcing only for one person's service (auth off, no file).
    Raises ``SpecError`` for a bad file, or when auth is on and no file is given."""
    if settings.policy_file is None:
        if settings.auth:
            raise SpecError(
                "policy",
                "auth is on, so teams share this service: give a path policy (--policy FILE or RAYFT_POLICY) "
                "naming each team's output root and the data and model locations it may read (format: service/policy.py)",
            )
        return PathPolicy.single_user(settings.data_dir)
    return PathPolicy.load(settings.policy_file, protected=(settings.data_dir,))


_HUB_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*(/[A-Za-z0-9][A-Za-z0-9_.-]*)?")


def is_hub_id(path: str) -> bool:
    """``org/name`` or ``name``: not a URI, not an absolute path, no ``..``."""
    return "://" not in path and not path.startswith(("/", "~")) and ".." not in path and _HUB_ID.fullmatch(path) is not None


def normalize(location: str, field: str) -> str:
    """One spelling per location: local paths absolute with ``.``/``..`` resolved lexically; URIs with a
    lower-case scheme, no empty segments, and no ``.``/``..`` segments at all (object stores keep them
    literally, some readers resolve them: refused rather than guessed)."""
    if "://" in location:
        scheme, _, rest = location.partition("://")
        segments = rest.split("/")
        if any(s in (".", "..") for s in segments):
            raise PolicyDenied(field, f"{location!r} has '.' or '..' segments; name the location directly")
        host = segments[0].rsplit("@", 1)[-1].split(":")[0].strip("[]")
        try:
            link_local = ipaddress.ip_address(host).is_link_local
        except ValueError:
            link_local = host.endswith("metadata.google.internal")
        if link_local:
            raise PolicyDenied(field, f"{location!r} is a link-local (cloud metadata) address; never allowed")
        return f"{scheme.lower()}://{'/'.join(s for s in segments if s)}"
    if not location.startswith("/"):
        raise PolicyDenied(field, f"{location!r} is relative; give an absolute path as the cluster's nodes see it")
    return os.path.normpath(location)


def within(location: str, prefix: str) -> bool:
    """``location`` is ``prefix`` or lies under it by whole segments (both normalized)."""
    prefix = prefix.rstrip("/")
    return location == prefix or location.startswith(prefix + "/") or (prefix == "" and location.startswith("/"))
