"""`graphaudit inspect`: what a model is made of, before any audit."""

from __future__ import annotations

import click
from tabulate import tabulate

from graphaudit.cli import graph_only_option
from graphaudit.load.model import load_for_audit
from graphaudit.load.repair import repair_note
from graphaudit.analyses.summary import GraphSummary, summarize
from graphaudit.wording import counted
from graphaudit.report.jsondoc import command_json


@click.command("inspect")
@click.argument("model", type=click.Path(dir_okay=False, path_type=str))
@graph_only_option
@click.option("--format", "fmt", type=click.Choice(["text", "json"]), default="text", show_default=True,
              help="Output format.")
def inspect_cmd(model: str, graph_only: bool, fmt: str) -> None:
    """Show MODEL's inputs, outputs, operators, control flow and declared coefficients."""
    summary = summarize(load_for_audit(model, graph_only=graph_only))
    if fmt == "json":
        click.echo(command_json(summary.to_json()))
    else:
        click.echo(render_text(summary))


_WEIGHTS = {"inline": "inline", "read": "read", "checked": "in their files, sizes checked, not read",
            "unread": "not read"}


def _shape(shape) -> str:
    return "?" if shape is None else "[" + ", ".join("?" if d is None else str(d) for d in shape) + "]"


def render_text(s: GraphSummary) -> str:
    """The summary as terminal text."""
    opsets = ", ".join(f"{d} {v}" for d, v in s.opsets)
    lines = [
        f"model: {s.model}  (opsets: {opsets}; weights {_WEIGHTS[s.weights]})",
        f"nodes: {s.node_count} ({s.nested_node_count} inside control flow or functions)",
        *([f"note: {repair_note(s.repairs)}"] if s.repairs else []),
        "",
        tabulate(
            [("input", v.name, v.elem_type, _shape(v.shape)) for v in s.inputs]
            + [("output", v.name, v.elem_type, _shape(v.shape)) for v in s.outputs],
            headers=["", "name", "dtype", "shape"],
        ),
        "",
        "operators: " + ", ".join(f"{op} {n}" for op, n in s.op_counts),
    ]
    if s.control_flow:
        lines.append("control flow: " + ", ".join(f"{op} `{n}` ({k} nodes inside)" for n, op, k in s.control_flow))
    if s.functions:
        lines.append("local functions: " + ", ".join(s.functions)
                     + (f" ({counted(s.inlined_calls, 'call')} inlined at load)" if s.inlined_calls else ""))
    if s.coefficients:
        lines += ["", tabulate([(c.tensor, c.family, c.layer, " × ".join(c.axes)) for c in s.coefficients],
                               headers=["coefficient", "family", "layer", "axes"])]
    else:
        lines.append("coefficients: none declared in the metadata")
    return "\n".join(lines)
