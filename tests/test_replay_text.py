"""`graphaudit replay`'s text report: what it says of the retained gap when there is none."""

import dataclasses

import pytest

from graphaudit.metrics.stats import Estimate
from graphaudit.replay.pipeline import replay
from graphaudit.report.replay_text import render_text


@pytest.fixture()
def files(gated_lm_files):
    """A folder holding gated.onnx (`gated_lm`), calib.npz and eval.npz."""
    return gated_lm_files


def test_text_says_when_there_is_no_gap_for_the_retained_shares(files):
    # a global mean no worse than the correct coefficients leaves no gap: the retained shares,
    # whatever they come to, are said to mean nothing
    report = replay(files / "gated.onnx", files / "calib.npz", files / "eval.npz", resamples=20, batch_size=5)

    def with_global_gap(value, ci):
        return dataclasses.replace(report, conditions=tuple(
            dataclasses.replace(c, delta_nll=Estimate(value, ci)) if c.name == "global_mean" else c
            for c in report.conditions))

    assert "no gap to share out" not in render_text(with_global_gap(0.8, (0.7, 0.9)))
    text = render_text(with_global_gap(0.004, (-0.02, 0.03)))
    assert "global_mean is not measurably worse than correct, ΔNLL +0.0040: there is no gap to share out" in text
