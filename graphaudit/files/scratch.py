"""Temporary files and folders, removed on every way out of a command: an error, Ctrl-C, SIGTERM, a hang.

`session` (the CLI's `main` runs every command inside it) makes one folder of graphaudit's own,
`graphaudit-*` in the system's temporary folder, and points TMPDIR and `tempfile` at it, so that
whatever the command or ONNX Runtime puts there (the profiler's folders, a spilled replay cache,
the `.ses` file ONNX Runtime 1.32 writes when imported) goes inside it; the folder goes when the
command ends. SIGTERM and SIGHUP unwind like Ctrl-C (a KeyboardInterrupt: every `finally` runs).

A signal cannot unwind Python's main thread while it waits in native code that never returns
(an ONNX Runtime run of a `Loop` with 2^62 trips), so a watcher thread, woken through Python's
signal wakeup descriptor, removes every path `track` names and ends the process itself (status
128 + the signal) when the main thread has not ended GRACE_S after the signal (longer inside
`grace`), or at a second one.
SIGKILL, which no process can catch, runs none of this: the reaper (graphaudit.files.reaper), a
process `session` starts beside the command and tells every path `track` names, removes what
is still tracked when the command ends without reaching the end of its session.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

from graphaudit.files import reaper
from graphaudit.files.reaper import clear, remove

GRACE_S = 2.0  # how long the main thread may take to unwind after a signal before the watcher ends it
SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
ROOT_PREFIX = "graphaudit-"

REAPER_WAIT_S = 5.0  # how long a command's end waits for its reaper to exit (it has nothing left to remove)

_lock = threading.Lock()
_tracked: dict[str, bytes] = {}  # paths to remove if the process must end without unwinding (how: reaper's
# TRACK or EMPTY), oldest first
_reaper: subprocess.Popen | None = None  # the session's reaper, told every path tracked and forgotten


class Terminated(KeyboardInterrupt):
    """SIGTERM or SIGHUP, raised in the main thread so that it unwinds as from Ctrl-C."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def exit_status(interrupt: BaseException | None) -> int:
    """The exit status for a command stopped by `interrupt`: 128 + its signal (130 for Ctrl-C). A
    plain KeyboardInterrupt counts as the last signal handled, where there was one: a library may
    catch the Terminated that SIGTERM raised and raise a KeyboardInterrupt of its own (Ray's
    `ray.wait` does)."""
    signum = getattr(interrupt, "signum", None)
    return 128 + (signum if signum is not None else _received[-1] if _received else signal.SIGINT)


_graces: list[float] = []  # longer graces asked for by `grace`, innermost last


@contextlib.contextmanager
def grace(seconds: float) -> Iterator[None]:
    """While the block runs, the main thread may take `seconds` (not GRACE_S) to unwind after a
    signal before the watcher ends the process: for what takes that long to stop cleanly (an
    embedded Ray's processes, which write into graphaudit's folder until they have ended)."""
    with _lock:
        _graces.append(seconds)
    try:
        yield
    finally:
        with _lock:
            _graces.remove(seconds)


def _grace_s() -> float:
    with _lock:
        return max([GRACE_S, *_graces])


def track(path: str | os.PathLike, *, empty_only: bool = False) -> None:
    """Name `path` (a file or folder graphaudit made) for removal should the process be ended;
    `empty_only`: a folder others may write into too, removed only while it is empty."""
    kind = reaper.EMPTY if empty_only else reaper.TRACK
    with _lock:
        _tracked.pop(os.fspath(path), None)
        _tracked[os.fspath(path)] = kind
        _tell(reaper.message(kind, path))


def untrack(path: str | os.PathLike) -> None:
    """Forget `path` (removed, or moved into place as an output)."""
    with _lock:
        _tracked.pop(os.fspath(path), None)
        _tell(reaper.message(reaper.FORGET, path))


def _tell(data: bytes) -> None:
    """Send the reaper, if one runs, a message (graphaudit.files.reaper's; the caller holds `_lock`)."""
    global _reaper
    if _reaper is None or _reaper.stdin is None:
        return
    try:
        _reaper.stdin.write(data)
        _reaper.stdin.flush()
    except OSError:  # it was ended (by hand): the command goes on, its own cleanup as before
        _reaper = None


@contextlib.contextmanager
def tracked(path: str | os.PathLike) -> Iterator[Path]:
    """`path`, tracked while the block runs and removed (file or folder) when it ends."""
    track(path)
    try:
        yield Path(path)
    finally:
        remove(path)
        untrack(path)


@contextlib.contextmanager
def session() -> Iterator[Path | None]:
    """graphaudit's own temporary folder (None where none can be made), TMPDIR pointing into it and
    the signals handled (in the main thread), for the length of the block; removed after. A signal
    that lands while the folder is being made or removed takes effect once that is done, so the
    folder is never made without being tracked, nor left half removed."""
    _received.clear()  # a signal of an earlier command run in this process is not this one's
    guard = _SignalGuard() if threading.current_thread() is threading.main_thread() else None
    saved = os.environ.get("TMPDIR"), tempfile.tempdir
    root = None
    started = None
    try:
        with _held():
            if _reaper is None:  # an inner session shares the outer one's
                started = _start_reaper()
            root = _make_root()
            if root is not None:
                track(root)
                os.environ["TMPDIR"] = tempfile.tempdir = str(root)
        yield root
    finally:
        try:  # the signals stay handled until the folder is gone
            with _held():
                environ, tempfile.tempdir = saved
                if environ is None:
                    os.environ.pop("TMPDIR", None)
                else:
                    os.environ["TMPDIR"] = environ
                if root is not None:
                    remove(root)
                    untrack(root)
        finally:
            if started is not None:
                _stop_reaper(started)
            if guard is not None:
                guard.close()


def _start_reaper() -> subprocess.Popen | None:
    """Start the reaper (None where no process can be started: the command's own cleanup stays)."""
    global _reaper
    if not sys.executable or getattr(sys, "frozen", False):  # no interpreter to run it (a frozen app's is itself)
        return None
    try:
        # -I -S: no site, user or environment paths, so that it starts in a few milliseconds;
        # its own session, so that a signal to the command's process group (Ctrl-C) leaves it
        started = subprocess.Popen([sys.executable, "-I", "-S", reaper.__file__], stdin=subprocess.PIPE,
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd="/",
                                   start_new_session=True)
    except OSError:
        return None
    with _lock:
        _reaper = started
    return started


def _stop_reaper(started: subprocess.Popen) -> None:
    """Tell the reaper the command has cleaned up after itself, close its pipe (it exits, removing
    nothing) and collect it. What is still tracked here was the command's own cleanup to do: a
    path left tracked by a mistake is never removed at a normal end."""
    global _reaper
    with _lock:
        _tell(reaper.DONE + reaper.END)
        if _reaper is started:
            _reaper = None
    if started.stdin is not None:
        with contextlib.suppress(OSError):
            started.stdin.close()
    with contextlib.suppress(subprocess.TimeoutExpired):
        started.wait(timeout=REAPER_WAIT_S)


def _make_root() -> Path | None:
    try:
        return Path(tempfile.mkdtemp(prefix=ROOT_PREFIX))
    except OSError:  # no writable temporary folder: what needs one says so itself
        return None


_holding = 0  # how many _held blocks the main thread is in
_pending: list[int] = []  # the signal that arrived inside one, raised when the outermost ends
_received: list[int] = []  # the last signal handled (empty: none yet)


def _interrupt(signum: int) -> KeyboardInterrupt:
    return KeyboardInterrupt() if signum == signal.SIGINT else Terminated(signum)


def _on_signal(signum, frame) -> None:
    _received[:] = [signum]
    if _holding:
        _pending[:] = _pending or [signum]
        return
    raise _interrupt(signum)


@contextlib.contextmanager
def _held() -> Iterator[None]:
    """The block runs to its end before a signal (SIGINT, SIGTERM, SIGHUP) raises: Python runs a
    handler between any two bytecodes, e.g. after `mkdtemp` made its folder and before it returned."""
    global _holding
    _holding += 1
    try:
        yield
    finally:
        _holding -= 1
        if not _holding and _pending:
            raise _interrupt(_pending.pop())


class _SignalGuard:
    """SIGINT raising KeyboardInterrupt (as Python's own handler does), SIGTERM and SIGHUP raising
    Terminated, all three held back inside `_held`; and the watcher thread that ends a process that
    cannot unwind. A signal the parent process ignored (a background job's SIGINT, nohup's
    SIGHUP) stays ignored."""

    def __init__(self):
        self._previous = {}
        for signum in SIGNALS:
            current = signal.getsignal(signum)
            if current is signal.SIG_IGN or current is None:
                continue
            self._previous[signum] = current
            signal.signal(signum, _on_signal)
        self._read, self._write = socket.socketpair()
        self._write.setblocking(False)  # set_wakeup_fd's requirement
        self._previous_fd = signal.set_wakeup_fd(self._write.fileno(), warn_on_full_buffer=False)
        self._watcher = threading.Thread(target=self._watch, name="graphaudit-signals", daemon=True)
        self._watcher.start()

    def close(self) -> None:
        signal.set_wakeup_fd(self._previous_fd)
        self._write.close()  # the watcher reads the end of the stream and returns
        self._watcher.join()
        self._read.close()
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)

    def _watch(self) -> None:
        first: int | None = None  # the first signal received, and when
        since = 0.0
        while True:
            self._read.settimeout(None if first is None else max(0.0, since + _grace_s() - time.monotonic()))
            try:
                received = self._read.recv(64)
            except TimeoutError:  # the main thread did not unwind in time: it waits in native code
                assert first is not None  # the timeout is set only once a signal came
                _abandon(first)
            except OSError:
                return
            if not received:  # closed: the command ended
                return
            for signum in (s for s in received if s in SIGNALS):
                if first is not None:
                    _abandon(signum)
                first, since = signum, time.monotonic()


def _abandon(signum: int) -> None:
    """Remove every tracked path and end the process, whose main thread cannot unwind."""
    with _lock:
        paths = list(reversed(_tracked.items()))
    for path, kind in paths:
        with contextlib.suppress(OSError):
            clear(path, kind)
    name = signal.Signals(signum).name
    os.write(2, f"\ngraphaudit: stopped by {name} while native code was running (it does not return to "
                "Python); its temporary files were removed\n".encode())
    os._exit(128 + signum)
