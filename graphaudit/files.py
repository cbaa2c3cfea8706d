"""Writing the files graphaudit makes, without ever writing through a link into an input.

`replace_file` writes a fresh file beside the target and renames it onto the target, so a
hard or symbolic link already there is replaced as a folder entry; `same_file` says whether
two names lead to one file, and `input_named` which input an output would overwrite.
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path
from typing import Callable

from graphaudit.errors import GraphAuditError


def replace_file(path: Path, write: Callable[[Path], None], what: str) -> None:
    """Write `path` afresh: `write` fills a new file beside it, which is then renamed onto `path`.

    A hard or symbolic link at `path` is replaced as a folder entry, so the file it led to is
    never written through; a write that fails leaves `path` as it was. An OSError becomes a
    GraphAuditError naming the path and `what` was being written there.
    """
    path = Path(path)
    temporary = path.with_name(f".{path.name[:200]}.{secrets.token_hex(6)}.tmp")
    try:  # O_EXCL: never an existing file (or link) of that name; 0o666 less the umask, like any new file
        os.close(os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))
    except OSError as err:
        raise GraphAuditError(f"expected a folder graphaudit can write {what} into, found {path.parent} "
                              f"({err.strerror})") from None
    try:
        write(temporary)
        os.replace(temporary, path)
    except OSError as err:
        directory = path.is_dir() and not path.is_symlink()
        found = " a directory" if directory else f": {err.strerror or type(err).__name__}"
        raise GraphAuditError(f"expected a file graphaudit can write {what} to at {path}, found{found}") from None
    finally:
        unlink_entry(temporary)


def input_named(path: str | os.PathLike, inputs) -> Path | None:
    """The one of `inputs` (paths, None skipped) that `path` names by any link, else None."""
    return next((Path(given) for given in inputs if given is not None and same_file(given, path)), None)


def same_file(a: str | os.PathLike, b: str | os.PathLike) -> bool:
    """Whether `a` and `b` name one file: the same path, or a link (hard or symbolic) to it."""
    try:
        return os.path.samefile(a, b)
    except OSError:  # one of them does not exist (or cannot be looked at)
        return Path(a).resolve() == Path(b).resolve()


def unlink_entry(path: Path) -> None:
    """Remove the folder entry `path` (never what a link there points at), if there is one."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
