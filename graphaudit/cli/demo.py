"""`graphaudit demo`: run graphaudit on the bundled reference zoo."""

from __future__ import annotations

from pathlib import Path

import click

from graphaudit.errors import GraphAuditError
from graphaudit.load import load_model
from graphaudit.summary import summarize

from graphaudit.cli.inspect import render_text

ZOO = ("dense", "featuregate", "mudd", "moe", "earlyexit")


def default_fixtures() -> Path:
    """The repository's fixtures/ folder (graphaudit installed from a checkout)."""
    return Path(__file__).resolve().parents[2] / "fixtures"


@click.command("demo")
@click.option("--fixtures", "fixtures", type=click.Path(file_okay=False, path_type=Path),
              default=None, help="Folder holding the zoo (default: the checkout's fixtures/).")
def demo(fixtures: Path | None) -> None:
    """Run graphaudit on the bundled zoo models.

    The full three-property audit is not built yet: for now this shows what `inspect`
    reads from each bundled model.
    """
    folder = fixtures or default_fixtures()
    models = [folder / name / "model.onnx" for name in ZOO if (folder / name / "model.onnx").is_file()]
    if not models:
        raise GraphAuditError(
            f"expected the zoo's model.onnx files under {folder} ({', '.join(ZOO)}), found none; "
            "regenerate them with `python -m exporters.build --out fixtures` or pass --fixtures"
        )
    click.echo("graphaudit demo: the audit is not built yet; showing `graphaudit inspect` of each zoo model.\n")
    for path in models:
        click.echo(f"== {path.parent.name} ==")
        click.echo(render_text(summarize(load_model(path))))
        click.echo("")
