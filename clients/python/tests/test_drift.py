"""The client against the live OpenAPI document: operations and dataclasses must match it."""

from __future__ import annotations

import dataclasses
import json
import typing
import urllib.request
from typing import Any, Dict, Tuple

import pytest

import narad
from narad.models import _unwrap_optional

HTTP_METHODS = ("get", "put", "post", "patch", "delete", "head", "options")


@pytest.fixture(scope="module")
def document(server: Any) -> Dict[str, Any]:
    with urllib.request.urlopen(server.url + "/openapi.json", timeout=10) as r:
        return json.load(r)


def _operations(document: Dict[str, Any]) -> Dict[str, Tuple[str, str]]:
    ops: Dict[str, Tuple[str, str]] = {}
    for path, item in document["paths"].items():
        for method, op in item.items():
            if method in HTTP_METHODS:
                ops[op["operationId"]] = (method.upper(), path)
    return ops


def test_operations_match_the_document(document: Dict[str, Any]) -> None:
    live = _operations(document)
    problems = []
    for op_id, (method, path) in sorted(live.items()):
        if op_id in narad.NOT_CALLED:
            assert not path.startswith("/v1/"), f"{op_id} is under /v1 and must be in OPERATIONS"
            continue
        if op_id not in narad.OPERATIONS:
            problems.append(f"the document's {op_id} ({method} {path}) is missing from OPERATIONS")
        elif narad.OPERATIONS[op_id] != (method, path):
            problems.append(f"{op_id}: OPERATIONS says {narad.OPERATIONS[op_id]}, the document {(method, path)}")
    for op_id in sorted(set(narad.OPERATIONS) - set(live)):
        if op_id in narad.NEWER_THAN_SOME_SERVERS:
            continue  # e.g. whoami on a server built before it; checked above once present
        problems.append(f"OPERATIONS names {op_id}, which the document lacks")
    for op_id in narad.NOT_CALLED:
        if op_id in narad.OPERATIONS:
            problems.append(f"{op_id} is both in OPERATIONS and excluded")
    assert not problems, "\n".join(problems)


def test_parameters_match_the_document(document: Dict[str, Any]) -> None:
    problems = []
    for path, item in document["paths"].items():
        for method, op in item.items():
            if method not in HTTP_METHODS or op["operationId"] not in narad.OPERATIONS:
                continue
            op_id = op["operationId"]
            params = [_resolve(document, p) for p in item.get("parameters", []) + op.get("parameters", [])]
            live = {p["name"] for p in params if p["in"] in ("query", "header")}
            ours = set(narad.PARAMETERS.get(op_id, frozenset()))
            if live != ours:
                problems.append(f"{op_id}: the document has {sorted(live)}, PARAMETERS {sorted(ours)}")
    for op_id in set(narad.PARAMETERS) - set(narad.OPERATIONS):
        problems.append(f"PARAMETERS names {op_id}, which OPERATIONS lacks")
    assert not problems, "\n".join(problems)


def test_the_client_refuses_parameters_it_does_not_declare() -> None:
    client = narad.Client("http://127.0.0.1:9")
    with pytest.raises(ValueError):
        client.url("getTopic", {"wait": "1s"}, topic="t")
    assert client.url("ack", {"receipt_handle": "h", "extend": None}, topic="a b") == (
        "http://127.0.0.1:9/v1/topics/a%20b/ack?receipt_handle=h"
    )


def _resolve(document: Dict[str, Any], schema: Dict[str, Any]) -> Dict[str, Any]:
    while "$ref" in schema:
        ref = schema["$ref"]
        assert ref.startswith("#/")
        node: Any = document
        for part in ref[2:].split("/"):
            node = node[part]
        schema = node
    return schema


def _pointer(document: Dict[str, Any], schema: Dict[str, Any], pointer: str) -> Dict[str, Any]:
    schema = _resolve(document, schema)
    for part in [p for p in pointer.split("/") if p]:
        schema = _resolve(document, schema[part])
    return schema


def _nullable(schema: Dict[str, Any]) -> bool:
    t = schema.get("type")
    if t == "null" or (isinstance(t, list) and "null" in t):
        return True
    if None in schema.get("enum", []):
        return True
    return any(_nullable(s) for s in schema.get("anyOf", []) + schema.get("oneOf", []))


def _schemas(document: Dict[str, Any]) -> Dict[type, Tuple[str, Dict[str, Any]]]:
    out: Dict[type, Tuple[str, Dict[str, Any]]] = {}
    components = document["components"]["schemas"]
    for cls, name in narad.SCHEMAS.items():
        assert name in components, f"{cls.__name__}: no schema {name} in the document"
        out[cls] = (f"components.schemas.{name}", components[name])
    live = _operations(document)
    for cls, (op_id, status, pointer) in narad.RESPONSE_SCHEMAS.items():
        if op_id not in live:
            assert op_id in narad.NEWER_THAN_SOME_SERVERS, f"{cls.__name__}: no operation {op_id}"
            continue
        method, path = live[op_id]
        response = _resolve(document, document["paths"][path][method.lower()]["responses"][status])
        schema = response["content"]["application/json"]["schema"]
        out[cls] = (f"{op_id} {status}{pointer}", _pointer(document, schema, pointer))
    return out


def test_every_dataclass_is_mapped() -> None:
    mapped = set(narad.SCHEMAS) | set(narad.RESPONSE_SCHEMAS)
    models = {
        obj for obj in vars(narad.models).values()
        if isinstance(obj, type) and dataclasses.is_dataclass(obj) and obj.__module__ == "narad.models"
    }
    assert models == mapped, f"not mapped to a schema: {sorted(c.__name__ for c in models - mapped)}"


def test_dataclasses_match_their_schemas(document: Dict[str, Any]) -> None:
    problems = []
    for cls, (where, raw) in _schemas(document).items():
        schema = _resolve(document, raw)
        props: Dict[str, Any] = schema.get("properties", {})
        required = set(schema.get("required", []))
        fields = {f.name: f for f in dataclasses.fields(cls)}
        hints = typing.get_type_hints(cls)
        label = f"{cls.__name__} ({where})"
        for name in sorted(set(props) - set(fields)):
            problems.append(f"{label}: property {name} has no field")
        for name in sorted(set(fields) - set(props)):
            problems.append(f"{label}: field {name} is not a property")
        for name in sorted(set(fields) & set(props)):
            f = fields[name]
            has_default = f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING  # type: ignore[misc]
            _, optional = _unwrap_optional(hints[name])
            is_any = hints[name] is typing.Any
            if name in required and has_default:
                problems.append(f"{label}: {name} is required but has a default")
            if name not in required and not has_default:
                problems.append(f"{label}: {name} is optional but has no default")
            nullable = _nullable(_resolve(document, props[name]))
            should_be_optional = name not in required or nullable
            if not is_any and optional != should_be_optional:
                problems.append(
                    f"{label}: {name} is {'Optional' if optional else 'not Optional'}, "
                    f"the schema says {'absent or null allowed' if should_be_optional else 'always present'}"
                )
    assert not problems, "\n".join(problems)
