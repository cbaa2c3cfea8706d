"""The audit as terminal text: the verdict first, then its evidence, then the measurements."""

from __future__ import annotations

import textwrap
from pathlib import Path

from tabulate import tabulate

from graphaudit.report.tables import Table, claim_lines, detail_tables, evidence_lines, header_lines, verdict_table

WIDTH = 100


def render_text(doc: dict) -> str:
    """Return the audit document as plain text for a terminal."""
    lines = ["graphaudit run · " + header_lines(doc)[0], "  " + header_lines(doc)[1], ""]
    verdict = verdict_table(doc)
    lines.append("Verdict")
    label_w = max(len(r[0]) for r in verdict.rows)
    for label, answer, statement in verdict.rows:
        head = f"  {label:<{label_w}}  {answer:<12}  "
        wrapped = textwrap.wrap(statement, WIDTH - len(head)) or [""]
        lines.append(head + wrapped[0])
        lines += [" " * len(head) + w for w in wrapped[1:]]
    for line in claim_lines(doc):
        lines += ["", line]
    lines += ["", "Evidence"]
    for label, items in evidence_lines(doc):
        lines.append(f"  {label}")
        for item in items:
            lines += textwrap.wrap(item, WIDTH, initial_indent="    ", subsequent_indent="      ")
    for note in doc.get("notes") or []:
        lines += textwrap.wrap(f"note: {note}", WIDTH, subsequent_indent="      ")
    for table in detail_tables(doc):
        lines += ["", *render_table(table, "simple")]
    return "\n".join(lines) + "\n"


def render_table(table: Table, tablefmt: str) -> list[str]:
    """A titled table as lines of text (tabulate `tablefmt`), with its note under it."""
    out = [table.title]
    if table.rows:
        out.append(tabulate(table.rows, headers=table.headers, tablefmt=tablefmt, disable_numparse=True))
    else:
        out.append("(nothing to show)")
    if table.note:
        out.append(table.note)
    return out


COMPARISON_LEGEND = """\
How to read it: coefficients vary = the input and token levels explain part of the
controller's coefficients' variance; layer identity (η²) = the share layer identity alone
explains; ΔNLL = nats lost when the frozen model is fed another input's coefficients or its
own shuffled over tokens (± half the 95% interval); retained gap = share of the
global-mean → correct improvement that a static per-layer profile keeps; skippable = blocks
the graph lets be skipped (branch) or shrunk (subset); measured = blocks that were, on the
profiled inputs; dynamic inference = some block was skipped or shrunk at run time."""


def render_comparison(named: list[tuple[str, dict]], baseline: str = "baseline", tablefmt: str = "simple") -> str:
    """The audited models side by side as a table, with how to read it."""
    from graphaudit.report.tables import comparison_table

    table = comparison_table(named, baseline)
    body = tabulate(table.rows, headers=table.headers, tablefmt=tablefmt, disable_numparse=True)
    legend = COMPARISON_LEGEND if tablefmt != "github" else " ".join(COMPARISON_LEGEND.split())
    return f"{body}\n\n{legend}\n"


def render_demo(named: list[tuple[str, dict]], folder: Path, missing: list[str], baseline: str = "dense",
                tablefmt: str = "simple") -> str:
    """`graphaudit demo`'s report: the zoo found in `folder` side by side, then the command that
    gives one model's full report; `missing`: the zoo's models not found there."""
    lines = [f"graphaudit demo: {len(named)} models from {folder} ({', '.join(name for name, _ in named)}), "
             f"audited against {baseline} on {named[0][1]['profile']['provider']}"]
    if missing:
        lines.append(f"not found, left out: {', '.join(missing)}")
    example = folder / named[-1][0]
    return ("\n".join(lines) + "\n\n" + render_comparison(named, baseline, tablefmt)
            + f"\nThe full report of one model: graphaudit run {example / 'model.onnx'} "
              f"--calib {example / 'calib.npz'} --data {example / 'eval.npz'} "
              f"--baseline {folder / baseline / 'model.onnx'}\n")
