"""The published contract (../shared/seeds/), read directly, for validating real responses."""

import copy
import os
import re
from functools import cache
from pathlib import Path

import jsonschema
import yaml

_FENCE = re.compile(r"^````yaml[^\n]*\n(.*?)^````", re.S | re.M)


def seeds_dir() -> Path:
    if os.environ.get("SEEDS_DIR"):
        return Path(os.environ["SEEDS_DIR"])
    return Path(__file__).resolve().parents[3] / "shared" / "seeds"


@cache
def seed_documents() -> list[dict]:
    documents = []
    for path in sorted(seeds_dir().glob("0*.txt")):
        match = _FENCE.search(path.read_text())
        assert match, f"no yaml fence in {path}"
        documents.append(yaml.safe_load(match.group(1)))
    return documents


def _to_json_schema(node: object) -> object:
    """OpenAPI's `nullable: true` becomes a JSON Schema type union (and null joins enums)."""
    if isinstance(node, list):
        return [_to_json_schema(item) for item in node]
    if not isinstance(node, dict):
        return node
    out = {key: _to_json_schema(value) for key, value in node.items() if key != "nullable"}
    if node.get("nullable"):
        if "type" in out:
            types = out["type"] if isinstance(out["type"], list) else [out["type"]]
            out["type"] = [*types, "null"]
        if "enum" in out and None not in out["enum"]:
            out["enum"] = [*out["enum"], None]
    if "$ref" in out:
        out["$ref"] = out["$ref"].replace("#/components/schemas/", "#/$defs/")
    return out


def response_schema(method: str, path: str, status: int) -> dict:
    """The seed's JSON Schema for one response, with its components as $defs."""
    for document in seed_documents():
        operation = document.get("paths", {}).get(path, {}).get(method.lower())
        if operation is None:
            continue
        response = operation["responses"][str(status)]
        schema = copy.deepcopy(response["content"]["application/json"]["schema"])
        defs = document.get("components", {}).get("schemas", {})
        return {**_to_json_schema(schema), "$defs": _to_json_schema(defs)}
    raise KeyError(f"no seed documents {method} {path} {status}")


def _extend_enums(node: object, extensions: dict[str, list]) -> None:
    if isinstance(node, list):
        for item in node:
            _extend_enums(item, extensions)
    elif isinstance(node, dict):
        for name, prop in node.get("properties", {}).items():
            if name in extensions and "enum" in prop:
                prop["enum"] = [*prop["enum"], *extensions[name]]
        for value in node.values():
            _extend_enums(value, extensions)


def assert_matches_seed(
    method: str, path: str, response: object, extend_enums: dict[str, list] | None = None
) -> dict:
    """Validate a test response (status and body) against the seed and return the body.

    `extend_enums` names the documented extensions of a seed enum (POST /api/sandbox's `mode`
    gains `local`)."""
    body = response.json()
    schema = response_schema(method, path, response.status_code)
    _extend_enums(schema, extend_enums or {})
    jsonschema.Draft202012Validator(schema).validate(body)
    return body
