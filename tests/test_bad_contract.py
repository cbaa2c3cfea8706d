"""The contract every bad input is held to, and the tiny models the bad-input tests use.

`refused` runs the command line in-process and checks what a user sees: the exit status
(1 for a bad file, 2 for bad usage), exactly one line on stderr (read at the file
descriptor, so ONNX Runtime's own log lines count too) that starts
`graphaudit: error: expected`, no traceback, and every input file — model, external data,
.npz — byte-for-byte as it was, with nothing new written beside it. The other
tests/test_bad_*.py files import it; the tests here check the contract itself.
"""

from __future__ import annotations

import hashlib
import re
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from graphaudit.cli import main
from graphaudit.analyses.declared_coefficients import Coefficient, metadata_entry

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "fixtures"
# The fewest rounds the runtime commands accept: the bad-input tests are about errors, not timing.
FAST_PROFILE = ["--runs", "1", "--warmup", "0", "--profile-runs", "1", "--opt-level", "disable"]
FAST_RUN = ["--runs", "1", "--warmup", "0", "--profile-runs", "1", "--resamples", "5", "--provider", "cpu", "-q"]
FAST_REPLAY = ["--resamples", "5", "--quiet"]
WIDTH = 4


def sha(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def snapshot(paths) -> dict:
    """sha256 of every input file (links followed) and the listing of every folder holding one."""
    files = {str(p): sha(p) for p in paths if Path(p).is_file()}
    folders = {str(Path(p).parent): sorted(q.name for q in Path(p).parent.iterdir()) for p in paths}
    return {"files": files, "folders": folders}


def invoke(args) -> int:
    """Run `graphaudit ARGS` in-process; return its exit status. A warning the user would see
    (Python prints all but deprecations to stderr) fails the test: it would be a second line."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with pytest.raises(SystemExit) as info:
            main([str(a) for a in args])
    shown = [f"{w.category.__name__}: {w.message} ({w.filename}:{w.lineno})" for w in caught
             if not issubclass(w.category, (DeprecationWarning, PendingDeprecationWarning))]
    assert not shown, shown
    return info.value.code


def refused(capfd, args, inputs, match: str | None = None, code: int = 1) -> str:
    """Run `graphaudit ARGS`; assert the one-line refusal and untouched inputs; return the line."""
    before = snapshot(inputs)
    status = invoke(args)
    out, err = capfd.readouterr()
    assert status == code, f"exit {status}, stderr: {err!r}"
    assert err.startswith("graphaudit: error: expected"), err
    assert err.endswith("\n") and err.count("\n") == 1, err
    assert "Traceback" not in err and out == ""
    if match is not None:
        assert re.search(match, err), err
    assert snapshot(inputs) == before
    return err


def accepted(capfd, args, inputs) -> str:
    """Run `graphaudit ARGS`; assert exit 0, a quiet stderr and untouched inputs; return stdout."""
    before = snapshot(inputs)
    status = invoke(args)
    out, err = capfd.readouterr()
    assert status == 0, err
    assert "Traceback" not in err and "error" not in err
    assert snapshot(inputs) == before
    return out


def zoo_subset(folder: Path, name: str = "featuregate", rows: int = 4, tokens: int = 16) -> dict:
    """A copy of a zoo model and the first `rows` x `tokens` of its calibration and evaluation data."""
    source = FIXTURES / name
    if not all((source / f).is_file() for f in ("model.onnx", "calib.npz", "eval.npz")):
        pytest.skip(f"zoo fixture {name} is not built (python -m exporters.build --out fixtures)")
    folder.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(source / "model.onnx", folder / "model.onnx")
    paths = {"model": folder / "model.onnx"}
    for split in ("calib", "eval"):
        with np.load(source / f"{split}.npz", allow_pickle=False) as archive:
            ids = archive["input_ids"][:rows, :tokens]
        paths[split] = folder / f"{split}.npz"
        np.savez(paths[split], input_ids=ids)
    return paths


def float_gated(log_in_controller: bool = False, custom_op: bool = False, seed: int = 0) -> onnx.ModelProto:
    """x (batch, seq, 4) float -> y = x + gate.0 * act(x W), gate.0 = Sigmoid(f(x) Wg), declared.

    `log_in_controller` makes f = Log, so the controller yields NaN for any input with a
    negative entry (the data itself is finite); `custom_op` makes act an `acme.Frob` that
    ONNX Runtime lacks (the graph is valid, the runtime cannot run it)."""
    rng = np.random.default_rng(seed)
    inits = [numpy_helper.from_array(rng.standard_normal((WIDTH, WIDTH)).astype(np.float32), "wg"),
             numpy_helper.from_array(rng.standard_normal((WIDTH, WIDTH)).astype(np.float32), "w")]
    act = helper.make_node("Frob", ["h"], ["t"], name="block0/act", domain="acme") if custom_op else \
        helper.make_node("Tanh", ["h"], ["t"], name="block0/act")
    nodes = [helper.make_node("Log" if log_in_controller else "Identity", ["x"], ["fx"], name="ctl/f"),
             helper.make_node("MatMul", ["fx", "wg"], ["gz"], name="ctl/matmul"),
             helper.make_node("Sigmoid", ["gz"], ["gate.0"], name="ctl/sigmoid"),
             helper.make_node("MatMul", ["x", "w"], ["h"], name="block0/matmul"),
             act,
             helper.make_node("Mul", ["gate.0", "t"], ["g"], name="block0/gate"),
             helper.make_node("Add", ["x", "g"], ["y"], name="block0/residual")]
    graph = helper.make_graph(nodes, "float_gated",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "seq", WIDTH])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", "seq", WIDTH])],
                              initializer=inits)
    opsets = [helper.make_opsetid("", 17)] + ([helper.make_opsetid("acme", 1)] if custom_op else [])
    model = helper.make_model(graph, opset_imports=opsets, ir_version=8)
    model.metadata_props.append(metadata_entry([Coefficient("gate.0", "gate", 0, ("batch", "token", "feature"))]))
    onnx.checker.check_model(model)
    return model


def float_data(count: int = 8, seed: int = 0) -> np.ndarray:
    """Positive inputs for `float_gated` (Log is finite on them)."""
    return np.random.default_rng(seed).uniform(0.5, 2.0, (count, 5, WIDTH)).astype(np.float32)


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
