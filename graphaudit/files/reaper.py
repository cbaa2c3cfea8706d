"""The reaper: a small process that removes what a killed command leaves behind.

No process can catch SIGKILL (the out-of-memory killer's, `kill -9`, a CI job's timeout), so
a command ended by it runs none of its own cleanup. `graphaudit.files.scratch.session` starts
this file as a process of its own (`python -I -S reaper.py`, in a session of its own, so that
a terminal's Ctrl-C or a signal to the command's process group does not reach it) and tells it,
down a pipe, each path the command makes and each it is done with. When the pipe closes, which
the kernel does however the command ends, the reaper removes every path still named, newest
first, again a few times over the next 3.5 s (AGAIN_S), and exits. A command that reaches the
end of its session (done, failed or stopped by a signal it caught) has cleaned up after itself:
it says so (`=`) before it closes the pipe, and the reaper exits at once, removing nothing.

The messages are `+PATH\\0` (track), `~PATH\\0` (track a folder, to be removed only while it is
empty: one that others may write into), `-PATH\\0` (forget) and `=\\0` (forget all: the command
ended in its own time), each PATH absolute, as bytes.
This file imports nothing of graphaudit: it runs before, and after, the command's own modules.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import stat
import sys
import time

TRACK, EMPTY, FORGET, DONE, END = b"+", b"~", b"-", b"=", b"\0"
# Pauses before each further pass over what was left: processes the command started (an embedded
# Ray's) may write into a folder for a moment after the command has ended (a path gone already
# costs a failed lstat). An EMPTY folder someone else keeps stays after the last.
AGAIN_S = (0.5, 1.0, 2.0)


def remove(path: str | bytes | os.PathLike) -> None:
    """Remove the entry `path`: a folder with what it holds, else the file or link itself (never its target)."""
    try:
        mode = os.lstat(path).st_mode
    except OSError:  # gone already
        return
    if stat.S_ISDIR(mode):
        shutil.rmtree(path, ignore_errors=True)
    else:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)


def message(kind: bytes, path: str | os.PathLike) -> bytes:
    """The message that tracks (`kind` TRACK) or forgets (FORGET) the absolute `path`."""
    return kind + os.fsencode(os.path.abspath(path)) + END


def clear(path: str | bytes | os.PathLike, kind: bytes = TRACK) -> None:
    """Remove `path` as tracked with `kind`: an EMPTY folder only while it holds nothing."""
    if kind == EMPTY:
        with contextlib.suppress(OSError):
            os.rmdir(path)
    else:
        remove(path)


def named(stream) -> dict[bytes, bytes]:
    """{path: how it was tracked} of the paths still tracked when `stream` (a binary stream of
    messages, read as they come) ends, oldest first."""
    paths: dict[bytes, bytes] = {}
    pending = b""
    while chunk := stream.read1(65536):
        *whole, pending = (pending + chunk).split(END)
        for item in whole:
            kind, path = item[:1], item[1:]
            if kind in (TRACK, EMPTY):
                paths.pop(path, None)  # tracked again: as new
                paths[path] = kind
            elif kind == FORGET:
                paths.pop(path, None)
            elif kind == DONE:
                paths.clear()
    return paths


def main() -> None:
    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, signal.SIG_IGN)  # it ends when the command has: its pipe tells it
    left = list(reversed(named(sys.stdin.buffer).items()))
    if not left:  # the command ended in its own time, its own cleanup done
        return
    for pause in (0.0, *AGAIN_S):
        time.sleep(pause)
        for path, kind in left:
            with contextlib.suppress(OSError):
                clear(path, kind)


if __name__ == "__main__":
    main()
