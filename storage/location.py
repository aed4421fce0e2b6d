"""Where a store lives: a local folder, or a prefix of an S3-compatible bucket (`s3://bucket/path`).

`store_root(root, storage_options)` returns a `pathlib.Path` for a local store (exactly as
before) or an `ObjectPath` for a bucket. `ObjectPath` has the part of pathlib's API the store
uses (`/`, `name`, `exists`, `is_dir`, `iterdir`, `stat`, `open("rb")`, `read_text`,
`write_text`), served by pyarrow's S3 file system, so checksums, verification and repair run
the same code on both kinds of root.

Storage options use deltalake's names (any case) and default to the usual AWS variables:
AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN, AWS_ENDPOINT_URL (or
AWS_ENDPOINT_URL_S3), AWS_REGION (or AWS_DEFAULT_REGION); AWS_ALLOW_HTTP is set when the
endpoint is http://. Options given to the store win over the environment.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path, PurePath
from typing import Any, NamedTuple
from urllib.parse import urlparse

from storage.errors import StoreError

# The environment variables read for an object-store root, with the option name each fills
# (a later line wins).
_ENV = (
    ("AWS_ACCESS_KEY_ID", "AWS_ACCESS_KEY_ID"),
    ("AWS_SECRET_ACCESS_KEY", "AWS_SECRET_ACCESS_KEY"),
    ("AWS_SESSION_TOKEN", "AWS_SESSION_TOKEN"),
    ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL"),
    ("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL"),  # the S3-only endpoint wins, as in the AWS SDKs
    ("AWS_DEFAULT_REGION", "AWS_REGION"),
    ("AWS_REGION", "AWS_REGION"),
    ("AWS_ALLOW_HTTP", "AWS_ALLOW_HTTP"),
)
_URI = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://(.*)$")
# pathlib folds "s3://b/p" into "s3:/b/p"; CLI options typed as Path arrive that way.
_FOLDED = re.compile(r"^(s3a?):/(?!/)(.*)$")
SCHEMES = ("s3", "s3a")


def storage_options(given: dict[str, Any] | None = None) -> dict[str, str]:
    """deltalake storage options: the AWS variables of the environment, then `given` (keys
    upper-cased); AWS_ALLOW_HTTP=true added for an http:// endpoint."""
    opts: dict[str, str] = {}
    for env, key in _ENV:
        if os.environ.get(env):
            opts[key] = os.environ[env]
    for key, value in (given or {}).items():
        opts[str(key).upper()] = str(value)
    if opts.get("AWS_ENDPOINT_URL", "").startswith("http://"):
        opts.setdefault("AWS_ALLOW_HTTP", "true")
    return opts


def store_root(root: Any, options: dict[str, Any] | None = None) -> Path | ObjectPath:
    """A local store folder as a Path, or an `s3://bucket/path` root as an ObjectPath."""
    if isinstance(root, ObjectPath):
        return root if options is None else ObjectPath(ObjectStore(storage_options(options)), root.bucket, root.key)
    text = os.fspath(root) if isinstance(root, os.PathLike) else str(root)
    match = _URI.match(text) or (_FOLDED.match(text) if isinstance(root, PurePath) else None)
    if match is None:
        return Path(text).expanduser()
    scheme, rest = match.group(1).lower(), match.group(2)
    if scheme == "file":
        return Path(rest).expanduser()
    if scheme not in SCHEMES:
        raise StoreError(f"store root {text!r}: {scheme}:// is not supported; give a local folder or s3://bucket/path")
    bucket, _, key = rest.partition("/")
    if not bucket:
        raise StoreError(f"store root {text!r} names no bucket; give s3://bucket/path")
    return ObjectPath(ObjectStore(storage_options(options)), bucket, key.strip("/"))


def is_object_path(path: Any) -> bool:
    return isinstance(path, ObjectPath)


def delta_options(root: Path | ObjectPath) -> dict[str, str] | None:
    """The storage_options deltalake needs for tables under `root` (None for a local root)."""
    return dict(root.store.options) if isinstance(root, ObjectPath) else None


def scan_parquet(path: Path | ObjectPath) -> Any:
    """pl.scan_parquet of one data file, local or in the bucket."""
    import polars as pl

    if isinstance(path, ObjectPath):
        return pl.scan_parquet(str(path), storage_options=dict(path.store.options))
    return pl.scan_parquet(path)


class ObjectStat(NamedTuple):
    """What `ObjectPath.stat` reports, named like os.stat_result: objects have no ctime or
    inode, so ctime is the last-modified time and ino 0."""

    st_size: int
    st_mtime_ns: int
    st_ctime_ns: int
    st_ino: int


@dataclass(eq=False)
class ObjectStore:
    """The resolved storage options of a bucket and the pyarrow S3 file system built from them."""

    options: dict[str, str]
    _fs: Any = field(default=None, repr=False)

    def __getstate__(self) -> dict[str, Any]:
        return {"options": self.options, "_fs": None}

    @property
    def endpoint(self) -> str:
        return self.options.get("AWS_ENDPOINT_URL") or "AWS S3"

    @property
    def fs(self) -> Any:
        if self._fs is None:
            from pyarrow import fs as pafs

            o = self.options
            kwargs: dict[str, Any] = {"region": o.get("AWS_REGION") or "us-east-1"}
            if o.get("AWS_ACCESS_KEY_ID"):
                kwargs.update(access_key=o["AWS_ACCESS_KEY_ID"], secret_key=o.get("AWS_SECRET_ACCESS_KEY"),
                              session_token=o.get("AWS_SESSION_TOKEN"))
            if o.get("AWS_ENDPOINT_URL"):
                url = urlparse(o["AWS_ENDPOINT_URL"])
                kwargs.update(endpoint_override=url.netloc + url.path.rstrip("/"), scheme=url.scheme or "https")
            self._fs = pafs.S3FileSystem(**kwargs)
        return self._fs


class ObjectPath:
    """An object or prefix `s3://bucket/key` with the pathlib methods the store uses."""

    __slots__ = ("store", "bucket", "key")

    def __init__(self, store: ObjectStore, bucket: str, key: str = "") -> None:
        self.store, self.bucket, self.key = store, bucket, key.strip("/")

    def __truediv__(self, part: str | os.PathLike[str]) -> ObjectPath:
        part = os.fspath(part).strip("/")
        return ObjectPath(self.store, self.bucket, f"{self.key}/{part}" if self.key else part)

    def __str__(self) -> str:
        return f"s3://{self.bucket}/{self.key}" if self.key else f"s3://{self.bucket}"

    def __repr__(self) -> str:
        return f"ObjectPath({str(self)!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ObjectPath) and (self.bucket, self.key) == (other.bucket, other.key)

    def __hash__(self) -> int:
        return hash((self.bucket, self.key))

    @property
    def name(self) -> str:
        return self.key.rsplit("/", 1)[-1] if self.key else self.bucket

    @property
    def _fs_path(self) -> str:
        return f"{self.bucket}/{self.key}" if self.key else self.bucket

    def _info(self) -> Any:
        try:
            return self.store.fs.get_file_info(self._fs_path)
        except OSError as exc:
            raise StoreError(f"{self} at {self.store.endpoint}: {_first_line(exc)}") from exc

    def bucket_exists(self) -> bool:
        return ObjectPath(self.store, self.bucket)._info().type.name != "NotFound"

    def expanduser(self) -> ObjectPath:
        return self

    def exists(self) -> bool:
        return self._info().type.name != "NotFound"

    def is_dir(self) -> bool:
        return self._info().type.name == "Directory"

    def is_file(self) -> bool:
        return self._info().type.name == "File"

    def iterdir(self) -> Iterator[ObjectPath]:
        from pyarrow import fs as pafs

        for info in self.store.fs.get_file_info(pafs.FileSelector(self._fs_path, allow_not_found=True)):
            yield self / info.base_name

    def stat(self) -> ObjectStat:
        info = self._info()
        if info.type.name != "File":
            raise FileNotFoundError(f"no object {self}")
        mtime = info.mtime_ns or 0
        return ObjectStat(info.size, mtime, mtime, 0)

    def open(self, mode: str = "rb") -> Any:
        if mode != "rb":
            raise ValueError(f"{self}: objects open for binary reading only, not {mode!r}")
        try:
            return self.store.fs.open_input_stream(self._fs_path)
        except FileNotFoundError:
            raise
        except OSError as exc:
            if "does not exist" in str(exc) or "NoSuchKey" in str(exc):
                raise FileNotFoundError(f"no object {self}") from exc
            raise

    def read_bytes(self) -> bytes:
        with self.open("rb") as f:
            return f.read()

    def read_text(self, encoding: str = "utf-8") -> str:
        return self.read_bytes().decode(encoding)

    def write_bytes(self, data: bytes) -> None:
        """One PUT: readers see the old object or the new one, never a part."""
        with self.store.fs.open_output_stream(self._fs_path) as f:
            f.write(data)

    def write_text(self, text: str, encoding: str = "utf-8") -> None:
        self.write_bytes(text.encode(encoding))

    def unlink(self, missing_ok: bool = False) -> None:
        try:
            self.store.fs.delete_file(self._fs_path)
        except FileNotFoundError:
            if not missing_ok:
                raise


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]
