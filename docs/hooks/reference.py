"""MkDocs hook: the configuration and command-line references, written at build time.

A page holding `<!-- reference:settings -->` gets every setting (its key, default,
`SHOAL_*` variable and the docstring under its field in `shoal/config/`);
`<!-- reference:model-spec -->` every field of a model spec (`shoal/model_registry/spec.py`);
`<!-- reference:cli -->` the help of every `shoal` command, from its argument parser;
`<!-- reference:endpoints -->` every route that runs work, from the route table
(`shoal/api/endpoints.py`).
A field without a docstring is a warning, so `mkdocs build --strict` fails on it.
"""

from __future__ import annotations

import argparse
import ast
import functools
import importlib
import inspect
import itertools
import logging
import sys
import textwrap
import warnings
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
log = logging.getLogger("mkdocs.hooks.reference")

SETTINGS = "<!-- reference:settings -->"
MODEL_SPEC = "<!-- reference:model-spec -->"
CLI = "<!-- reference:cli -->"
ENDPOINTS = "<!-- reference:endpoints -->"
HELP_WIDTH = 96


def _import_this_trees_shoal() -> None:
    """Import `shoal` from this tree, now: MkDocs takes what a hook adds to `sys.path` back
    out once the hook is loaded, and the venv's editable install may name another tree
    (a worktree's docs would then describe the main checkout's code)."""
    sys.path.insert(0, str(ROOT))
    try:
        shoal = importlib.import_module("shoal")
    finally:
        sys.path.remove(str(ROOT))
    if Path(shoal.__file__).parent != ROOT / "shoal":
        log.warning("reference: documenting %s, not this tree's shoal/", shoal.__file__)


_import_this_trees_shoal()


def on_page_markdown(markdown: str, **_: Any) -> str:
    if SETTINGS in markdown:
        markdown = markdown.replace(SETTINGS, settings_reference())
    if MODEL_SPEC in markdown:
        markdown = markdown.replace(MODEL_SPEC, model_spec_reference())
    if CLI in markdown:
        markdown = markdown.replace(CLI, cli_reference())
    if ENDPOINTS in markdown:
        markdown = markdown.replace(ENDPOINTS, endpoints_reference())
    return markdown


def endpoints_reference() -> str:
    from shoal.api.endpoints import GROUPS

    lines = [
        "| route | what | key right | request | streams | batch line |",
        "|---|---|---|---|---|---|",
    ]
    for group in GROUPS:
        for e in group.endpoints:
            paths = ", ".join(f"`POST {path}`" for path in e.paths)
            lines.append(
                f"| {paths} | {e.summary} | `{group.name}` | `{e.request.__name__}` |"
                f" {'yes' if e.streams else ''} | {'yes' if e.batchable else ''} |"
            )
    return "\n".join(lines)


def settings_reference() -> str:
    import msgspec

    from shoal.config import ApiKey, Settings

    out: list[str] = []
    top: list[tuple[str, str, Any, str]] = []
    sections: list[tuple[str, type]] = []
    docs = _field_docs(Settings)
    for f in msgspec.structs.fields(Settings):
        if isinstance(f.type, type) and issubclass(f.type, msgspec.Struct):
            sections.append((f.name, f.type))
        else:
            top.append((f.name, f"SHOAL_{f.name.upper()}", _default(f), docs.get(f.name, "")))
    out += ["### Top level", "", *_table(top)]
    for section, struct in sections:
        rows = []
        field_docs = _field_docs(struct)
        for f in msgspec.structs.fields(struct):
            variable = f"SHOAL_{section.upper()}__{f.name.upper()}"
            if (section, f.name) == ("telemetry", "otel"):
                variable = "`OTEL_*` (the standard variables)"
            rows.append((f"{section}.{f.name}", variable, _default(f), field_docs.get(f.name, "")))
        out += [f"### `{section}`", "", _doc(struct), "", *_table(rows)]
    out += ["### An API key's entry", "", _doc(ApiKey), "", *_struct_table(ApiKey, "auth.keys[].")]
    return "\n".join(out)


def model_spec_reference() -> str:
    from shoal.model_registry.spec import BatchProfile, ModelSpec, MultiVectorOptions

    out: list[str] = []
    for title, struct, prefix in (
        ("`[[models]]`", ModelSpec, ""),
        ("`[models.profile]`", BatchProfile, "profile."),
        ("`[models.multivector]`", MultiVectorOptions, "multivector."),
    ):
        out += [f"### {title}", "", _doc(struct), "", *_struct_table(struct, prefix)]
    return "\n".join(out)


def _struct_table(struct: type, prefix: str) -> list[str]:
    import msgspec

    docs = _field_docs(struct)
    rows = [
        (f"{prefix}{f.name}", "", _default(f), docs.get(f.name, ""))
        for f in msgspec.structs.fields(struct)
        if not (isinstance(f.type, type) and issubclass(f.type, msgspec.Struct))  # own table
    ]
    return _table(rows, variable=False)


def _table(rows: list[tuple[str, str, Any, str]], variable: bool = True) -> list[str]:
    head = "| key | variable | default | meaning |" if variable else "| key | default | meaning |"
    lines = [head, "|---" * head.count(" | ") + "|---|"]
    for key, var, default, doc in rows:
        if not doc:
            log.warning("reference: %s has no docstring in shoal/", key)
        if variable:
            shown = var if var.startswith("`") else f"`{var}`"
            lines.append(f"| `{key}` | {shown} | {default} | {_cell(doc)} |")
        else:
            lines.append(f"| `{key}` | {default} | {_cell(doc)} |")
    return [*lines, ""]


def _default(field: Any) -> str:
    import msgspec

    if field.default is not msgspec.NODEFAULT:
        value = field.default
    elif field.default_factory is not msgspec.NODEFAULT:
        value = field.default_factory()
    else:
        return "(required)"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, list | dict):
        return f"`{','.join(map(str, value))}`" if value else "(empty)"
    if value == "":
        return "(empty)"
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    shown = f"`{value}`"
    if isinstance(value, int) and "bytes" in field.name and value >= 1 << 20:
        shown += f" ({_bytes(value)})"
    return shown


def _bytes(n: int) -> str:
    for unit, size in (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20)):
        if n >= size and n % size == 0:
            return f"{n // size} {unit}"
    return f"{n / (1 << 20):.0f} MiB"


def _field_docs(cls: type) -> dict[str, str]:
    """The string literal under each annotated field of `cls` (its docstring)."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    body = tree.body[0].body  # type: ignore[attr-defined]
    docs = {}
    for node, after in itertools.pairwise(body):
        if (
            isinstance(node, ast.AnnAssign)
            and isinstance(node.target, ast.Name)
            and isinstance(after, ast.Expr)
            and isinstance(after.value, ast.Constant)
            and isinstance(after.value.value, str)
        ):
            docs[node.target.id] = " ".join(after.value.value.split())
    return docs


def _doc(cls: type) -> str:
    return " ".join((cls.__doc__ or "").split())


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def cli_reference() -> str:
    with warnings.catch_warnings():  # what its imports deprecate is not the docs' business
        warnings.simplefilter("ignore", DeprecationWarning)
        from shoal.cli import _parser

    out: list[str] = []
    for name, parser in _commands(_parser()):
        out += [f"### `{name}`", "", "```text", _help(parser).rstrip(), "```", ""]
    return "\n".join(out)


def _commands(parser: argparse.ArgumentParser) -> list[tuple[str, argparse.ArgumentParser]]:
    found = [(parser.prog, parser)]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                found += _commands(sub)
    return found


def _help(parser: argparse.ArgumentParser) -> str:
    parser.formatter_class = functools.partial(parser.formatter_class, width=HELP_WIDTH)
    return parser.format_help()
