"""Writing only where it may: never over an input, a device, a pipe, or through a link out of a folder.

Every file graphaudit or ONNX Runtime writes goes to a fresh name first and is moved into place
at the end, checked against every input: `--keep-profiles` holding the model as `optimised.onnx`
(the name ONNX Runtime gives its optimised model) is refused before anything runs. `-o` onto a
character device or a pipe writes into it (`/dev/full`: a disk-full line), never renames over it.
`freeze` refuses weights named like its graphs or behind a link out of its folder, and a disk
that fills or a write cut short leaves neither graph. Names the file system refuses and a folder
under a file are one line. Character devices are only ever written through the tool (`/dev/null`,
`/dev/full`, or a private one made in tmp_path), and asserted to still be devices after.
"""

from __future__ import annotations

import errno
import os
import shutil
import socket
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path

import onnx
import pytest

import graphaudit.profile.profiler as profiler
import graphaudit.replay.frozen_files as frozen_files
from graphaudit.errors import GraphAuditError

from support.cli import FAST_PROFILE, FAST_RUN, accepted, refused, sha
from support.models import float_gated
from support.zoo import ROOT

LONG = "x" * 300  # past every common file system's 255-byte name limit


@pytest.fixture
def files(float_gated_files) -> Path:
    """A folder holding gated.onnx (a tiny model with one declared gate) and calib.npz."""
    return float_gated_files


def _run(files, *extra):
    return ["run", files / "gated.onnx", "--calib", files / "calib.npz", *FAST_RUN, "--limit", "2", *extra]


def _profile(model, data, *extra):
    return ["profile", model, "--data", data, *FAST_PROFILE[:-2], "--limit", "1", *extra]  # ORT's optimised model too


def _stage_left(folder: Path) -> list[str]:
    return [p.name for p in folder.iterdir() if p.name.startswith(".graphaudit") or p.name.endswith(".tmp")]


# --- --keep-profiles: ONNX Runtime's files never land on an input


@pytest.mark.parametrize("how", ["copy", "hard-link", "symlink"])
def test_keep_profiles_holding_the_model_as_optimised_onnx_is_refused(files, tmp_path, capfd, how):
    """The folder given holds the model audited under the name ONNX Runtime saves its optimised model as."""
    keep = tmp_path / "keep"
    keep.mkdir()
    model = keep / "optimised.onnx"
    if how == "copy":
        model.write_bytes((files / "gated.onnx").read_bytes())
    else:
        (os.link if how == "hard-link" else os.symlink)(files / "gated.onnx", model)
        model = files / "gated.onnx"
    refused(capfd, _profile(model, files / "calib.npz", "--keep-profiles", keep), [model, files / "calib.npz"],
            code=2, match=r"expected --keep-profiles to name a folder where optimised\.onnx \(which ONNX Runtime "
                          r"writes\) is not one of the inputs")
    assert sha(keep / "optimised.onnx") == sha(files / "gated.onnx")
    assert sorted(p.name for p in keep.iterdir()) == ["optimised.onnx"]


def test_keep_profiles_holding_the_data_as_the_optimised_weights_is_refused(files, tmp_path, capfd):
    keep = tmp_path / "keep"
    keep.mkdir()
    data = keep / "optimised.onnx.data"
    data.write_bytes((files / "calib.npz").read_bytes())
    refused(capfd, _profile(files / "gated.onnx", data, "--keep-profiles", keep), [files / "gated.onnx", data],
            code=2, match=r"where optimised\.onnx\.data \(which ONNX Runtime writes\) is not one of the inputs")


def test_keep_profiles_gets_every_file_and_no_staging_folder(files, tmp_path, capfd):
    keep = tmp_path / "keep"
    keep.mkdir()
    (keep / "optimised.onnx").write_text("an older run's")  # not an input: replaced
    accepted(capfd, _profile(files / "gated.onnx", files / "calib.npz", "--keep-profiles", keep),
             [files / "gated.onnx", files / "calib.npz"])
    names = sorted(p.name for p in keep.iterdir())
    assert "optimised.onnx" in names and any(n.startswith("profile_") and n.endswith(".json") for n in names)
    onnx.checker.check_model(onnx.load(keep / "optimised.onnx"))
    assert _stage_left(keep) == []


def test_keep_profiles_made_for_a_profile_that_fails_goes_with_it(files, tmp_path, capfd, monkeypatch):
    """The folders --keep-profiles made are kept with the profiles, and removed when there are none."""
    keep = tmp_path / "new" / "keep"
    accepted(capfd, _profile(files / "gated.onnx", files / "calib.npz", "--keep-profiles", keep),
             [files / "gated.onnx", files / "calib.npz"])
    assert "optimised.onnx" in os.listdir(keep)
    shutil.rmtree(tmp_path / "new")

    def failing(*args, **kwargs):
        raise GraphAuditError("expected the timed rounds to run, found them cut short")

    monkeypatch.setattr(profiler, "_timed_rounds", failing)
    refused(capfd, _profile(files / "gated.onnx", files / "calib.npz", "--keep-profiles", keep),
            [files / "gated.onnx", files / "calib.npz"], match="cut short")
    assert not (tmp_path / "new").exists()


@pytest.mark.parametrize("under", ["calib.npz/kept", "calib.npz/a/b"])
def test_keep_profiles_under_a_file_is_one_line(files, capfd, under):
    refused(capfd, _profile(files / "gated.onnx", files / "calib.npz", "--keep-profiles", files / under),
            [files / "gated.onnx", files / "calib.npz"],
            match=r"expected --keep-profiles to name a folder graphaudit can write into, found .*calib\.npz/.* "
                  r"\(Not a directory\)")


# --- names the file system refuses


def test_trace_name_past_the_file_system_limit_is_one_line(files, capfd):
    refused(capfd, _profile(files / "gated.onnx", files / "calib.npz", "--trace", files / f"{LONG}.json"),
            [files / "gated.onnx", files / "calib.npz"],
            match=r"expected a name graphaudit can write the --trace output to, found .*xxx\.\.\.\(305 characters\) "
                  r"\(File name too long\)")


def test_report_name_past_the_file_system_limit_is_one_line(files, tmp_path, capfd):
    refused(capfd, _run(files, "-o", tmp_path / LONG), [files / "gated.onnx", files / "calib.npz"],
            match=r"expected a name graphaudit can write the -o output to, found .*\(File name too long\)")


# --- devices and pipes: written into, never renamed over


@pytest.mark.parametrize("device", ["/dev/null", "/dev/full"])
def test_report_onto_a_system_character_device_writes_into_it(files, capfd, device):
    if not os.path.exists(device) or not stat.S_ISCHR(os.stat(device).st_mode):
        pytest.skip(f"no {device} here")
    inputs = [files / "gated.onnx", files / "calib.npz"]
    if device == "/dev/null":
        accepted(capfd, _run(files, "--format", "json", "-o", device), inputs)
    else:
        refused(capfd, _run(files, "--format", "json", "-o", device), inputs,
                match=r"expected /dev/full to take the report, found: No space left on device")
    assert stat.S_ISCHR(os.lstat(device).st_mode)
    assert not [n for n in os.listdir(os.path.dirname(device)) if n.startswith(f".{os.path.basename(device)}.")]


def _private_device(tmp_path: Path, kind: int, numbers: tuple[int, int]) -> Path:
    """A device node of our own in tmp_path (root only): the test writes to it, never to a system one."""
    path = tmp_path / "dev" / ("char" if kind == stat.S_IFCHR else "block")
    path.parent.mkdir(exist_ok=True)
    try:
        os.mknod(path, kind | 0o666, os.makedev(*numbers))
    except (PermissionError, AttributeError, OSError) as err:
        pytest.skip(f"cannot make a device node here ({err})")
    return path


def test_report_onto_a_character_device_of_its_own_is_written_into_not_replaced(files, tmp_path, capfd):
    device = _private_device(tmp_path, stat.S_IFCHR, (1, 3))  # the null device's numbers
    try:
        os.close(os.open(device, os.O_WRONLY))
    except OSError:
        pytest.skip("device nodes cannot be opened in tmp_path (mounted nodev)")
    accepted(capfd, _run(files, "-o", device), [files / "gated.onnx", files / "calib.npz"])
    assert stat.S_ISCHR(os.lstat(device).st_mode)
    assert sorted(p.name for p in device.parent.iterdir()) == ["char"]


def test_trace_onto_a_block_device_is_refused(files, tmp_path, capfd):
    device = _private_device(tmp_path, stat.S_IFBLK, (7, 250))  # never opened
    refused(capfd, _profile(files / "gated.onnx", files / "calib.npz", "--trace", device),
            [files / "gated.onnx", files / "calib.npz"],
            match=r"expected a file graphaudit can write the --trace output to at .*block, found a block device")
    assert stat.S_ISBLK(os.lstat(device).st_mode)


def test_report_onto_a_socket_is_refused(files, tmp_path, capfd):
    path = Path(f"/tmp/ga-{os.getpid()}-{threading.get_ident() % 10000}.sock")  # sockets take short paths
    listener = socket.socket(socket.AF_UNIX)
    try:
        listener.bind(str(path))
        refused(capfd, _run(files, "-o", path), [files / "gated.onnx", files / "calib.npz"],
                match=r"expected a file graphaudit can write the -o output to at .*\.sock, found a socket")
        assert stat.S_ISSOCK(os.lstat(path).st_mode)
    finally:
        listener.close()
        path.unlink(missing_ok=True)


@pytest.mark.parametrize("through_link", [False, True], ids=["fifo", "link-to-fifo"])
def test_report_onto_a_fifo_is_written_into_it(files, tmp_path, capfd, through_link):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    target = fifo
    if through_link:
        target = tmp_path / "report.json"
        target.symlink_to(fifo)
    received = []
    reader = threading.Thread(target=lambda: received.append(fifo.read_bytes()), daemon=True)
    reader.start()
    try:
        accepted(capfd, _run(files, "--format", "json", "-o", target), [files / "gated.onnx", files / "calib.npz"])
        reader.join(30)
        assert received and received[0].startswith(b"{")
        assert stat.S_ISFIFO(os.lstat(fifo).st_mode)
        assert target.is_symlink() == through_link
    finally:
        if reader.is_alive():  # the report never came: let the reader go
            os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
    assert _stage_left(tmp_path) == []


def test_report_onto_dev_stdout_goes_to_standard_output(files, tmp_path):
    """/dev/stdout is a link to the descriptor's name: written through, to a pipe or to a file, never replaced."""
    if not os.path.islink("/dev/stdout"):
        pytest.skip("no /dev/stdout link here")
    command = [sys.executable, "-m", "graphaudit", *map(str, _run(files, "--format", "json", "-o", "/dev/stdout"))]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    piped = subprocess.run(command, capture_output=True, text=True, env=env, timeout=300)
    assert piped.returncode == 0, piped.stderr
    assert piped.stdout.startswith("{") and "Traceback" not in piped.stderr
    with open(tmp_path / "out.json", "w") as out:
        redirected = subprocess.run(command, stdout=out, stderr=subprocess.PIPE, text=True, env=env, timeout=300)
    assert redirected.returncode == 0, redirected.stderr
    assert (tmp_path / "out.json").read_text().startswith("{")
    assert os.path.islink("/dev/stdout")


# --- freeze: inside its folder, no collision, both graphs or neither


def _external(folder: Path, location: str, name: str = "m.onnx") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / location).parent.mkdir(parents=True, exist_ok=True)
    onnx.save_model(float_gated(), str(folder / name), save_as_external_data=True, location=location,
                    size_threshold=0)
    return folder / name


def test_freeze_never_copies_weights_through_a_link_out_of_its_folder(tmp_path, capfd):
    model = _external(tmp_path / "in", "sub/w.bin")
    outside = tmp_path / "outside"
    outside.mkdir()
    out = tmp_path / "out"
    out.mkdir()
    (out / "sub").symlink_to(outside)
    refused(capfd, ["freeze", model, "-o", out], [model, tmp_path / "in" / "sub" / "w.bin"],
            match=r"expected a folder inside .*out at .*out/sub for the weights 'sub/w\.bin', found a link to "
                  r".*outside")
    assert list(outside.iterdir()) == [] and sorted(p.name for p in out.iterdir()) == ["sub"]


def test_freeze_copies_weights_into_a_subfolder_it_makes(tmp_path, capfd):
    model = _external(tmp_path / "in", "sub/w.bin")
    out = tmp_path / "out"
    accepted(capfd, ["freeze", model, "-o", out], [model, tmp_path / "in" / "sub" / "w.bin"])
    assert sha(out / "sub" / "w.bin") == sha(tmp_path / "in" / "sub" / "w.bin")
    for kind in ("trace", "frozen"):
        onnx.checker.check_model(str(out / f"m.{kind}.onnx"))
    assert _stage_left(out) == []


@pytest.mark.parametrize("location", ["m.trace.onnx", "m.frozen.onnx", "m.trace.onnx.data"])
def test_freeze_of_weights_named_like_a_graph_is_refused(tmp_path, capfd, location):
    model = _external(tmp_path / "in", location)
    out = tmp_path / "out"
    refused(capfd, ["freeze", model, "-o", out], [model, tmp_path / "in" / location],
            match=rf"expected the model's external weights file '{location}' to be named unlike the graphs freeze "
                  r"writes \(m\.trace\.onnx, m\.frozen\.onnx\)")
    assert not out.exists()


def test_freeze_onto_a_fifo_is_refused_not_replaced(files, tmp_path, capfd):
    out = tmp_path / "out"
    out.mkdir()
    os.mkfifo(out / "gated.frozen.onnx")
    refused(capfd, ["freeze", files / "gated.onnx", "-o", out], [files / "gated.onnx"],
            match=r"expected a file graphaudit can write the frozen graphs to at .*gated\.frozen\.onnx, found a "
                  r"device or pipe")
    assert stat.S_ISFIFO(os.lstat(out / "gated.frozen.onnx").st_mode)
    assert sorted(p.name for p in out.iterdir()) == ["gated.frozen.onnx"]


def _failing_save(monkeypatch, fail_on: int, how: str) -> None:
    """onnx.save_model failing on its `fail_on`-th call: a full disk, or a file cut short without an error."""
    real, calls = onnx.save_model, []

    def save(proto, path, *args, **kwargs):
        calls.append(path)
        real(proto, path, *args, **kwargs)
        if len(calls) == fail_on:
            if how == "disk-full":
                raise OSError(errno.ENOSPC, "No space left on device")
            os.truncate(path, os.path.getsize(path) // 2)

    monkeypatch.setattr(onnx, "save_model", save)


@pytest.mark.parametrize("fail_on", [1, 2], ids=["trace", "frozen"])
@pytest.mark.parametrize("how", ["disk-full", "cut-short"])
def test_freeze_that_cannot_write_both_graphs_leaves_neither(files, tmp_path, capfd, monkeypatch, fail_on, how):
    _failing_save(monkeypatch, fail_on, how)
    out = tmp_path / "new" / "out"
    message = (r"expected to write the frozen graphs into .*out, found: No space left on device" if how == "disk-full"
               else r"expected gated\.(trace|frozen)\.onnx as written to hold \d+ bytes, found \d+; the disk may be full")
    refused(capfd, ["freeze", files / "gated.onnx", "-o", out], [files / "gated.onnx"], match=message)
    assert not (tmp_path / "new").exists()  # the folders it made, removed with nothing in them


def test_freeze_that_fails_keeps_the_graphs_written_before(files, tmp_path, capfd, monkeypatch):
    out = tmp_path / "out"
    accepted(capfd, ["freeze", files / "gated.onnx", "-o", out], [files / "gated.onnx"])
    before = {p.name: sha(p) for p in out.iterdir()}
    _failing_save(monkeypatch, 2, "disk-full")
    refused(capfd, ["freeze", files / "gated.onnx", "-o", out], [files / "gated.onnx"], match="No space left")
    assert {p.name: sha(p) for p in out.iterdir()} == before


_KILLED_FREEZE = """
import os, signal, sys, onnx
from pathlib import Path
import graphaudit.cli as cli
real, calls = onnx.save_model, []
def save(proto, path, *args, **kwargs):
    calls.append(path)
    real(proto, path, *args, **kwargs)
    if len(calls) == 2:  # both graphs staged, neither in place
        print(sorted(str(p.relative_to(sys.argv[3])) for p in Path(sys.argv[3]).rglob("*")), flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
onnx.save_model = save
cli.main(["freeze", sys.argv[1], "-o", sys.argv[2]])
"""


def test_freeze_killed_outright_leaves_neither_its_stage_nor_the_folders_it_made(files, tmp_path):
    """SIGKILL with both graphs staged: the reaper removes the staging folder, then the output
    folders freeze made, now empty."""
    made = tmp_path / "made"
    made.mkdir()
    done = subprocess.run([sys.executable, "-c", _KILLED_FREEZE, str(files / "gated.onnx"), str(made / "new" / "out"),
                           str(made)], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == -9, done.stderr
    assert ".graphaudit-freeze-" in done.stdout and "gated.frozen.onnx" in done.stdout, done.stdout
    deadline = time.monotonic() + 30  # the reaper's work, once the process has ended
    while os.listdir(made) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert os.listdir(made) == []


def test_freeze_that_fails_once_its_weights_are_in_place_takes_them_back(tmp_path, capfd, monkeypatch):
    """The weights copied into the output folder are read back with the graphs before either graph
    is moved into place: a failure then leaves neither the graphs nor the copied weights, nor the
    folders made for them."""
    model = _external(tmp_path / "in", "sub/w.bin")
    real, calls = frozen_files._read_back, []

    def read_back(path, weights):
        calls.append(weights)
        if weights is not None and weights.name == "out":  # read against the weights in place
            raise GraphAuditError(f"expected the graph written as {path.name} to read back, found: cut short")
        real(path, weights)

    monkeypatch.setattr(frozen_files, "_read_back", read_back)
    out = tmp_path / "new" / "out"
    refused(capfd, ["freeze", model, "-o", out], [model, tmp_path / "in" / "sub" / "w.bin"], match="cut short")
    assert any(w is not None and w.name == "out" for w in calls)  # it failed with the weights in place
    assert not (tmp_path / "new").exists()


def test_freeze_of_a_model_without_a_controller_is_one_line_and_writes_nothing(tmp_path, capfd):
    model = onnx.parser.parse_model("""
        <ir_version: 8, opset_import: ["" : 17]>
        plain (float[N, 4] x) => (float[N, 4] y) { y = Relu (x) }""")
    path = tmp_path / "plain.onnx"
    onnx.save(model, path)
    out = tmp_path / "out"
    refused(capfd, ["freeze", path, "-o", out], [path],
            match=r"expected a model with a controller to freeze, found none in plain\.onnx: .*nothing was written")
    assert not out.exists()
