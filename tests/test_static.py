"""Execution verdicts on tiny graphs in ONNX text syntax: one graph per verdict and per kind
of control flow, coefficients from each source, the `graphaudit static` command."""

import json

import numpy as np
import onnx
import onnx.parser
import pytest
from onnx.reference import ReferenceEvaluator

from graphaudit.analyses.static import audit_static
from graphaudit.cli import main
from graphaudit.coefficients import Coefficient, metadata_entry
from graphaudit.errors import GraphAuditError, UsageError
from graphaudit.load import load_model

EYE = "{1.0, 0.0, 0.0, 1.0}"


def model_of(text: str, declared=()) -> onnx.ModelProto:
    model = onnx.parser.parse_model(text)
    if declared:
        model.metadata_props.append(metadata_entry(declared))
    onnx.checker.check_model(model)
    return model


def audit(text: str, declared=(), **options):
    return audit_static(load_model(model_of(text, declared)), **options)


def verdicts(report) -> list[str]:
    return [b.verdict for b in report.blocks]


def graph(blocks: list[str], weights: list[str], inputs="float[T, 2] x0", opsets='"" : 17') -> str:
    """Blocks in order, block i reading x{i} and writing x{i+1}; `@` stands for the number."""
    body = "\n".join(b.replace("@+1", str(i + 1)).replace("@", str(i)) for i, b in enumerate(blocks))
    inits = ", ".join(w.replace("@", str(i)) for i, ws in enumerate(weights) for w in [ws] if w)
    return f"""
    <ir_version: 8, opset_import: [{opsets}]>
    g ({inputs}) => (float[T, 2] y) <{inits}> {{
        {body}
        ["/model/head/Identity"] y = Identity (x{len(blocks)})
    }}"""


DENSE = """
        ["/model/layers.@/fc/MatMul"] h@ = MatMul (x@, "model.layers.@.fc.weight")
        ["/model/layers.@/Add"] x@+1 = Add (x@, h@)
"""
DENSE_W = f'float[2, 2] "model.layers.@.fc.weight" = {EYE}'

GATED = """
        ["/model/layers.@/fc/MatMul"] h@ = MatMul (x@, "model.layers.@.fc.weight")
        ["/model/layers.@/gate/MatMul"] gl@ = MatMul (x@, "model.layers.@.gate.weight")
        ["/model/layers.@/gate/Sigmoid"] "gate.@" = Sigmoid (gl@)
        ["/model/layers.@/Mul"] m@ = Mul ("gate.@", h@)
        ["/model/layers.@/Add"] x@+1 = Add (x@, m@)
"""
GATED_W = DENSE_W + f', float[2, 2] "model.layers.@.gate.weight" = {EYE}'
GATE_META = [Coefficient(f"gate.{i}", "gate", i, ("token", "feature")) for i in range(2)]


def test_dense_blocks_always_run():
    report = audit(graph([DENSE] * 3, [DENSE_W] * 3))
    assert verdicts(report) == ["always"] * 3
    assert not report.conditional_execution and not report.dynamic
    assert report.coefficients == ()
    assert report.contradiction("static") is None
    assert "expected dynamic execution" in report.contradiction("dynamic")


def test_gated_blocks_with_declared_coefficients():
    report = audit(graph([GATED] * 2, [GATED_W] * 2), GATE_META)
    assert verdicts(report) == ["gated", "gated"]
    assert [(c.tensor, c.source) for c in report.coefficients] == [("gate.0", "metadata"), ("gate.1", "metadata")]
    ev = report.blocks[1].evidence[0]
    assert (ev.kind, ev.op, ev.tensor) == ("gate", "Mul", "gate.1")
    assert not report.conditional_execution and not report.dynamic


def test_coefficients_detected_when_nothing_declares_them():
    report = audit(graph([GATED] * 2, [GATED_W] * 2, inputs="float[batch, seq, 2] x0").replace(
        "float[T, 2] y", "float[batch, seq, 2] y"))
    assert [(c.tensor, c.family, c.layer, c.axes, c.source) for c in report.coefficients] == [
        ("gate.0", "gate", 0, ("batch", "token", "slot"), "detected"),
        ("gate.1", "gate", 1, ("batch", "token", "slot"), "detected"),
    ]
    assert verdicts(report) == ["gated", "gated"]


def test_coefficients_named_by_the_user_and_unknown_names():
    text = graph([GATED] * 2, [GATED_W] * 2)
    report = audit(text, coefficients=("gate.*",))
    assert [(c.tensor, c.family, c.layer, c.source) for c in report.coefficients] == [
        ("gate.0", "gate", 0, "user"), ("gate.1", "gate", 1, "user")]
    with pytest.raises(UsageError, match=r"'gates\.1'.*closest: gate\.1"):
        audit(text, coefficients=("gates.1",))
    declared_and_named = audit(text, GATE_META[:1], coefficients=("gate.1",))
    assert [c.source for c in declared_and_named.coefficients] == ["metadata", "user"]


def test_metadata_naming_a_missing_tensor_is_an_error():
    with pytest.raises(GraphAuditError, match="'gate.7'"):
        audit(graph([GATED] * 2, [GATED_W] * 2), [Coefficient("gate.7", "gate", 7, ("token",))])


# -- control flow ----------------------------------------------------------------------------
CONDITIONS = {
    "value": """
        total = ReduceSum <keepdims = 0> (x1)
        zero = Constant <value = float {0.0}> ()
        go = Greater (total, zero)""",
    "const": """
        go = Constant <value = bool {1}> ()""",
    "shape": """
        s = Shape (x1)
        four = Constant <value = int64[1] {4}> ()
        big = Greater (s, four)
        first = Constant <value = int64[1] {0}> ()
        bigs = Gather (big, first)
        go = Squeeze (bigs)""",
}
SKIPPABLE = """
        ["/model/exit/If"] x2 = If (go) <
            then_branch = t () => (float[T, 2] same) { same = Identity (x1) },
            else_branch = e () => (float[T, 2] x2b) {
                ["/model/layers.1/fc/MatMul"] h1 = MatMul (x1, "model.layers.1.fc.weight")
                ["/model/layers.1/Add"] x2b = Add (x1, h1)
            }
        >
"""


@pytest.mark.parametrize("condition, verdict", [("value", "branch"), ("const", "always"), ("shape", "always")])
def test_if_is_dynamic_only_when_its_condition_depends_on_values(condition, verdict):
    report = audit(graph([DENSE, CONDITIONS[condition] + SKIPPABLE, DENSE], [DENSE_W] * 3))
    assert verdicts(report) == ["always", verdict, "always"]
    assert report.conditional_execution == (verdict == "branch")
    (control,) = report.controls
    assert control.op == "If" and control.dependence == condition
    if verdict == "branch":
        ev = report.blocks[1].evidence[0]
        assert (ev.kind, ev.node, ev.tensor, ev.dependence) == ("branch", "/model/exit/If", "go", "value")
        assert "else-branch" in ev.detail
        assert "If `/model/exit/If`" in report.contradiction("static")
    else:
        assert "not dynamic" in control.detail


def test_if_with_compute_in_both_branches_counts_each_branch():
    both = """
        ["/model/layers.1/If"] x2 = If (go) <
            then_branch = t () => (float[T, 2] x2a) {
                ["/model/layers.1/a/MatMul"] ha = MatMul (x1, "model.layers.1.fc.weight")
                ["/model/layers.1/a/Add"] x2a = Add (x1, ha)
            },
            else_branch = e () => (float[T, 2] x2b) {
                ["/model/layers.1/b/MatMul"] hb = MatMul (x1, "model.layers.1.fc.weight")
                ["/model/layers.1/b/MatMul_1"] x2b = MatMul (hb, "model.layers.1.fc.weight")
            }
        >
"""
    report = audit(graph([DENSE, CONDITIONS["value"] + both], [DENSE_W] * 2))
    assert verdicts(report) == ["always", "branch"]
    detail = report.blocks[1].evidence[0].detail
    assert detail.startswith("1 of the block's 3 compute nodes run only in the then-branch of If "
                             "`/model/layers.1/If` and 2 only in the else-branch of If `/model/layers.1/If`; ")


def test_nested_if_dynamic_inside_a_constant_one():
    inner = """
        ["/model/outer/If"] x2 = If (yes) <
            then_branch = t () => (float[T, 2] o) {
                ["/model/inner/If"] o = If (go) <
                    then_branch = t2 () => (float[T, 2] same) { same = Identity (x1) },
                    else_branch = e2 () => (float[T, 2] x2b) {
                        ["/model/layers.1/fc/MatMul"] h1 = MatMul (x1, "model.layers.1.fc.weight")
                        ["/model/layers.1/Add"] x2b = Add (x1, h1)
                    }
                >
            },
            else_branch = e () => (float[T, 2] o2) { o2 = Identity (x1) }
        >
"""
    report = audit(graph([DENSE, CONDITIONS["value"] + 'yes = Constant <value = bool {1}> ()' + inner],
                         [DENSE_W] * 2))
    assert verdicts(report) == ["always", "branch"]
    assert report.blocks[1].evidence[0].node == "/model/inner/If"
    assert {c.node: c.dependence for c in report.controls} == {"/model/outer/If": "const", "/model/inner/If": "value"}


LOOPED = """
        yes = Constant <value = bool {1}> ()
        ["/model/repeat/Loop"] x2 = Loop (n, yes, x1) <
            body = b (int64 i, bool c, float[T, 2] a) => (bool c_out, float[T, 2] a_out) {
                c_out = Identity (c)
                ["/model/layers.1/fc/MatMul"] h1 = MatMul (a, "model.layers.1.fc.weight")
                ["/model/layers.1/Add"] a_out = Add (a, h1)
            }
        >
"""
TRIPS = {
    "value": """
        total = ReduceSum <keepdims = 0> (x1)
        n = Cast <to = 7> (total)""",
    "shape": """
        s = Shape (x1)
        first = Constant <value = int64[1] {0}> ()
        t = Gather (s, first)
        n = Squeeze (t)""",
}


@pytest.mark.parametrize("trip, verdict", [("value", "branch"), ("shape", "always")])
def test_loop_trip_count(trip, verdict):
    report = audit(graph([DENSE, TRIPS[trip] + LOOPED], [DENSE_W] * 2))
    assert verdicts(report) == ["always", verdict]
    assert report.conditional_execution == (trip == "value")
    if verdict == "branch":
        ev = report.blocks[1].evidence[0]
        assert ev.kind == "loop" and "trip count depends on input values" in ev.detail


def test_loop_growing_by_a_value_dependent_count_gives_a_value_dependent_extent():
    grown = """
        yes = Constant <value = bool {1}> ()
        ["/model/layers.1/Loop"] x2 = Loop (n, yes, x1) <
            body = b (int64 i, bool c, float[K, 2] a) => (bool c_out, float[L, 2] a_out) {
                c_out = Identity (c)
                ["/model/layers.1/Concat"] a_out = Concat <axis = 0> (a, x1)
            }
        >
"""
    report = audit(graph([DENSE, TRIPS["value"] + grown, DENSE], [DENSE_W] * 3))
    assert verdicts(report) == ["always", "branch", "subset"]  # the block after reads a grown tensor
    ev = report.blocks[2].evidence[0]
    assert (ev.kind, ev.tensor, ev.size) == ("extent", "x2", "data-dependent")


def test_scan_over_tokens_is_not_dynamic():
    scanned = """
        start = Constant <value = float[2] {0.0, 0.0}> ()
        ["/model/layers.1/Scan"] last, x2 = Scan (start, x1) <
            num_scan_inputs = 1,
            body = b (float[2] acc, float[2] x) => (float[2] acc_out, float[2] seen) {
                ["/model/layers.1/Add"] acc_out = Add (acc, x)
                seen = Identity (acc_out)
            }
        >
"""
    report = audit(graph([DENSE, scanned], [DENSE_W] * 2))
    assert verdicts(report) == ["always", "always"]
    assert not report.conditional_execution
    assert report.controls[0].op == "Scan" and report.controls[0].dependence == "shape"


# -- routing -----------------------------------------------------------------------------------
ROUTE = """
        ["/model/layers.@/router/MatMul"] s2 = MatMul (x@, "model.layers.@.router.weight")
        axis1 = Constant <value = int64[1] {1}> ()
        ["/model/layers.@/router/Squeeze"] score = Squeeze (s2, axis1)
"""
PICK_CAPACITY = """
        k = Constant <value = int64[1] {2}> ()
        ["/model/layers.@/TopK"] top, idx = TopK <axis = 0> (score, k)
"""
PICK_NONZERO = """
        zero = Constant <value = float {0.0}> ()
        positive = Greater (score, zero)
        ["/model/layers.@/NonZero"] nz = NonZero (positive)
        flat = Constant <value = int64[1] {-1}> ()
        ["/model/layers.@/Reshape"] idx = Reshape (nz, flat)
"""
DISPATCH = """
        ["/model/layers.@/Gather"] sel = Gather <axis = 0> (x@, idx)
        ["/model/layers.@/expert/MatMul"] out = MatMul (sel, "model.layers.@.expert.weight")
        ["/model/layers.@/Unsqueeze"] idx2 = Unsqueeze (idx, axis1)
        ["/model/layers.@/ScatterND"] x@+1 = ScatterND (x@, idx2, out)
"""
MOE_W = (f'float[2, 1] "model.layers.@.router.weight" = {{1.0, 1.0}}, '
         f'float[2, 2] "model.layers.@.expert.weight" = {EYE}')


@pytest.mark.parametrize("pick, size", [(PICK_CAPACITY, "fixed (capacity)"), (PICK_NONZERO, "data-dependent")])
def test_subset_by_value_selection(pick, size):
    report = audit(graph([DENSE, ROUTE + pick + DISPATCH, DENSE], [DENSE_W, MOE_W, DENSE_W]))
    assert verdicts(report) == ["always", "subset", "always"]  # the block after the scatter is whole again
    ev = report.blocks[1].evidence[0]
    assert (ev.kind, ev.op, ev.node, ev.size) == ("selection", "Gather", "/model/layers.1/Gather", size)
    assert ("TopK" if pick is PICK_CAPACITY else "NonZero") in ev.detail
    assert report.data_dependent_compute and not report.conditional_execution and report.dynamic


def test_subset_graph_runs_in_the_reference_evaluator():
    model = model_of(graph([DENSE, ROUTE + PICK_NONZERO + DISPATCH], [DENSE_W, MOE_W]))
    x = np.array([[1.0, 2.0], [-3.0, -1.0], [0.5, 0.5]], dtype=np.float32)
    (y,) = ReferenceEvaluator(model).run(None, {"x0": x})
    assert y.shape == (3, 2)  # only the tokens with a positive score went through the expert


MASKED = """
        ["/model/layers.@/router/MatMul"] logits = MatMul (x@, "model.layers.@.router.weight")
        k1 = Constant <value = int64[1] {1}> ()
        ["/model/layers.@/router/TopK"] top, choice = TopK (logits, k1)
        e0 = Constant <value = int64 {0}> ()
        e1 = Constant <value = int64 {1}> ()
        is0 = Equal (choice, e0)
        is1 = Equal (choice, e1)
        m0 = Cast <to = 1> (is0)
        m1 = Cast <to = 1> (is1)
        ["/model/layers.@/experts.0/MatMul"] y0 = MatMul (x@, "model.layers.@.experts.0.weight")
        ["/model/layers.@/experts.1/MatMul"] y1 = MatMul (x@, "model.layers.@.experts.1.weight")
        ["/model/layers.@/experts.0/Mul"] w0 = Mul (y0, m0)
        ["/model/layers.@/experts.1/Mul"] w1 = Mul (y1, m1)
        ["/model/layers.@/Add"] mix = Add (w0, w1)
        ["/model/layers.@/Add_1"] x@+1 = Add (x@, mix)
"""
MASKED_W = (f'float[2, 2] "model.layers.@.router.weight" = {EYE}, '
            f'float[2, 2] "model.layers.@.experts.0.weight" = {EYE}, '
            f'float[2, 2] "model.layers.@.experts.1.weight" = {EYE}')


def test_densified_moe_is_masked_not_subset():
    report = audit(graph([DENSE, MASKED, DENSE], [DENSE_W, MASKED_W, DENSE_W]))
    assert verdicts(report) == ["always", "masked", "always"]
    ev = report.blocks[1].evidence[0]
    assert ev.kind == "routing mask" and ev.op == "Mul" and "TopK" in ev.detail
    assert not report.dynamic


CHOICE = """
        ["/model/layers.1/a/MatMul"] a1 = MatMul (x1, "model.layers.1.a.weight")
        ["/model/layers.1/b/MatMul"] b1 = MatMul (x1, "model.layers.1.b.weight")
        FILL
        ["/model/layers.1/Where"] x2 = Where (go, a1, OTHER)
"""
CHOICE_W = f'float[2, 2] "model.layers.@.a.weight" = {EYE}, float[2, 2] "model.layers.@.b.weight" = {EYE}'
FILLED = """
        sa = Shape (a1)
        ["/model/layers.1/Fill"] low = ConstantOfShape <value = float[1] {-10000.0}> (sa)
"""


@pytest.mark.parametrize("condition, other, verdict", [
    ("value", "b1", "masked"),  # both paths computed, one kept: a densified choice
    ("shape", "b1", "always"),  # decided by the input shape, like a causal mask
    ("value", "low", "always"),  # a filled branch, like the -inf of an attention mask
])
def test_where_choosing_between_computed_results(condition, other, verdict):
    choice = CHOICE.replace("OTHER", other).replace("FILL", FILLED if other == "low" else "")
    block = CONDITIONS[condition] + choice
    text = graph([DENSE, block, DENSE], [DENSE_W, CHOICE_W, DENSE_W])
    (y,) = ReferenceEvaluator(model_of(text)).run(None, {"x0": np.ones((3, 2), dtype=np.float32)})
    assert y.shape == (3, 2)
    report = audit(text)
    assert verdicts(report) == ["always", verdict, "always"]
    if verdict == "masked":
        ev = report.blocks[1].evidence[0]
        assert (ev.kind, ev.op, ev.tensor) == ("routing mask", "Where", "go")
        assert "`a1` and `b1`, both computed at full size" in ev.detail


DENSE_GATES = """
        ["/model/layers.@/router/MatMul"] logits = MatMul (x@, "model.layers.@.router.weight")
        ["/model/layers.@/router/Softmax"] probs = Softmax (logits)
        k1 = Constant <value = int64[1] {1}> ()
        ["/model/layers.@/router/TopK"] top, choice = TopK (probs, k1)
        ps = Shape (probs)
        zeros = ConstantOfShape (ps)
        ["/model/layers.@/router/Scatter"] gates = ScatterElements <axis = 1> (zeros, choice, top)
        ["/model/layers.@/experts/Einsum"] every = Einsum <equation = "td,edh->teh"> (x@, "model.layers.@.experts.weight")
"""
COMBINE = {
    "Einsum": """
        ["/model/layers.@/combine/Einsum"] mix = Einsum <equation = "te,teh->th"> (gates, every)""",
    "MatMul": """
        middle = Constant <value = int64[1] {1}> ()
        gates3 = Unsqueeze (gates, middle)
        ["/model/layers.@/combine/MatMul"] mix3 = MatMul (gates3, every)
        mix = Squeeze (mix3, middle)""",
}
PICK_EXPERT = """
        ["/model/layers.@/router/MatMul"] logits = MatMul (x@, "model.layers.@.router.weight")
        k1 = Constant <value = int64[1] {1}> ()
        ["/model/layers.@/router/TopK"] top, choice = TopK (logits, k1)
        ["/model/layers.@/router/Softmax"] weight = Softmax (top)
        ["/model/layers.@/experts/Einsum"] every = Einsum <equation = "td,edh->teh"> (x@, "model.layers.@.experts.weight")
        last = Constant <value = int64[1] {-1}> ()
        choice3 = Unsqueeze (choice, last)
        wide = Constant <value = int64[3] {1, 1, 2}> ()
        idx = Expand (choice3, wide)
        ["/model/layers.@/GatherElements"] picked = GatherElements <axis = 1> (every, idx)
        weight3 = Unsqueeze (weight, last)
        ["/model/layers.@/combine/Mul"] weighted = Mul (picked, weight3)
        one = Constant <value = int64[1] {1}> ()
        mix = ReduceSum <keepdims = 0> (weighted, one)"""
EXPERTS_W = (f'float[2, 2] "model.layers.@.router.weight" = {EYE}, '
             'float[2, 2, 2] "model.layers.@.experts.weight" = {1.0, 0.0, 0.0, 1.0, 2.0, 0.0, 0.0, 2.0}')


@pytest.mark.parametrize("combine, op", [
    (DENSE_GATES + COMBINE["Einsum"], "Einsum"),  # dense gates from a scatter of the top-k
    (DENSE_GATES + COMBINE["MatMul"], "MatMul"),
    (PICK_EXPERT, "GatherElements"),  # every expert computed, the top one picked
])
def test_densified_moe_combined_or_picked_is_masked(combine, op):
    text = graph([DENSE, combine + '\n        ["/model/layers.@/Add"] x@+1 = Add (x@, mix)', DENSE],
                 [DENSE_W, EXPERTS_W, DENSE_W])
    x = np.array([[1.0, 2.0], [3.0, -1.0], [0.5, 0.5]], dtype=np.float32)
    (y,) = ReferenceEvaluator(model_of(text)).run(None, {"x0": x})
    assert y.shape == (3, 2)
    report = audit(text)
    assert verdicts(report) == ["always", "masked", "always"]
    ev = report.blocks[1].evidence[0]
    assert ev.kind == "routing mask" and "TopK" in ev.detail
    assert ev.op == ("Mul" if op == "GatherElements" else op)  # the pick's output is data, weighted by Mul
    assert not report.dynamic


def test_ort_moe_operator_is_subset():
    contrib = """
        ["/model/layers.@/router/MatMul"] logits = MatMul (x@, "model.layers.@.router.weight")
        ["/model/layers.@/router/Softmax"] probs = Softmax (logits)
        ["/model/layers.@/moe/MoE"] moe = com.microsoft.MoE (x@, probs, "model.layers.@.fc1", "", "model.layers.@.fc2") <k = 1>
        ["/model/layers.@/Add"] x@+1 = Add (x@, moe)
"""
    weights = (f'float[2, 2] "model.layers.@.router.weight" = {EYE}, '
               'float[2, 2, 3] "model.layers.@.fc1" = {0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0}, '
               'float[2, 3, 2] "model.layers.@.fc2" = {0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0}')
    report = audit(graph([DENSE, contrib], [DENSE_W, weights], opsets='"" : 17, "com.microsoft" : 1'),
                   shapes={"x0": (4, 2)})
    assert verdicts(report) == ["always", "subset"]
    ev = report.blocks[1].evidence[0]
    assert (ev.kind, ev.op) == ("contrib", "com.microsoft.MoE")
    assert report.blocks[1].flops == 2 * 4 * 2 * 2 + 2 * 4 * 1 * (2 * 3 + 3 * 2)  # router + one expert per token


@pytest.mark.parametrize("op", ["BeamSearch", "GreedySearch"])
def test_ort_search_decoder_is_conditional(op):
    text = """
    <ir_version: 8, opset_import: ["" : 17, "com.microsoft" : 1]>
    g (int32[B, T] input_ids, int32[1] max_length, int32[1] min_length, int32[1] num_beams,
       int32[1] num_return, float[1] length_penalty, float[1] repetition_penalty) => (int32[B, R, S] sequences)
      <float[2, 2] "decoder.layers.0.fc.weight" = {1.0, 0.0, 0.0, 1.0},
       float[2, 2] "decoder.layers.1.fc.weight" = {1.0, 0.0, 0.0, 1.0}> {
        ["/search/BeamSearch"] sequences = com.microsoft.OP (input_ids, max_length, min_length, num_beams,
                                                   num_return, length_penalty, repetition_penalty) <
            eos_token_id = 2, pad_token_id = 0, model_type = 0,
            decoder = dec (int32[B, S] ids, int32[B, S] mask) => (float[B, S, 2] logits) {
                f = Cast <to = 1> (ids)
                axes = Constant <value = int64[1] {-1}> ()
                u = Unsqueeze (f, axes)
                shape = Constant <value = int64[3] {0, 0, 2}> ()
                x0 = Expand (u, shape)
                ["/decoder/layers.0/fc/MatMul"] h0 = MatMul (x0, "decoder.layers.0.fc.weight")
                ["/decoder/layers.0/Add"] x1 = Add (x0, h0)
                ["/decoder/layers.1/fc/MatMul"] h1 = MatMul (x1, "decoder.layers.1.fc.weight")
                ["/decoder/layers.1/Add"] logits = Add (x1, h1)
            }
        >
    }""".replace("OP", op)
    report = audit(text)
    assert verdicts(report) == ["branch", "branch"]
    assert report.conditional_execution
    (control,) = report.controls
    assert control.op == f"com.microsoft.{op}" and control.dependence == "value"
    assert "decoder of" in report.blocks[0].evidence[0].detail


# -- FLOPs ---------------------------------------------------------------------------------------
def test_flops_per_block_and_skippable_share():
    report = audit(graph([DENSE, CONDITIONS["value"] + SKIPPABLE, DENSE], [DENSE_W] * 3), shapes={"x0": (8, 2)})
    per_block = 2 * 8 * 2 * 2
    assert [b.flops for b in report.blocks] == [per_block] * 3
    assert [b.skippable_flops for b in report.blocks] == [0, per_block, 0]
    assert report.flops.total == 3 * per_block and report.flops.skippable_share == pytest.approx(1 / 3)
    assert ("Add", 3) in report.flops.count.uncounted


def test_no_flops_without_shapes_for_symbolic_inputs():
    report = audit(graph([DENSE], [DENSE_W]))
    assert report.flops is None and report.blocks[0].flops is None


# -- JSON and the command ----------------------------------------------------------------------
def test_json_has_the_documented_fields():
    doc = audit(graph([GATED] * 2, [GATED_W] * 2), GATE_META, shapes={"x0": (4, 2)}).to_json()
    json.dumps(doc)
    assert {"blocks", "coefficients", "conditional_execution", "block_method", "flops"} <= set(doc)
    assert set(doc["blocks"][0]) >= {"name", "index", "verdict", "flops", "evidence"}
    assert set(doc["coefficients"][0]) == {"tensor", "family", "layer", "axes", "source"}
    assert set(doc["blocks"][0]["evidence"][0]) >= {"kind", "node", "op", "tensor", "dependence", "text"}
    assert doc["flops"]["skippable_share"] == 0.0


def run_main(args, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(args)
    out, err = capsys.readouterr()
    return exit_info.value.code, out, err


@pytest.fixture
def branchy(tmp_path):
    path = tmp_path / "branchy.onnx"
    onnx.save(model_of(graph([DENSE, CONDITIONS["value"] + SKIPPABLE], [DENSE_W] * 2)), path)
    return str(path)


def test_cli_text_and_json(branchy, capsys, tmp_path):
    code, out, _ = run_main(["static", branchy, "--shape", "x0=8,2"], capsys)
    assert code == 0
    assert "branch" in out and "conditional execution: yes" in out and "50.0%" in out
    data = tmp_path / "data.npz"
    np.savez(data, x0=np.zeros((5, 2), dtype=np.float32))
    code, out, _ = run_main(["static", branchy, "--data", str(data), "--format", "json"], capsys)
    doc = json.loads(out)
    assert code == 0 and doc["flops"]["shapes"] == {"x0": [1, 2]}
    assert [b["verdict"] for b in doc["blocks"]] == ["always", "branch"]


def test_cli_claims_exit_3_when_contradicted(branchy, capsys):
    code, _, err = run_main(["static", branchy, "--expect", "static"], capsys)
    assert code == 3 and "claim refuted: expected static execution, found conditional execution" in err
    code, _, _ = run_main(["static", branchy, "--expect", "dynamic"], capsys)
    assert code == 0


@pytest.mark.parametrize("args, message", [
    (["--shape", "x0"], "expected --shape NAME=DIMS"),
    (["--shape", "ids=1,2"], "expected --shape to name a graph input"),
    (["--block-pattern", "("], "expected --block-pattern to be a regular expression"),
    (["--coefficients", "nothing.like.it"], "expected --coefficients 'nothing.like.it'"),
])
def test_cli_usage_errors_are_one_line_status_2(branchy, capsys, args, message):
    code, _, err = run_main(["static", branchy, *args], capsys)
    assert code == 2 and err.startswith(f"graphaudit: error: {message}") and err.count("\n") == 1
