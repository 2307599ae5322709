"""Validate instances against OpenAI's published OpenAPI schemas (../shared/openai)."""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path

import jsonschema
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT202012

SPEC_PATHS = [
    Path(__file__).parent / "data" / "openai-openapi.json",
    Path(__file__).resolve().parents[2] / "shared" / "openai" / "openapi.json",
]


@cache
def _registry() -> tuple[Registry, dict]:
    for path in SPEC_PATHS:
        if path.exists():
            document = _nullable_to_null(json.loads(path.read_text()))
            resource = Resource.from_contents(document, default_specification=DRAFT202012)
            return Registry().with_resource("openai", resource), document
    raise FileNotFoundError("OpenAI's openapi.json was not found")


def _nullable_to_null(node):
    """OpenAI's document still marks some fields with OpenAPI 3.0's `nullable: true`, which
    JSON Schema 2020-12 ignores; OpenAI's API sends null there (e.g. `logprobs`), so the
    keyword is turned into what 3.1 means by it: null is allowed too."""
    if isinstance(node, list):
        return [_nullable_to_null(n) for n in node]
    if not isinstance(node, dict):
        return node
    node = {k: _nullable_to_null(v) for k, v in node.items()}
    if node.pop("nullable", False):
        return {"anyOf": [node, {"type": "null"}]}
    return node


def validate(instance: object, schema_name: str) -> None:
    """Raise jsonschema.ValidationError unless `instance` is a valid `schema_name`."""
    registry, _ = _registry()
    schema = {"$ref": f"openai#/components/schemas/{schema_name}"}
    jsonschema.Draft202012Validator(schema, registry=registry).validate(instance)
