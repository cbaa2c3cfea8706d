"""Shape arguments computed in floating point, and a FLOPs total that leaves compute out.

TorchScript exports `torch.arange(T, dtype=torch.float32)` (rotary embeddings) as a `Range` of
a `Cast` to float of the sequence length: its length, and the shapes and FLOPs after it, are
found at concrete input shapes, as ONNX Runtime computes them. A total that leaves compute of
unknown size out says it is a lower bound, as a block's cell does.
"""

import numpy as np
import onnx
import onnx.parser
import onnxruntime as ort
import pytest

from graphaudit.analyses.flops import count_flops
from graphaudit.graph.build import build_graph
from graphaudit.load.inference import infer_at
from graphaudit.load.model import load_model
from graphaudit.report.static_text import render_text

from support.text_graphs import audit, graph


def positions(limit: str, start: str = "0.0", delta: str = "1.0", to: int = onnx.TensorProto.FLOAT) -> str:
    """A graph whose output `r` is Range(start, limit, delta), `t` the length of its input (as float)."""
    kind = {onnx.TensorProto.FLOAT: "float", onnx.TensorProto.DOUBLE: "double"}[to]
    return f"""
    <ir_version: 8, opset_import: ["" : 17]>
    g (float[T] x) => ({kind}[N] r) {{
        n = Shape (x)
        zero = Constant <value = int64 {{0}}> ()
        length = Gather <axis = 0> (n, zero)
        t = Cast <to = {to}> (length)
        start = Constant <value = {kind} {{{start}}}> ()
        delta = Constant <value = {kind} {{{delta}}}> ()
        two = Constant <value = {kind} {{2.0}}> ()
        limit = {limit}
        r = Range (start, limit, delta)
    }}"""


def ort_length(model: onnx.ModelProto, size: int) -> int:
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return len(session.run(None, {"x": np.zeros(size, np.float32)})[0])


@pytest.mark.parametrize("size, limit, start, delta, to", [
    (24, "Identity (t)", "0.0", "1.0", onnx.TensorProto.FLOAT),  # torch.arange(T, dtype=torch.float32)
    (7, "Div (t, two)", "0.0", "1.0", onnx.TensorProto.FLOAT),  # 3.5: four positions
    (5, "Sub (t, two)", "7.0", "1.0", onnx.TensorProto.FLOAT),  # limit below start: none
    (6, "Neg (t)", "0.0", "-1.5", onnx.TensorProto.FLOAT),  # counting down
    (5, "Identity (t)", "0.5", "0.25", onnx.TensorProto.FLOAT),
    (3, "Identity (t)", "0.1", "0.1", onnx.TensorProto.DOUBLE),
])
def test_a_range_of_a_length_cast_to_float_has_the_length_onnx_runtime_gives(size, limit, start, delta, to):
    model = onnx.parser.parse_model(positions(limit, start, delta, to))
    onnx.checker.check_model(model)
    loaded = load_model(model)
    before = loaded.model.SerializeToString()
    known = infer_at(loaded.model, {"x": (size,)})
    assert known["r"] == (ort_length(model, size),)
    assert loaded.model.SerializeToString() == before  # folded on a copy


@pytest.mark.parametrize("size, start, delta, runtime", [(3, "0.1", "0.1", 29), (2, "0.3", "0.1", 17),
                                                         (3, "0.2", "0.7", 5)])
def test_a_float_range_whose_length_depends_on_rounding_stays_unknown(size, start, delta, runtime):
    # ONNX's inference rounds limit - start to float (30, 18 and 4 positions), ONNX Runtime keeps
    # it in double: no length is given rather than a wrong one
    model = onnx.parser.parse_model(positions("Identity (t)", start, delta))
    assert ort_length(model, size) == runtime
    assert "r" not in infer_at(load_model(model).model, {"x": (size,)})


@pytest.mark.parametrize("limit, why", [
    ("Sqrt (t)", "Sqrt's last bit is the library's: not computed here"),
    ("Cast <to = 1> (most)", "a value of the input: never computed"),
])
def test_a_range_of_what_is_not_exactly_a_shape_computation_stays_unknown(limit, why):
    text = positions(limit).replace("limit = ", "most = ReduceMax <keepdims = 0> (x)\n        limit = ")
    loaded = load_model(onnx.parser.parse_model(text))
    assert "r" not in infer_at(loaded.model, {"x": (9,)}), why


ROTARY = """
        ["/model/layers.@/attn/Shape"] n@ = Shape (x@)
        ["/model/layers.@/attn/Constant"] zero@ = Constant <value = int64 {0}> ()
        ["/model/layers.@/attn/Gather"] t@ = Gather <axis = 0> (n@, zero@)
        ["/model/layers.@/attn/Cast"] tf@ = Cast <to = 1> (t@)
        ["/model/layers.@/attn/Constant_1"] s@ = Constant <value = float {0.0}> ()
        ["/model/layers.@/attn/Constant_2"] d@ = Constant <value = float {1.0}> ()
        ["/model/layers.@/attn/Range"] pos@ = Range (s@, LIMIT, d@)
        ["/model/layers.@/attn/Einsum"] ang@ = Einsum <equation = "i,j->ij"> (pos@, "model.layers.@.attn.inv_freq")
        ["/model/layers.@/Add"] x@+1 = Add (x@, ang@)
"""
ROTARY_W = 'float[2] "model.layers.@.attn.inv_freq" = {1.0, 0.01}'
T = 9
OUTER = 2 * T * 2  # the [T] x [2] outer product, counted as Einsum's multiply-adds


def test_the_outer_product_of_rotary_positions_is_counted():
    report = audit(graph([ROTARY.replace("LIMIT", "tf@")] * 2, [ROTARY_W] * 2), shapes={"x0": (T, 2)})
    assert [(b.flops, b.uncounted) for b in report.blocks] == [(OUTER, 0), (OUTER, 0)]
    assert report.flops.total == 2 * OUTER and report.flops.count.unknown_shape == ()
    assert "FLOPs: 72 in total, 0 skippable" in render_text(report)


def test_the_same_graph_counted_by_count_flops_with_infer_at():
    loaded = load_model(onnx.parser.parse_model(graph([ROTARY.replace("LIMIT", "tf@")], [ROTARY_W])))
    mg, shapes = build_graph(loaded.model), {"x0": (T, 2)}
    assert count_flops(mg, shapes).unknown_shape == ("/model/layers.0/attn/Einsum",)
    count = count_flops(mg, shapes, infer_at(loaded.model, shapes))
    assert count.unknown_shape == () and count.total == OUTER


def test_a_total_that_leaves_compute_of_unknown_size_out_says_it_is_a_lower_bound():
    # block 1's positions run to the square root of T: no shape found, its Einsum not counted
    unsized = ROTARY.replace("LIMIT", "root@").replace(
        '["/model/layers.@/attn/Range"]', '["/model/layers.@/attn/Sqrt"] root@ = Sqrt (tf@)\n'
                                          '        ["/model/layers.@/attn/Range"]')
    report = audit(graph([ROTARY.replace("LIMIT", "tf@"), unsized], [ROTARY_W] * 2), shapes={"x0": (T, 2)})
    assert [(b.flops, b.uncounted) for b in report.blocks] == [(OUTER, 0), (0, 1)]
    out = render_text(report)
    assert "model.layers.1  always     ≥ 0" in out  # the block's cell ...
    assert "FLOPs: ≥ 36 in total (without 1 compute node of unknown size), 0 skippable" in out  # ... and the total
    assert "not counted, size unknown (value-dependent or not inferred): 1 nodes, e.g. /model/layers.1/attn/Einsum" in out
    doc = report.to_json()["flops"]
    assert doc["total"] == OUTER and doc["unknown_shape_nodes"] == ["/model/layers.1/attn/Einsum"]
    assert doc["counted_as"] == ["without 1 compute node of unknown size"]
    assert doc["note"] == "the most expensive run at these shapes: without 1 compute node of unknown size"
