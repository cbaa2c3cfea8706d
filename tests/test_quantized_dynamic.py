"""ONNX Runtime's dynamic quantization (`quantize_dynamic`, as CPU deployments of transformers
use it): each MatMul by a weight becomes DynamicQuantizeLinear of its input, MatMulInteger, a
Cast to float and a Mul by the input's scale times the weight's. Detection finds in the
quantized zoo models what it finds in the float ones, MUDD's unsquashed mixes included (their
projection is now that whole pattern), and the replay holds parity."""

import numpy as np
import onnx
import pytest

from graphaudit.analyses.static import audit_static
from graphaudit.load.model import load_model
from graphaudit.replay.pipeline import replay

from support.zoo import FIXTURES

quantization = pytest.importorskip("onnxruntime.quantization")


def _bare_and_quantized(name: str, folder):
    """The fixture `name` without its declared coefficients, and its dynamically quantized copy."""
    model = onnx.load(FIXTURES / name / "model.onnx")
    del model.metadata_props[:]
    onnx.save(model, folder / "bare.onnx")
    quantization.quantize_dynamic(str(folder / "bare.onnx"), str(folder / "quantized.onnx"),
                                  weight_type=quantization.QuantType.QInt8)
    return folder / "bare.onnx", folder / "quantized.onnx"


@pytest.mark.parametrize("name", ["featuregate", "mudd", "moe"])
def test_detection_finds_in_the_quantized_model_what_it_finds_in_the_float_one(tmp_path, name):
    bare, quantized = _bare_and_quantized(name, tmp_path)
    assert any(n.op_type == "MatMulInteger" for n in onnx.load(quantized).graph.node)
    theirs, ours = (audit_static(load_model(p)) for p in (quantized, bare))
    assert ours.coefficients  # the float model's, detected
    assert [(c.tensor, c.family, c.layer, c.axes) for c in theirs.coefficients] == \
        [(c.tensor, c.family, c.layer, c.axes) for c in ours.coefficients]
    assert [b.verdict for b in theirs.blocks] == [b.verdict for b in ours.blocks]


def test_the_quantized_mudds_mixes_replay_with_parity(tmp_path):
    _, quantized = _bare_and_quantized("mudd", tmp_path)
    np.savez(tmp_path / "calib.npz", input_ids=np.load(FIXTURES / "mudd" / "calib.npz")["input_ids"][:8])
    np.savez(tmp_path / "eval.npz", input_ids=np.load(FIXTURES / "mudd" / "eval.npz")["input_ids"][:8])
    report = replay(quantized, tmp_path / "calib.npz", tmp_path / "eval.npz", resamples=20)
    assert report.parity.ok
    assert [(c.family, c.layer) for c in report.coefficients] == [("mix", i) for i in range(4)]
    assert report.condition("cross_input").delta_nll.value > 0  # the mixes matter, as in the float model
