"""Fixtures several test modules use. Helper functions and constants are in tests/support/."""

from pathlib import Path

import numpy as np
import onnx
import pytest

from support.models import float_data, float_gated, gated_lm, token_ids


@pytest.fixture
def float_gated_files(tmp_path) -> Path:
    """A folder holding gated.onnx (a tiny model with one declared gate) and calib.npz."""
    folder = tmp_path / "in"
    folder.mkdir()
    onnx.save(float_gated(), folder / "gated.onnx")
    np.savez(folder / "calib.npz", x=float_data())
    return folder


@pytest.fixture()
def gated_lm_files(tmp_path) -> Path:
    """tmp_path holding gated.onnx (`gated_lm`), calib.npz (12 inputs) and eval.npz (10 inputs)."""
    onnx.save(gated_lm(), tmp_path / "gated.onnx")
    np.savez(tmp_path / "calib.npz", input_ids=token_ids(12, seed=1))
    np.savez(tmp_path / "eval.npz", input_ids=token_ids(10, seed=2))
    return tmp_path
