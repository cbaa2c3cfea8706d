"""Progress: a bar on stderr for a terminal, nothing for a pipe or with --quiet."""

import io

from graphaudit.progress import ProgressBar, track


class Terminal(io.StringIO):
    def isatty(self):
        return True


def test_bar_draws_in_place_and_ends_each_stage_with_a_newline():
    stream = Terminal()
    bar = ProgressBar(stream, clock=lambda: 0.0)
    for _ in track(range(3), "replay", bar):
        pass
    bar("profile", 0, None)
    bar.close()
    out = stream.getvalue()
    assert "\rreplay" in out and "[" + "#" * 28 + "] 3/3" in out
    assert out.count("\n") == 2  # replay finished, profile closed
    assert "profile" in out.splitlines()[-1]


def test_quiet_and_pipes_get_nothing():
    for bar in (ProgressBar(io.StringIO()), ProgressBar(Terminal(), quiet=True)):
        for _ in track([1, 2], "static audit", bar):
            pass
        bar.close()
        assert bar.stream.getvalue() == ""


def test_track_without_a_callback_just_yields():
    assert list(track(iter([1, 2, 3]), "x", None)) == [1, 2, 3]
    seen = []
    list(track([5, 6], "x", lambda *a: seen.append(a)))
    assert seen == [("x", 0, 2), ("x", 1, 2), ("x", 2, 2)]
