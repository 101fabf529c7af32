"""Where runs are written: a local directory or an ``s3://`` prefix, through one pyarrow filesystem.

S3 settings come from the environment, so the same spec works against AWS, MinIO or any
S3-compatible store: ``AWS_ENDPOINT_URL`` (or ``AWS_ENDPOINT_URL_S3``) for the endpoint,
``AWS_REGION``/``AWS_DEFAULT_REGION``, and the usual credential variables. Ray Train gets the same
filesystem object (``RunConfig(storage_filesystem=...)``), so checkpoints land beside the adapter.

On a shared cluster each team's keys are its own: the service names the job's team (``RAYFT_TEAM``) and
the Ray nodes mount one Secret per team under ``RAYFT_TEAM_CREDENTIALS_DIR`` (``k8s/base/raycluster.yaml``).
Every S3 filesystem the job makes, in its driver, its Train workers and its Ray Data tasks, then signs
with its team's keys. Only the team's name travels in Ray's runtime environment, never a key.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any


@dataclasses.dataclass(frozen=True)
class Location:
    """A directory on a filesystem: ``fs`` (pyarrow) and ``path`` inside it (``bucket/key`` on S3)."""

    uri: str
    fs: Any
    path: str

    @property
    def is_local(self) -> bool:
        return "://" not in self.uri

    def child(self, name: str) -> Location:
        sep = "" if self.uri.endswith("/") else "/"
        return Location(f"{self.uri}{sep}{name}", self.fs, f"{self.path.rstrip('/')}/{name}")

    def exists(self) -> bool:
        import pyarrow.fs as pafs

        return self.fs.get_file_info(self.path).type != pafs.FileType.NotFound

    def write_text(self, text: str) -> None:
        self.write_bytes(text.encode())

    def write_bytes(self, data: bytes) -> None:
        """The whole file or none of it, for a reader at any moment: on S3 one PUT is atomic; a local file is
        written beside and renamed into place."""
        import uuid

        self.fs.create_dir(self.path.rsplit("/", 1)[0], recursive=True)
        target = self.path if not self.is_local else f"{self.path}.{uuid.uuid4().hex[:8]}.part"
        with self.fs.open_output_stream(target) as out:
            out.write(data)
        if target != self.path:
            self.fs.move(target, self.path)

    def read_bytes(self) -> bytes:
        with self.fs.open_input_stream(self.path) as stream:
            return stream.read()

    def upload(self, local: Path) -> None:
        """Copy a local directory's files under this location, or a local file to it."""
        import pyarrow.fs as pafs

        if self.is_local and Path(self.path) == Path(local):
            return
        self.fs.create_dir(self.path if local.is_dir() else self.path.rsplit("/", 1)[0], recursive=True)
        pafs.copy_files(str(local), self.path, destination_filesystem=self.fs)

    def upload_tree(self, local: str | Path, last: str) -> None:
        """Copy a local directory's files under this location, the file named ``last`` after all the others:
        where it is, the copy is whole (a reader checks for it)."""
        import pyarrow.fs as pafs

        local = Path(local)
        self.fs.create_dir(self.path, recursive=True)
        for item in sorted(local.iterdir()):
            if item.name != last:
                target = self.child(item.name)
                self.fs.create_dir(target.path if item.is_dir() else self.path, recursive=True)
                pafs.copy_files(str(item), target.path, destination_filesystem=self.fs)
        pafs.copy_files(str(local / last), self.child(last).path, destination_filesystem=self.fs)

    def list_dirs(self) -> list[str]:
        """The names of the directories right under this location (none when it does not exist)."""
        import pyarrow.fs as pafs

        if not self.exists():
            return []
        found = self.fs.get_file_info(pafs.FileSelector(self.path))
        return sorted(info.base_name for info in found if info.type == pafs.FileType.Directory)

    def delete(self) -> None:
        if self.exists():
            self.fs.delete_dir(self.path)


def location(uri: str, *, team_keys: bool = True) -> Location:
    """The filesystem and path for a local directory or an ``s3://bucket/prefix`` URI. ``team_keys=False``: S3
    signed with the node's own identity, never the job's team's keys, for the operator's own stores (the
    cluster's compiled kernels, ``ray_jobs.train.kernel_store``), which no team's keys may write."""
    import pyarrow.fs as pafs

    if uri.startswith("s3://"):
        return Location(uri, s3_filesystem(team_keys=team_keys), uri[len("s3://") :].rstrip("/"))
    if "://" in uri:
        raise ValueError(f"unsupported storage URI {uri!r}: use a local path or s3://bucket/prefix")
    path = str(Path(uri).expanduser().resolve())
    return Location(path, pafs.LocalFileSystem(), path)


def s3_filesystem(*, team_keys: bool = True) -> Any:
    import pyarrow.fs as pafs

    endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
    kwargs: dict[str, Any] = {}
    if endpoint:
        scheme, _, host = endpoint.partition("://")
        kwargs.update(endpoint_override=host or scheme, scheme=scheme if host else "https")
    region = os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")
    if region:
        kwargs["region"] = region
    keys = team_credentials() if team_keys else {}
    if keys:
        kwargs.update(
            access_key=keys["AWS_ACCESS_KEY_ID"],
            secret_key=keys["AWS_SECRET_ACCESS_KEY"],
            session_token=keys.get("AWS_SESSION_TOKEN", ""),
        )
    return pafs.S3FileSystem(**kwargs)


CREDENTIAL_FILES = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN")


def team_credentials() -> dict[str, str]:
    """The job's team's S3 keys: ``{RAYFT_TEAM_CREDENTIALS_DIR}/{RAYFT_TEAM}/AWS_ACCESS_KEY_ID`` and the rest,
    one file per key (a Secret's layout). Empty where either is unset or the team has no folder: then the
    usual chain (environment, the node's workload identity) signs. A folder with one key but not the other
    is an operator's mistake and fails loudly, rather than falling back to the nodes' identity."""
    root, team = os.environ.get("RAYFT_TEAM_CREDENTIALS_DIR"), os.environ.get("RAYFT_TEAM")
    if not root or not team:
        return {}
    if team in (".", "..") or "/" in team or "\\" in team:
        raise ValueError(f"RAYFT_TEAM={team!r} is not one path component")
    folder = Path(root) / team
    keys = {name: (folder / name).read_text().strip() for name in CREDENTIAL_FILES if (folder / name).is_file()}
    if keys and not {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"} <= keys.keys():
        raise ValueError(f"{folder} holds {sorted(keys)}: a team's credentials need AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY")
    return keys
