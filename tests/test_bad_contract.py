"""The contract every bad input is held to (tests/support/cli.py), checked on itself.

`refused` runs the command line in-process and checks what a user sees: the exit status
(1 for a bad file, 2 for bad usage), exactly one line on stderr (read at the file
descriptor, so ONNX Runtime's own log lines count too) that starts
`graphaudit: error: expected`, no traceback, and every input file — model, external data,
.npz — byte-for-byte as it was, with nothing new written beside it.
"""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import onnx

from support.cli import FAST_PROFILE, FAST_REPLAY, accepted, refused
from support.models import float_data, float_gated


def test_refused_holds_a_one_line_error_to_the_contract(tmp_path, capfd):
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"not a model")
    line = refused(capfd, ["inspect", bad], [bad], match="expected an ONNX model")
    assert line.startswith("graphaudit: error: expected an ONNX model (protobuf ModelProto)")


def test_accepted_models_run_and_stay_untouched(tmp_path, capfd):
    path = tmp_path / "gated.onnx"
    onnx.save(float_gated(), path)
    np.savez(tmp_path / "calib.npz", x=float_data())
    out = accepted(capfd, ["replay", path, "--calib", tmp_path / "calib.npz", *FAST_REPLAY, "--format", "json"],
                   [path, tmp_path / "calib.npz"])
    assert '"parity"' in out


def test_the_installed_command_prints_one_line_for_a_run_that_fails(tmp_path):
    """Outside pytest's capture: a model ONNX Runtime refuses at run time prints one line, no log lines."""
    path = tmp_path / "gated.onnx"
    onnx.save(float_gated(), path)
    data = float_data()
    np.savez(tmp_path / "wide.npz", x=np.concatenate([data, data], axis=-1))  # 8 features for a 4-wide graph
    model = float_gated()
    model.graph.input[0].type.tensor_type.shape.dim[2].dim_param = "width"  # the rank is checked, the width not
    onnx.save(model, tmp_path / "open.onnx")
    result = subprocess.run([sys.executable, "-m", "graphaudit", "profile", str(tmp_path / "open.onnx"), "--data",
                             str(tmp_path / "wide.npz"), *FAST_PROFILE], capture_output=True, text=True)
    assert result.returncode == 1, result.stderr
    assert result.stderr.count("\n") == 1, result.stderr
    assert result.stderr.startswith("graphaudit: error: expected inputs that")
    assert "ONNX Runtime's error in node 'block0/matmul' (MatMul)" in result.stderr
