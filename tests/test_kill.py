"""Killed at any point, graphaudit leaves nothing behind: no temporary folder, no `.ses`, no partial output.

Each test starts `python -m graphaudit` as a process with a TMPDIR of its own, waits until the
command has made its temporary folder (`graphaudit-*`), then sends SIGINT or SIGTERM after a
delay, and checks what a user would find: a non-zero exit (128 + the signal), no traceback, an
empty TMPDIR (ONNX Runtime's `.ses` included) and no file at `-o`, nor a temporary one beside it.
A model whose ONNX Runtime run never returns (a `Loop` of 2^62 trips) cannot unwind Python's
main thread: graphaudit's watcher thread removes the files and ends the process itself.
SIGKILL runs no code of the command's at all: the reaper, a process of its own, removes what it
had made once it has ended.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import onnx
import pytest

from support.zoo import zoo_subset

ROOT = Path(__file__).resolve().parents[1]
STARTED_S = 60  # how long a process may take to import and make its temporary folder (a busy machine)
REAPED_S = 30  # how long the reaper may take to remove what a killed command left (a busy machine)

SPIN = """
<ir_version: 8, opset_import: ["" : 17]>
spin (float[N] x) => (float[N] y) {
  trips = Constant <value = int64 {4611686018427387904}> ()
  cond = Constant <value = bool {1}> ()
  y = Loop (trips, cond, x) <body = step (int64 i, bool c_in, float[N] v) => (bool c_out, float[N] w) {
      c_out = Identity (c_in)
      w = Neg (v)
  }>
}
"""


def _start(args, tmpdir: Path) -> subprocess.Popen:
    tmpdir.mkdir(exist_ok=True)
    env = {**os.environ, "TMPDIR": str(tmpdir), "PYTHONPATH": str(ROOT)}
    # SIGINT as a terminal gives it: a shell runs a background job (and all it starts) with SIGINT ignored
    return subprocess.Popen([sys.executable, "-m", "graphaudit", *map(str, args)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))


def _wait_for(process: subprocess.Popen, tmpdir: Path, pattern: str) -> None:
    """Wait until `pattern` matches something under `tmpdir` (the command has got that far)."""
    deadline = time.monotonic() + STARTED_S
    while not list(tmpdir.glob(pattern)):
        if process.poll() is not None:
            pytest.fail(f"the command ended (exit {process.returncode}) before {pattern} appeared: "
                        f"{process.stderr.read()}")
        if time.monotonic() > deadline:
            process.kill()
            pytest.fail(f"no {pattern} in {tmpdir} after {STARTED_S} s")
        time.sleep(0.02)


def _stopped(process: subprocess.Popen, signum: int, timeout: float = 60) -> str:
    """Send `signum`; return stderr once the process has ended of it, checked to end as 128 + signum."""
    process.send_signal(signum)
    try:
        _, err = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        _, err = process.communicate()
        pytest.fail(f"still running {timeout} s after {signal.Signals(signum).name}: {err}")
    assert process.returncode == 128 + signum, (process.returncode, err)
    assert "Traceback" not in err, err
    return err


@pytest.fixture(scope="module")
def zoo(tmp_path_factory):
    return zoo_subset(tmp_path_factory.mktemp("zoo"), rows=4, tokens=16)


def _endless_run(zoo, tmp_path: Path, delay: float) -> tuple[subprocess.Popen, Path]:
    """A `run` of the zoo's model (many rounds: it never ends by itself) `delay` s after it made its
    temporary folder, and where its report would go."""
    report = tmp_path / "out" / "report.json"
    report.parent.mkdir()
    process = _start(["run", zoo["model"], "--calib", zoo["calib"], "--data", zoo["eval"], "--runs", "10000",
                      "--warmup", "0", "--profile-runs", "1", "--resamples", "5", "--provider", "cpu", "-q",
                      "-o", report], tmp_path / "tmp")
    _wait_for(process, tmp_path / "tmp", "graphaudit-*")
    time.sleep(delay)
    return process, report


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
@pytest.mark.parametrize("delay", [0.0, 0.5, 1.5, 3.0])
def test_a_run_stopped_at_any_point_leaves_nothing(zoo, tmp_path, signum, delay):
    """Stopped while importing, loading, capturing, replaying or profiling (many rounds: it never ends by itself)."""
    process, report = _endless_run(zoo, tmp_path, delay)
    err = _stopped(process, signum)
    assert "aborted" in err or "stopped by" in err, err
    assert os.listdir(tmp_path / "tmp") == []  # no graphaudit-* folder, no .ses
    assert os.listdir(report.parent) == []  # no report, no temporary beside it


def _killed(process: subprocess.Popen, *folders: Path) -> None:
    """SIGKILL `process`, then wait until every one of `folders` is empty (the reaper's work)."""
    process.kill()
    process.communicate(timeout=60)
    assert process.returncode == -signal.SIGKILL
    deadline = time.monotonic() + REAPED_S
    while any(os.listdir(folder) for folder in folders) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert {str(folder): os.listdir(folder) for folder in folders} == {str(folder): [] for folder in folders}


@pytest.mark.parametrize("delay", [0.0, 1.0, 3.0])
def test_a_run_killed_outright_leaves_nothing(zoo, tmp_path, delay):
    """SIGKILL (the out-of-memory killer's) while loading, capturing, replaying or profiling: the
    temporary folder (the profiler's files, ONNX Runtime's `.ses`) and the report's temporary go."""
    process, report = _endless_run(zoo, tmp_path, delay)
    _killed(process, tmp_path / "tmp", report.parent)


@pytest.fixture(scope="module")
def spin(tmp_path_factory) -> dict:
    """A model whose ONNX Runtime run does not return, and data for it."""
    folder = tmp_path_factory.mktemp("spin")
    model = onnx.parser.parse_model(SPIN)
    onnx.checker.check_model(model)
    onnx.save(model, folder / "spin.onnx")
    np.savez(folder / "x.npz", x=np.ones(2, np.float32))
    return {"model": folder / "spin.onnx", "data": folder / "x.npz"}


@pytest.mark.parametrize("twice", [False, True], ids=["once", "twice"])
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_run_that_never_returns_is_stopped_and_leaves_nothing(spin, tmp_path, signum, twice):
    kept = tmp_path / "kept"
    process = _start(["profile", spin["model"], "--data", spin["data"], "--runs", "1", "--warmup", "0",
                      "--profile-runs", "1", "--opt-level", "disable", "--keep-profiles", kept,
                      "--trace", tmp_path / "trace.json"], tmp_path / "tmp")
    # the profile's own folder for ONNX Runtime's files: its sessions open next, then the run that never returns
    _wait_for(process, kept, ".graphaudit-profile-*")
    time.sleep(2.0)
    if twice:
        process.send_signal(signum)
        time.sleep(0.2)
    err = _stopped(process, signum)
    assert f"stopped by {signal.Signals(signum).name} while native code was running" in err, err
    assert os.listdir(tmp_path / "tmp") == []
    assert os.listdir(tmp_path) == ["tmp"]  # no trace, no staging folder, nor the --keep-profiles folder it made


def test_a_profile_killed_in_native_code_leaves_nothing(spin, tmp_path):
    """SIGKILL while ONNX Runtime runs: the staging folder inside --keep-profiles goes too, and the
    folder itself, which the command made."""
    kept = tmp_path / "kept"
    process = _start(["profile", spin["model"], "--data", spin["data"], "--runs", "1", "--warmup", "0",
                      "--profile-runs", "1", "--opt-level", "disable", "--keep-profiles", kept], tmp_path / "tmp")
    _wait_for(process, kept, ".graphaudit-profile-*")
    time.sleep(1.0)
    _killed(process, tmp_path / "tmp")
    deadline = time.monotonic() + REAPED_S
    while kept.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert os.listdir(tmp_path) == ["tmp"]  # the --keep-profiles folder it made, with its staging folder


def test_an_import_a_signal_cut_short_is_a_stop_not_a_traceback(monkeypatch, capsys):
    """A signal during `import onnxruntime` surfaces as "ImportError: initialization failed",
    raised while handling the KeyboardInterrupt: still a stop (130), in one line."""
    import graphaudit.cli as cli_module

    def interrupted_import(*args, **kwargs):
        try:
            raise KeyboardInterrupt
        except KeyboardInterrupt:
            raise ImportError("initialization failed")  # noqa: B904 - no `from`: as ONNX Runtime raises it

    monkeypatch.setattr(cli_module.cli, "main", interrupted_import)
    assert cli_module._run(["inspect", "x.onnx"]) == 130
    assert capsys.readouterr().err == "graphaudit: aborted (Ctrl-C); temporary files removed\n"
    monkeypatch.setattr(cli_module.cli, "main", lambda *a, **k: (_ for _ in ()).throw(ImportError("no module")))
    with pytest.raises(ImportError, match="no module"):  # any other failure is a bug, and shows itself
        cli_module._run(["inspect", "x.onnx"])


@pytest.mark.parametrize("where", ["_make_root", "remove"])
def test_a_signal_while_the_temporary_folder_is_made_or_removed_is_a_stop_in_one_line(tmp_path, where):
    """SIGTERM landing inside `scratch.session` itself, outside the command (the folder just made, or
    being removed), ends as 143 with the same one line as anywhere else, not silently."""
    script = (f"import os, graphaudit.files.scratch as s, graphaudit.cli as c\n"
              f"real = s.{where}\n"
              f"def cut(*a):\n"
              f"    made = real(*a)\n"
              f"    os.kill(os.getpid(), 15)  # Python runs the handler at the next bytecode\n"
              f"    return made\n"
              f"s.{where} = cut\n"
              f"c.main(['--version'])\n")
    tmpdir = tmp_path / "tmp"
    tmpdir.mkdir()
    done = subprocess.run([sys.executable, "-c", script], env={**os.environ, "TMPDIR": str(tmpdir),
                          "PYTHONPATH": str(ROOT)}, capture_output=True, text=True, timeout=120)
    assert done.returncode == 143, (done.returncode, done.stderr)
    assert done.stderr == "graphaudit: aborted (SIGTERM); temporary files removed\n", done.stderr
    assert os.listdir(tmpdir) == []
