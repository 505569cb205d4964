"""Our generated OpenAPI schema against the contract's seed documents.

For every seed operation we implement: parameters, status codes, and for each JSON body the
required fields, property names, enums and nullability, recursively through $ref/allOf/oneOf.
Seed operations we do not implement yet are skipped, never silently passed.
"""

import copy
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml
from drf_spectacular.generators import SchemaGenerator


def _seeds_dir() -> Path:
    if os.environ.get("SEEDS_DIR"):
        return Path(os.environ["SEEDS_DIR"])
    return Path(__file__).resolve().parents[2].parent / "shared" / "seeds"


SEEDS_DIR = _seeds_dir()
_FENCE = re.compile(r"^````yaml[^\n]*\n(.*?)^````[ \t]*$", re.MULTILINE | re.DOTALL)
_METHODS = ("get", "put", "post", "delete", "patch", "head", "options")


@dataclass(frozen=True)
class SeedOperation:
    source: str
    path: str
    method: str
    document: dict = field(repr=False, compare=False, hash=False)

    @property
    def label(self) -> str:
        return f"{self.method.upper()} {self.path}"


def _seed_operations() -> list[SeedOperation]:
    operations = []
    for seed in sorted(SEEDS_DIR.glob("*.txt")):
        match = _FENCE.search(seed.read_text())
        assert match, f"{seed.name} has no ````yaml fence"
        document = yaml.safe_load(match.group(1))
        for path, item in document["paths"].items():
            for method in _METHODS:
                if method in item:
                    operations.append(SeedOperation(seed.name, path, method, document))
    return operations


SEED_OPERATIONS = _seed_operations() if SEEDS_DIR.is_dir() else []


@pytest.fixture(scope="module")
def our_schema() -> dict:
    return SchemaGenerator().get_schema(request=None, public=True)


# --- Resolving a schema node to the facts we compare ----------------------------------------


@dataclass
class Shape:
    types: set[str] = field(default_factory=set)
    nullable: bool = False
    enum: set | None = None
    properties: dict[str, dict] | None = None
    required: set[str] = field(default_factory=set)
    items: dict | None = None

    def merge(self, other: "Shape") -> None:
        self.types |= other.types
        self.nullable = self.nullable or other.nullable
        if other.enum is not None:
            self.enum = (self.enum or set()) | other.enum
        if other.properties is not None:
            self.properties = {**(self.properties or {}), **other.properties}
        self.required |= other.required
        self.items = self.items if self.items is not None else other.items


def _deref(node: dict, document: dict) -> dict:
    seen = set()
    while "$ref" in node:
        ref = node["$ref"]
        assert ref.startswith("#/") and ref not in seen, f"unresolvable $ref {ref}"
        seen.add(ref)
        target = document
        for part in ref[2:].split("/"):
            target = target[part]
        node = {**target, **{k: v for k, v in node.items() if k != "$ref"}}
    return node


def _is_null_only(node: dict, document: dict) -> bool:
    node = _deref(node, document)
    return node.get("type") in ("null", ["null"]) or node.get("enum") == [None]


def shape_of(node: dict, document: dict) -> Shape:
    node = _deref(node, document)
    shape = Shape(nullable=bool(node.get("nullable")))
    declared = node.get("type")
    shape.types = set(declared) if isinstance(declared, list) else {declared} if declared else set()
    if "null" in shape.types:
        shape.types.discard("null")
        shape.nullable = True
    if "enum" in node:
        shape.nullable = shape.nullable or None in node["enum"]
        shape.enum = {value for value in node["enum"] if value is not None}
    if "properties" in node:
        shape.properties = dict(node["properties"])
    shape.required = set(node.get("required", []))
    shape.items = node.get("items")
    for branch in node.get("allOf", []):
        shape.merge(shape_of(branch, document))
    for key in ("oneOf", "anyOf"):
        branches = node.get(key, [])
        real = [b for b in branches if not _is_null_only(b, document)]
        if len(real) < len(branches):
            shape.nullable = True
        alternatives = [shape_of(b, document) for b in real]
        if alternatives:
            common_required = set.intersection(*(a.required for a in alternatives))
            for alternative in alternatives:
                shape.merge(alternative)
            shape.required = common_required | set(node.get("required", []))
    return shape


def compare_schemas(seed: dict, seed_doc: dict, ours: dict, our_doc: dict, where: str) -> list:
    """Every way our schema node fails to honour the seed's, as readable strings."""
    errors: list[str] = []
    s, o = shape_of(seed, seed_doc), shape_of(ours, our_doc)
    if s.nullable and not o.nullable:
        errors.append(f"{where}: nullable in the contract, not nullable in ours")
    if s.types and not s.types <= o.types:
        errors.append(f"{where}: type {sorted(s.types)} in the contract, {sorted(o.types)} in ours")
    if s.enum is not None:
        if o.enum is None:
            errors.append(f"{where}: the contract has enum {sorted(map(str, s.enum))}, ours none")
        elif not s.enum <= o.enum:
            errors.append(f"{where}: enum values missing from ours: {sorted(s.enum - o.enum)}")
    if s.properties is not None or s.required:
        if o.properties is None:
            errors.append(f"{where}: an object with properties in the contract, not in ours")
            return errors
        if s.required != o.required:
            errors.append(
                f"{where}: required differs; only in contract {sorted(s.required - o.required)}, "
                f"only in ours {sorted(o.required - s.required)}"
            )
        missing = sorted(set(s.properties or {}) - set(o.properties))
        if missing:
            errors.append(f"{where}: properties missing from ours: {missing}")
        for name in sorted(set(s.properties or {}) & set(o.properties)):
            errors += compare_schemas(
                s.properties[name], seed_doc, o.properties[name], our_doc, f"{where}.{name}"
            )
    if s.items is not None:
        if o.items is None:
            errors.append(f"{where}: an array in the contract, not in ours")
        else:
            errors += compare_schemas(s.items, seed_doc, o.items, our_doc, f"{where}[]")
    return errors


def _json_schema(container: dict) -> dict | None:
    return container.get("content", {}).get("application/json", {}).get("schema")


def compare_operation(seed: SeedOperation, ours: dict, our_doc: dict) -> list[str]:
    mine = seed.document["paths"][seed.path][seed.method]
    errors: list[str] = []

    def params(operation: dict) -> list[tuple[str, str, bool]]:
        return [
            (p["name"], p["in"], bool(p.get("required"))) for p in operation.get("parameters", [])
        ]

    seed_params, our_params = params(mine), params(ours)
    if len(set(our_params)) != len(our_params) or len({p[:2] for p in our_params}) != len(
        our_params
    ):
        errors.append(f"parameters: duplicates in ours {our_params}")
    our_by_key = {p[:2]: p for p in our_params}
    for name, where, required in seed_params:
        theirs = our_by_key.get((name, where))
        if theirs is None:
            errors.append(f"parameters: {where} parameter {name!r} missing from ours")
        elif theirs[2] != required:
            errors.append(f"parameters: {name!r} required={required} in contract, ours {theirs[2]}")
    for name, where, required in our_params:
        if required and (name, where) not in {p[:2] for p in seed_params}:
            errors.append(f"parameters: ours requires {where} {name!r}, the contract has no such")

    if "requestBody" in mine:
        seed_body = _json_schema(mine["requestBody"])
        our_body = _json_schema(ours.get("requestBody", {}))
        if our_body is None:
            errors.append("requestBody: the contract has a JSON body, ours does not")
        elif seed_body is not None:
            errors += compare_schemas(seed_body, seed.document, our_body, our_doc, "requestBody")

    our_responses = {str(code): response for code, response in ours["responses"].items()}
    for code, response in mine["responses"].items():
        code = str(code)
        if code not in our_responses:
            errors.append(f"responses: status {code} missing from ours")
            continue
        seed_body = _json_schema(response)
        if seed_body is None:
            continue
        our_body = _json_schema(our_responses[code])
        if our_body is None:
            errors.append(f"responses.{code}: the contract has a JSON body, ours does not")
        else:
            errors += compare_schemas(seed_body, seed.document, our_body, our_doc, code)
    return errors


def _template(path: str) -> str:
    return re.sub(r"\{[^}]+\}", "{}", path)


def find_operation(our_doc: dict, path: str, method: str) -> dict | None:
    """Our operation for a seed's path and method, None when we do not implement it yet.

    A path that matches only once parameter names are ignored is a contract break, not a skip.
    """
    if path in our_doc["paths"]:
        return our_doc["paths"][path].get(method)
    renamed = [p for p in our_doc["paths"] if _template(p) == _template(path)]
    if renamed and method in our_doc["paths"][renamed[0]]:
        pytest.fail(f"{method.upper()} {path} is served as {renamed[0]}: path parameters renamed")
    return None


# --- The tests -------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", SEED_OPERATIONS, ids=lambda op: op.label)
def test_our_schema_honours_the_contract(seed, our_schema):
    ours = find_operation(our_schema, seed.path, seed.method)
    if ours is None:
        pytest.skip(f"{seed.label} ({seed.source}) is not implemented yet")
    errors = compare_operation(seed, ours, our_schema)
    assert not errors, f"{seed.label} breaks {seed.source}:\n" + "\n".join(errors)


def test_the_contract_check_compares_at_least_the_implemented_operations(our_schema):
    assert SEED_OPERATIONS, f"no seed documents found in {SEEDS_DIR} (set SEEDS_DIR)"
    compared = {
        (op.method, op.path)
        for op in SEED_OPERATIONS
        if find_operation(our_schema, op.path, op.method) is not None
    }
    assert ("get", "/api/sessions/{sessionId}") in compared


# --- The comparison is strict enough to catch real breaks -----------------------------------


def _get_session_seed() -> SeedOperation:
    matches = [op for op in SEED_OPERATIONS if op.label == "GET /api/sessions/{sessionId}"]
    if not matches:
        pytest.fail(f"seed for GET /api/sessions/{{sessionId}} not found in {SEEDS_DIR}")
    return matches[0]


def _break(schema: dict, how: str) -> dict:
    broken = copy.deepcopy(schema)
    operation = broken["paths"]["/api/sessions/{sessionId}"]["get"]
    session = broken["components"]["schemas"]["Session"]
    if how == "renamed field":
        session["properties"]["repoOwnerName"] = session["properties"].pop("repoOwner")
    elif how == "renamed required field":
        session["properties"]["user_id"] = session["properties"].pop("userId")
        session["required"] = [r if r != "userId" else "user_id" for r in session["required"]]
    elif how == "dropped status code":
        del operation["responses"]["403"]
    elif how == "dropped nullability":
        del session["properties"]["cloneUrl"]["nullable"]
    elif how == "dropped nullability behind allOf":
        del session["properties"]["lifecycleState"]["nullable"]
    elif how == "dropped enum value":
        values = broken["components"]["schemas"]["LifecycleStateEnum"]["enum"]
        values.remove("hibernated")
    elif how == "optional field":
        session["required"].remove("isNewBranch")
    elif how == "extra required field":
        session["required"].append("repoOwner")
    elif how == "error envelope":
        broken["components"]["schemas"]["Error"]["properties"]["status"] = {"type": "string"}
    elif how == "renamed path parameter":
        operation["parameters"][0]["name"] = "id"
    elif how == "extra required parameter":
        operation["parameters"].append({"name": "verbose", "in": "query", "required": True})
    elif how == "wrong type":
        session["properties"]["lifecycleVersion"] = {"type": "string"}
    return broken


@pytest.mark.parametrize(
    "how",
    [
        "renamed field",
        "renamed required field",
        "dropped status code",
        "dropped nullability",
        "dropped nullability behind allOf",
        "dropped enum value",
        "optional field",
        "extra required field",
        "error envelope",
        "renamed path parameter",
        "extra required parameter",
        "wrong type",
    ],
)
def test_the_contract_check_catches_a_break(how, our_schema):
    seed = _get_session_seed()
    assert compare_operation(seed, find_operation(our_schema, seed.path, "get"), our_schema) == []

    broken = _break(our_schema, how)

    assert compare_operation(seed, find_operation(broken, seed.path, "get"), broken) != []


def test_the_comparison_treats_every_spelling_of_null_as_nullable():
    doc: dict = {"components": {"schemas": {"E": {"type": "string", "enum": ["a", "b"]}}}}
    contract = {"type": "string", "nullable": True, "enum": ["a"]}
    for ours in [
        {"type": "string", "nullable": True, "enum": ["a", "b"]},
        {"type": ["string", "null"], "enum": ["a", "b"]},
        {"oneOf": [{"$ref": "#/components/schemas/E"}, {"enum": [None]}]},
        {"oneOf": [{"$ref": "#/components/schemas/E"}, {"type": "null"}]},
        {"allOf": [{"$ref": "#/components/schemas/E"}], "nullable": True},
    ]:
        assert compare_schemas(contract, doc, ours, doc, "x") == [], ours
    assert compare_schemas(contract, doc, {"$ref": "#/components/schemas/E"}, doc, "x") != []
