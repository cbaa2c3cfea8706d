"""Outputs that would write into an input, or cannot be written: refused in one line, inputs untouched.

An output named by -o, --trace or freeze's folder may already be a hard or symbolic link to
the model audited. graphaudit refuses an output that is the same file as an input, and writes
every output as a new file renamed onto its name, so a link there is replaced, never written
through. A folder it cannot write into, or a directory where a graph should go, is one line.
"""

from __future__ import annotations

import os
from pathlib import Path

import onnx
import pytest

from graphaudit.errors import GraphAuditError
from graphaudit.files.write import replace_file

from support.cli import FAST_RUN, accepted, refused, sha
from support.models import float_gated


@pytest.fixture
def files(float_gated_files) -> Path:
    """A folder holding gated.onnx (a tiny model with one declared gate) and calib.npz."""
    return float_gated_files


def test_run_report_onto_a_hard_link_of_the_model_is_refused(files, capfd):
    model, calib = files / "gated.onnx", files / "calib.npz"
    os.link(model, files / "gated_hard.onnx")
    refused(capfd, ["run", model, "--calib", calib, *FAST_RUN, "--limit", "2", "-o", files / "gated_hard.onnx"],
            [model, calib], code=2, match=r"expected -o to name a file that is not one of the inputs, found "
                                          r".*gated_hard\.onnx, an input")


@pytest.mark.parametrize("kind", ["trace", "frozen"])
@pytest.mark.parametrize("link", [os.symlink, os.link], ids=["symlink", "hard-link"])
def test_freeze_into_a_link_to_the_model_is_refused(files, tmp_path, capfd, kind, link):
    model = files / "gated.onnx"
    out = tmp_path / "out"
    out.mkdir()
    link(model, out / f"gated.{kind}.onnx")
    refused(capfd, ["freeze", model, "-o", out], [model], code=2,
            match=rf"expected an output folder where gated\.{kind}\.onnx is not one of the inputs, found "
                  rf".*gated\.{kind}\.onnx, the same file as the input .*gated\.onnx")
    assert sorted(p.name for p in out.iterdir()) == [f"gated.{kind}.onnx"]  # nothing else written


def test_freeze_replaces_a_link_instead_of_writing_through_it(files, tmp_path, capfd):
    """A link at the output's name to some other file: the link is replaced, the file it led to kept."""
    model = files / "gated.onnx"
    other = tmp_path / "other.bin"
    other.write_bytes(b"someone else's file")
    out = tmp_path / "out"
    out.mkdir()
    (out / "gated.trace.onnx").symlink_to(other)
    os.link(other, out / "gated.frozen.onnx")
    accepted(capfd, ["freeze", model, "-o", out], [model])
    assert other.read_bytes() == b"someone else's file"
    for kind in ("trace", "frozen"):
        written = out / f"gated.{kind}.onnx"
        assert not written.is_symlink() and not written.samefile(other)
        onnx.checker.check_model(onnx.load(written))
    assert sorted(p.name for p in out.iterdir()) == ["gated.frozen.onnx", "gated.trace.onnx"]  # no temporaries


@pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="needs Linux /proc")
def test_freeze_into_a_folder_that_cannot_be_written(files, capfd):
    model = files / "gated.onnx"
    refused(capfd, ["freeze", model, "-o", "/proc/self"], [model],
            match=r"expected a folder graphaudit can write the frozen graphs into, found /proc/self \(")


def test_freeze_onto_a_directory_is_refused_before_anything_is_written(files, tmp_path, capfd):
    model = files / "gated.onnx"
    out = tmp_path / "out"
    (out / "gated.frozen.onnx").mkdir(parents=True)
    refused(capfd, ["freeze", model, "-o", out], [model],
            match=r"expected a file graphaudit can write the frozen graphs to at .*gated\.frozen\.onnx, "
                  r"found a directory")
    assert sorted(p.name for p in out.iterdir()) == ["gated.frozen.onnx"]  # the trace graph was not written


def test_replace_file_keeps_the_target_when_the_write_fails(tmp_path):
    target = tmp_path / "report.txt"
    target.write_text("old")
    before = sha(target)

    def fail(path: Path) -> None:
        path.write_text("half")
        raise OSError(28, "No space left on device")

    with pytest.raises(GraphAuditError, match=r"expected a file graphaudit can write the report to at .*report\.txt, "
                                              r"found: No space left on device"):
        replace_file(target, fail, "the report")
    assert sha(target) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report.txt"]  # the temporary is gone


def test_run_report_replaces_a_link_instead_of_writing_through_it(files, tmp_path, capfd):
    """-o naming a symbolic link to some other file: the report replaces the link; that file is kept."""
    model, calib = files / "gated.onnx", files / "calib.npz"
    other = tmp_path / "other.txt"
    other.write_text("someone else's notes")
    link = tmp_path / "report.json"
    link.symlink_to(other)
    accepted(capfd, ["run", model, "--calib", calib, *FAST_RUN, "--limit", "2", "--format", "json", "-o", link],
             [model, calib, other])
    assert other.read_text() == "someone else's notes"
    assert not link.is_symlink() and link.read_text().startswith("{")


def test_freeze_never_copies_weights_through_a_broken_link(tmp_path, capfd):
    """A dangling link where the frozen graphs' weights go: refused, and nothing appears where it points."""
    folder = tmp_path / "in"
    folder.mkdir()
    onnx.save_model(float_gated(), str(folder / "gated.onnx"), save_as_external_data=True, location="w.bin",
                    size_threshold=0)
    out = tmp_path / "out"
    out.mkdir()
    (out / "w.bin").symlink_to(tmp_path / "elsewhere.bin")
    refused(capfd, ["freeze", folder / "gated.onnx", "-o", out], [folder / "gated.onnx", folder / "w.bin"],
            match=r"expected no other file at .*w\.bin")
    assert not (tmp_path / "elsewhere.bin").exists()
