"""Checks of the commands' JSON documents against graphaudit/report/schema.json.

Validation is jsonschema's Draft 2020-12 validator, format checking off. A document kind is
one of the schema's `$defs/<kind>_document` (run, static, replay, profile, inspect).
`undescribed` walks a document beside the schema and gives back every field path the
schema does not describe, so that a field written without a schema entry fails a test even
where validation alone would let it through.
"""

from __future__ import annotations

import functools

from jsonschema import Draft202012Validator

from graphaudit.report.jsondoc import schema

KINDS = ("run", "static", "replay", "profile", "inspect")


@functools.cache
def _root() -> dict:
    root = schema()
    Draft202012Validator.check_schema(root)
    return root


@functools.cache
def _validator(ref: str | None) -> Draft202012Validator:
    """A validator of the whole schema (`ref` None) or of the definition at `ref`, refs resolved in the schema."""
    root = _root()
    node = root if ref is None else {"$ref": ref, "$defs": root["$defs"]}
    return Draft202012Validator(node, format_checker=None)


def errors(doc, kind: str = "run") -> list[str]:
    """Return the places where `doc` breaks the schema of a `kind` document, as 'path: message'."""
    found = [leaf for e in _validator(f"#/$defs/{kind}_document").iter_errors(doc) for leaf in _leaves(e)]
    return [f"{e.json_path}: {e.message[:300]}" for e in sorted(found, key=lambda e: list(map(str, e.absolute_path)))]


def _leaves(error) -> list:
    """The errors inside an anyOf / oneOf that `error` reports as a whole: those of the branches
    whose type the value has (a null-or-object field that is an object: the object's errors)."""
    if not error.context:
        return [error]
    branches: dict = {}
    for e in error.context:
        branches.setdefault(e.relative_schema_path[0], []).append(e)
    typed = [es for es in branches.values()
             if not any(e.validator == "type" and not e.relative_path for e in es)]
    return [leaf for es in typed for e in es for leaf in _leaves(e)] or [error]


def validate(doc, kind: str = "run") -> None:
    """Nothing; fails with the first 20 places where `doc` breaks the schema of a `kind` document,
    or where the whole schema would not take it as that kind alone."""
    problems = errors(doc, kind)
    assert not problems, "\n".join(problems[:20])
    others = [k for k in KINDS if k != kind and not errors(doc, k)]
    assert not others, f"a {kind} document is valid as {others} too: the schema's oneOf cannot tell them apart"
    assert _validator(None).is_valid(doc)


def undescribed(doc, kind: str = "run", root: dict | None = None, closed: bool = True) -> list[str]:
    """Return the field paths of `doc` the schema (`root`, default graphaudit's) leaves undescribed:
    a key under no `properties` nor a typed `additionalProperties`, an array with no `items`, a
    value with no type, const or enum, or (`closed`) an object whose schema admits unknown keys."""
    root = root or _root()
    walk = _Walk(root, closed)
    walk.value(doc, walk.applicable(doc, {"$ref": f"#/$defs/{kind}_document"}), "$")
    return walk.missing


def field_paths(doc, path: str = "$") -> set[str]:
    """Every field path of `doc` ('$.a.b', '$.list[]'), map keys written out."""
    found = {path}
    if isinstance(doc, dict):
        for key, item in doc.items():
            found |= field_paths(item, f"{path}.{key}")
    elif isinstance(doc, list):
        for item in doc:
            found |= field_paths(item, f"{path}[]")
    return found


class _Walk:
    def __init__(self, root: dict, closed: bool):
        self.root, self.closed, self.missing = root, closed, []
        self.seen: set[str] = set()
        self.validators: dict[int, Draft202012Validator] = {}

    def target(self, ref: str) -> dict:
        node = self.root
        for part in ref.removeprefix("#/").split("/"):
            node = node[part]
        return node

    def valid(self, value, node: dict) -> bool:
        if id(node) not in self.validators:
            self.validators[id(node)] = Draft202012Validator({**node, "$defs": self.root.get("$defs", {})},
                                                             format_checker=None)
        return self.validators[id(node)].is_valid(value)

    def applicable(self, value, node) -> list[dict]:
        """`node` and every subschema that applies to `value` in place: $ref targets, allOf, and the
        anyOf / oneOf branches `value` is valid under (else those of its type)."""
        if not isinstance(node, dict):
            return []
        found = [node]
        if "$ref" in node:
            found += self.applicable(value, self.target(node["$ref"]))
        for sub in node.get("allOf", []):
            found += self.applicable(value, sub)
        for key in ("anyOf", "oneOf"):
            branches = node.get(key, [])
            # those `value` is valid under; where none is (a document that breaks the schema
            # somewhere deeper), those of its type, so that the walk still reaches the break
            chosen = [b for b in branches if self.valid(value, b)] or [b for b in branches if self.typed(value, b)]
            for sub in chosen:
                found += self.applicable(value, sub)
        return found

    def typed(self, value, node: dict) -> bool:
        while "$ref" in node and "type" not in node:
            node = self.target(node["$ref"])
        kinds = node.get("type", [])
        return not kinds or any(Draft202012Validator.TYPE_CHECKER.is_type(value, k)
                                for k in ([kinds] if isinstance(kinds, str) else kinds))

    def note(self, path: str, why: str) -> None:
        if path not in self.seen:
            self.seen.add(path)
            self.missing.append(f"{path}: {why}")

    def value(self, value, nodes: list[dict], path: str) -> None:
        if not any(k in n for n in nodes for k in ("type", "const", "enum")):
            self.note(path, "no type, const or enum")
        if isinstance(value, dict):
            if self.closed and not any(n.get("additionalProperties", True) is not True
                                       or n.get("unevaluatedProperties", True) is False for n in nodes):
                self.note(path, "an object that admits fields the schema does not name")
            for key, item in value.items():
                children = [n["properties"][key] for n in nodes if key in n.get("properties", {})]
                if not children:
                    children = [n["additionalProperties"] for n in nodes
                                if isinstance(n.get("additionalProperties"), dict) and n["additionalProperties"]]
                if not children:
                    self.note(f"{path}.{key}", "not described")
                    continue
                self.value(item, [a for c in children for a in self.applicable(item, c)], f"{path}.{key}")
        elif isinstance(value, list):
            children = [n["items"] for n in nodes if isinstance(n.get("items"), dict)]
            if value and not children:
                self.note(f"{path}[]", "array items not described")
            for item in value if children else ():
                self.value(item, [a for c in children for a in self.applicable(item, c)], f"{path}[]")
