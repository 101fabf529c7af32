"""Where runs are written: a local directory or an ``s3://`` prefix, through one pyarrow filesystem.

S3 settings come from the environment, so the same spec works against AWS, MinIO or any
S3-compatible store: ``AWS_ENDPOINT_URL`` (or ``AWS_ENDPOINT_URL_S3``) for the endpoint,
``AWS_REGION``/``AWS_DEFAULT_REGION``, and the usual credential variables. Ray Train gets the same
filesystem object (``RunConfig(storage_filesystem=...)``), so checkpoints land beside the adapter.
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
        self.fs.create_dir(self.path.rsplit("/", 1)[0], recursive=True)
        with self.fs.open_output_stream(self.path) as out:
            out.write(text.encode())

    def upload(self, local: Path) -> None:
        """Copy a local directory's files under this location, or a local file to it."""
        import pyarrow.fs as pafs

        if self.is_local and Path(self.path) == Path(local):
            return
        self.fs.create_dir(self.path if local.is_dir() else self.path.rsplit("/", 1)[0], recursive=True)
        pafs.copy_files(str(local), self.path, destination_filesystem=self.fs)

    def delete(self) -> None:
        if self.exists():
            self.fs.delete_dir(self.path)


def location(uri: str) -> Location:
    """The filesystem and path for a local directory or an ``s3://bucket/prefix`` URI."""
    import pyarrow.fs as pafs

    if uri.startswith("s3://"):
        return Location(uri, s3_filesystem(), uri[len("s3://") :].rstrip("/"))
    if "://" in uri:
        raise ValueError(f"unsupported storage URI {uri!r}: use a local path or s3://bucket/prefix")
    path = str(Path(uri).expanduser().resolve())
    return Location(path, pafs.LocalFileSystem(), path)


def s3_filesystem() -> Any:
    import pyarrow.fs as pafs

    endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
    kwargs: dict[str, Any] = {}
    if endpoint:
        scheme, _, host = endpoint.partition("://")
        kwargs.update(endpoint_override=host or scheme, scheme=scheme if host else "https")
    region = os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")
    if region:
        kwargs["region"] = region
    return pafs.S3FileSystem(**kwargs)
