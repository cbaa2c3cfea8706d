"""Writing the files graphaudit makes, without ever writing through a link into an input.

`replace_file` writes a fresh file beside the target and renames it onto the target, so a
hard or symbolic link already there is replaced as a folder entry; a character device or a
pipe there (`/dev/null`, a FIFO, `/dev/stdout`) is written into instead, never renamed over.
`check_target` refuses, before any work, a target that is an input or cannot be written;
`same_file` says whether two names lead to one file, and `input_named` which input an output
would overwrite.
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import stat
from collections.abc import Callable, Sequence
from pathlib import Path

from graphaudit.errors import GraphAuditError, UsageError
from graphaudit.files import scratch

NEW, STREAM = "new", "stream"  # what `target_kind` finds: a name to (re)place a file at, or one to write into
# The folder of an open descriptor's names (/dev/stdout leads to /proc/self/fd/1): written into, never replaced
_DESCRIPTORS = re.compile(r"/proc/[^/]+/fd")
_KINDS = {stat.S_IFBLK: "a block device", stat.S_IFSOCK: "a socket", stat.S_IFDIR: "a directory"}


def replace_file(path: Path, write: Callable[[Path], object], what: str) -> None:
    """Write `path` afresh: `write` fills a new file beside it, which is then renamed onto `path`.

    A hard or symbolic link at `path` is replaced as a folder entry, so the file it led to is
    never written through; a write that fails leaves `path` as it was. A character device or pipe
    at `path` is written into by `write` itself. An OSError becomes a GraphAuditError naming the
    path and `what` was being written there.
    """
    path = Path(path)
    if target_kind(path, what) == STREAM:
        try:
            write(path)
        except OSError as err:
            raise GraphAuditError(f"expected {shown(path)} to take {what}, found: {err.strerror or err}") from None
        return
    temporary = path.with_name(f".{path.name[:200]}.{secrets.token_hex(6)}.tmp")
    try:  # O_EXCL: never an existing file (or link) of that name; 0o666 less the umask, like any new file
        os.close(os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))
    except OSError as err:
        raise GraphAuditError(f"expected a folder graphaudit can write {what} into, found {path.parent} "
                              f"({err.strerror})") from None
    scratch.track(temporary)
    try:
        write(temporary)
        target_kind(path, what, stream=False)  # still nothing but a file or a link there
        os.replace(temporary, path)
    except OSError as err:
        raise GraphAuditError(f"expected a file graphaudit can write {what} to at {shown(path)}, found: "
                              f"{err.strerror or type(err).__name__}") from None
    finally:
        unlink_entry(temporary)
        scratch.untrack(temporary)


def target_kind(path: str | os.PathLike, what: str, stream: bool = True) -> str:
    """NEW where a file can be put at `path` (nothing there, a file, or a link, which is replaced),
    STREAM where `path` is written into (a character device, a pipe, an open descriptor's name);
    else (a directory, a block device, a socket; a name the file system refuses) a GraphAuditError.
    `stream` False: a target to write into is refused too."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return NEW
    except OSError as err:  # a name too long, a file where a folder should be
        raise GraphAuditError(f"expected a name graphaudit can write {what} to, found {shown(path)} "
                              f"({err.strerror})") from None
    if stat.S_ISLNK(mode):
        if not _names_a_descriptor(path):
            try:
                mode = os.stat(path).st_mode
            except OSError:  # a broken link: replaced like any link
                return NEW
            if stat.S_ISREG(mode):
                return NEW
        else:
            mode = os.stat(path).st_mode
            if stat.S_ISREG(mode):
                mode = stat.S_IFCHR  # an open file is written through its descriptor's name, as a shell would
    if stat.S_ISREG(mode):
        return NEW
    if (stat.S_ISCHR(mode) or stat.S_ISFIFO(mode)) and stream:
        return STREAM
    found = _KINDS.get(stat.S_IFMT(mode), "a device or pipe, which graphaudit does not write")
    raise GraphAuditError(f"expected a file graphaudit can write {what} to at {shown(path)}, found {found}")


def check_target(path: str | os.PathLike, option: str, inputs) -> None:
    """Refuse, before any work, an output `path` that is one of `inputs` (by any link), cannot be
    written (see `target_kind`), or has no folder to go in."""
    if input_named(path, inputs) is not None:
        raise UsageError(f"expected {option} to name a file that is not one of the inputs, found {path}, "
                         "an input; graphaudit never overwrites the files it audits")
    if os.path.isdir(path):
        raise GraphAuditError(f"expected {option} to name a file, found a directory at {path}")
    parent = Path(path).resolve().parent
    if not parent.is_dir():
        from graphaudit.files.path_kinds import not_a_folder

        raise GraphAuditError(f"expected {option} to name a file in an existing folder, found {not_a_folder(parent)}")
    target_kind(path, f"the {option} output")


def shown(path: str | os.PathLike) -> str:
    """`path` for a message: a part longer than a file name can be is cut to its start and its length."""
    parts = [p if len(p) <= 80 else f"{p[:40]}...({len(p)} characters)" for p in str(path).split(os.sep)]
    return os.sep.join(parts)


def refuse_input(path: str | os.PathLike, inputs, expected: str) -> None:
    """Refuse an output `path` that is one of `inputs` (by any link): "expected {expected}, found ..."."""
    given = input_named(path, inputs)
    if given is not None:
        raise UsageError(f"expected {expected}, found {path}, the same file as the input {given}; graphaudit never "
                         "overwrites the files it audits")


def input_named(path: str | os.PathLike, inputs) -> Path | None:
    """The one of `inputs` (paths, None skipped) that `path` names by any link, else None."""
    return next((Path(given) for given in inputs if given is not None and same_file(given, path)), None)


def same_file(a: str | os.PathLike, b: str | os.PathLike) -> bool:
    """Whether `a` and `b` name one file: the same path, or a link (hard or symbolic) to it."""
    try:
        return os.path.samefile(a, b)
    except OSError:  # one of them does not exist (or cannot be looked at)
        return Path(a).resolve() == Path(b).resolve()


def make_folders(folder: Path) -> list[Path]:
    """Create `folder` and the folders above it that are missing; return those made, outermost
    first, each tracked (graphaudit.files.scratch) to go while empty should the process be
    killed, until `settle_folders`. An OSError (`filename`: the folder that could not be made)
    leaves none of them."""
    missing = []
    while not folder.exists() and not folder.is_symlink() and folder != folder.parent:
        missing.append(folder)
        folder = folder.parent
    made: list[Path] = []
    try:
        for each in reversed(missing):
            each.mkdir()
            made.append(each)
            scratch.track(each, empty_only=True)
    except OSError:
        settle_folders(made, failed=True)
        raise
    return made


def settle_folders(folders: Sequence[Path], failed: bool) -> None:
    """Done with the `folders` `make_folders` made (outermost first): kept, or where what was to
    be written in them `failed`, removed innermost first while empty; no longer tracked."""
    for folder in reversed(folders) if failed else ():
        try:
            folder.rmdir()
        except FileNotFoundError:  # removed already, with what it held
            continue
        except OSError:
            break  # not empty: nor are those above it
    for folder in folders:
        scratch.untrack(folder)


class MadeFiles:
    """The files a write makes (a cache's partial files, the weights freeze copies), each tracked
    for removal (graphaudit.files.scratch) from when it is added until it is in place (`done`,
    `keep`) or removed (`discard`)."""

    def __init__(self) -> None:
        self._paths: list[Path] = []

    def add(self, path: Path) -> Path:
        self._paths.append(path)
        scratch.track(path)
        return path

    def done(self, path: Path) -> None:
        """`path` is in place under its own name, or gone."""
        self._paths.remove(path)
        scratch.untrack(path)

    def keep(self) -> None:
        """Every file is in place."""
        for path in self._paths:
            scratch.untrack(path)
        self._paths.clear()

    def discard(self) -> None:
        """Remove every file not yet in place."""
        for path in self._paths:
            with contextlib.suppress(OSError):
                path.unlink()
        self.keep()


def unlink_entry(path: Path) -> None:
    """Remove the folder entry `path` (never what a link there points at), if there is one."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)


def _names_a_descriptor(path: str | os.PathLike) -> bool:
    """Whether following the links from `path` passes through /proc/PID/fd/N (as /dev/stdout does)."""
    current = os.fspath(path)
    for _ in range(40):  # the kernel's own limit on links followed
        if not os.path.islink(current):
            return False
        folder = os.path.dirname(current) or "."
        if _DESCRIPTORS.fullmatch(os.path.realpath(folder)):
            return True
        current = os.path.join(folder, os.readlink(current))
    return False
