"""A check of a JSON document against graphaudit/report/schema.json.

`jsonschema` is not a dependency, so the schema is checked by a small validator of the
keywords the schema uses (type, const, enum, required, properties, additionalProperties,
items, min/maxItems, minLength, minimum, maximum, anyOf, $ref); it refuses any other
keyword so that the schema cannot silently outgrow it.
"""

import math

from graphaudit.report.jsondoc import schema

KNOWN = {"$schema", "$id", "$defs", "title", "description", "type", "const", "enum", "required", "properties",
         "additionalProperties", "items", "minItems", "maxItems", "minLength", "minimum", "maximum", "anyOf", "$ref"}
TYPES = {"object": dict, "array": list, "string": str, "boolean": bool, "null": type(None)}


def errors(value, node, root, path="$"):
    """Return the list of places where `value` breaks the schema `node`."""
    unknown = set(node) - KNOWN
    assert not unknown, f"schema keyword(s) {unknown} at {path} are not checked by this validator"
    if "$ref" in node:
        target = root
        for part in node["$ref"].lstrip("#/").split("/"):
            target = target[part]
        return errors(value, target, root, path)
    found = []
    if "anyOf" in node:
        options = [errors(value, option, root, path) for option in node["anyOf"]]
        if all(options):
            found.append(f"{path}: matches none of anyOf ({'; '.join(p[0] for p in options)})")
    if "type" in node:
        kinds = node["type"] if isinstance(node["type"], list) else [node["type"]]
        if not any(_is(value, k) for k in kinds):
            return found + [f"{path}: expected {kinds}, found {type(value).__name__}"]
    if "const" in node and value != node["const"]:
        found.append(f"{path}: expected {node['const']!r}, found {value!r}")
    if "enum" in node and value not in node["enum"]:
        found.append(f"{path}: expected one of {node['enum']}, found {value!r}")
    if isinstance(value, str) and len(value) < node.get("minLength", 0):
        found.append(f"{path}: string shorter than {node['minLength']}")
    if _is(value, "number"):
        if "minimum" in node and value < node["minimum"]:
            found.append(f"{path}: {value} < {node['minimum']}")
        if "maximum" in node and value > node["maximum"]:
            found.append(f"{path}: {value} > {node['maximum']}")
    if isinstance(value, dict):
        for key in node.get("required", []):
            if key not in value:
                found.append(f"{path}: missing {key!r}")
        props = node.get("properties", {})
        extra = node.get("additionalProperties", True)
        for key, item in value.items():
            if key in props:
                found += errors(item, props[key], root, f"{path}.{key}")
            elif extra is False:
                found.append(f"{path}: unexpected {key!r}")
            elif isinstance(extra, dict):
                found += errors(item, extra, root, f"{path}.{key}")
    if isinstance(value, list):
        if len(value) < node.get("minItems", 0) or len(value) > node.get("maxItems", math.inf):
            found.append(f"{path}: {len(value)} items")
        if "items" in node:
            for i, item in enumerate(value):
                found += errors(item, node["items"], root, f"{path}[{i}]")
    return found


def _is(value, kind):
    if kind == "number":
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if kind == "integer":
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, TYPES[kind])


def validate(doc):
    """Nothing; fails with the first 20 places where `doc` breaks the report's schema."""
    problems = errors(doc, schema(), schema())
    assert not problems, "\n".join(problems[:20])
