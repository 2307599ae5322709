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
            document = json.loads(path.read_text())
            resource = Resource.from_contents(document, default_specification=DRAFT202012)
            return Registry().with_resource("openai", resource), document
    raise FileNotFoundError("OpenAI's openapi.json was not found")


def validate(instance: object, schema_name: str) -> None:
    """Raise jsonschema.ValidationError unless `instance` is a valid `schema_name`."""
    registry, _ = _registry()
    schema = {"$ref": f"openai#/components/schemas/{schema_name}"}
    jsonschema.Draft202012Validator(schema, registry=registry).validate(instance)
