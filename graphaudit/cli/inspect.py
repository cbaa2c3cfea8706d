"""`graphaudit inspect`: what a model is made of, before any audit."""

from __future__ import annotations

import json

import click

from graphaudit.cli import graph_only_option
from graphaudit.load.model import load_for_audit
from graphaudit.analyses.summary import summarize
from graphaudit.report.inspect_text import render_text


@click.command("inspect")
@click.argument("model", type=click.Path(dir_okay=False, path_type=str))
@graph_only_option
@click.option("--format", "fmt", type=click.Choice(["text", "json"]), default="text", show_default=True,
              help="Output format.")
def inspect_cmd(model: str, graph_only: bool, fmt: str) -> None:
    """Show MODEL's inputs, outputs, operators, control flow and declared coefficients."""
    summary = summarize(load_for_audit(model, graph_only=graph_only))
    if fmt == "json":
        click.echo(json.dumps(summary.to_json(), indent=2))
    else:
        click.echo(render_text(summary))
