"""A damaged coefficient cache through `graphaudit replay`: the figures of a clean one, with a note.

The tiny gated LM replayed with `--cache-dir`; its kept cache then damaged (a manifest that is a
list, NaN in a coefficient, a check file cut short, a file replaced by a link out): the next
replay captures again and reports the same figures with the reason in `cache_note`, and the one
after reuses the healed cache. A folder where a cached file goes is refused in one line.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest

from graphaudit.replay.cache_files import LIVE_FILE, MANIFEST
from graphaudit.replay.capture import _CHECK_FILE

from support.cli import FAST_REPLAY, accepted, refused
from support.models import gated_lm, token_ids


@pytest.fixture(scope="module")
def replayed(tmp_path_factory):
    """The gated LM and its data on disk, and the JSON of a clean replay that keeps its cache."""
    folder = tmp_path_factory.mktemp("replayed")
    onnx.save(gated_lm(), folder / "gated.onnx")
    np.savez(folder / "calib.npz", input_ids=token_ids(8, seed=1))
    np.savez(folder / "eval.npz", input_ids=token_ids(6, seed=2))
    return folder


def _replay(folder: Path, cache_dir: Path, fmt: str = "json") -> list:
    return ["replay", folder / "gated.onnx", "--calib", folder / "calib.npz", "--data", folder / "eval.npz",
            "--cache-dir", cache_dir, "--format", fmt, *FAST_REPLAY]


def _figures(out: str) -> dict:
    doc = json.loads(out)
    del doc["timing"]
    doc["settings"].pop("cache_note", None)
    del doc["settings"]["cache"]["reused"]  # the evaluation cache's: reused where only the calibration one was damaged
    return doc


def _inputs(folder: Path) -> list[Path]:
    return [folder / "gated.onnx", folder / "calib.npz", folder / "eval.npz"]


def _nan_in_a_coefficient(cache_dir: Path) -> None:
    evaluation = next(cache_dir.glob("evaluation-*"))
    path = next(p for p in sorted(evaluation.glob("*.npy")) if p.name != _CHECK_FILE)
    array = np.load(path, mmap_mode="r+")
    array[1] = np.nan  # today: three conditions come back null, exit 0
    array.flush()


def _link_out(cache_dir: Path) -> None:
    evaluation = next(cache_dir.glob("evaluation-*"))
    path = next(p for p in sorted(evaluation.glob("*.npy")) if p.name != _CHECK_FILE)
    path.unlink()
    path.symlink_to(cache_dir.parent / "outside.npy")


DAMAGE = {
    "manifest-list": (lambda d: next(d.glob("calibration-*")).joinpath(MANIFEST).write_text("[]"),
                      "manifest.json is not a JSON object"),
    "nan": (_nan_in_a_coefficient, "does not match its SHA-256 digest"),
    "cut-short": (lambda d: next(d.glob("evaluation-*")).joinpath(_CHECK_FILE).write_bytes(b"\x93NUMPY"),
                  "(cut short)"),
    "link": (_link_out, "is a symbolic link (never followed)"),
}


@pytest.mark.parametrize("damage", sorted(DAMAGE))
def test_a_damaged_cache_replays_the_figures_of_a_clean_one_with_a_note(replayed, capfd, tmp_path, damage):
    cache_dir = tmp_path / "cache"
    outside = tmp_path / "outside.npy"
    outside.write_bytes(b"the user's own file")
    clean = _figures(accepted(capfd, _replay(replayed, cache_dir), _inputs(replayed)))
    change, note = DAMAGE[damage]
    change(cache_dir)
    out = accepted(capfd, _replay(replayed, cache_dir), _inputs(replayed))
    assert _figures(out) == clean
    assert json.loads(out)["settings"]["cache_note"].startswith(
        "the kept coefficient cache was damaged and captured again: ")
    assert note in json.loads(out)["settings"]["cache_note"]
    assert outside.read_bytes() == b"the user's own file"
    text = accepted(capfd, _replay(replayed, cache_dir, "text"), _inputs(replayed))  # healed: reused, no note
    assert "captured again" not in text
    again = accepted(capfd, _replay(replayed, cache_dir), _inputs(replayed))
    assert _figures(again) == clean and json.loads(again)["settings"]["cache"]["reused"]


def test_the_note_is_in_the_text_report(replayed, capfd, tmp_path):
    cache_dir = tmp_path / "cache"
    accepted(capfd, _replay(replayed, cache_dir), _inputs(replayed))
    next(cache_dir.glob("evaluation-*")).joinpath(MANIFEST).write_text("{")
    text = accepted(capfd, _replay(replayed, cache_dir, "text"), _inputs(replayed))
    assert "cache: the kept coefficient cache was damaged and captured again: " in " ".join(text.split())


def test_a_folder_in_the_cache_is_refused_in_one_line(replayed, capfd, tmp_path):
    cache_dir = tmp_path / "cache"
    accepted(capfd, _replay(replayed, cache_dir), _inputs(replayed))
    live = next(cache_dir.glob("evaluation-*")) / LIVE_FILE
    live.unlink()
    live.mkdir()
    refused(capfd, _replay(replayed, cache_dir), _inputs(replayed),
            match=r"expected the coefficient cache file .*live.npz to be a file, found a folder")
