"""Running `graphaudit` in-process, and the contract every bad input is held to.

`refused` runs the command line in-process and checks what a user sees: the exit status
(1 for a bad file, 2 for bad usage), exactly one line on stderr (read at the file
descriptor, so ONNX Runtime's own log lines count too) that starts
`graphaudit: error: expected`, no traceback, and every input file — model, external data,
.npz — byte-for-byte as it was, with nothing new written beside it. tests/test_bad_contract.py
checks the contract itself.
"""

from __future__ import annotations

import hashlib
import re
import warnings
from pathlib import Path

import pytest

from graphaudit.cli import main

# The fewest rounds the runtime commands accept: the bad-input tests are about errors, not timing.
FAST_PROFILE = ["--runs", "1", "--warmup", "0", "--profile-runs", "1", "--opt-level", "disable"]
FAST_RUN = ["--runs", "1", "--warmup", "0", "--profile-runs", "1", "--resamples", "5", "--provider", "cpu", "-q"]
FAST_REPLAY = ["--resamples", "5", "--quiet"]


def sha(path: Path) -> str:
    """The sha256 of the file at `path`, in hex."""
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def snapshot(paths) -> dict:
    """sha256 of every input file (links followed) and the listing of every folder holding one."""
    files = {str(p): sha(p) for p in paths if Path(p).is_file()}
    folders = {str(Path(p).parent): sorted(q.name for q in Path(p).parent.iterdir()) for p in paths}
    return {"files": files, "folders": folders}


def invoke(args) -> int:
    """Run `graphaudit ARGS` in-process; return its exit status. A warning the user would see
    (Python prints all but deprecations to stderr) fails the test: it would be a second line."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with pytest.raises(SystemExit) as info:
            main([str(a) for a in args])
    shown = [f"{w.category.__name__}: {w.message} ({w.filename}:{w.lineno})" for w in caught
             if not issubclass(w.category, (DeprecationWarning, PendingDeprecationWarning))]
    assert not shown, shown
    return info.value.code


def refused(capfd, args, inputs, match: str | None = None, code: int = 1) -> str:
    """Run `graphaudit ARGS`; assert the one-line refusal and untouched inputs; return the line."""
    before = snapshot(inputs)
    status = invoke(args)
    out, err = capfd.readouterr()
    assert status == code, f"exit {status}, stderr: {err!r}"
    assert err.startswith("graphaudit: error: expected"), err
    assert err.endswith("\n") and err.count("\n") == 1, err
    assert "Traceback" not in err and out == ""
    if match is not None:
        assert re.search(match, err), err
    assert snapshot(inputs) == before
    return err


def accepted(capfd, args, inputs) -> str:
    """Run `graphaudit ARGS`; assert exit 0, a quiet stderr and untouched inputs; return stdout."""
    before = snapshot(inputs)
    status = invoke(args)
    out, err = capfd.readouterr()
    assert status == 0, err
    assert "Traceback" not in err and "error" not in err
    assert snapshot(inputs) == before
    return out


def run_main(args, capsys):
    """Run `graphaudit ARGS` in-process; return its exit status, stdout and stderr (read by capsys)."""
    with pytest.raises(SystemExit) as exit_info:
        main(args)
    out, err = capsys.readouterr()
    return exit_info.value.code, out, err
