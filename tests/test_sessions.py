"""Sessions of a model that holds large weights: the weights reach ONNX Runtime as arrays,
not through the serialised proto (runtime.weights_apart), and the session computes what the
serialised model computes."""

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

import graphaudit.replay.prefix as prefix
import graphaudit.runtime.sessions as runtime
from graphaudit.replay.pipeline import replay
from graphaudit.runtime.handed_weights import weights_apart
from graphaudit.runtime.sessions import create_session

from support.models import gated_lm, token_ids

BIG = 2**20 // 4 + 1  # float32 values in a weight just past HANDED_OVER


def model_with_weights() -> onnx.ModelProto:
    """y = (x @ big) @ back + x @ kept and z = Σ bf: `big` and `back` past HANDED_OVER, `kept`
    small, `bf` a large bfloat16 weight (a type NumPy has none of its own for)."""
    rng = np.random.default_rng(0)
    big = numpy_helper.from_array(rng.standard_normal((4, BIG // 4 + 1)).astype(np.float32), "big")
    back = numpy_helper.from_array(rng.standard_normal((BIG // 4 + 1, 4)).astype(np.float32), "back")
    kept = numpy_helper.from_array(rng.standard_normal((4, 4)).astype(np.float32), "kept")
    bf = helper.make_tensor("bf", TensorProto.BFLOAT16, [BIG], np.zeros(BIG, np.uint16).tobytes(), raw=True)
    nodes = [helper.make_node("MatMul", ["x", "big"], ["h"]), helper.make_node("MatMul", ["h", "back"], ["a"]),
             helper.make_node("MatMul", ["x", "kept"], ["b"]), helper.make_node("Add", ["a", "b"], ["y"]),
             helper.make_node("Cast", ["bf"], ["bf32"], to=TensorProto.FLOAT),
             helper.make_node("ReduceSum", ["bf32"], ["z"], keepdims=0)]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 4]),
                               helper.make_tensor_value_info("z", TensorProto.FLOAT, [])],
                              initializer=[big, back, kept, bf])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def test_large_native_weights_are_taken_out_and_the_model_is_left_alone():
    model = model_with_weights()
    before = model.SerializeToString()
    skeleton, names, arrays = weights_apart(model)
    assert names == ["big", "back"]  # `kept` is small, `bf` has no NumPy type of its own
    assert model.SerializeToString() == before
    stubs = {t.name: t for t in skeleton.graph.initializer}
    assert stubs["big"].data_location == TensorProto.EXTERNAL and not stubs["big"].raw_data
    assert list(stubs["big"].dims) == [4, BIG // 4 + 1] and stubs["kept"].raw_data == model.graph.initializer[2].raw_data
    np.testing.assert_array_equal(arrays[0], numpy_helper.to_array(model.graph.initializer[0]))
    assert weights_apart(gated_lm())[0] is not None and weights_apart(gated_lm())[1] == []  # small: nothing goes


def test_a_session_of_handed_over_weights_computes_what_the_serialised_model_does():
    model = model_with_weights()
    x = np.random.default_rng(1).standard_normal((3, 4)).astype(np.float32)
    ours = create_session(model).run(None, {"x": x})
    theirs = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    for a, b in zip(ours, theirs):
        np.testing.assert_array_equal(a, b)
    again = ort.SessionOptions()  # options of the caller's own: the weights go through the proto
    np.testing.assert_array_equal(create_session(model, options=again).run(None, {"x": x})[0], theirs[0])
    np.testing.assert_array_equal(create_session(model, options=again).run(None, {"x": x})[0], theirs[0])


def test_handed_over_weights_beside_weights_in_a_file(tmp_path):
    model = model_with_weights()
    ext = numpy_helper.from_array(np.full((4, 4), 0.5, np.float32), "ext")
    (tmp_path / "ext.bin").write_bytes(ext.raw_data)
    stub = model.graph.initializer.add(name="ext", data_type=TensorProto.FLOAT, dims=[4, 4])
    stub.data_location = TensorProto.EXTERNAL
    for key, value in (("location", "ext.bin"), ("offset", "0"), ("length", "64")):
        stub.external_data.add(key=key, value=value)
    model.graph.node.append(helper.make_node("MatMul", ["x", "ext"], ["e"]))
    model.graph.output.append(helper.make_tensor_value_info("e", TensorProto.FLOAT, ["n", 4]))
    x = np.ones((2, 4), np.float32)
    y, _, e = create_session(model, weights_folder=tmp_path).run(None, {"x": x})
    np.testing.assert_array_equal(e, np.full((2, 4), 2.0, np.float32))
    assert np.isfinite(y).all()


def test_the_replay_is_the_same_whichever_way_the_weights_go(tmp_path, monkeypatch):
    onnx.save(gated_lm(), tmp_path / "m.onnx")
    np.savez(tmp_path / "calib.npz", input_ids=token_ids(8, seed=1))
    np.savez(tmp_path / "eval.npz", input_ids=token_ids(6, seed=2))

    def doc():
        report = replay(tmp_path / "m.onnx", tmp_path / "calib.npz", tmp_path / "eval.npz", resamples=30)
        return {k: v for k, v in report.to_json().items() if k != "timing"}

    serialised = doc()
    handed, given = [], []
    real, real_create = runtime.weights_apart, prefix.create_session
    # past 128 bytes: the embedding and the head (a value shape inference reads, as Unsqueeze's
    # axes, must stay: ONNX Runtime infers shapes before it puts the arrays in)
    for module in (runtime, prefix):
        monkeypatch.setattr(module, "weights_apart", lambda m, over=None: handed.append(real(m, 128)) or handed[-1])
    monkeypatch.setattr(prefix, "create_session", lambda m, *a, **k: given.append(k.get("weights")) or
                        real_create(m, *a, **k))
    assert doc() == serialised
    # the trace's, then the frozen graph's once; its two parts hold stubs, and are handed the arrays
    assert [sorted(names) for _, names, _ in handed] == [["emb", "head"], ["emb", "head"], [], []]
    prefix_weights, suffix_weights = given
    assert prefix_weights is suffix_weights and sorted(prefix_weights) == ["emb", "head"]
    assert prefix_weights["emb"] is handed[1][2][handed[1][1].index("emb")]  # the same array, not a copy


def test_a_session_ort_refuses_with_weights_apart_is_made_from_the_whole_model(monkeypatch):
    """Every weight taken out, Unsqueeze's axes too: ONNX Runtime cannot infer shapes without
    them and refuses; the session is then made from the whole serialised model."""
    real = runtime.weights_apart
    monkeypatch.setattr(runtime, "weights_apart", lambda m, over=None: real(m, 0))
    model = gated_lm()
    assert "axis_last" in runtime.weights_apart(model)[1]
    ids = token_ids(2)
    out = create_session(model).run(["logits"], {"input_ids": ids})[0]
    expected = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        ["logits"], {"input_ids": ids})[0]
    np.testing.assert_array_equal(out, expected)
