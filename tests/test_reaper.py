"""The reaper: what it reads down its pipe, and that it comes and goes with the command's session.

The end to end cases (a command killed outright, its files removed) are in test_kill.py.
"""

from __future__ import annotations

import io
import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from graphaudit.files import reaper, scratch

ENDED_S = 30  # how long a process may take to end (a busy machine)


class _Trickle:
    """A stream that hands back a few bytes at a time, as a pipe may: messages cut anywhere."""

    def __init__(self, data: bytes, step: int):
        self._data, self._step = data, step

    def read1(self, size: int) -> bytes:
        chunk, self._data = self._data[: min(size, self._step)], self._data[min(size, self._step):]
        return chunk


@pytest.mark.parametrize("step", [1, 3, 7, 65536])
def test_the_paths_still_named_at_the_end_are_those_tracked_and_not_forgotten(tmp_path, step):
    a, b, c = tmp_path / "a", tmp_path / "b c\nd", tmp_path / "é"
    messages = b"".join([reaper.message(reaper.TRACK, a), reaper.message(reaper.TRACK, b),
                         reaper.message(reaper.FORGET, a), reaper.message(reaper.TRACK, c),
                         reaper.message(reaper.FORGET, tmp_path / "never tracked"),
                         reaper.message(reaper.TRACK, a)])
    named = reaper.named(_Trickle(messages, step))
    assert list(named.items()) == [(os.fsencode(p), reaper.TRACK) for p in (b, c, a)]


def test_a_relative_path_is_named_from_where_it_was_tracked(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert reaper.message(reaper.TRACK, "x") == b"+" + os.fsencode(tmp_path / "x") + b"\0"


def test_the_end_of_a_command_in_its_own_time_forgets_every_path(tmp_path):
    messages = reaper.message(reaper.TRACK, tmp_path / "a") + reaper.DONE + reaper.END
    assert reaper.named(io.BytesIO(messages)) == {}


def test_a_message_cut_off_by_the_end_names_nothing(tmp_path):
    whole = reaper.message(reaper.TRACK, tmp_path / "whole")
    cut = reaper.message(reaper.TRACK, tmp_path / "cut")[:-1]
    assert list(reaper.named(io.BytesIO(whole + cut))) == [os.fsencode(tmp_path / "whole")]


def _run_reaper(messages: bytes) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-I", "-S", reaper.__file__], input=messages, capture_output=True,
                          timeout=ENDED_S)


def test_the_reaper_removes_what_is_still_named_and_never_what_a_link_leads_to(tmp_path):
    folder, file, link, kept = tmp_path / "folder", tmp_path / "file", tmp_path / "link", tmp_path / "kept"
    (folder / "inner").mkdir(parents=True)
    (folder / "inner" / "x").write_text("x")
    file.write_text("f")
    kept.mkdir()
    (kept / "mine").write_text("mine")
    link.symlink_to(kept)
    (folder / "to-kept").symlink_to(kept)
    done = _run_reaper(b"".join(reaper.message(reaper.TRACK, p) for p in (folder, file, link, kept))
                       + reaper.message(reaper.FORGET, kept))
    assert done.returncode == 0 and done.stderr == b""
    assert sorted(os.listdir(tmp_path)) == ["kept"] and os.listdir(kept) == ["mine"]


def _wait_ignoring(pid: int, signals) -> None:
    """Wait until process `pid` ignores every one of `signals` (its SigIgn mask in /proc)."""
    status = f"/proc/{pid}/status"
    if not os.path.exists(status):
        pytest.skip("no /proc here to see a process's ignored signals")
    wanted = sum(1 << (s - 1) for s in signals)
    deadline = time.monotonic() + ENDED_S
    while time.monotonic() < deadline:
        with open(status) as f:
            ignored = int(next(line for line in f if line.startswith("SigIgn:")).split()[1], 16)
        if ignored & wanted == wanted:
            return
        time.sleep(0.01)
    pytest.fail(f"the reaper did not ignore {signals} within {ENDED_S} s")


def test_a_folder_tracked_while_empty_goes_only_once_what_it_holds_has_gone(tmp_path):
    """Newest first: the files a command made in a folder it made go before the folder; a file
    someone else put there keeps it."""
    made, shared = tmp_path / "made", tmp_path / "shared"
    for folder in (made, shared):
        folder.mkdir()
        (folder / ".partial-x").write_text("x")
    (shared / "theirs").write_text("theirs")
    done = _run_reaper(b"".join([reaper.message(reaper.EMPTY, made), reaper.message(reaper.EMPTY, shared),
                                 reaper.message(reaper.TRACK, made / ".partial-x"),
                                 reaper.message(reaper.TRACK, shared / ".partial-x")]))
    assert done.returncode == 0
    assert sorted(os.listdir(tmp_path)) == ["shared"] and os.listdir(shared) == ["theirs"]


def test_a_folder_written_into_after_the_command_ended_is_removed_again(tmp_path):
    """A process the command started (an embedded Ray's) may write into its folder for a moment
    after the command has ended: a later pass removes what it wrote."""
    folder = tmp_path / "ray-x"
    folder.mkdir()
    rewritten = threading.Event()

    def write_once_removed() -> None:
        deadline = time.monotonic() + ENDED_S
        while folder.exists() and time.monotonic() < deadline:
            time.sleep(0.001)
        folder.mkdir()
        (folder / "late.log").write_text("late")
        rewritten.set()

    writer = threading.Thread(target=write_once_removed)
    writer.start()
    done = _run_reaper(reaper.message(reaper.TRACK, folder))
    writer.join()
    assert done.returncode == 0 and rewritten.is_set()
    assert not folder.exists()


def test_the_reaper_outlives_the_signals_meant_for_the_command(tmp_path):
    """SIGINT, SIGTERM and SIGHUP leave it: it ends when its pipe closes, and does its work then."""
    made = tmp_path / "made"
    made.mkdir()
    process = subprocess.Popen([sys.executable, "-I", "-S", reaper.__file__], stdin=subprocess.PIPE)
    process.stdin.write(reaper.message(reaper.TRACK, made))
    process.stdin.flush()
    _wait_ignoring(process.pid, (signal.SIGINT, signal.SIGTERM, signal.SIGHUP))
    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        process.send_signal(signum)
    time.sleep(0.2)
    assert process.poll() is None
    process.stdin.close()
    assert process.wait(timeout=ENDED_S) == 0
    assert not made.exists()


def test_a_session_starts_its_reaper_and_collects_it_at_its_end(tmp_path, monkeypatch):
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    with scratch.session() as root:
        started = scratch._reaper
        assert started is not None and started.poll() is None
        with scratch.session():  # an inner session shares it
            assert scratch._reaper is started
        assert scratch._reaper is started
    assert scratch._reaper is None
    assert started.returncode == 0  # collected: no process left behind
    assert not root.exists() and os.listdir(tmp_path) == []


def test_a_path_left_tracked_at_a_sessions_end_is_not_the_reapers_to_remove(tmp_path, monkeypatch):
    """A session that ends in its own time (done, failed or stopped by a signal it caught) did its
    own cleanup: what is still tracked then (a path left so by a mistake) stays."""
    monkeypatch.setenv("TMPDIR", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    left = tmp_path / "left"
    with pytest.raises(RuntimeError, match="failed"), scratch.session():
        started = scratch._reaper
        left.mkdir()
        scratch.track(left)
        raise RuntimeError("failed")
    assert started.returncode == 0  # collected: it exited at once, removing nothing
    assert left.is_dir()
    scratch.untrack(left)


def test_a_reaper_ended_by_hand_leaves_the_command_to_its_own_cleanup(tmp_path, monkeypatch):
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    with scratch.session() as root:
        started = scratch._reaper
        started.kill()
        started.wait(timeout=ENDED_S)
        with scratch.tracked(root / "later") as later:  # told to a pipe that is gone: no error
            later.mkdir()
        assert scratch._reaper is None
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("how", ["no interpreter", "a frozen app"])
def test_where_no_interpreter_can_run_it_a_session_goes_on_without_a_reaper(tmp_path, monkeypatch, how):
    """A frozen application's sys.executable is the application itself: run with the reaper's
    arguments, it would start a command of its own, and that one another reaper."""
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    if how == "no interpreter":
        monkeypatch.setattr(sys, "executable", "")
    else:
        monkeypatch.setattr(sys, "frozen", True, raising=False)
    with scratch.session() as root:
        assert scratch._reaper is None and root.is_dir()
    assert os.listdir(tmp_path) == []
