"""The trace and frozen graphs written to a folder, for replaying a model elsewhere.

`write_graphs` freezes a loaded model and saves both graphs as `STEM.trace.onnx` and
`STEM.frozen.onnx`. Weights in the proto are written with the graphs (beside them, as
external data, past protobuf's 2 GiB). Weights that a model keeps in external files stay
there, never read: both graphs refer to the same files, which are copied into the folder
(cloned, sharing the original's blocks, where the file system can) or, asked for, hard-linked
there. A copy is the default because onnx's loader refuses a weights file with more than one
link (it takes it for a hard-link attack): a link would make onnx.load refuse the user's own
model too. A different file of the same name already in the folder is never overwritten; one
copied there before (same size and modification time) is kept.

Every output is written by `graphaudit.files.replace_file`: a fresh file beside the target,
renamed onto it, so a link already at the target is replaced, never written through.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Sequence

import onnx

from graphaudit.coefficients import Coefficient
from graphaudit.errors import GraphAuditError, UsageError
from graphaudit.files import input_named, replace_file, same_file, unlink_entry
from graphaudit.load import LoadedModel
from graphaudit.surgery import Surgery, freeze

# Protobuf cannot serialise past 2 GiB: larger graphs keep their weights beside them.
_INLINE_LIMIT = 2**31 - 2**20


@dataclass(frozen=True)
class WrittenGraphs:
    """Where the graphs went, what freezing did, and which external weight files were placed beside them."""

    trace: Path
    frozen: Path
    surgery: Surgery
    placed: tuple[str, ...]  # external-data files linked or copied into the folder


def write_graphs(loaded: LoadedModel, coefficients: Sequence[Coefficient], out_dir: Path, stem: str,
                 link: bool = False) -> WrittenGraphs:
    """Freeze `loaded` for `coefficients` and write both graphs into `out_dir` (created if missing).
    `link`: hard-link external weight files into `out_dir` instead of copying them."""
    paths = [out_dir / f"{stem}.{kind}.onnx" for kind in ("trace", "frozen")]
    _refuse_targets(paths, _input_files(loaded))
    surgery = freeze(loaded.model, coefficients)
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise GraphAuditError(f"expected a folder graphaudit can write the frozen graphs into, found {out_dir} "
                              f"({err.strerror})") from None
    placed: tuple[str, ...] = ()
    if loaded.weights_folder is not None and out_dir.resolve() != loaded.weights_folder:
        _place_weights(loaded.external_files, loaded.weights_folder, out_dir, link)
        placed = loaded.external_files
    for path, proto in zip(paths, (surgery.trace, surgery.frozen)):
        location = None
        if loaded.weights_folder is None and proto.ByteSize() > _INLINE_LIMIT:
            location = f"{path.name}.data"
            unlink_entry(out_dir / location)  # onnx appends to it: start from a fresh entry, not a link's target
        replace_file(path, partial(_save, proto, location), "the frozen graphs")
    return WrittenGraphs(paths[0], paths[1], surgery, placed)


_FICLONE = 0x40049409  # Linux ioctl: make `target` share `original`'s blocks (btrfs, XFS)


def _copy(original: Path, target: Path) -> None:
    """Copy `original` to `target`, its modification time kept: cloned where the file system
    can, else in the kernel (`shutil.copyfile`)."""
    with open(original, "rb") as src, open(target, "wb") as dst:
        try:
            import fcntl

            fcntl.ioctl(dst.fileno(), _FICLONE, src.fileno())
        except (ImportError, OSError):  # no clones here: copy
            shutil.copyfileobj(src, dst, 16 * 2**20)
    shutil.copystat(original, target)


def _copied(original: Path, target: Path) -> bool:
    """Whether `target` is the copy `_copy` made of `original`: same size and modification time."""
    a, b = original.stat(), target.stat()
    return (a.st_size, a.st_mtime_ns) == (b.st_size, b.st_mtime_ns)


def _save(proto: onnx.ModelProto, location: str | None, path: Path) -> None:
    onnx.save_model(proto, str(path), save_as_external_data=location is not None, location=location)


def _input_files(loaded: LoadedModel) -> list[Path]:
    """The files `loaded` was read from: the model and its external weights."""
    files = [loaded.path] if loaded.path is not None else []
    if loaded.weights_folder is not None:
        files += [loaded.weights_folder / location for location in loaded.external_files]
    return files


def _refuse_targets(paths: Sequence[Path], inputs: Sequence[Path]) -> None:
    """Refuse, before anything is written, a target that is an input file (by any link) or a directory."""
    for path in paths:
        given = input_named(path, inputs)
        if given is not None:
            raise UsageError(f"expected an output folder where {path.name} is not one of the inputs, found "
                             f"{path}, the same file as the input {given}; graphaudit never overwrites the "
                             "files it audits")
        if path.is_dir() and not path.is_symlink():
            raise GraphAuditError(f"expected a file graphaudit can write the frozen graphs to at {path}, "
                                  "found a directory")


def _place_weights(locations: tuple[str, ...], source: Path, out_dir: Path, link: bool) -> None:
    """Make each external-data file available in `out_dir`: a copy (cloned where the file system
    can), or with `link` a hard link (else a copy); never overwrite another."""
    for location in locations:
        original, target = source / location, out_dir / location
        if target.exists() or target.is_symlink():  # a broken link too: a copy would land where it points
            if target.exists() and (same_file(target, original) or _copied(original, target)):
                continue
            raise GraphAuditError(
                f"expected no other file at {target} (the frozen graphs' weights {location!r} go there), "
                "found one; choose another output folder"
            )
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            try:
                if not link:
                    raise OSError("a copy was asked for")
                os.link(original, target)
            except OSError:  # a copy asked for, another file system, or links not allowed
                _copy(original, target)
        except OSError as err:
            raise GraphAuditError(f"expected to place the weights {location!r} in {out_dir}, found: "
                                  f"{err.strerror}") from None
