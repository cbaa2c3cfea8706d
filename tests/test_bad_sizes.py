"""Never read what will be refused: sizes, archives, shapes and option bounds (issue 24, families 3-5).

A model file past protobuf's 2 GiB and an .npz whose keys or headers are wrong are refused
before they are read: the peak memory of the process that refuses them stays far below what
reading would take (measured in a subprocess with resource.getrusage; a correctness check,
not a timing). Zip members that zipfile cannot read (encrypted, Deflate64), that declare more
than they hold or than their compression can expand to, and headers with negative shapes are
one line from every command; so are `--shape` dims past 2^31-1 and `--runs` past its bound.
`--threads` past the cores is capped, with a note.
"""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import onnx
import pytest

from support.archives import patch_member
from support.cli import FAST_PROFILE, FAST_REPLAY, FAST_RUN, accepted, invoke, refused
from support.models import gated_lm, token_ids
from support.zoo import ROOT


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    folder = tmp_path_factory.mktemp("sizes")
    onnx.save(gated_lm(), folder / "gated.onnx")
    np.savez(folder / "calib.npz", input_ids=token_ids(8, seed=1))
    return folder


def _peak_rss_bytes(args, cwd: Path) -> tuple[int, str, int]:
    """Run `graphaudit ARGS` in a fresh Python; return its exit status, stderr and peak RSS in bytes."""
    script = ("import resource, sys\n"
              "from graphaudit.cli import main\n"
              "try:\n    main(sys.argv[1:])\nexcept SystemExit as exit:\n    code = exit.code\n"
              "sys.stdout.write(str(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss))\n"
              "sys.exit(code)\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "-c", script, *map(str, args)], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=300)
    return done.returncode, done.stderr, int(done.stdout.strip()) * 1024  # Linux gives kilobytes


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="ru_maxrss in kilobytes is Linux's")
def test_a_model_file_past_2_gib_is_refused_before_it_is_read(tmp_path):
    path = tmp_path / "huge.onnx"
    with open(path, "wb") as f:
        f.truncate(3 * 2**30)  # sparse: no disk used, but reading it would take 3 GiB
    status, err, peak = _peak_rss_bytes(["inspect", path], tmp_path)
    assert status == 1 and err.count("\n") == 1 and "Traceback" not in err, err
    assert "expected an ONNX model file of at most 2 GiB (protobuf's limit" in err
    assert "found 3 GiB (3221225472 bytes)" in err
    assert peak < 2**30, f"peak RSS {peak} bytes: the file was read"


@pytest.mark.parametrize("command", ["static", "inspect"])
def test_a_model_file_past_2_gib_is_one_line_in_every_command(tmp_path, capfd, command):
    path = tmp_path / "huge.onnx"
    with open(path, "wb") as f:
        f.truncate(2**31)  # one byte past what protobuf parses
    refused(capfd, [command, path], [], match=r"of at most 2 GiB .*found 2 GiB \(2147483648 bytes\)")


def _zeros_member(path: Path, key: str, nbytes: int, extra: dict[str, np.ndarray]) -> None:
    """An .npz holding `extra` and, under `key`, `nbytes` of int8 zeros, deflated as it is written."""
    np.savez(path, **extra)
    header = _npy_header((nbytes,), "|i1")
    with (zipfile.ZipFile(path, "a", compression=zipfile.ZIP_DEFLATED, compresslevel=1) as archive,  # fast
          archive.open(f"{key}.npy", "w", force_zip64=True) as member):
        member.write(header)
        chunk = bytes(2**24)
        for _ in range(nbytes // len(chunk)):
            member.write(chunk)


@pytest.fixture(scope="module")
def bomb(tmp_path_factory):
    data = tmp_path_factory.mktemp("bomb") / "bomb.npz"
    _zeros_member(data, "attention_maks", 2**30, {"input_ids": token_ids(4)})
    assert data.stat().st_size < 2**23  # a 1 GiB member in a few MB
    return data


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="ru_maxrss in kilobytes is Linux's")
@pytest.mark.parametrize("command", ["profile", "replay"])
def test_a_bomb_under_an_unexpected_key_is_refused_before_it_is_decompressed(files, bomb, tmp_path, command):
    data = bomb
    flag, fast = ("--data", FAST_PROFILE) if command == "profile" else ("--calib", FAST_REPLAY)
    status, err, peak = _peak_rss_bytes([command, files / "gated.onnx", flag, data, *fast], tmp_path)
    assert status == 1 and err.count("\n") == 1, err
    assert "found unexpected keys ['attention_maks']" in err
    assert peak < 2**29, f"peak RSS {peak} bytes: the unexpected member was decompressed"


def _npy_header(shape, descr="<i8") -> bytes:
    text = f"{{'descr': '{descr}', 'fortran_order': False, 'shape': {tuple(shape)!r}, }}"
    text += " " * ((64 - (len(text) + 11) % 64) % 64) + "\n"
    return b"\x93NUMPY\x01\x00" + struct.pack("<H", len(text)) + text.encode()


def _member(path: Path, content: bytes, name: str = "input_ids.npy", method: int = zipfile.ZIP_STORED) -> Path:
    with zipfile.ZipFile(path, "w", compression=method) as archive:
        archive.writestr(name, content)
    return path


def _all_commands(files, data):
    model = files / "gated.onnx"
    return {
        "static": ["static", model, "--data", data],
        "profile": ["profile", model, "--data", data, *FAST_PROFILE],
        "replay": ["replay", model, "--calib", files / "calib.npz", "--data", data, *FAST_REPLAY],
        "run": ["run", model, "--calib", data, *FAST_RUN],
    }


IDS = token_ids(6, seed=2)
NPY = _npy_header(IDS.shape) + IDS.tobytes()
# name -> (the member's bytes, how the zip is patched, what the one line says)
BAD_ARCHIVES = {
    "encrypted": (NPY, {"flags": 0x1}, r"expected \.npz members that are not encrypted .*'input_ids\.npy' encrypted"),
    "strong-encryption": (NPY, {"flags": 0x41}, r"not encrypted .*encrypted"),
    "deflate64": (NPY, {"method": 9}, r"found 'input_ids\.npy' compressed with deflate64 \(method 9\), which "
                                      r"Python's zipfile cannot read"),
    "ppmd": (NPY, {"method": 98}, r"compressed with ppmd \(method 98\)"),
    "zstandard": (NPY, {"method": 93}, r"compressed with unknown \(method 93\)"),
    "header-says-more-than-held": (_npy_header((6, 600)) + IDS.tobytes(), {},
                                   r"expected each array in .* to hold what its header declares, found a declared "
                                   r"shape \(6, 600\) of int64 \(28800 bytes\) for key 'input_ids' in a member of 288"),
    "negative-shape": (_npy_header((-6, 6)) + IDS.tobytes(), {},
                       r"expected the array 'input_ids' in .* to have non-negative integer dimensions .*found -6 "
                       r"on axis 0 of \(-6, 6\)"),
    "dim-past-2^31": (_npy_header((2**31, 6)) + IDS.tobytes(), {},
                      r"non-negative integer dimensions of at most 2147483647 .*found 2147483648"),
    "overflowing-shape": (_npy_header((2**31 - 1,) * 3) + IDS.tobytes(), {},
                          r"to take at most 2\^47 bytes .*elements of 8 bytes"),
    "stored-size-lies": (NPY, {"file_size": 10**8}, r"declaring 95.4 MiB \(100000000 bytes\) from 416 bytes "
                                                    r"\(store expands at most 1-fold\)"),
}


@pytest.mark.parametrize("case", sorted(BAD_ARCHIVES))
def test_a_bad_archive_is_one_line_in_every_command(files, tmp_path, capfd, case):
    content, patch, message = BAD_ARCHIVES[case]
    data = _member(tmp_path / f"{case}.npz", content)
    patch_member(data, **patch)
    for command in _all_commands(files, data).values():
        refused(capfd, command, [files / "gated.onnx", files / "calib.npz", data], match=message)


def test_a_deflated_member_declaring_past_deflates_ratio_is_refused_before_decompressing(files, tmp_path, capfd):
    data = _member(tmp_path / "bomb.npz", NPY, method=zipfile.ZIP_DEFLATED)
    with zipfile.ZipFile(data) as archive:
        packed = archive.infolist()[0].compress_size
    patch_member(data, file_size=packed * 2000)
    for command in _all_commands(files, data).values():
        refused(capfd, command, [files / "gated.onnx", data],
                match=r"found 'input_ids\.npy' declaring .* \(deflate expands at most 1032-fold\)")


def test_a_well_made_deflated_archive_still_loads(files, tmp_path, capfd):
    """The control: numpy's own savez_compressed passes every check."""
    data = tmp_path / "good.npz"
    np.savez_compressed(data, input_ids=np.zeros((6, 6), np.int64))
    out = accepted(capfd, ["static", files / "gated.onnx", "--data", data, "--format", "json"], [data])
    assert json.loads(out)["flops"]["shapes"] == {"input_ids": [1, 6]}


@pytest.mark.parametrize("shape, message", [
    ("input_ids=1,9223372036854775808", r"found 9223372036854775808 on axis 1"),
    ("input_ids=1,2147483648", r"of at most 2147483647 \(2\^31-1\), found 2147483648 on axis 1 of \(1, 2147483648\)"),
    ("input_ids=2147483647,2147483647", r"to take at most 2\^47 bytes .*found shape \(2147483647, 2147483647\)"),
    ("input_ids=1,-3", r"with positive integer dims"),
])
def test_a_shape_past_the_bounds_is_bad_usage(files, capfd, shape, message):
    refused(capfd, ["static", files / "gated.onnx", "--shape", shape], [files / "gated.onnx"], code=2,
            match=message)


def test_the_flop_count_takes_shapes_from_python_through_the_same_check(files):
    from graphaudit.analyses.static import audit_static
    from graphaudit.errors import GraphAuditError
    from graphaudit.load.model import load_for_audit

    loaded = load_for_audit(files / "gated.onnx")
    for bad in ((1, -4), (1, 2**63), (2**31 - 1, 2**31 - 1)):
        with pytest.raises(GraphAuditError, match=r"expected --shape input_ids to"):
            audit_static(loaded, shapes={"input_ids": bad})


@pytest.mark.parametrize("option", ["--runs", "--warmup", "--profile-runs"])
@pytest.mark.parametrize("command", ["profile", "run"])
def test_rounds_past_their_bound_are_bad_usage(files, capfd, command, option):
    model, calib = files / "gated.onnx", files / "calib.npz"
    args = ["profile", model, "--data", calib] if command == "profile" else ["run", model, "--calib", calib, "-q"]
    refused(capfd, [*args, option, "1000000000"], [model, calib], code=2,
            match=rf"expected {option} of at most 10000 \(more rounds only take time\), found 1000000000")


def test_timed_runs_past_their_bound_are_bad_usage(files, tmp_path, capfd):
    data = tmp_path / "many.npz"
    np.savez(data, input_ids=token_ids(1001, seed=3))
    refused(capfd, ["profile", files / "gated.onnx", "--data", data, "--runs", "10000", "--warmup", "0"],
            [files / "gated.onnx", data], code=2,
            match=r"expected at most 10000000 timed runs of the model, found 10000 rounds of 1001 batches")


def test_threads_past_the_cores_are_capped_with_a_note(files, capfd):
    from graphaudit.runtime.sessions import usable_cores

    model, calib = files / "gated.onnx", files / "calib.npz"
    out = accepted(capfd, ["profile", model, "--data", calib, *FAST_PROFILE, "--threads", "1024", "--format", "json"],
                   [model, calib])
    report = json.loads(out)
    assert report["threads"] == usable_cores()
    assert any(f"--threads 1024 was capped at the {usable_cores()} CPU cores" in n for n in report["notes"])


def test_threads_within_the_cores_are_kept_without_a_note(files, capfd):
    model, calib = files / "gated.onnx", files / "calib.npz"
    out = accepted(capfd, ["profile", model, "--data", calib, *FAST_PROFILE, "--threads", "1", "--format", "json"],
                   [model, calib])
    report = json.loads(out)
    assert report["threads"] == 1 and not any("capped" in n for n in report["notes"])


def test_replay_caps_threads_too(files):
    from graphaudit.replay.pipeline import replay
    from graphaudit.runtime.sessions import usable_cores

    report = replay(files / "gated.onnx", files / "calib.npz", resamples=5, threads=1024)
    assert report.settings["threads"] == usable_cores()
    assert dict(report.setting_notes())["threads"].startswith("--threads 1024 was capped")


def test_the_refusals_leave_no_traceback_for_click_ints_too(files, capfd):
    """click reads --runs as any integer; a value past a C long reaches the library and is refused there."""
    model, calib = files / "gated.onnx", files / "calib.npz"
    status = invoke(["profile", model, "--data", calib, "--runs", str(2**80)])
    err = capfd.readouterr().err
    assert status == 2 and "Traceback" not in err and err.count("\n") == 1, err
