"""`graphaudit demo`: audit the bundled zoo and show the models side by side."""

from __future__ import annotations

from pathlib import Path
from typing import TypedDict

import click

from graphaudit.cli.options import OutputSettings, output_options
from graphaudit.progress import ProgressBar


class DemoSettings(TypedDict):
    """The keyword options `audit` takes from the demo (a TypedDict, so none is mistaken for another parameter)."""

    runs: int
    warmup: int
    profile_runs: int
    profile_limit: int
    resamples: int


# Small enough to finish in about a minute on two cores; `graphaudit run` takes full settings.
DEMO_SETTINGS = DemoSettings(runs=10, warmup=2, profile_runs=1, profile_limit=12, resamples=300)


def default_fixtures() -> Path:
    """The zoo graphaudit ships (graphaudit/zoo in an installed wheel), else the checkout's
    fixtures/ folder it is made from (an editable install)."""
    package = Path(__file__).resolve().parents[1]
    shipped = package / "zoo"
    return shipped if (shipped / "zoo.json").is_file() else package.parent / "fixtures"


def _display(path: Path) -> Path:
    """`path` relative to the working directory when it lies below it (shorter commands to copy)."""
    try:
        return path.resolve().relative_to(Path.cwd().resolve())
    except ValueError:
        return path


@click.command("demo")
@click.option("--fixtures", "fixtures", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Folder holding the zoo, one folder per model (default: the zoo installed with graphaudit).")
@click.option("--provider", type=click.Choice(["cpu", "cuda", "auto"]), default="auto", show_default=True,
              help="ONNX Runtime execution provider.")
@output_options(["text", "markdown"], "Table format.")
def demo(fixtures: Path | None, provider: str, out: OutputSettings) -> None:
    """Audit the bundled zoo (Dense, FeatureGate, MUDD, MoE, EarlyExit) against Dense, side by side.

    Each model gets the full three-property audit with small settings (a few timed rounds
    on the first 12 evaluation inputs, 300 bootstrap resamples); `graphaudit run` on one
    model gives the full report.
    """
    from graphaudit.audit import ZOO, audit_zoo
    from graphaudit.report.text import render_demo

    folder = _display(fixtures or default_fixtures())
    out.check(())
    with ProgressBar(quiet=out.quiet) as bar:
        results = audit_zoo(folder, baseline="dense", provider=provider, progress=bar, **DEMO_SETTINGS)
    missing = [n for n in ZOO if n not in {name for name, _ in results}]
    out.emit(render_demo([(name, report.to_json()) for name, report in results], folder, missing, "dense",
                         "github" if out.fmt == "markdown" else "simple"), nl=False)
