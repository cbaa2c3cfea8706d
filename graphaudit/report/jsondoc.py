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
from importlib import resources

SCHEMA_VERSION = "1.0"


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
