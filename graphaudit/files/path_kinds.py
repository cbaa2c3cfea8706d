"""What a path names, in words, for the messages that refuse it: never "nothing" for a pipe
or a device that is there, never "no folder" for a file that is in a folder's place."""

from __future__ import annotations

import os
import stat
from pathlib import Path

KINDS = ((stat.S_ISREG, "a file"), (stat.S_ISDIR, "a directory"), (stat.S_ISCHR, "a character device"),
         (stat.S_ISBLK, "a block device"), (stat.S_ISFIFO, "a named pipe (FIFO)"), (stat.S_ISSOCK, "a socket"))


def path_kind(path: str | os.PathLike) -> str:
    """What is at `path` in words ("a file", "a directory", "a named pipe (FIFO)", "a character
    device", ..., "nothing"), looked at without opening it (a pipe would block, a device may never end)."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return "a symbolic link to nothing" if os.path.islink(path) else "nothing"
    except NotADirectoryError:
        return "nothing (a file stands where a folder above it should be)"
    except OSError as err:
        return f"a path that cannot be looked at ({err.strerror or err})"
    return next((name for test, name in KINDS if test(mode)), "something that is not a regular file")


def not_a_folder(path: str | os.PathLike) -> str:
    """The nearest existing path at or above `path` and what it is, in words, where `path` was to
    be a folder: "no folder /a/b" when nothing is there, "a file at /a/model.onnx" when a file is."""
    here = Path(path)
    while not os.path.lexists(here) and here.parent != here:
        here = here.parent
    if here == Path(path) or os.path.isdir(here):
        kind = path_kind(path)
        return f"no folder {path}" if kind == "nothing" else f"{kind} at {path}, not a folder"
    return f"{path_kind(here)} at {here}, not a folder"
