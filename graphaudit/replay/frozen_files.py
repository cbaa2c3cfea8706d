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

Nothing is written through a link: a link at a graph's name is replaced, and a folder on the
way to a weights file that is a link out of the folder is refused. Every file is first written
into a staging folder inside the output folder; each graph is read back (parsed, its size and
its weights' extents checked, the ONNX checker run) before anything is moved into place, the
weights first, then both graphs, so a write that fails (a disk that fills) leaves neither graph.
The weights' names never collide with the graphs': such a model is refused before anything is written.
"""

from __future__ import annotations

import os
import shutil
import stat
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import onnx

from graphaudit.analyses.declared_coefficients import Coefficient
from graphaudit.errors import GraphAuditError
from graphaudit.files import scratch
from graphaudit.files.write import MadeFiles, make_folders, refuse_input, same_file, settle_folders, target_kind
from graphaudit.load import external_data
from graphaudit.load.checker import check_model
from graphaudit.load.model import LoadedModel
from graphaudit.replay.surgery import Freeze, Freezing, Trace

# Protobuf cannot serialise past 2 GiB: larger graphs keep their weights beside them.
_INLINE_LIMIT = 2**31 - 2**20
_WHAT = "the frozen graphs"


@dataclass(frozen=True)
class WrittenGraphs:
    """Where the graphs went, what freezing did, and which external weight files were placed beside them."""

    trace: Path
    frozen: Path
    freezing: Freezing
    placed: tuple[str, ...]  # external-data files linked or copied into the folder


def write_graphs(loaded: LoadedModel, coefficients: Sequence[Coefficient], out_dir: Path, stem: str,
                 link: bool = False) -> WrittenGraphs:
    """Freeze `loaded` for `coefficients` and write both graphs into `out_dir` (created if missing).
    `link`: hard-link external weight files into `out_dir` instead of copying them."""
    paths = [out_dir / f"{stem}.{kind}.onnx" for kind in ("trace", "frozen")]
    copies = (loaded.external_files if loaded.weights_folder is not None
              and out_dir.resolve() != loaded.weights_folder else ())
    _refuse_targets(paths, loaded.source_files, copies, out_dir)
    frozen = Freeze(tuple(coefficients))(loaded.model)
    trace = Trace(tuple(coefficients))(loaded.model).model
    made = _made_folders(out_dir)  # the folders made for what is written, outermost first
    moved = MadeFiles()  # the weights files moved into out_dir: taken back if the graphs are not
    failed = True
    try:
        try:
            stage = Path(tempfile.mkdtemp(prefix=".graphaudit-freeze-", dir=out_dir))
        except OSError as err:
            raise GraphAuditError(f"expected a folder graphaudit can write {_WHAT} into, found {out_dir} "
                                  f"({err.strerror})") from None
        with scratch.tracked(stage):
            placed = _stage_weights(copies, loaded.weights_folder, out_dir, stage, link)
            graphs = [_stage_graph(proto, path.name, stage, loaded.weights_folder is None)
                      for path, proto in zip(paths, (trace, frozen.model))]
            for staged, _ in graphs:
                _read_back(staged, None)
            for location in placed:
                made += _made_folders((out_dir / location).parent)
                _move_new(stage / location, out_dir / location)
                moved.add(out_dir / location)  # once there: a file that appeared there meanwhile is not ours
            for staged, side in graphs:  # their weights now where they will be read from
                _read_back(staged, stage if side else out_dir)
            for staged, side in graphs:
                for name in (side, staged.name) if side else (staged.name,):
                    target_kind(out_dir / name, _WHAT, stream=False)  # still a file or a link, replaced
                    os.replace(stage / name, out_dir / name)
        failed = False
    except OSError as err:
        raise GraphAuditError(f"expected to write {_WHAT} into {out_dir}, found: {err.strerror or err}") from None
    finally:
        if failed:  # new files: nothing else refers to them
            moved.discard()
        else:
            moved.keep()
        settle_folders(made, failed)
    return WrittenGraphs(paths[0], paths[1], frozen.details, tuple(copies))


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


def _stage_graph(proto: onnx.ModelProto, name: str, stage: Path, inline: bool) -> tuple[Path, str | None]:
    """Save `proto` as `stage/name` (its weights beside it, as `name.data`, past protobuf's limit);
    return the file and the name of that side file (None when the weights are in the graph)."""
    side = f"{name}.data" if inline and proto.ByteSize() > _INLINE_LIMIT else None
    onnx.save_model(proto, str(stage / name), save_as_external_data=side is not None, location=side)
    # what was written must be what was meant: onnx leaves `proto` as the file's encoding
    if (stage / name).stat().st_size != proto.ByteSize():
        raise GraphAuditError(f"expected {name} as written to hold {proto.ByteSize()} bytes, found "
                              f"{(stage / name).stat().st_size}; the disk may be full")
    return stage / name, side


def _read_back(path: Path, weights: Path | None) -> None:
    """Parse the graph written at `path` and run the checker on it; with `weights` (the folder its
    external tensors' files are in), check each tensor lies inside its file."""
    try:
        written = onnx.load(str(path), load_external_data=False)
    except Exception as err:  # noqa: BLE001 - protobuf's DecodeError, onnx's own
        raise GraphAuditError(f"expected the graph written as {path.name} to read back, found: {err}") from None
    tensors, nested = external_data.scan(written)
    if weights is None:
        found = external_data.locations(tensors, path)
        check_model(external_data.as_inputs(written) if tensors else written, path, found if nested else ())
    else:
        external_data.check_extents(tensors, weights, path)


def _refuse_targets(paths: Sequence[Path], inputs: Sequence[Path], copies: Sequence[str], out_dir: Path) -> None:
    """Refuse, before anything is written, a target that is an input file (by any link), one that is
    not a file or a link (a directory, a device, a pipe), weights named like a graph, and a folder
    on the way to a weights file that is a link or a file."""
    for path in [*paths, *(p.with_name(p.name + ".data") for p in paths)]:
        refuse_input(path, inputs, f"an output folder where {path.name} is not one of the inputs")
        target_kind(path, _WHAT, stream=False)
    names = {p.name for p in paths} | {p.name + ".data" for p in paths}
    for location in copies:
        if location in names:
            raise GraphAuditError(f"expected the model's external weights file {location!r} to be named unlike "
                                  f"the graphs freeze writes ({', '.join(p.name for p in paths)}), found they "
                                  "share a name; rename the model (its name names the graphs) and its weights")
        folder = out_dir
        for part in Path(location).parts[:-1]:
            folder = folder / part
            try:
                mode = os.lstat(folder).st_mode
            except FileNotFoundError:
                break
            if not stat.S_ISDIR(mode):
                found = f"a link to {os.readlink(folder)}" if stat.S_ISLNK(mode) else "something else"
                raise GraphAuditError(f"expected a folder inside {out_dir} at {folder} for the weights "
                                      f"{location!r}, found {found}; graphaudit never writes through a link "
                                      "out of the output folder")


def _stage_weights(locations: tuple[str, ...], source: Path | None, out_dir: Path, stage: Path,
                   link: bool) -> list[str]:
    """Put each external-data file to place in `out_dir` into `stage` (a copy, cloned where the file
    system can, or with `link` a hard link, else a copy); return those staged. One already in
    `out_dir` (the same file, or the copy made before) stays; another file there is refused."""
    staged: list[str] = []
    if source is None:  # no external weights (`locations` is empty): nothing to place
        return staged
    for location in locations:
        original, target = source / location, out_dir / location
        if target.exists() or target.is_symlink():  # a broken link too: a copy would land where it points
            if not target.is_symlink() and (same_file(target, original) or _copied(original, target)):
                continue
            raise GraphAuditError(
                f"expected no other file at {target} (the frozen graphs' weights {location!r} go there), "
                "found one; choose another output folder"
            )
        (stage / location).parent.mkdir(parents=True, exist_ok=True)
        try:
            if not link:
                raise OSError("a copy was asked for")
            os.link(original, stage / location)
        except OSError:  # a copy asked for, another file system, or links not allowed
            _copy(original, stage / location)
        staged.append(location)
    return staged


def _move_new(staged: Path, target: Path) -> None:
    """Move `staged` to `target`, where nothing may be (a link is made, then the staged name removed:
    a file that appeared there meanwhile is kept), into `target`'s folder."""
    try:
        os.link(staged, target)
    except FileExistsError:
        raise GraphAuditError(f"expected no other file at {target} (the frozen graphs' weights go there), "
                              "found one; choose another output folder") from None
    except OSError:  # no hard links on this file system
        if target.exists() or target.is_symlink():
            raise
        os.rename(staged, target)
        return
    os.unlink(staged)


def _made_folders(folder: Path) -> list[Path]:
    """`make_folders(folder)`, a folder that cannot be made a one-line error."""
    try:
        return make_folders(folder)
    except OSError as err:
        raise GraphAuditError(f"expected a folder graphaudit can write {_WHAT} into, found {err.filename} "
                              f"({err.strerror})") from None
