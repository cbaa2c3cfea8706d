"""Shapes through ONNX Runtime's fused operators (graphaudit.load.contrib_shapes): a model that ONNX
Runtime's transformer optimizer fused keeps its shapes, and so its FLOPs, past the first
com.microsoft node; the shapes agree with what ONNX Runtime computes; the loaded model keeps
its own nodes; outputs whose shape cannot be told stay unknown."""

import numpy as np
import onnx
import onnx.parser
import onnxruntime as ort
import pytest

from graphaudit.analyses.flops import count_flops
from graphaudit.errors import GraphAuditError
from graphaudit.graph.build import build_graph
from graphaudit.load.model import load_model

FUSED = """
    <ir_version: 8, opset_import: ["" : 18, "com.microsoft" : 1]>
    g (float[B, S, 8] x) => (float[B, S, 4] y) <float[16, 8] w1 = {WEIGHTS_128}, float[8] gamma = {ONES_8},
        float[8] beta = {ZEROS_8}, float[8, 24] qkv = {WEIGHTS_192}, float[24] qkv_bias = {ZEROS_24},
        float[8, 8] w2 = {WEIGHTS_64}, float[8, 4] w3 = {WEIGHTS_32}> {
        h = com.microsoft.FusedMatMul <transB = 1, alpha = 1.0> (x, w1)
        a, b = Split <axis = -1, num_outputs = 2> (h)
        g = com.microsoft.BiasGelu (a, beta)
        n, mean, inv, sum = com.microsoft.SkipLayerNormalization <epsilon = 1e-5> (g, x, gamma, beta)
        att = com.microsoft.Attention <num_heads = 2> (n, qkv, qkv_bias)
        f = com.microsoft.FastGelu (att)
        m = MatMul (f, w2)
        r = com.microsoft.SkipSimplifiedLayerNormalization <epsilon = 1e-5> (m, n, gamma)
        y = MatMul (r, w3)
    }"""


def _filled(text: str) -> str:
    rng = np.random.default_rng(0)
    for token, size in (("WEIGHTS_128", 128), ("WEIGHTS_192", 192), ("WEIGHTS_64", 64), ("WEIGHTS_32", 32)):
        text = text.replace(token, ", ".join(f"{v:.3f}" for v in rng.standard_normal(size) * 0.3))
    for token, value, size in (("ONES_8", 1.0, 8), ("ZEROS_8", 0.0, 8), ("ZEROS_24", 0.0, 24)):
        text = text.replace(token, ", ".join([str(value)] * size))
    return text


@pytest.fixture(scope="module")
def fused():
    return onnx.parser.parse_model(_filled(FUSED))


def test_shapes_flow_through_fused_operators_as_onnx_runtime_computes_them(fused):
    loaded = load_model(fused)
    mg = build_graph(loaded.model)
    shapes = {r.name: info.shape for r, info in mg.tensors.items()}
    assert shapes["h"] == ("B", "S", 16) and shapes["g"] == ("B", "S", 8) and shapes["att"] == ("B", "S", 8)
    assert shapes["y"] == ("B", "S", 4)
    names = ["h", "g", "n", "sum", "att", "f", "m", "r", "y"]
    probe = onnx.ModelProto()
    probe.CopyFrom(fused)
    probe.graph.output.extend(onnx.helper.make_empty_tensor_value_info(n) for n in names[:-1])
    session = ort.InferenceSession(probe.SerializeToString(), providers=["CPUExecutionProvider"])
    run = dict(zip([o.name for o in session.get_outputs()],
                   session.run(None, {"x": np.ones((2, 5, 8), np.float32)})))
    bound = {"B": 2, "S": 5}
    for name in names:
        assert tuple(bound.get(d, d) for d in shapes[name]) == run[name].shape, name
    # the loaded model keeps its own nodes and opsets: only shapes were added
    assert [n.op_type for n in loaded.model.graph.node] == [n.op_type for n in fused.graph.node]
    assert not loaded.model.functions and "graphaudit.shapes" not in {o.domain for o in loaded.model.opset_import}


def test_flops_of_a_fused_model_are_counted(fused):
    mg = build_graph(load_model(fused).model)
    count = count_flops(mg, {"x": (2, 5, 8)})
    assert count.unknown_shape == ()
    rows = 2 * 5
    matmuls = 2 * rows * (8 * 16 + 8 * 24 + 8 * 8 + 8 * 4)
    assert count.total >= matmuls  # FusedMatMul, Attention's projection, both MatMuls; attention itself on top


def test_attention_with_a_past_is_shaped_and_its_present_length_left_to_the_declaration():
    # GPT-2 fused by ONNX Runtime with a KV cache: the output is shaped, so what follows is counted;
    # the present cache's length (past + new positions) is left unknown, never made up, so the
    # graph output's declared length stands
    model = onnx.parser.parse_model(_filled("""
    <ir_version: 8, opset_import: ["" : 18, "com.microsoft" : 1]>
    g (float[B, S, 8] x, float[2, B, 2, P, 4] past) => (float[B, S, 8] y, float[2, B, 2, T, 4] present)
        <float[8, 24] qkv = {WEIGHTS_192}, float[24] qkv_bias = {ZEROS_24}, float[8, 8] w2 = {WEIGHTS_64}> {
        att, present = com.microsoft.Attention <num_heads = 2, unidirectional = 1> (x, qkv, qkv_bias, , past)
        y = MatMul (att, w2)
    }"""))
    mg = build_graph(load_model(model).model)
    shapes = {r.name: info.shape for r, info in mg.tensors.items()}
    assert shapes["att"] == ("B", "S", 8) and shapes["present"] == (2, "B", 2, "T", 4)
    b, s, p = 2, 3, 5
    feeds = {"x": np.ones((b, s, 8), np.float32), "past": np.ones((2, b, 2, p, 4), np.float32)}
    run = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    assert run[0].shape == (b, s, 8) and run[1].shape == (2, b, 2, p + s, 4)
    count = count_flops(mg, {"x": (b, s, 8), "past": (2, b, 2, p, 4)})
    assert count.unknown_shape == ()
    assert count.total == 2 * b * s * 8 * 24 + 4 * b * s * (p + s) * 8 + 2 * b * s * 8 * 8


def test_a_four_bit_matmul_is_shaped_by_its_n():
    rng = np.random.default_rng(1)
    packed = onnx.numpy_helper.from_array(rng.integers(0, 255, (4, 1, 8)).astype(np.uint8), "packed")
    scales = onnx.numpy_helper.from_array(np.full(4, 0.1, np.float32), "scales")
    node = onnx.helper.make_node("MatMulNBits", ["x", "packed", "scales"], ["h"], domain="com.microsoft",
                                 K=16, N=4, bits=4, block_size=16)
    graph = onnx.helper.make_graph(
        [node, onnx.helper.make_node("Relu", ["h"], ["y"])], "g",
        [onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["B", "S", 16])],
        [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, ["B", "S", 4])], [packed, scales])
    model = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 17),
                                                         onnx.helper.make_opsetid("com.microsoft", 1)])
    mg = build_graph(load_model(model).model)
    assert {r.name: info.shape for r, info in mg.tensors.items()}["h"] == ("B", "S", 4)  # inferred, not declared
    (y,) = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, {"x": np.ones((3, 2, 16), np.float32)})
    assert y.shape == (3, 2, 4)
    assert count_flops(mg, {"x": (3, 2, 16)}).total == 2 * 6 * 16 * 4


def test_quantized_and_fused_conv_gemm_nodes_are_shaped_as_onnx_runtime_shapes_them():
    rng = np.random.default_rng(2)
    w8 = onnx.numpy_helper.from_array(rng.integers(-5, 5, (8, 6)).astype(np.int8), "w8")
    scale = onnx.numpy_helper.from_array(np.array(0.05, np.float32), "scale")
    kernel = onnx.numpy_helper.from_array(rng.standard_normal((4, 3, 3, 3)).astype(np.float32), "kernel")
    gw = onnx.numpy_helper.from_array(rng.standard_normal((5, 6)).astype(np.float32), "gw")
    ms = dict(domain="com.microsoft")
    nodes = [
        onnx.helper.make_node("DynamicQuantizeMatMul", ["x", "w8", "scale"], ["q"], **ms),
        onnx.helper.make_node("FusedGemm", ["q", "gw"], ["g"], transB=1, alpha=1.0, activation="Relu", **ms),
        onnx.helper.make_node("FusedConv", ["img", "kernel"], ["c"], strides=[2, 2], pads=[1, 1, 1, 1],
                              activation="Relu", **ms),
        onnx.helper.make_node("Relu", ["g"], ["y"]), onnx.helper.make_node("Relu", ["c"], ["z"]),
    ]
    graph = onnx.helper.make_graph(
        nodes, "g",
        [onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["N", 8]),
         onnx.helper.make_tensor_value_info("img", onnx.TensorProto.FLOAT, ["N", 3, 9, 9])],
        [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, ["N", 5]),
         onnx.helper.make_tensor_value_info("z", onnx.TensorProto.FLOAT, ["N", 4, 5, 5])], [w8, scale, kernel, gw])
    model = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 17),
                                                         onnx.helper.make_opsetid("com.microsoft", 1)])
    mg = build_graph(load_model(model).model)
    shapes = {r.name: info.shape for r, info in mg.tensors.items()}
    probe = onnx.ModelProto()
    probe.CopyFrom(model)
    probe.graph.output.extend(onnx.helper.make_empty_tensor_value_info(n) for n in ("q", "g", "c"))
    session = ort.InferenceSession(probe.SerializeToString(), providers=["CPUExecutionProvider"])
    run = dict(zip([o.name for o in session.get_outputs()], session.run(
        None, {"x": np.ones((2, 8), np.float32), "img": np.ones((2, 3, 9, 9), np.float32)})))
    for name in ("q", "g", "c"):
        assert tuple(2 if d == "N" else d for d in shapes[name]) == run[name].shape, name
    assert count_flops(mg, {"x": (2, 8), "img": (2, 3, 9, 9)}).unknown_shape == ()


@pytest.mark.parametrize("packed", [False, True], ids=["qkv-apart", "qkv-packed"])
@pytest.mark.parametrize("past", [0, 3])
def test_group_query_attention_output_and_caches(past, packed):
    # a decoder layer as ONNX Runtime GenAI writes it: GQA (4 query heads, 2 kv heads of size 8),
    # fed separate query, key and value or one packed projection, then the output projection;
    # with and without a past cache
    rng = np.random.default_rng(3)
    wo = onnx.numpy_helper.from_array(rng.standard_normal((32, 32)).astype(np.float32), "wo")
    widths = {"qkv": 64} if packed else {"q": 32, "k": 16, "v": 16}
    inputs = [*(onnx.helper.make_tensor_value_info(n, onnx.TensorProto.FLOAT, ["B", "S", w]) for n, w in widths.items()),
              onnx.helper.make_tensor_value_info("seqlens_k", onnx.TensorProto.INT32, ["B"]),
              onnx.helper.make_tensor_value_info("total", onnx.TensorProto.INT32, [])]
    names = ["qkv", "", "", "", "", "seqlens_k", "total"] if packed else ["q", "k", "v", "", "", "seqlens_k", "total"]
    if past:
        inputs += [onnx.helper.make_tensor_value_info(n, onnx.TensorProto.FLOAT, ["B", 2, "P", 8])
                   for n in ("past_key", "past_value")]
        names[3:5] = ["past_key", "past_value"]
    nodes = [onnx.helper.make_node("GroupQueryAttention", names, ["att", "present_key", "present_value"],
                                   domain="com.microsoft", num_heads=4, kv_num_heads=2),
             onnx.helper.make_node("MatMul", ["att", "wo"], ["y"])]
    graph = onnx.helper.make_graph(
        nodes, "g", inputs,
        [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, ["B", "S", 32]),
         onnx.helper.make_tensor_value_info("present_key", onnx.TensorProto.FLOAT, ["B", 2, "T", 8]),
         onnx.helper.make_tensor_value_info("present_value", onnx.TensorProto.FLOAT, ["B", 2, "T", 8])], [wo])
    model = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 17),
                                                         onnx.helper.make_opsetid("com.microsoft", 1)])
    mg = build_graph(load_model(model).model)
    shapes = {r.name: info.shape for r, info in mg.tensors.items()}
    assert shapes["att"] == ("B", "S", 32)  # inferred: only the graph outputs are declared
    assert shapes["present_key"] == ("B", 2, "T", 8)  # the declared length stands: inference leaves it unknown
    s, b = 5, 1 if past else 2  # ORT takes a past with more than one new token at batch 1 only
    feeds = {**{n: np.ones((b, s, w), np.float32) for n, w in widths.items()},
             "seqlens_k": np.full(b, past + s - 1, np.int32), "total": np.array(past + s, np.int32)}
    if past:
        feeds.update(past_key=np.ones((b, 2, past, 8), np.float32), past_value=np.ones((b, 2, past, 8), np.float32))
    run = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    assert run[0].shape == (b, s, 32) and run[1].shape == (b, 2, past + s, 8)
    count = count_flops(mg, {n: v.shape for n, v in feeds.items()})
    assert count.unknown_shape == ()
    assert count.total == 2 * b * s * 32 * 32 + 4 * b * s * (past + s) * 32  # projection; attention over every key


def test_onnx_runtime_operators_in_the_default_domain_pass_the_check():
    # ONNX Runtime GenAI writes SimplifiedLayerNormalization (RMSNorm) in the default domain, where
    # ONNX defines no such operator: the checker refused every such model; ONNX Runtime runs it
    def model(op):
        graph = onnx.helper.make_graph(
            [onnx.helper.make_node(op, ["x", "scale"], ["n"], epsilon=1e-5, axis=-1),
             onnx.helper.make_node("MatMul", ["n", "w"], ["y"])], "g",
            [onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["B", 8])],
            [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, ["B", 4])],
            [onnx.numpy_helper.from_array(np.ones(8, np.float32), "scale"),
             onnx.numpy_helper.from_array(np.ones((8, 4), np.float32), "w")])
        return onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 22)])

    rms = model("SimplifiedLayerNormalization")
    loaded = load_model(rms)
    assert [n.domain for n in loaded.model.graph.node] == ["", ""]  # the model itself is not relabelled
    mg = build_graph(loaded.model)
    assert {r.name: info.shape for r, info in mg.tensors.items()}["n"] == ("B", 8)
    (y,) = ort.InferenceSession(rms.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, {"x": np.ones((3, 8), np.float32)})
    assert y.shape == (3, 4)
    with pytest.raises(GraphAuditError, match="ONNX checker's objection: No Op registered for RootMeanSquareNorm"):
        load_model(model("RootMeanSquareNorm"))  # no runtime has it: still refused


def test_an_onnx_runtime_operator_an_inlined_function_brings_is_shaped_too():
    # inside a local function's body, the operator is put apart for the checker too (it was left
    # in the default domain, the checker objected again, and the loader recursed to Python's
    # limit); inlined, the function's node is shaped as one of the graph's own
    model = onnx.parser.parse_model("""
    <ir_version: 10, opset_import: ["" : 22, "local" : 1]>
    g (float[B, 8] x, float[8] scale) => (float[B, 8] y) {
        y = local.Norm (x, scale)
    }
    <domain: "local", opset_import: ["" : 22]>
    Norm (a, s) => (n) {
        n = SimplifiedLayerNormalization <epsilon: float = 1e-5, axis: int = -1> (a, s)
    }""")
    loaded = load_model(model)
    assert loaded.inlined_calls == 1
    mg = build_graph(loaded.model)
    (norm,) = [n for n in mg.nodes.values() if n.op_type == "SimplifiedLayerNormalization"]
    assert mg.tensors[norm.outputs[0]].shape == ("B", 8)


def test_inference_that_refuses_the_shape_functions_runs_again_without_them(fused, monkeypatch):
    # should ONNX's inference ever refuse a shape function (an onnx release stricter about
    # function bodies), the model loads with the shapes inference finds without them, as before
    import graphaudit.load.inference as load
    from graphaudit.load.contrib_shapes import DOMAIN

    real = load.shape_inference.infer_shapes

    def strict(model, **options):
        if any(f.domain == DOMAIN for f in model.functions):
            raise onnx.shape_inference.InferenceError("function bodies refused")
        return real(model, **options)

    monkeypatch.setattr(load.shape_inference, "infer_shapes", strict)
    loaded = load_model(fused)
    assert loaded.shape_inference_ok
    shapes = {r.name: info.shape for r, info in build_graph(loaded.model).tensors.items()}
    assert shapes["y"] == ("B", "S", 4)  # declared
    assert shapes["h"] is None  # past the fused node, as before the shape functions


@pytest.mark.parametrize("layout", ["apart", "packed-kv", "packed-qkv"])
def test_multi_head_attention_on_separate_or_packed_inputs_is_shaped(layout):
    # MultiHeadAttention (2 heads of size 4) on separate query, key and value; on a query with key
    # and value packed (batch, positions, heads, 2, head size); on query, key and value packed in
    # one (batch, seq, heads, 3, head size), as ONNX Runtime's operator documentation lays them
    # out; then the output projection
    rng = np.random.default_rng(5)
    wo = onnx.numpy_helper.from_array(rng.standard_normal((8, 8)).astype(np.float32), "wo")
    make = onnx.helper.make_tensor_value_info
    if layout == "apart":
        inputs, names = [make(n, onnx.TensorProto.FLOAT, ["B", "S" if n == "q" else "L", 8]) for n in "qkv"], ["q", "k", "v"]
    elif layout == "packed-kv":
        inputs = [make("q", onnx.TensorProto.FLOAT, ["B", "S", 8]), make("kv", onnx.TensorProto.FLOAT, ["B", "L", 2, 2, 4])]
        names = ["q", "kv"]
    else:
        inputs, names = [make("qkv", onnx.TensorProto.FLOAT, ["B", "S", 2, 3, 4])], ["qkv"]
    nodes = [onnx.helper.make_node("MultiHeadAttention", names, ["att"], domain="com.microsoft", num_heads=2),
             onnx.helper.make_node("MatMul", ["att", "wo"], ["y"])]
    graph = onnx.helper.make_graph(nodes, "g", inputs, [make("y", onnx.TensorProto.FLOAT, ["B", "S", 8])], [wo])
    model = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 17),
                                                         onnx.helper.make_opsetid("com.microsoft", 1)])
    mg = build_graph(load_model(model).model)
    shapes = {r.name: info.shape for r, info in mg.tensors.items()}
    assert shapes["att"] == ("B", "S", 8)  # inferred: only the graph output is declared
    b, s, length = 2, 3, (3 if layout == "packed-qkv" else 6)
    feeds = {"q": (b, s, 8), "k": (b, length, 8), "v": (b, length, 8), "kv": (b, length, 2, 2, 4),
             "qkv": (b, s, 2, 3, 4)}
    feeds = {i.name: rng.standard_normal(feeds[i.name]).astype(np.float32) for i in inputs}
    if layout == "apart":  # ONNX Runtime's CPU kernel takes no packed inputs (its CUDA one does)
        run = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
        assert run[0].shape == (b, s, 8)
    count = count_flops(mg, {n: v.shape for n, v in feeds.items()})
    assert count.unknown_shape == ()
    assert count.total == 4 * b * s * length * 8 + 2 * b * s * 8 * 8  # scores and mix over every key; projection


@pytest.mark.parametrize("node, dims, inits", [
    (onnx.helper.make_node("FusedMatMul", ["x"], ["y"], domain="com.microsoft"), ["N", 4], ()),
    (onnx.helper.make_node("Attention", ["x"], ["y"], domain="com.microsoft", num_heads=1), ["N", 5, 4], ()),
    (onnx.helper.make_node("Attention", ["x", "w"], ["y"], domain="com.microsoft", num_heads=1, qkv_hidden_sizes=[4]),
     ["N", 5, 4], (("w", np.zeros((4, 12), np.float32)),)),
    (onnx.helper.make_node("MatMulNBits", ["x", "wq", "sc"], ["y"], domain="com.microsoft", K="four", N=4, bits=4,
                           block_size=16), ["N", 4],
     (("wq", np.zeros((4, 1, 8), np.uint8)), ("sc", np.ones((4,), np.float32)))),
    (onnx.helper.make_node("GroupQueryAttention", ["x", "", "", "", "", "sl", "tl"], ["y"], domain="com.microsoft",
                           num_heads="a", kv_num_heads=1), ["N", 5, 12],
     (("sl", np.zeros((1,), np.int32)), ("tl", np.array(5, np.int32)))),
], ids=["FusedMatMul-one-input", "Attention-one-input", "Attention-short-qkv-sizes", "MatMulNBits-text-K",
        "GQA-text-heads"])
def test_a_fused_node_not_as_onnx_runtime_defines_it_is_left_unshaped(node, dims, inits, capsys):
    """Too few inputs or an attribute of another type (the checker does not know these operators):
    no shape function is made for it, and the audit goes on; it was a traceback."""

    graph = onnx.helper.make_graph([node], "g", [onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, dims)],
                                   [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, ["N", 4])],
                                   [onnx.numpy_helper.from_array(a, n) for n, a in inits])
    model = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 18),
                                                         onnx.helper.make_opsetid("com.microsoft", 1)], ir_version=8)
    mg = build_graph(load_model(model).model)
    assert mg.tensors[mg.find_tensor("y")].shape == ("N", 4)  # as declared, nothing inferred past the node
