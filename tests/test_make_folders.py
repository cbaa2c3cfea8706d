"""The folders an output needs: made (`make_folders`), tracked while the write runs, and kept or
taken back (`settle_folders`); the files a write makes, alike (`MadeFiles`)."""

from __future__ import annotations

import os

import pytest

from graphaudit.files import reaper, scratch
from graphaudit.files.write import MadeFiles, make_folders, settle_folders


def test_the_missing_folders_are_made_outermost_first_and_tracked_to_go_while_empty(tmp_path):
    target = tmp_path / "a" / "b" / "c"
    made = make_folders(target)
    try:
        assert made == [tmp_path / "a", tmp_path / "a" / "b", target] and target.is_dir()
        assert all(scratch._tracked[str(p)] == reaper.EMPTY for p in made)
        assert make_folders(target) == []  # there already: nothing made
    finally:
        settle_folders(made, failed=False)
    assert target.is_dir() and not any(str(p) in scratch._tracked for p in made)


def test_a_failed_write_takes_back_its_folders_while_empty(tmp_path):
    made = make_folders(tmp_path / "a" / "b")
    settle_folders(made, failed=True)
    assert os.listdir(tmp_path) == []


def test_a_folder_someone_wrote_into_stays_with_those_above_it(tmp_path):
    made = make_folders(tmp_path / "a" / "b")
    (tmp_path / "a" / "b" / "theirs").write_text("theirs")
    settle_folders(made, failed=True)
    assert (tmp_path / "a" / "b" / "theirs").is_file()


def test_a_folder_removed_already_lets_those_above_it_go(tmp_path):
    made = make_folders(tmp_path / "a" / "b")
    (tmp_path / "a" / "b").rmdir()  # as a capture removes its cache's folder whole
    settle_folders(made, failed=True)
    assert os.listdir(tmp_path) == []


def test_a_folder_that_cannot_be_made_names_itself_and_leaves_none(tmp_path):
    (tmp_path / "file").write_text("in the way")
    with pytest.raises(OSError) as err:
        make_folders(tmp_path / "file" / "b")
    assert err.value.filename == str(tmp_path / "file" / "b")
    too_long = tmp_path / "new" / ("x" * 300)  # past every common file system's 255-byte name limit
    with pytest.raises(OSError) as err:
        make_folders(too_long / "deeper")
    assert err.value.filename == str(too_long)
    assert os.listdir(tmp_path) == ["file"]  # "new", made before, taken back
    assert not any(str(tmp_path) in path for path in scratch._tracked)


def test_made_files_are_tracked_until_kept_or_taken_back(tmp_path):
    kept, dropped, placed = MadeFiles(), MadeFiles(), MadeFiles()
    for made, name in ((kept, "kept"), (dropped, "dropped"), (placed, "placed")):
        (made.add(tmp_path / name)).write_text(name)
        assert scratch._tracked[str(tmp_path / name)] == reaper.TRACK
    kept.keep()
    dropped.discard()
    placed.done(tmp_path / "placed")  # in place under its own name
    assert sorted(os.listdir(tmp_path)) == ["kept", "placed"]
    assert not any(str(tmp_path) in path for path in scratch._tracked)
