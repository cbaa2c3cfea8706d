"""Shapes and FLOPs through a static quantization in ONNX Runtime's operator form
(QuantFormat.QOperator): its com.microsoft QLinearAdd / QLinearMul / QLinearSigmoid /
QLinearSoftmax / QLinearConcat / QLinearWhere / QLinearGlobalAveragePool / QGemm nodes are
shaped as ONNX Runtime computes them, so the products past them keep their sizes."""

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from graphaudit.analyses.flops import count_flops
from graphaudit.analyses.static import audit_static
from graphaudit.graph.build import build_graph
from graphaudit.load.model import load_model

from support.zoo import quantized_featuregate

FIXTURE = Path(__file__).resolve().parent.parent / "fixtures" / "featuregate"
MS = dict(domain="com.microsoft")


def _quantized_graph() -> onnx.ModelProto:
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(np.array(0.05, np.float32), "s"),
             numpy_helper.from_array(np.array(128, np.uint8), "z"),
             numpy_helper.from_array(np.array(0, np.int8), "wz"),
             numpy_helper.from_array(rng.integers(-5, 5, (6, 4)).astype(np.int8), "w"),
             numpy_helper.from_array(rng.integers(-5, 5, (3, 4)).astype(np.int8), "gw"),
             numpy_helper.from_array(rng.integers(0, 255, (1, 4)).astype(np.uint8), "bias")]
    n = helper.make_node
    nodes = [
        n("QLinearMatMul", ["x", "s", "z", "w", "s", "wz", "s", "z"], ["m"]),
        n("QLinearAdd", ["m", "s", "z", "bias", "s", "z", "s", "z"], ["a"], **MS),
        n("QLinearSigmoid", ["a", "s", "z", "s", "z"], ["g"], **MS),
        n("QLinearMul", ["a", "s", "z", "g", "s", "z", "s", "z"], ["p"], **MS),
        n("QLinearSoftmax", ["p", "s", "z", "s", "z"], ["sm"], axis=-1, opset=13, **MS),
        n("QLinearConcat", ["s", "z", "sm", "s", "z", "p", "s", "z"], ["c"], axis=-1, **MS),
        n("Greater", ["m", "z"], ["cond"]),
        n("QLinearWhere", ["cond", "m", "s", "z", "a", "s", "z", "s", "z"], ["wh"], **MS),
        n("QGemm", ["wh", "s", "z", "gw", "s", "wz", "", "s", "z"], ["q"], transB=1, **MS),
        n("QLinearGlobalAveragePool", ["img", "s", "z", "s", "z"], ["pooled"], channels_last=0, **MS),
    ]
    graph = helper.make_graph(
        nodes, "qop",
        [helper.make_tensor_value_info("x", TensorProto.UINT8, ["N", 6]),
         helper.make_tensor_value_info("img", TensorProto.UINT8, ["N", 3, 5, 5])],
        [helper.make_tensor_value_info("c", TensorProto.UINT8, ["N", 8]),
         helper.make_tensor_value_info("q", TensorProto.UINT8, ["N", 3]),
         helper.make_tensor_value_info("pooled", TensorProto.UINT8, ["N", 3, 1, 1])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)])


def test_operator_form_nodes_are_shaped_as_onnx_runtime_shapes_them():
    model = _quantized_graph()
    mg = build_graph(load_model(model).model)
    shapes = {r.name: info.shape for r, info in mg.tensors.items()}
    names = ("a", "g", "p", "sm", "c", "wh", "q", "pooled")
    probe = onnx.ModelProto()
    probe.CopyFrom(model)
    probe.graph.output.extend(helper.make_empty_tensor_value_info(n) for n in names if n not in ("c", "q", "pooled"))
    session = ort.InferenceSession(probe.SerializeToString(), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(1)
    run = dict(zip([o.name for o in session.get_outputs()], session.run(None, {
        "x": rng.integers(0, 255, (2, 6)).astype(np.uint8), "img": rng.integers(0, 255, (2, 3, 5, 5)).astype(np.uint8)})))
    for name in names:
        assert shapes[name] is not None, name
        assert tuple(2 if d == "N" else d for d in shapes[name]) == run[name].shape, name
    count = count_flops(mg, {"x": (2, 6), "img": (2, 3, 5, 5)})
    assert count.unknown_shape == ()
    assert sorted(count.per_node.values()) == sorted([2 * 2 * 6 * 4, 2 * 2 * 4 * 3])  # QLinearMatMul, QGemm


def test_an_operator_form_quantization_counts_the_flops_of_the_float_model(tmp_path):
    quantized_featuregate(tmp_path / "model.onnx", "QOperator")
    model = onnx.load(tmp_path / "model.onnx")
    assert {"QLinearMatMul", "QLinearAdd", "QLinearSigmoid"} <= {n.op_type for n in model.graph.node}
    # the metadata's float gates are integers now: the quantizer's `gate.0_quantized` stands for `gate.0`
    assert [(c.tensor, c.layer, c.source) for c in audit_static(load_model(model)).coefficients] == [
        (f"gate.{i}_quantized", i, "metadata") for i in range(4)]
    del model.metadata_props[:]
    shapes = {"input_ids": (2, 16)}
    quantized = audit_static(load_model(model), shapes=shapes).flops
    exported = audit_static(load_model(FIXTURE / "model.onnx"), shapes=shapes).flops
    assert quantized.count.unknown_shape == ()
    assert quantized.total == exported.total > 0
