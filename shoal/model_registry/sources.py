"""Where weights come from: a packaged model, a local path, S3, or a hub id.

`s3://bucket/prefix` sources are downloaded once with boto3 into a local cache (keyed by
the URI) and served from there; registration checks them first, so a missing or
unreachable prefix is refused before anything is registered.

Sources registered at run time (the admin API) come from callers, not the operator, and
are held to more (`registered=True`): a local path must lie under the model roots
(`_local_source`), a hub id must look like one. Whoever registers them, an S3 key never
lands outside its download directory (`_s3_source`) and the gateway never imports a
package (`_packages`).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path

from ..config import S3Settings, Settings
from ..s3 import s3_client
from ._errors import SourceError
from ._local_source import confined_path
from ._packages import check_model_package, gguf_file, model_package_path
from ._s3_source import cache_target, download, list_objects
from .cache_dirs import is_complete, one_builder

__all__ = ["SourceError", "SourceResolver", "gguf_file", "resolve_source"]

_HUB_ID = re.compile(r"(?:\w[\w.-]*/)?\w[\w.-]*")
"""`ORG/NAME` or `NAME` as the hub spells ids; a path (`/x`, `./x`, `../x`) is not one."""


def _hub_id(source: str, registered: bool) -> str:
    hub_id = source.removeprefix("hf:")
    # The loading libraries read an existing directory of that name instead of the hub,
    # so a registered "hub id" that is a path would be a local path under another name.
    if registered and (not _HUB_ID.fullmatch(hub_id) or ".." in hub_id):
        raise SourceError(f"{hub_id!r} is not a hub id (ORG/NAME)")
    return hub_id


class SourceResolver:
    """Turns a source string into something the loading libraries accept."""

    def __init__(
        self,
        cache_dir: str | Path = "",
        s3: S3Settings | None = None,
        roots: Sequence[str | Path] = (),
    ) -> None:
        self.cache_dir = Path(cache_dir) if cache_dir else Path.home() / ".cache" / "shoal"
        self.s3 = s3 or S3Settings()
        self.roots = [Path(root) for root in roots]
        """Where local paths of run-time registrations must lie (none: nowhere)."""

    @classmethod
    def of(cls, settings: Settings) -> SourceResolver:
        """The resolver of a process with these settings (its cache in the data dir)."""
        return cls(settings.cache_path, settings.s3, settings.model_root_paths)

    def _client(self):
        return s3_client(self.s3)

    def check(self, source: str, *, registered: bool = False) -> None:
        """Raises SourceError unless `source` can be fetched (hub ids: their form only).

        Args:
            source: the source.
            registered: it comes from a run-time registration (see the module docstring).
        """
        if source.startswith("gguf:"):
            gguf_file(source, self.roots if registered else None)
        elif source.startswith("s3://"):
            list_objects(self._client(), source)
        elif source.startswith("package:"):
            check_model_package(source.removeprefix("package:"))
        elif source.startswith("hf:"):
            _hub_id(source, registered)
        else:
            self._path(source, registered)

    def local(self, source: str, *, registered: bool = False) -> str:
        """A local directory (or a hub id) for `source`, fetching S3 sources first.

        Args:
            source: the source.
            registered: it comes from a run-time registration (see the module docstring).

        Raises:
            SourceError: the source cannot be fetched, or is not allowed.
        """
        if source.startswith("package:"):
            return model_package_path(source.removeprefix("package:"))
        if source.startswith("gguf:"):
            # the generation worker converts it
            return str(gguf_file(source, self.roots if registered else None))
        if source.startswith("hf:"):
            return _hub_id(source, registered)
        if source.startswith("s3://"):
            return self._fetch_s3(source)
        return str(self._path(source, registered))

    def _path(self, source: str, registered: bool) -> Path:
        if registered:
            return confined_path(source, self.roots)
        path = Path(source).expanduser()
        if not path.exists():
            raise SourceError(f"path {path} does not exist")
        return path

    def _fetch_s3(self, uri: str) -> str:
        target = cache_target(self.cache_dir, uri)
        with one_builder(target):
            if not is_complete(target):
                download(self._client(), uri, target)
        return str(target)


def resolve_source(spec, resolver: SourceResolver | None = None) -> str:
    """A local directory or hub id for a model or adapter spec's `source`."""
    return (resolver or SourceResolver()).local(spec.source)
