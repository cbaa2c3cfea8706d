"""`graphaudit report`: a saved JSON report of `graphaudit run`, rendered again."""

from __future__ import annotations

import click

from graphaudit.cli.options import OutputSettings, output_options
from graphaudit.report import FORMATS

EPILOG = """\b
Examples:
  graphaudit run model.onnx --calib calib.npz -o audit.json
  graphaudit report audit.json -o audit.html
  graphaudit report audit.json --format markdown
"""


@click.command("report", epilog=EPILOG)
@click.argument("document", type=click.Path(dir_okay=False, path_type=str))
@output_options(FORMATS, "Report format.", quiet="No line on stderr saying where the report went.")
def report_cmd(document: str, out: OutputSettings) -> None:
    """Render DOCUMENT, a JSON report saved by `graphaudit run`, as text, JSON, Markdown or HTML.

    Nothing is run again: the figures are those the report holds.
    """
    from graphaudit.report import render
    from graphaudit.report.jsondoc import read_document

    out.check((document,))
    out.emit(render(read_document(document), out.fmt), nl=False)
