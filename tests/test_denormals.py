"""Denormals flushed to zero in graphaudit's own ONNX Runtime runs (graphaudit.runtime.denormals):
only during a run, only where asked, and the caller's thread left as it was."""

import threading
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from graphaudit.replay.pipeline import replay
from graphaudit.runtime import denormals
from graphaudit.runtime.denormals import FlushingSession
from graphaudit.runtime.sessions import create_session

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
needs_mxcsr = pytest.mark.skipif(not denormals.supported(), reason="FTZ/DAZ are set through glibc on x86-64 only")
TINY = np.float32(1e-30)  # TINY * TINY_TOO is 1e-40: a denormal float32


def product_model():
    """z = x * y, and a causal-style masked softmax of s (half of each row -inf)."""
    nodes = [helper.make_node("Mul", ["x", "y"], ["z"]), helper.make_node("Softmax", ["s"], ["p"], axis=-1)]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in "xys"],
                              [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in "zp"])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def feeds():
    scores = np.random.default_rng(0).standard_normal((2, 8, 8)).astype(np.float32)
    scores[:, np.triu_indices(8, 1)[0], np.triu_indices(8, 1)[1]] = -np.inf
    return {"x": np.full(64, TINY), "y": np.full(64, np.float32(1e-10)), "s": scores}


@needs_mxcsr
def test_a_flushing_session_flushes_in_its_runs_and_only_there():
    model = product_model()
    plain = create_session(model, threads=1)
    flushing = create_session(model, threads=1, flush_denormals=True)
    assert isinstance(flushing, FlushingSession) and not isinstance(plain, FlushingSession)
    assert not denormals.flushing()
    z_plain, p_plain = plain.run(None, feeds())
    z_flush, p_flush = flushing.run(None, feeds())
    assert (z_plain > 0).all() and z_plain.max() < np.finfo(np.float32).tiny  # denormal products kept
    assert (z_flush == 0).all()  # flushed
    np.testing.assert_array_equal(p_flush, p_plain)  # a masked softmax: the same to the bit
    assert not denormals.flushing()  # the caller's thread as it was
    assert flushing.get_inputs()[0].name == "x"  # the rest is the session's own


@needs_mxcsr
def test_making_a_session_leaves_the_callers_floating_point_mode_alone():
    # ONNX Runtime's constructor sets FTZ/DAZ on the creating thread when asked for them on
    # one intra-op thread, and clears them when not: either way the caller's mode stays
    assert not denormals.flushing()
    create_session(product_model(), threads=1, flush_denormals=True)
    assert not denormals.flushing()
    options = ort.SessionOptions()
    options.add_session_config_entry(denormals.SESSION_OPTION, "1")
    create_session(product_model(), options=options, threads=1)
    assert not denormals.flushing()
    with denormals.flushed():
        create_session(product_model(), threads=1)
        assert denormals.flushing()
    assert not denormals.flushing()


@needs_mxcsr
def test_a_flushing_run_in_another_thread_flushes_there():
    session = create_session(product_model(), threads=1, flush_denormals=True)
    out = {}
    worker = threading.Thread(target=lambda: out.update(z=session.run(["z"], feeds())[0], after=denormals.flushing()))
    worker.start()
    worker.join()
    assert (out["z"] == 0).all() and out["after"] is False


@pytest.mark.skipif(not (FIXTURES / "mudd" / "model.onnx").is_file(), reason="no zoo fixtures")
def test_the_replay_gives_the_same_figures_whether_it_flushes_or_not():
    args = (FIXTURES / "mudd" / "model.onnx", FIXTURES / "mudd" / "calib.npz", FIXTURES / "mudd" / "eval.npz")
    flushed = replay(*args, threads=1, resamples=50).to_json()
    kept = replay(*args, threads=1, resamples=50, flush_denormals=False).to_json()
    assert flushed["settings"].pop("flush_denormals") is True and kept["settings"].pop("flush_denormals") is False
    for name, figures in kept["conditions"].items():
        assert flushed["conditions"][name]["nll"] == pytest.approx(figures["nll"], abs=1e-9)
        assert flushed["conditions"][name]["kl"] == pytest.approx(figures["kl"], abs=1e-9)
    assert flushed["parity"]["max_abs_diff"] == pytest.approx(kept["parity"]["max_abs_diff"], abs=1e-6)


@pytest.mark.skipif(not (FIXTURES / "featuregate" / "model.onnx").is_file(), reason="no zoo fixtures")
@pytest.mark.parametrize("command", ["replay", "run"])
def test_keep_denormals_on_the_command_line(command):
    import json

    from click.testing import CliRunner

    from graphaudit.cli import cli

    folder = FIXTURES / "featuregate"
    extra = ["--runs", "1", "--warmup", "0", "--profile-runs", "1", "--limit", "2"] if command == "run" else []
    for flag, expected in (([], True), (["--keep-denormals"], False)):
        result = CliRunner().invoke(cli, [command, str(folder / "model.onnx"), "--calib", str(folder / "calib.npz"),
                                          "--resamples", "20", "--format", "json", "-q", *extra, *flag])
        assert result.exit_code == 0, result.output
        report = json.loads(result.output)
        settings = report["settings"] if command == "replay" else report["inputs"]
        assert settings["flush_denormals"] is expected
