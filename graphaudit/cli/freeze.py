"""`graphaudit freeze`: write the trace graph and the frozen graph of a model."""

from __future__ import annotations

from pathlib import Path

import click

from graphaudit.cli import axes_option, with_axes
from graphaudit.errors import GraphAuditError
from graphaudit.load.model import load_for_runtime
from graphaudit.replay.frozen_files import write_graphs
from graphaudit.replay.pipeline import resolve


@click.command("freeze")
@click.argument("model", type=click.Path(dir_okay=False, path_type=str))
@click.option("-o", "--output", "out_dir", required=True, type=click.Path(file_okay=False, path_type=Path),
              help="Folder to write MODEL.trace.onnx and MODEL.frozen.onnx into (created if missing).")
@click.option("--coefficients", "names", multiple=True, metavar="NAME_OR_GLOB",
              help="Coefficient tensors to freeze (repeatable; default: declared in the metadata, else detected).")
@click.option("--link", is_flag=True,
              help="Hard-link external weight files into the folder instead of copying them (no copy of large "
                   "weights, but onnx.load then refuses both models' weights: it takes a file with several "
                   "links for an attack; ONNX Runtime loads them).")
@axes_option
def freeze_cmd(model: str, out_dir: Path, names: tuple[str, ...], axes: tuple[str, ...], link: bool) -> None:
    """Write MODEL's trace graph (coefficients as extra outputs) and frozen graph (coefficients
    as inputs, controller nodes removed), for replaying the model elsewhere. A model whose
    weights lie in external files keeps them there: both graphs refer to the same files, copied
    into the output folder unread (cloned where the file system can; --link hard-links them)."""
    loaded = load_for_runtime(model)
    coefficients = resolve(loaded, with_axes(_split(names), axes))
    if not coefficients:  # nothing written: a folder without the graphs asked for must not look like success
        raise GraphAuditError(f"expected a model with a controller to freeze, found none in {loaded.name}: it "
                              "declares no coefficient tensors, none were given (--coefficients) and none were "
                              "detected; nothing was written")
    written = write_graphs(loaded, coefficients, out_dir, Path(model).name.removesuffix(".onnx"), link=link)
    click.echo(f"{len(coefficients)} coefficient tensors ({', '.join(sorted({c.family for c in coefficients}))})")
    click.echo(f"trace graph:  {written.trace}  (+{len(coefficients)} outputs)")
    click.echo(f"frozen graph: {written.frozen}  (+{len(coefficients)} inputs, {len(written.surgery.removed)} "
               "controller nodes removed)")
    if written.placed:
        how = "hard-linked, or copied where a link cannot be made" if link else "copied"
        click.echo(f"weights: {', '.join(written.placed)} beside them ({how})")


def _split(values: tuple[str, ...]) -> tuple[str, ...]:
    return tuple(v for value in values for v in value.split(",") if v)
