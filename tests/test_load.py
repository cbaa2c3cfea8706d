"""Model loading: graph-only loads, the checker, and errors for bad files."""


import numpy as np
import onnx
import onnxruntime as ort
import pytest

from graphaudit.errors import GraphAuditError
from graphaudit.graph.build import build_graph
from graphaudit.load.model import load_model
from graphaudit.testing.synthetic import WEIGHTS_FILE, transformer_graph

from support.cli import sha


def test_graph_only_load_of_a_24_layer_model_reads_no_weights(tmp_path, monkeypatch):
    path = tmp_path / "pythia.onnx"
    onnx.save(transformer_graph(), path)
    assert not (tmp_path / WEIGHTS_FILE).exists()  # the 5.6 GB weight file is absent
    opened = []
    real_open = open

    def spy(file, *args, **kwargs):
        opened.append(str(file))
        return real_open(file, *args, **kwargs)

    monkeypatch.setattr("builtins.open", spy)
    before = sha(path)
    loaded = load_model(path, weights=False)
    assert not any(WEIGHTS_FILE in f for f in opened)
    assert loaded.weights_loaded is False
    assert loaded.external_files == (WEIGHTS_FILE,)
    assert loaded.shape_inference_ok
    mg = build_graph(loaded.model)
    assert sum(n.op_type == "MatMul" for n in mg.nodes.values()) == 24 * 6 + 1
    # Symbolic dimensions survive shape inference.
    assert mg.tensors[mg.outputs[0]].shape == ("batch", "seq", 50432)
    assert sha(path) == before


def test_load_with_weights_says_the_weight_file_is_missing(tmp_path):
    path = tmp_path / "m.onnx"
    onnx.save(transformer_graph(layers=2, hidden=64, heads=4, vocab=100), path)
    with pytest.raises(GraphAuditError, match=r"external-data file 'weights.bin'.*found none"):
        load_model(path)


def test_inline_model_loads_and_runs(tmp_path):
    model = transformer_graph(layers=2, hidden=32, heads=4, vocab=50, external=None)
    loaded = load_model(model)
    sess = ort.InferenceSession(loaded.model.SerializeToString(), providers=["CPUExecutionProvider"])
    (logits,) = sess.run(None, {"input_ids": np.zeros((2, 5), np.int64)})
    assert logits.shape == (2, 5, 50)


@pytest.mark.parametrize(
    "content, expected",
    [
        (b"", "found an empty file"),
        (b"\xff\xfe\x00garbage\x13\x37" * 10, "do not parse"),
        (onnx.helper.make_tensor_value_info("x", 1, [2]).SerializeToString(), "no graph"),
    ],
    ids=["empty", "random", "other-protobuf"],
)
def test_bad_files_give_one_line_errors(tmp_path, content, expected):
    path = tmp_path / "bad.onnx"
    path.write_bytes(content)
    with pytest.raises(GraphAuditError, match=expected) as info:
        load_model(path)
    assert "\n" not in str(info.value)
    assert path.read_bytes() == content


def test_truncated_model_is_refused(tmp_path):
    good = transformer_graph(layers=1, hidden=16, heads=2, vocab=20, external=None).SerializeToString()
    path = tmp_path / "cut.onnx"
    path.write_bytes(good[: len(good) // 2])
    with pytest.raises(GraphAuditError, match=r"truncated|no graph|checker"):
        load_model(path)


@pytest.mark.parametrize("location", ["../outside.bin", "/etc/passwd", "sub/../../x.bin"])
def test_external_data_escaping_the_folder_is_refused(tmp_path, location):
    model = transformer_graph(layers=1, hidden=16, heads=2, vocab=20, external=location)
    folder = tmp_path / "model"
    folder.mkdir()
    path = folder / "m.onnx"
    onnx.save(model, path)
    for weights in (True, False):
        with pytest.raises(GraphAuditError, match="refusing to read it"):
            load_model(path, weights=weights)


def test_external_data_symlink_out_of_the_folder_is_refused(tmp_path):
    outside = tmp_path / "secret.bin"
    outside.write_bytes(bytes(10**6))
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "link.bin").symlink_to(outside)
    onnx.save(transformer_graph(layers=1, hidden=16, heads=2, vocab=20, external="link.bin"), folder / "m.onnx")
    with pytest.raises(GraphAuditError, match="resolves to"):
        load_model(folder / "m.onnx")


def test_checker_objection_is_reported():
    model = transformer_graph(layers=1, hidden=16, heads=2, vocab=20, external=None)
    model.graph.node[3].input[0] = "nowhere"
    with pytest.raises(GraphAuditError, match="reads 'nowhere', which no node, input or initializer defines"):
        load_model(model)
    model.graph.node[3].input[0] = model.graph.node[2].output[0]
    model.graph.node[3].op_type = "NoSuchOp"
    with pytest.raises(GraphAuditError, match="checker's objection: No Op registered for NoSuchOp"):
        load_model(model)


def test_load_never_changes_its_argument():
    model = transformer_graph(layers=1, hidden=16, heads=2, vocab=20, external=None)
    before = model.SerializeToString()
    load_model(model)
    assert model.SerializeToString() == before


def test_external_weights_present_load_and_run_like_inline_ones(tmp_path):
    rng = np.random.default_rng(0)
    model = transformer_graph(layers=2, hidden=16, heads=2, vocab=23, external=None)
    for tensor in model.graph.initializer:
        values = rng.standard_normal(tuple(tensor.dims)).astype(np.float32)
        tensor.raw_data = values.tobytes()
    path = tmp_path / "m.onnx"
    saved = onnx.ModelProto()
    saved.CopyFrom(model)  # onnx.save moves the weights of what it is given out to the file
    onnx.save(saved, path, save_as_external_data=True, all_tensors_to_one_file=True,
              location="m.weights", size_threshold=0)
    loaded = load_model(path)
    assert loaded.weights_loaded and loaded.external_files == ("m.weights",)
    assert loaded.shape_inference_ok
    assert not any(t.data_location == onnx.TensorProto.EXTERNAL for t in loaded.model.graph.initializer)
    ids = {"input_ids": rng.integers(0, 23, (2, 5))}

    def run(m):
        return ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, ids)[0]

    np.testing.assert_array_equal(run(loaded.model), run(model))
    assert build_graph(loaded.model).tensors[build_graph(loaded.model).outputs[0]].shape == ("batch", "seq", 23)


def _weighty_model(ir3: bool = False) -> onnx.ModelProto:
    """x @ w (w: 128 KiB of float weights, past INFER_WEIGHTS_OVER), reshaped by a small int64
    initializer, then an If whose branches have values of their own: what inference must type."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((128, 256)).astype(np.float32), "w")
    shape = numpy_helper.from_array(np.array([0, 16, 16], np.int64), "shape")
    then_g = helper.make_graph([helper.make_node("Relu", ["r"], ["t_out"])], "then", [],
                               [helper.make_tensor_value_info("t_out", TensorProto.FLOAT, None)])
    else_g = helper.make_graph([helper.make_node("Neg", ["r"], ["e_mid"]), helper.make_node("Abs", ["e_mid"], ["e_out"])],
                               "else", [], [helper.make_tensor_value_info("e_out", TensorProto.FLOAT, None)])
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Reshape", ["h", "shape"], ["r"]),
             helper.make_node("If", ["c"], ["y"], then_branch=then_g, else_branch=else_g)]
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", 128]),
              helper.make_tensor_value_info("c", TensorProto.BOOL, [])]
    if ir3:  # the old way: every initializer is a graph input too
        inputs += [helper.make_tensor_value_info("w", TensorProto.FLOAT, [128, 256]),
                   helper.make_tensor_value_info("shape", TensorProto.INT64, [3])]
    graph = helper.make_graph(nodes, "g", inputs, [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["b", None, None])],
                              initializer=[w, shape])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=3 if ir3 else 8)


@pytest.mark.parametrize("ir3", [False, True])
def test_weights_kept_from_shape_inference_change_nothing_it_infers(tmp_path, ir3, monkeypatch):
    """Inference runs without the initializers past INFER_WEIGHTS_OVER and writes what it found
    back: the loaded model is byte for byte what ONNX's inference of the whole model gives, the
    Reshape typed from its small shape initializer, the If's branch values and the refined
    output included."""
    from onnx import shape_inference

    import graphaudit.load.inference as load_module

    model = _weighty_model(ir3)
    onnx.save(model, tmp_path / "m.onnx")
    seen = []
    real = shape_inference.infer_shapes

    def spy(m, **kw):  # inference takes a model or its encoding (the checker's, where the model is as checked)
        seen.append([t.name for t in (onnx.ModelProto.FromString(m) if isinstance(m, bytes) else m).graph.initializer])
        return real(m, **kw)

    monkeypatch.setattr(load_module.shape_inference, "infer_shapes", spy)
    loaded = load_model(tmp_path / "m.onnx")
    assert seen == [["shape"]]  # the weight never reached inference, the shape did
    expected = real(model, check_type=False, strict_mode=False, data_prop=True)
    assert loaded.shape_inference_ok
    assert loaded.model.SerializeToString() == expected.SerializeToString()
    assert [d.dim_value for d in loaded.model.graph.output[0].type.tensor_type.shape.dim[1:]] == [16, 16]


def test_a_damaged_weight_past_the_inference_limit_is_still_refused_by_the_checker(tmp_path):
    model = _weighty_model()
    w = model.graph.initializer[0]
    w.raw_data = w.raw_data[:1000]  # 1000 of the 131072 bytes its shape takes
    onnx.save(model, tmp_path / "m.onnx")
    with pytest.raises(GraphAuditError, match=r"raw_data size \(1000 bytes\) is too small"):
        load_model(tmp_path / "m.onnx")


def test_weights_kept_from_shape_inference_with_a_local_function(tmp_path):
    """A node calling a model-local function on a weight past the limit: typed as ONNX's own
    inference of the whole model types it (the function's output shape from the weight's)."""
    from onnx import TensorProto, helper, numpy_helper, shape_inference

    w = numpy_helper.from_array(np.ones((128, 256), np.float32), "w")
    block = helper.make_function("local", "Block", ["a", "b"], ["o"],
                                 [helper.make_node("MatMul", ["a", "b"], ["m"]), helper.make_node("Relu", ["m"], ["o"])],
                                 [helper.make_opsetid("", 17)])
    graph = helper.make_graph([helper.make_node("Block", ["x", "w"], ["y"], domain="local")], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", 128])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["b", None])], initializer=[w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("local", 1)],
                              functions=[block])
    onnx.save(model, tmp_path / "m.onnx")
    loaded = load_model(tmp_path / "m.onnx", inline=False).model
    expected = shape_inference.infer_shapes(model, check_type=False, strict_mode=False, data_prop=True)
    assert loaded.SerializeToString() == expected.SerializeToString()
    assert loaded.graph.output[0].type.tensor_type.shape.dim[1].dim_value == 256


def _branches(else_name: str) -> onnx.ModelProto:
    """An If whose else-branch names its value `else_name` (`m`: as the then-branch does)."""
    import onnx.parser

    return onnx.parser.parse_model(f"""
    <ir_version: 8, opset_import: ["" : 17]>
    g (float[2, 6] x, bool c) => (float[2, 6] y) {{
        y = If (c) <
            then_branch = t () => (float[2, 6] ty) {{ m = Relu (x)
                ty = Identity (m) }},
            else_branch = e () => (float[2, 6] ey) {{ {else_name} = Neg (x)
                ey = Identity ({else_name}) }}
        >
    }}""")


def test_inference_keeps_each_bodys_values_apart_where_a_name_repeats_across_bodies(monkeypatch):
    """ONNX's data propagation keys the values it propagates by name across If branches: in a
    decoder merged with its cached twin (Optimum's), one branch's `/decoder/Mul_1_output_0`
    shaped the other's, and ONNX Runtime refused the shapes written in. Where a name repeats
    across bodies, inference sees each body's values under names of their own, and the loaded
    model has its own names back, with the shapes inference found."""
    import onnx.parser
    from onnx import shape_inference

    from graphaudit.load.protos import names_repeat_across_graphs, rename_body_values, restore_names

    assert names_repeat_across_graphs(_branches("m").graph)
    assert not names_repeat_across_graphs(_branches("n").graph)
    assert not names_repeat_across_graphs(onnx.parser.parse_graph("g (float[2] x) => (float[2] y) { y = Relu (x) }"))
    model = _branches("m")
    before = model.SerializeToString()
    back = rename_body_values(model.graph)
    assert not names_repeat_across_graphs(model.graph) and sorted(back.values()) == ["ey", "m", "m", "ty"]
    restore_names(model.graph, back)
    assert model.SerializeToString() == before

    seen = []
    original = shape_inference.infer_shapes

    def spy(model, *args, **kwargs):
        seen.append((names_repeat_across_graphs(model.graph), kwargs.get("data_prop")))
        return original(model, *args, **kwargs)

    monkeypatch.setattr(shape_inference, "infer_shapes", spy)
    loaded = load_model(_branches("m")).model
    assert seen == [(False, True)]
    branches = {a.name: a.g for a in loaded.graph.node[0].attribute}
    assert {v.name for v in branches["then_branch"].value_info} == {"m"}
    assert {v.name for v in branches["else_branch"].value_info} == {"m"}
    assert [d.dim_value for d in branches["else_branch"].value_info[0].type.tensor_type.shape.dim] == [2, 6]


def test_body_values_renamed_for_inference_take_no_name_the_model_has():
    """A main-graph value already named as a branch's value would be renamed (`t__body0`): the
    renaming picks another, and the branch reads what it read (it read `t` and `t__body0`)."""
    import onnx.parser

    model = onnx.parser.parse_model("""
    <ir_version: 8, opset_import: ["" : 18]>
    g (float[1, 4] x, bool[1] c) => (float[1, 4] y) {
        t__body0 = Relu (x)
        y = If (c) <
            then_branch = tb () => (float[1, 4] o) { t = Neg (x)
                o = Add (t, t__body0) },
            else_branch = eb () => (float[1, 4] o) { t = Sigmoid (x)
                o = Identity (t) }
        >
    }""")
    loaded = load_model(model).model
    then = next(a.g for a in loaded.graph.node[1].attribute if a.name == "then_branch")
    assert [list(n.input) for n in then.node] == [["x"], ["t", "t__body0"]]


def test_a_fused_node_holding_a_body_keeps_its_place_among_the_bodies():
    """An ONNX Runtime node with a shape function that also holds a graph attribute is not
    given one: the bodies' shapes are copied back by their order, and the If's branch outputs
    keep their own names (`o_else` was written over by `o_then`)."""
    from onnx import TensorProto, helper, numpy_helper

    branch = lambda op, out: helper.make_graph(  # noqa: E731
        [helper.make_node(op, ["f"], [out + "_t"]), helper.make_node("Relu", [out + "_t"], [out])], "b", [],
        [helper.make_tensor_value_info(out, TensorProto.FLOAT, [1, 4])])
    junk = helper.make_graph([helper.make_node("Neg", ["f"], ["jo"])], "junk", [],
                             [helper.make_tensor_value_info("jo", TensorProto.FLOAT, [1, 4])])
    nodes = [helper.make_node("QLinearSigmoid", ["xq", "s", "z", "s", "z"], ["yq"], domain="com.microsoft", junk=junk),
             helper.make_node("If", ["c"], ["y"], then_branch=branch("Neg", "o_then"),
                              else_branch=branch("Sigmoid", "o_else"))]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("xq", TensorProto.UINT8, [1, 4]),
                     helper.make_tensor_value_info("f", TensorProto.FLOAT, [1, 4]),
                     helper.make_tensor_value_info("c", TensorProto.BOOL, [1])],
        [helper.make_tensor_value_info("yq", TensorProto.UINT8, [1, 4]),
         helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])],
        [numpy_helper.from_array(np.array(0.1, np.float32), "s"), numpy_helper.from_array(np.array(128, np.uint8), "z")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid("com.microsoft", 1)],
                              ir_version=8)
    loaded = load_model(model).model
    branches = {a.name: a.g for a in loaded.graph.node[1].attribute}
    assert [o.name for o in branches["else_branch"].output] == ["o_else"]
    assert [o.name for o in branches["then_branch"].output] == ["o_then"]
