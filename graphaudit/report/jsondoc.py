"""The audit as JSON: versioned documents described by `schema.json` (JSON Schema 2020-12).

`version` is the documents' schema version: it changes when a field is removed or changes
meaning, not when one is added. `run`'s document holds the parts (`static`, `replay`,
`profile`) as their own JSON, null when the part did not run; `static`, `replay`, `profile`
and `inspect` print theirs alone, with the same `version` first (`command_json`). The schema
describes every field of each.
"""

from __future__ import annotations

import json
import math
import os
import stat
from importlib import resources

from graphaudit.errors import GraphAuditError
from graphaudit.files.path_kinds import path_kind

SCHEMA_VERSION = "1.0"
MAX_DOCUMENT_BYTES = 2**28  # a saved report is kilobytes to a few megabytes; past this it is not one


def schema() -> dict:
    """Return the JSON Schema of every document the commands write (`$defs` names each)."""
    return json.loads(resources.files("graphaudit.report").joinpath("schema.json").read_text(encoding="utf-8"))


def command_json(doc: dict) -> str:
    """Return a command's own JSON document (static, replay, profile, inspect) as text, `version` first."""
    return json.dumps({"version": SCHEMA_VERSION, **doc}, indent=2)


def render_json(doc: dict) -> str:
    """Return the audit document as JSON text (NaN and infinities written as null)."""
    return json.dumps(plain(doc), indent=2, ensure_ascii=False, allow_nan=False) + "\n"


def plain(value):
    """`value` with tuples as lists, numpy scalars and arrays as Python values, NaN as None."""
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if hasattr(value, "tolist") and not isinstance(value, (str, bytes)):
        return plain(value.tolist())
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def read_document(path) -> dict:
    """The audit document saved at `path` (`graphaudit run --format json`), checked before use:
    a regular file of JSON text, an object of this schema's major version, with a verdict."""
    try:
        info = os.stat(path)
    except OSError:
        raise GraphAuditError(f"expected a saved JSON report at {path}, found {path_kind(path)}") from None
    if not stat.S_ISREG(info.st_mode):
        raise GraphAuditError(f"expected a saved JSON report at {path}, found {path_kind(path)}")
    if info.st_size > MAX_DOCUMENT_BYTES:
        raise GraphAuditError(f"expected a saved JSON report of at most {MAX_DOCUMENT_BYTES} bytes at {path}, "
                              f"found {info.st_size} bytes")
    with open(path, "rb") as f:
        raw = f.read(MAX_DOCUMENT_BYTES + 1)
    try:
        doc = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as err:
        raise GraphAuditError(f"expected JSON text in {path}, found text that does not parse "
                              f"({' '.join(str(err).split())[:120]})") from None
    if not isinstance(doc, dict):
        raise GraphAuditError(f"expected a JSON object in {path}, found a {type(doc).__name__}")
    version = doc.get("version")
    if not isinstance(version, str) or version.split(".")[0] != SCHEMA_VERSION.split(".")[0]:
        raise GraphAuditError(f"expected an audit report of schema version {SCHEMA_VERSION.split('.')[0]}.x in "
                              f"{path}, found version {version!r}")
    if not isinstance(doc.get("verdict"), dict):
        raise GraphAuditError(f"expected the report of graphaudit run (with a verdict) in {path}, found a document "
                              f"with {', '.join(sorted(doc)[:8]) or 'no fields'}")
    return doc
