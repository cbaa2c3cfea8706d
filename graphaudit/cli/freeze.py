"""`graphaudit freeze`: write the trace graph and the frozen graph of a model."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import click

from graphaudit.cli.options import CoefficientSettings, coefficient_options
from graphaudit.errors import GraphAuditError


@click.command("freeze")
@click.argument("model", type=click.Path(dir_okay=False, path_type=str))
@click.option("-o", "--output", "out_dir", required=True, type=click.Path(file_okay=False, path_type=Path),
              help="Folder to write MODEL.trace.onnx and MODEL.frozen.onnx into (created if missing).")
@coefficient_options("Coefficient tensors to freeze (repeatable; default: declared in the metadata, else detected).",
                     "NAME_OR_GLOB", split=lambda names: _split(names))
@click.option("--link", is_flag=True,
              help="Hard-link external weight files into the folder instead of copying them (no copy of large "
                   "weights, but onnx.load then refuses both models' weights: it takes a file with several "
                   "links for an attack; ONNX Runtime loads them).")
def freeze_cmd(model: str, out_dir: Path, coefficients: CoefficientSettings, link: bool) -> None:
    """Write MODEL's trace graph (coefficients as extra outputs) and frozen graph (coefficients
    as inputs, controller nodes removed), for replaying the model elsewhere. A model whose
    weights lie in external files keeps them there: both graphs refer to the same files, copied
    into the output folder unread (cloned where the file system can; --link hard-links them)."""
    from graphaudit.load.model import load_for_runtime
    from graphaudit.replay.frozen_files import write_graphs
    from graphaudit.replay.pipeline import resolve
    from graphaudit.report.freeze_text import render_text

    loaded = load_for_runtime(model)
    found = resolve(loaded, coefficients.entries)
    if not found:  # nothing written: a folder without the graphs asked for must not look like success
        raise GraphAuditError(f"expected a model with a controller to freeze, found none in {loaded.name}: it "
                              "declares no coefficient tensors, none were given (--coefficients) and none were "
                              "detected; nothing was written")
    written = write_graphs(loaded, found, out_dir, Path(model).name.removesuffix(".onnx"), link=link)
    click.echo(render_text(written, found, link))


def _split(values: Sequence[str]) -> tuple[str, ...]:
    return tuple(v for value in values for v in value.split(",") if v)
