"""The kept coefficient cache is input: a damaged one is captured again, with the reason, or refused.

The tiny gated LM of test_replay_models is captured under a `cache_dir`; then its manifest is
replaced (not JSON, not an object, keys missing, wrong types, another format), a .npy file cut
short, re-typed (`|O`, a pickle that would leave a mark if it were ever loaded), given a header
that disagrees with the manifest, NaN written into it (with and without its digest recomputed),
a file replaced by a link to a file outside the cache or by a FIFO. Each is captured again:
`rebuilt` says why, the values are those of a clean capture, and nothing outside the cache
changes. A folder where a cached file goes, or a cache folder that is a link, is refused in one
line. Random damage is test_cache_files_fuzz's, the same through `graphaudit replay`
test_cache_files_cli's.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
from pathlib import Path

import numpy as np
import onnx
import pytest

import graphaudit.replay.capture as capture_module
from graphaudit.errors import GraphAuditError
from graphaudit.files.write import MadeFiles
from graphaudit.replay.cache_files import LIVE_FILE, MANIFEST, kept_cache, seal
from graphaudit.replay.capture import _CHECK_FILE, capture
from graphaudit.replay.capture import _file as file_of

from support.cache_files import CHECK, assert_clean_values, capture_again, clean_capture, files_outside, npy_of, within
from support.models import gated_lm, traced


@pytest.fixture(scope="module")
def clean(tmp_path_factory):
    """The trace, coefficients and data, and the files and values of their clean cache."""
    return clean_capture(tmp_path_factory.mktemp("clean"))


@pytest.fixture
def cache(clean, tmp_path):
    """A copy of the clean cache under tmp_path/"cache", and a file and folder outside it."""
    root = tmp_path / "cache"
    folder = root / clean["folder"].name
    shutil.copytree(clean["folder"], folder)
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "mine.npy").write_bytes(b"the user's own file")
    return folder



def _rebuilt(clean, folder, match: str):
    """Capture again over the damaged `folder`: rebuilt with a reason matching `match`, clean
    values, nothing outside touched; and the next capture reuses the rebuilt cache."""
    before = files_outside(folder)
    with capture_again(clean, folder.parent) as again:
        assert_clean_values(clean, again, reused=False)
        assert again.rebuilt is not None and re.search(match, again.rebuilt), again.rebuilt
    assert files_outside(folder) == before
    for name in (MANIFEST, LIVE_FILE, _CHECK_FILE, *(file_of(c) for c in clean["coefs"])):
        assert (folder / name).is_file() and not (folder / name).is_symlink()
    assert not [p for p in folder.iterdir() if p.name.startswith(".partial-")]
    with capture_again(clean, folder.parent) as third:
        assert_clean_values(clean, third, reused=True)
        assert third.rebuilt is None


def _manifest(folder) -> dict:
    return json.loads((folder / MANIFEST).read_text())



@pytest.mark.parametrize("text, match", [
    ("[1, 2]", r"manifest.json is not a JSON object \(found list\)"),
    ("17", r"not a JSON object \(found int\)"),
    ('"a string"', r"not a JSON object \(found str\)"),
    ("null", r"not a JSON object \(found NoneType\)"),
    ("{not json", r"manifest.json is not JSON"),
    (b"\xff\xfe{}", r"manifest.json is not JSON"),
    ("[" * 100000 + "]" * 100000, r"manifest.json is not JSON \(RecursionError\)"),
    ("", r"manifest.json is not JSON"),
])
def test_a_manifest_that_is_not_a_json_object_is_rebuilt(clean, cache, text, match):
    (cache / MANIFEST).write_bytes(text if isinstance(text, bytes) else text.encode())
    _rebuilt(clean, cache, match)


@pytest.mark.parametrize("change, match", [
    (lambda m: m.pop("live"), r"has keys \['arrays', 'count', 'format', 'key'\], not"),
    (lambda m: m.update(extra=1), r"has keys .*'extra'"),
    (lambda m: m.update(format=2), r"has format 2, not 3"),
    (lambda m: m.update(format=True), r"has format True"),
    (lambda m: m.update(count="6"), r"has count '6', not the 6 inputs"),
    (lambda m: m.update(count=7), r"has count 7"),
    (lambda m: m.update(key="0" * 64), r"another key"),
    (lambda m: m.update(arrays=[]), r"lists arrays list"),
    (lambda m: m["arrays"].pop("gate.0"), r"lists arrays \['gate.1', 'graphaudit.live_check'\]"),
    (lambda m: m["arrays"].update({"../../outside/mine": m["arrays"]["gate.0"]}), r"lists arrays"),
    (lambda m: m["arrays"]["gate.0"].update(shape="6,6,4"), r"entry for 'gate.0' has no dtype or no shape"),
    (lambda m: m["arrays"]["gate.0"].update(shape=[6, -6, 4]), r"no dtype or no shape"),
    (lambda m: m["arrays"]["gate.0"].update(shape=[7, 6, 4]), r"no dtype or no shape of 6 inputs"),
    (lambda m: m["arrays"]["gate.0"].update(descr=["<f4"]), r"no dtype"),
    (lambda m: m["arrays"]["gate.0"].update(bytes=-1), r"has no size in bytes and SHA-256 digest"),
    (lambda m: m["arrays"]["gate.0"].update(sha256="x" * 64), r"no size in bytes and SHA-256 digest"),
    (lambda m: m["live"].update(bytes=1.5), r"entry for live.npz has no size"),
    (lambda m: m["arrays"]["gate.0"].update(shape=[6, 6, 5]), r"header holds '<f4' \[6, 6, 4\], where the manifest"),
    (lambda m: m["arrays"]["gate.0"].update(descr="<f8"), r"header holds '<f4' .* says '<f8'"),
])
def test_a_manifest_with_wrong_keys_or_types_is_rebuilt(clean, cache, change, match):
    manifest = _manifest(cache)
    change(manifest)
    (cache / MANIFEST).write_text(json.dumps(manifest))
    _rebuilt(clean, cache, match)


def test_a_cached_array_cut_short_is_rebuilt(clean, cache):
    path = npy_of(clean, cache)
    path.write_bytes(path.read_bytes()[:-7])
    _rebuilt(clean, cache, r"is \d+ bytes, where the manifest says \d+ \(cut short\)")


def _header(path: Path, descr: str, shape=None) -> None:
    """Rewrite the .npy header at `path` with `descr` (and `shape`), its data left as it is."""
    raw = path.read_bytes()
    with open(path, "rb") as f:
        np.lib.format.read_magic(f)
        old_shape, _, _ = np.lib.format.read_array_header_2_0(f)
        offset = f.tell()
    with open(path, "wb") as f:
        np.lib.format.write_array_header_2_0(f, {"descr": descr, "fortran_order": False,
                                                 "shape": old_shape if shape is None else shape})
        assert f.tell() == offset  # the same length: only the header says otherwise
        f.write(raw[offset:])


@pytest.mark.parametrize("descr, shape, match", [
    ("|O", None, r"holds dtype '\|O', not numbers \(never loaded\)"),
    ("<f8", None, r"header holds '<f8' \[6, 6, 4\], where the manifest says '<f4' \[6, 6, 4\]"),
    (">f4", None, r"header holds '>f4'"),
    ("<i4", None, r"header holds '<i4'"),
    ("<f4", (6, 4, 6), r"header holds '<f4' \[6, 4, 6\]"),
    ("<f4", (4, 6, 4), r"header holds '<f4' \[4, 6, 4\]"),
])
def test_a_cached_header_that_disagrees_with_the_manifest_is_rebuilt(clean, cache, descr, shape, match):
    _header(npy_of(clean, cache), descr, shape)
    _rebuilt(clean, cache, match)


class _Mark:
    """An object whose unpickling creates the file `path`: proof that a pickle was loaded."""

    def __init__(self, path):
        self.path = str(path)

    def __reduce__(self):
        return open, (self.path, "w")


def test_a_cached_pickle_is_never_loaded(clean, cache, tmp_path):
    mark = tmp_path / "outside" / "unpickled"
    for path in (npy_of(clean, cache), cache / _CHECK_FILE):
        np.save(path, np.array([_Mark(mark)] * 6, dtype=object))  # written as a pickle
    np.savez(cache / LIVE_FILE, logits=np.array([_Mark(mark)], dtype=object))
    _rebuilt(clean, cache, r"(bytes, where the manifest says|not numbers)")
    assert not mark.exists()


@pytest.mark.parametrize("file_digest", [True, False], ids=["python3.11", "python3.10"])
def test_live_outputs_named_like_savez_arguments_are_kept_and_reused(tmp_path, monkeypatch, file_digest):
    # outputs are the model's names: `file` and `allow_pickle` are np.savez's own arguments
    if not file_digest:  # Python 3.10's hashlib has no file_digest
        monkeypatch.delattr(hashlib, "file_digest", raising=False)
    live = {"file": np.arange(3.0), "allow_pickle": np.ones((2, 2), np.float32), "logits": np.zeros((2, 1, 4))}
    folder = tmp_path / "cache"
    folder.mkdir()
    seal(folder, "key", 2, {}, live, MadeFiles())
    found = kept_cache(folder, "key", {}, 2, set())
    assert found is not None
    arrays, maps, kept = found
    assert arrays == {} and maps == {} and list(kept) == list(live)
    for name, values in live.items():
        assert kept[name].dtype == values.dtype
        np.testing.assert_array_equal(kept[name], values)


def test_a_string_output_is_not_kept_and_the_cache_is_reused(tmp_path):
    """Only numeric live outputs are kept: a string one would be pickled into the kept cache, which
    reading refuses, so the cache would be captured again on every run."""
    trace, coefs, data = traced(gated_lm, count=6)
    trace.graph.node.append(onnx.helper.make_node("Constant", [], ["label"], value=onnx.helper.make_tensor(
        "label", onnx.TensorProto.STRING, [1], [b"gated"])))
    trace.graph.output.append(onnx.helper.make_tensor_value_info("label", onnx.TensorProto.STRING, [1]))
    with capture(trace, coefs, data, batch_size=4, cache_dir=tmp_path, check=CHECK) as first:
        assert "label" not in first.live and "logits" in first.live
    with capture(trace, coefs, data, batch_size=4, cache_dir=tmp_path, check=CHECK) as again:
        assert again.reused and again.rebuilt is None
        assert sorted(again.live) == sorted(first.live)


def test_nan_in_a_cached_array_is_rebuilt_even_with_its_digest_recomputed(clean, cache):
    path = npy_of(clean, cache, 1)
    array = np.load(path, mmap_mode="r+")
    array[3, 2, 1] = np.nan
    array.flush()
    del array
    _rebuilt(clean, cache, r"does not match its SHA-256 digest")
    array = np.load(path, mmap_mode="r+")
    array[0, 0, 0] = np.inf
    array.flush()
    del array
    manifest = _manifest(cache)  # as if whoever changed it had written the manifest again
    manifest["arrays"]["gate.1"]["sha256"] = hashlib.sha256(path.read_bytes()).hexdigest()
    (cache / MANIFEST).write_text(json.dumps(manifest))
    _rebuilt(clean, cache, r"holds NaN or Inf values, which a capture never keeps")


def test_a_changed_live_file_is_rebuilt(clean, cache):
    np.savez(cache / LIVE_FILE, logits=clean["live"]["logits"] + 1)
    _rebuilt(clean, cache, r"live.npz does not match its size and SHA-256 digest")


@pytest.mark.parametrize("name", ["array", "check", MANIFEST, LIVE_FILE])
def test_a_cached_file_replaced_by_a_link_is_never_written_through(clean, cache, tmp_path, name):
    path = {"array": npy_of(clean, cache), "check": cache / _CHECK_FILE}.get(name, cache / name)
    target = tmp_path / "outside" / "mine.npy"
    path.unlink()
    path.symlink_to(target)
    _rebuilt(clean, cache, r"is a symbolic link \(never followed\)" if name != MANIFEST else "symbolic link")
    assert target.read_bytes() == b"the user's own file"


def test_a_link_to_a_copy_of_the_cached_file_is_not_followed_either(clean, cache, tmp_path):
    path = npy_of(clean, cache)
    copy = tmp_path / "outside" / "copy.npy"
    shutil.copyfile(path, copy)
    path.unlink()
    path.symlink_to(copy)
    before = copy.read_bytes()
    _rebuilt(clean, cache, r"is a symbolic link")
    assert copy.read_bytes() == before

@pytest.mark.parametrize("name", ["array", MANIFEST, LIVE_FILE])
def test_a_cached_file_that_is_a_fifo_is_replaced_without_being_opened(clean, cache, name):
    path = npy_of(clean, cache) if name == "array" else cache / name
    path.unlink()
    os.mkfifo(path)
    with within(20):
        _rebuilt(clean, cache, r"is not a regular file" if name != MANIFEST else "regular file")


@pytest.mark.parametrize("name", ["array", MANIFEST, LIVE_FILE])
def test_a_folder_where_a_cached_file_goes_is_refused_and_kept(clean, cache, name):
    path = npy_of(clean, cache) if name == "array" else cache / name
    path.unlink()
    path.mkdir()
    (path / "inside").write_text("kept")
    with pytest.raises(GraphAuditError, match=rf"expected the coefficient cache file {re.escape(str(path))} to be "
                                              r"a file, found a folder; remove it or choose another --cache-dir"):
        capture_again(clean, cache.parent)
    assert (path / "inside").read_text() == "kept"


def test_a_cache_folder_that_is_a_link_is_refused(clean, cache, tmp_path):
    elsewhere = tmp_path / "outside" / "elsewhere"
    cache.rename(elsewhere)
    cache.symlink_to(elsewhere)
    with pytest.raises(GraphAuditError, match=r"expected the coefficient cache folder .* to be a folder, found a "
                                              r"symbolic link to .*elsewhere; remove it or choose another"):
        capture_again(clean, cache.parent)
    shutil.rmtree(elsewhere)  # the link now dangles: nothing is made through it
    with pytest.raises(GraphAuditError, match="found a symbolic link"):
        capture_again(clean, cache.parent)
    assert not elsewhere.exists()


def test_a_cache_dir_that_is_a_link_is_the_users_choice(clean, cache, tmp_path):
    """--cache-dir itself may be a link (a cache kept on another disk): the cache goes where it points."""
    linked = tmp_path / "linked"
    linked.symlink_to(cache.parent)
    with capture_again(clean, linked) as again:
        assert_clean_values(clean, again, reused=True)


def test_an_unfinished_capture_is_rebuilt_and_its_partial_files_removed(clean, cache, tmp_path, monkeypatch):
    (cache / MANIFEST).unlink()
    (cache / ".partial-0123456789abcdef-manifest.json").write_text("{}")  # left by a capture that was killed
    (cache / ".partial-0123456789abcdef-live.npz").symlink_to(tmp_path / "outside" / "mine.npy")
    _rebuilt(clean, cache, r"manifest.json is missing \(a capture that did not finish\)")
    real = capture_module._check_finite
    seen = []

    def stop_at_the_second_batch(coefficients, outputs, rows, label):
        seen.append(rows)
        if len(seen) == 2:
            raise GraphAuditError("stopped")
        real(coefficients, outputs, rows, label)

    (cache / MANIFEST).write_text("[]")
    monkeypatch.setattr(capture_module, "_check_finite", stop_at_the_second_batch)
    with pytest.raises(GraphAuditError, match="stopped"):
        capture_again(clean, cache.parent)
    assert not (cache / MANIFEST).exists()
    assert not [p for p in cache.iterdir() if p.name.startswith(".partial-")]



def test_a_cache_that_cannot_be_written_again_is_refused_in_one_line(clean, cache, monkeypatch):
    (cache / MANIFEST).write_text("[]")
    real = Path.unlink

    def read_only(self, *args, **kwargs):
        if self.parent == cache:
            raise PermissionError(13, "Permission denied", str(self))
        return real(self, *args, **kwargs)

    monkeypatch.setattr(Path, "unlink", read_only)
    with pytest.raises(GraphAuditError, match=r"^expected to write the coefficient cache in .*, found Permission "
                                              r"denied$"):
        capture_again(clean, cache.parent)
