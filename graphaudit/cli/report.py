"""`graphaudit report`: a saved JSON report of `graphaudit run`, rendered again."""

from __future__ import annotations

from pathlib import Path

import click

from graphaudit.cli import check_output, output_format
from graphaudit.report import FORMATS

EPILOG = """\b
Examples:
  graphaudit run model.onnx --calib calib.npz -o audit.json
  graphaudit report audit.json -o audit.html
  graphaudit report audit.json --format markdown
"""


@click.command("report", epilog=EPILOG)
@click.argument("document", type=click.Path(dir_okay=False, path_type=str))
@click.option("--format", "fmt", type=click.Choice(list(FORMATS)), default=None,
              help="Report format (default: the one -o's suffix names, .json, .md or .html, else text).")
@click.option("-o", "--output", type=click.Path(dir_okay=False, allow_dash=True, path_type=str),
              help="Write the report to this file ('-': standard output, the default).")
@click.option("--quiet", "-q", is_flag=True, help="No line on stderr saying where the report went.")
def report_cmd(document: str, fmt: str | None, output: str | None, quiet: bool) -> None:
    """Render DOCUMENT, a JSON report saved by `graphaudit run`, as text, JSON, Markdown or HTML.

    Nothing is run again: the figures are those the report holds.
    """
    from graphaudit.files.write import replace_file
    from graphaudit.report import render
    from graphaudit.report.jsondoc import read_document

    fmt = output_format(fmt, output)
    target = None if output is None or output == "-" else Path(output)
    if target is not None:
        check_output(target, "-o", (document,))
    text = render(read_document(document), fmt)
    if target is not None:
        replace_file(target, lambda fresh: fresh.write_text(text, encoding="utf-8"), "the report")
        if not quiet:
            click.echo(f"graphaudit: wrote the {fmt} report to {target}", err=True)
    else:
        click.echo(text, nl=False)
