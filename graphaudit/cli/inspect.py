"""`graphaudit inspect`: what a model is made of, before any audit."""

from __future__ import annotations

import click

from graphaudit.cli import graph_only_option
from graphaudit.cli.options import OutputSettings, output_options


@click.command("inspect")
@click.argument("model", type=click.Path(dir_okay=False, path_type=str))
@graph_only_option
@output_options(["text", "json"], "Output format.", quiet="No line on stderr saying where the report went.")
def inspect_cmd(model: str, graph_only: bool, out: OutputSettings) -> None:
    """Show MODEL's inputs, outputs, operators, control flow and declared coefficients."""
    from graphaudit.analyses.summary import summarize
    from graphaudit.load.model import load_for_audit
    from graphaudit.report.inspect_text import render_text
    from graphaudit.report.jsondoc import command_json

    out.check((model,))
    summary = summarize(load_for_audit(model, graph_only=graph_only))
    out.emit(command_json(summary.to_json()) if out.fmt == "json" else render_text(summary))
