"""Shape inference takes what the ONNX checker was handed (graphaudit.load.inference).

The checker is handed a copy of the model whose weights are typed graph inputs, encoded once.
While the model stays as it was checked, inference runs on that same encoding instead of
encoding the model again: the loaded model is byte for byte what inference of the model itself
gives, its external weights still references. Where the model changed after the check (free
dimensions named, functions inlined) or a node needs a shape function, inference takes the model.
"""

from __future__ import annotations

import warnings

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import graphaudit.load.inference as inference
import graphaudit.load.model as loader
from graphaudit.load.model import load_model


def _mlp(batch: str | int = "b", opset_extra=()) -> onnx.ModelProto:
    """x[batch, 8] -> MatMul w1 -> Relu -> Reshape by a small constant -> MatMul w2 -> y."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.standard_normal((8, 16)).astype(np.float32), "w1"),
             numpy_helper.from_array(rng.standard_normal((16, 4)).astype(np.float32), "w2"),
             numpy_helper.from_array(np.array([-1, 16], np.int64), "shape")]
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"], name="mm1"),
             helper.make_node("Relu", ["h"], ["a"], name="relu"),
             helper.make_node("Reshape", ["a", "shape"], ["r"], name="reshape"),
             helper.make_node("MatMul", ["r", "w2"], ["y"], name="mm2")]
    graph = helper.make_graph(nodes, "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, None])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), *opset_extra])


def _save_external(model: onnx.ModelProto, folder, threshold: int = 0):
    path = folder / "m.onnx"
    onnx.save(model, path, save_as_external_data=True, all_tensors_to_one_file=True, location="w.bin",
              size_threshold=threshold)
    return path


@pytest.fixture
def handed_to_inference(monkeypatch):
    """What each run of shape inference is handed: ("encoding", its initializers) or ("model", ...)."""
    seen: list[tuple[str, list[str]]] = []
    real = inference.shape_inference.infer_shapes

    def spy(model, **kwargs):
        proto = onnx.ModelProto.FromString(model) if isinstance(model, bytes) else model
        seen.append(("encoding" if isinstance(model, bytes) else "model", [t.name for t in proto.graph.initializer]))
        return real(model, **kwargs)

    monkeypatch.setattr(inference.shape_inference, "infer_shapes", spy)
    return seen


def _as_before(monkeypatch):
    """Load as the loader did before it kept the checker's encoding: inference encodes the model."""
    real = inference.with_inferred_shapes
    monkeypatch.setattr(loader, "with_inferred_shapes", lambda model, every=None, checked=None, fields=None: real(model, every))


@pytest.mark.parametrize("threshold", [0, 100])  # every weight outside; the small shape constant inline
@pytest.mark.parametrize("graph_only", [False, True])
def test_external_weights_reach_inference_as_the_checker_had_them(tmp_path, monkeypatch, handed_to_inference,
                                                                  threshold, graph_only):
    path = _save_external(_mlp(), tmp_path, threshold)
    if graph_only:
        (tmp_path / "w.bin").unlink()  # a graph-only load never opens them
    loaded = load_model(path, weights=False)
    assert handed_to_inference == [("encoding", [] if threshold == 0 else ["shape"])]
    assert loaded.shape_inference_ok
    assert [t.name for t in loaded.model.graph.initializer] == ["w1", "w2", "shape"]
    outside = [t.name for t in loaded.model.graph.initializer if t.data_location == TensorProto.EXTERNAL]
    assert outside == (["w1", "w2", "shape"] if threshold == 0 else ["w1", "w2"])
    assert [i.name for i in loaded.model.graph.input] == ["x"]  # the checker's typed inputs are not kept
    _as_before(monkeypatch)
    before = load_model(path, weights=False)
    if threshold:  # the shape constant's value read by inference either way: the same model, to the byte
        assert loaded.model.SerializeToString() == before.model.SerializeToString()
        dims = loaded.model.graph.output[0].type.tensor_type.shape.dim
        assert dims[1].dim_value == 4  # (the Reshape's -1 leaves the rows unknown to ONNX's inference)


def test_a_shape_read_from_an_external_tensor_is_unknown_and_inference_carries_on(tmp_path, monkeypatch):
    """With every tensor outside (size_threshold=0), the Reshape's shape is a value inference cannot
    read. Handed the external reference, ONNX's inference stopped at it and typed nothing after;
    handed a typed input, as the checker is, it gives the Reshape its rank and carries on."""
    path = _save_external(_mlp(), tmp_path, 0)
    values = {v.name: v for v in load_model(path, weights=False).model.graph.value_info}
    assert len(values["r"].type.tensor_type.shape.dim) == 2
    y = load_model(path, weights=False).model.graph.output[0].type.tensor_type
    assert y.elem_type == TensorProto.FLOAT and y.shape.dim[1].dim_value == 4
    _as_before(monkeypatch)
    before = load_model(path, weights=False).model
    assert "r" not in {v.name for v in before.graph.value_info}


def test_inline_models_hand_inference_the_files_own_bytes(tmp_path, handed_to_inference, monkeypatch):
    """No weight moved: the checker read the file's own bytes, and so does inference."""
    onnx.save(_mlp(), tmp_path / "m.onnx")
    loaded = load_model(tmp_path / "m.onnx")
    assert handed_to_inference == [("encoding", ["w1", "w2", "shape"])]
    _as_before(monkeypatch)
    assert loaded.model.SerializeToString() == load_model(tmp_path / "m.onnx").model.SerializeToString()


@pytest.mark.parametrize("where", ["input", "output", "function"])
def test_a_model_changed_after_the_check_is_encoded_again(tmp_path, handed_to_inference, where):
    """A free dimension named after the check (-1 written as an input's batch), a free spelling
    cleared ("?" in an output), or a call of a local function inlined: the checker's encoding is
    no longer the model's, so inference takes the model."""
    model = _mlp(batch=-1 if where == "input" else "b",
                 opset_extra=[helper.make_opsetid("local", 1)] if where == "function" else ())
    if where == "output":
        model.graph.output[0].type.tensor_type.shape.dim[0].dim_param = "?"
    if where == "function":
        model.functions.append(helper.make_function("local", "Act", ["i"], ["o"], [helper.make_node("Relu", ["i"], ["o"])],
                                                    [helper.make_opsetid("", 17)]))
        model.graph.node[1].CopyFrom(helper.make_node("Act", ["h"], ["a"], name="act", domain="local"))
    path = _save_external(model, tmp_path)
    loaded = load_model(path, weights=False)
    assert [kind for kind, _ in handed_to_inference] == ["model"]
    if where == "input":
        assert loaded.model.graph.input[0].type.tensor_type.shape.dim[0].dim_param.startswith("free__")
    if where == "function":
        assert loaded.inlined_calls == 1 and [n.op_type for n in loaded.model.graph.node][1] == "Relu"


def test_a_fused_runtime_operator_takes_the_model_and_its_shape_functions(tmp_path, handed_to_inference):
    model = _mlp(opset_extra=[helper.make_opsetid("com.microsoft", 1)])
    model.graph.node[1].CopyFrom(helper.make_node("FastGelu", ["h"], ["a"], name="gelu", domain="com.microsoft"))
    path = _save_external(model, tmp_path)
    loaded = load_model(path, weights=False)
    assert [kind for kind, _ in handed_to_inference] == ["model"]
    values = {v.name: v.type.tensor_type for v in loaded.model.graph.value_info}
    assert [d.dim_value for d in values["a"].shape.dim][1:] == [16]  # FastGelu shaped by its function


def test_onnx_operator_cases_load_as_before(monkeypatch):
    """A sample of ONNX's own operator test models (ModelProtos, weights inline): each loads to the
    same bytes with inference taking the checker's encoding as with it encoding the model."""
    from onnx.backend.test.case import node

    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")  # the generators' own casts overflow on purpose
        cases = node.collect_testcases(None)[::9]
    now = [load_model(case.model) for case in cases]
    _as_before(monkeypatch)
    for case, loaded in zip(cases, now):
        before = load_model(case.model)
        assert loaded.model.SerializeToString() == before.model.SerializeToString(), case.name
        assert (loaded.shape_inference_ok, loaded.shape_inference_error) == \
            (before.shape_inference_ok, before.shape_inference_error), case.name
