"""Reports: every command's text, and the audit's as text, JSON, Markdown and a self-contained HTML page.

The audit's renderers take its JSON document (`AuditReport.to_json()`, or a saved JSON report
loaded back); `static_text`, `replay_text`, `profile_text` and `inspect_text` take the report
object of their command. Each gives back a string; none prints or writes files. Numbers are
written by graphaudit.wording's formatters.
"""

from __future__ import annotations

import importlib

FORMATS = {
    "text": "graphaudit.report.text:render_text",
    "json": "graphaudit.report.jsondoc:render_json",
    "markdown": "graphaudit.report.markdown:render_markdown",
    "html": "graphaudit.report.html:render_html",
}


def render(document: dict, fmt: str = "text") -> str:
    """Return the audit `document` rendered as `fmt` (text, json, markdown or html)."""
    if fmt not in FORMATS:
        raise ValueError(f"expected a report format among {', '.join(FORMATS)}, found {fmt!r}")
    module, attr = FORMATS[fmt].split(":")
    return getattr(importlib.import_module(module), attr)(document)
