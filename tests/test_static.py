"""Execution verdicts on tiny graphs in ONNX text syntax: one graph per kind of control flow,
coefficients from each source, FLOPs, the `graphaudit static` command. Routing verdicts
(subset, masked) are in test_static_routing.py, on the same helpers (tests/support/text_graphs.py)."""

import json

import numpy as np
import onnx
import onnx.parser
import pytest

from graphaudit.analyses.block_verdicts import execution_verdicts
from graphaudit.analyses.blocks import find_blocks
from graphaudit.analyses.coefficients import resolve_coefficients
from graphaudit.analyses.declared_coefficients import Coefficient
from graphaudit.analyses.dependence import analyse_dependence
from graphaudit.errors import GraphAuditError, UsageError
from graphaudit.graph.model import TensorRef
from graphaudit.load.model import load_model

from support.cli import run_main
from support.text_graphs import (
    CONDITIONS,
    DENSE,
    DENSE_W,
    EYE,
    GATED,
    GATED_W,
    SKIPPABLE,
    TRIPS,
    audit,
    graph,
    graph_of,
    model_of,
    verdicts,
)

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


def test_a_squashed_activation_that_meets_only_weights_is_not_a_coefficient():
    # BERT's pooler: Tanh of the first token's projection, read by the classifier's Gemm and its
    # weight; as wide as the hidden state and computed from the input, but it weights nothing
    # computed from the input, so it is a layer's input, not a gate
    text = f"""
    <ir_version: 8, opset_import: ["" : 17]>
    g (float[batch, seq, 2] x0) => (float[batch, 2] y) <{DENSE_W.replace("@", "0")}, {DENSE_W.replace("@", "1")},
        float[2, 2] "pooler.weight" = {EYE}, float[2, 2] "classifier.weight" = {EYE}, int64 first = {{0}}> {{
        {DENSE.replace("@+1", "1").replace("@", "0")}
        {DENSE.replace("@+1", "2").replace("@", "1")}
        ["/model/pooler/Gather"] fs = Gather <axis = 1> (x2, first)
        ["/model/pooler/Gemm"] p = Gemm <transB = 1> (fs, "pooler.weight")
        ["/model/pooler/Tanh"] pooled = Tanh (p)
        ["/model/classifier/Gemm"] y = Gemm <transB = 1> (pooled, "classifier.weight")
    }}"""
    report = audit(text)
    assert report.coefficients == ()
    assert verdicts(report) == ["always", "always"]
    # the same Tanh weighting the hidden state itself is a gate
    gated = audit(text.replace('y = Gemm <transB = 1> (pooled, "classifier.weight")', "y = Mul (pooled, fs)"))
    assert [(c.tensor, c.family, c.source) for c in gated.coefficients] == [("pooled", "gate", "detected")]

GELU_TANH = """
        ["/model/layers.@/fc/MatMul"] h@ = MatMul (x@, "model.layers.@.fc.weight")
        ["/model/layers.@/gelu/Mul"] hh@ = Mul (h@, h@)
        ["/model/layers.@/gelu/Mul_1"] cube@ = Mul (hh@, h@)
        ["/model/layers.@/gelu/Add"] inner@ = Add (h@, cube@)
        ["/model/layers.@/gelu/Tanh"] t@ = Tanh (inner@)
        ["/model/layers.@/gelu/Add_1"] t1@ = Add (t@, "one")
        ["/model/layers.@/gelu/Mul_2"] half@ = Mul (h@, "half")
        ["/model/layers.@/gelu/Mul_3"] g@ = Mul (half@, t1@)
        ["/model/layers.@/Add"] x@+1 = Add (x@, g@)
"""


def test_an_activation_function_written_out_is_not_a_gate():
    # GELU's tanh form (BLOOM's, GPT-2's) as TorchScript writes it: the Tanh weights x·½, but both
    # come from the same x element by element; an FFN as wide as the residual stream lets the
    # width rule pass it, so only that tells it from a gate
    text = graph([GELU_TANH] * 2, [DENSE_W] * 2, inputs="float[batch, seq, 2] x0").replace(
        "float[T, 2] y", "float[batch, seq, 2] y").replace("> {", ', float one = {1.0}, float half = {0.5}> {', 1)
    report = audit(text)
    assert report.coefficients == () and verdicts(report) == ["always", "always"]


def test_a_quantised_gate_weights_its_block_through_its_quantize_dequantize_pair():
    # a QDQ model (ONNX Runtime's static quantisation) puts QuantizeLinear / DequantizeLinear
    # between the gate and the Mul it weights: declared or detected, it still gates its block
    qdq = GATED.replace('["/model/layers.@/Mul"] m@ = Mul ("gate.@", h@)',
                        'gq@ = QuantizeLinear ("gate.@", "scale", "zero")\n'
                        '        gd@ = DequantizeLinear (gq@, "scale", "zero")\n'
                        '        ["/model/layers.@/Mul"] m@ = Mul (gd@, h@)')
    text = graph([qdq] * 2, [GATED_W] * 2, inputs="float[batch, seq, 2] x0").replace(
        "float[T, 2] y", "float[batch, seq, 2] y").replace("> {", ', float scale = {0.01}, uint8 zero = {0}> {', 1)
    assert verdicts(audit(text, GATE_META)) == ["gated", "gated"]
    detected = audit(text)
    assert [(c.tensor, c.source) for c in detected.coefficients] == [("gate.0", "detected"), ("gate.1", "detected")]
    assert verdicts(detected) == ["gated", "gated"]


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
    with pytest.raises(GraphAuditError, match=r"'gate\.7'"):
        audit(graph([GATED] * 2, [GATED_W] * 2), [Coefficient("gate.7", "gate", 7, ("token",))])


# -- control flow ----------------------------------------------------------------------------


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


def test_a_tensor_the_dependence_map_leaves_out_reads_as_value_sized():
    # The verdicts skip the extent test on a model where no tensor's extent depends on input
    # values; one the map has no entry for counts as value-dependent, so it is not skipped.
    loaded = load_model(model_of(graph([DENSE] * 2, [DENSE_W] * 2)))
    mg = graph_of(loaded.model)
    blocks = find_blocks(mg)

    def evidence(dm):
        coefs = resolve_coefficients(loaded, mg, (), blocks=blocks, dependence=dm)
        return [(b.verdict, [e.kind for e in b.evidence]) for b in execution_verdicts(mg, blocks, coefs, dm).blocks]

    dm = analyse_dependence(mg)
    assert evidence(dm) == [("always", []), ("always", [])]
    del dm.shapes[TensorRef("x1")]  # what block 1 reads
    assert evidence(dm) == [("always", []), ("subset", ["extent"])]


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

