"""The audit as Markdown, for a pull-request comment: the verdict table, evidence, details."""

from __future__ import annotations

from tabulate import tabulate

from graphaudit.report.tables import claim_lines, detail_tables, evidence_lines, header_lines, verdict_table

ANSWER_MARK = {"yes": "**yes**", "no": "**no**", "not measured": "_not measured_", "inconclusive": "_inconclusive_"}


def render_markdown(doc: dict) -> str:
    """Return the audit document as GitHub-flavoured Markdown."""
    head = header_lines(doc)
    lines = [f"## graphaudit: `{doc.get('model', '?')}`", "", head[1], ""]
    verdict = verdict_table(doc)
    rows = [(label, ANSWER_MARK.get(answer, answer), _cell(statement)) for label, answer, statement in verdict.rows]
    lines += [tabulate(rows, headers=verdict.headers, tablefmt="github", disable_numparse=True), ""]
    for claim in claim_lines(doc):
        lines += [f"> {claim}", ""]
    evidence = evidence_lines(doc)
    if evidence:
        lines += ["<details><summary>Evidence</summary>", ""]
        for label, items in evidence:
            lines.append(f"- **{label}**")
            lines += [f"  - {_cell(item)}" for item in items]
        lines += ["", "</details>", ""]
    for note in doc.get("notes") or []:
        lines += [f"_Note: {_cell(note)}_", ""]
    for table in detail_tables(doc):
        lines += [f"### {table.title}", ""]
        cells = [tuple(_cell(str(c)) for c in row) for row in table.rows]
        lines.append(tabulate(cells, headers=table.headers, tablefmt="github", disable_numparse=True)
                     if cells else "_(nothing to show)_")
        if table.note:
            lines += ["", table.note]
        lines.append("")
    return "\n".join(lines).rstrip() + "\n"


def _cell(text: str) -> str:
    """Text safe inside a Markdown table cell (pipes escaped, one line)."""
    return " ".join(str(text).split()).replace("|", "\\|")
