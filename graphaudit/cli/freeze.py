"""`graphaudit freeze`: write the trace graph and the frozen graph of a model."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import click
import onnx

from graphaudit.errors import GraphAuditError
from graphaudit.load import load_for_runtime
from graphaudit.replay import resolve
from graphaudit.surgery import freeze

# Protobuf cannot serialise past 2 GiB: larger graphs keep their weights beside them.
_INLINE_LIMIT = 2**31 - 2**20


@click.command("freeze")
@click.argument("model", type=click.Path(dir_okay=False, path_type=str))
@click.option("-o", "--output", "out_dir", required=True, type=click.Path(file_okay=False, path_type=Path),
              help="Folder to write MODEL.trace.onnx and MODEL.frozen.onnx into (created if missing).")
@click.option("--coefficients", "names", multiple=True, metavar="NAME_OR_GLOB",
              help="Coefficient tensors to freeze (repeatable; default: declared in the metadata, else detected).")
def freeze_cmd(model: str, out_dir: Path, names: tuple[str, ...]) -> None:
    """Write MODEL's trace graph (coefficients as extra outputs) and frozen graph (coefficients
    as inputs, controller nodes removed), for replaying the model elsewhere. A model whose
    weights lie in external files keeps them there: both graphs refer to the same files, linked
    or copied into the output folder unread."""
    loaded = load_for_runtime(model)
    coefficients = resolve(loaded, _split(names))
    if not coefficients:
        click.echo(f"{loaded.name}: no controller — the model declares no coefficient tensors, none were given "
                   "(--coefficients) and none were detected; nothing to freeze")
        return
    result = freeze(loaded.model, coefficients)
    stem = Path(model).name.removesuffix(".onnx")
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise GraphAuditError(f"expected a folder we can write at {out_dir}, found: {err.strerror}") from None
    if loaded.weights_folder is not None:
        _place_weights(loaded.external_files, loaded.weights_folder, out_dir)
    paths = []
    for kind, proto in (("trace", result.trace), ("frozen", result.frozen)):
        path = out_dir / f"{stem}.{kind}.onnx"
        external = loaded.weights_folder is None and proto.ByteSize() > _INLINE_LIMIT
        onnx.save_model(proto, str(path), save_as_external_data=external,
                        location=f"{path.name}.data" if external else None)
        paths.append(path)
    click.echo(f"{len(coefficients)} coefficient tensors ({', '.join(sorted({c.family for c in coefficients}))})")
    click.echo(f"trace graph:  {paths[0]}  (+{len(coefficients)} outputs)")
    click.echo(f"frozen graph: {paths[1]}  (+{len(coefficients)} inputs, {len(result.removed)} controller nodes removed)")
    if loaded.weights_folder is not None and out_dir.resolve() != loaded.weights_folder:
        click.echo(f"weights: {', '.join(loaded.external_files)} beside them (linked, or copied where a link "
                   "cannot be made)")


def _place_weights(locations: tuple[str, ...], source: Path, out_dir: Path) -> None:
    """Make each external-data file the graphs refer to available in `out_dir`: a hard link, else a copy.

    A file of that name already there must be the same file; another one is never overwritten.
    """
    if out_dir.resolve() == source:
        return
    for location in locations:
        original, target = source / location, out_dir / location
        if target.exists():
            if target.samefile(original):
                continue
            raise GraphAuditError(
                f"expected no other file at {target} (the frozen graphs' weights {location!r} go there), "
                "found one; choose another output folder"
            )
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            try:
                os.link(original, target)
            except OSError:  # another file system, or links not allowed: copy, in chunks
                shutil.copyfile(original, target)
        except OSError as err:
            raise GraphAuditError(f"expected to place the weights {location!r} in {out_dir}, found: "
                                  f"{err.strerror}") from None


def _split(values: tuple[str, ...]) -> tuple[str, ...]:
    return tuple(v for value in values for v in value.split(",") if v)
