"""Who decides each If and Loop: the caller (a graph input, named), the input shapes, a
constant, or the model. Conditional execution says whether some compute runs or not as an
input's value decides, whoever decides; `dynamic` and `--expect` are about the model's own."""

import onnx
import onnx.parser
import pytest

from graphaudit.analyses.decisions import decisions
from graphaudit.analyses.static import audit_static
from graphaudit.analyses.switches import same_compute, switches
from graphaudit.cli import main
from graphaudit.graph.build import build_graph
from graphaudit.load.model import load_model

W = ", ".join(["0.1"] * 16)
W2 = ", ".join(["0.2"] * 16)
BIG = ", ".join(["0.1"] * 128)
# the then-branch computes, the else-branch passes x through
DIFFERENT = """
        y = If (c) <
            then_branch = t () => (float[B, 4] ty) { ty = MatMul (x, w) },
            else_branch = e () => (float[B, 4] ey) { ey = Identity (x) }
        >"""
CONDITIONS = {
    "caller": "c = Identity (cond)",
    # Silero VAD's sample-rate switch: sr reshaped, its first element compared with 16000
    "sample-rate": """
        minus1 = Constant <value = int64[1] {-1}> ()
        flat = Reshape (sr, minus1)
        index = Constant <value = int64 {0}> ()
        first = Gather (flat, index)
        rate = Constant <value = int64 {16000}> ()
        c = Equal (first, rate)""",
    "shape": """
        s = Shape (x)
        one = Constant <value = int64 {1}> ()
        rows = Gather (s, one)
        three = Constant <value = int64 {3}> ()
        c = Greater (rows, three)""",
    "constant": "c = Constant <value = bool {1}> ()",
    "model": """
        h = MatMul (x, w)
        m = ReduceMean <keepdims = 0> (h)
        c = Greater (m, zero)""",
}


def model(condition: str, body: str = DIFFERENT) -> onnx.ModelProto:
    text = f"""
    <ir_version: 8, opset_import: ["" : 17]>
    g (float[B, 4] x, bool cond, int64 sr) => (float[B, 4] y)
      <float[4, 4] w = {{{W}}}, float zero = {{0.0}}> {{
        {CONDITIONS[condition]}
        {body}
    }}"""
    m = onnx.parser.parse_model(text)
    onnx.checker.check_model(m, full_check=True)
    return m


@pytest.mark.parametrize("condition, by, sources, conditional, dynamic", [
    ("caller", "caller", ("cond",), True, False),
    ("sample-rate", "caller", ("sr",), True, False),
    ("shape", "shape", ("x",), False, False),
    ("constant", "constant", (), False, False),
    ("model", "model", ("m",), True, True),  # the mean the model computes: the nearest computed tensor
])
def test_each_condition_is_traced_to_who_decides_it(condition, by, sources, conditional, dynamic):
    report = audit_static(load_model(model(condition)))
    (decision,) = report.decisions
    assert (decision.node, decision.op, decision.decided_by) == ("If#1", "If", by)
    assert all(name in decision.sources for name in sources), decision
    assert report.conditional_execution == conditional
    assert report.dynamic == dynamic
    assert (report.contradiction("static") is None) == (not dynamic)
    doc = report.to_json()
    assert doc["decisions"][0]["decided_by"] == by and doc["conditional_execution"] == conditional
    assert doc["decided_by"] == {"If#1": by}
    if condition == "sample-rate":  # named, with the value it is compared with
        assert "the graph input `sr`" in decision.reason and "Equal with 16000" in decision.reason


def test_a_bare_if_on_a_callers_flag_is_conditional_the_callers_and_passes_expect_static(tmp_path, capsys):
    path = tmp_path / "flag.onnx"
    onnx.save(model("caller"), path)
    with pytest.raises(SystemExit) as done:
        main(["static", str(path), "--expect", "static"])
    out, err = capsys.readouterr()
    assert done.value.code == 0, err
    assert "conditional execution: yes (decided If `If#1` by the caller (`cond`))" in out
    assert "the model's own decisions: no" in out


def test_the_sample_rate_switch_is_the_callers_not_the_models(tmp_path, capsys):
    path = tmp_path / "vad.onnx"
    onnx.save(model("sample-rate"), path)
    with pytest.raises(SystemExit) as done:
        main(["static", str(path), "--expect", "static"])
    out, _ = capsys.readouterr()
    assert done.value.code == 0
    assert "by the caller (`sr`)" in out
    (block,) = audit_static(load_model(model("sample-rate"))).blocks  # the block in its branch says so too
    assert block.verdict == "always"
    assert "run only in the then-branch of If `If#1`, which the caller (`sr`) chooses" in block.evidence[0].detail


def test_a_models_decision_still_refutes_expect_static(tmp_path, capsys):
    path = tmp_path / "exit.onnx"
    onnx.save(model("model"), path)
    with pytest.raises(SystemExit) as done:
        main(["static", str(path), "--expect", "static"])
    _, err = capsys.readouterr()
    assert done.value.code == 3 and "conditional execution the model decides" in err


def test_a_learned_weight_makes_it_the_models_even_with_a_caller_input():
    text = f"""
    <ir_version: 8, opset_import: ["" : 17]>
    g (float[B, 4] x, bool cond) => (float[B, 4] y) <float[128] table = {{{BIG}}}, int64 k = {{3}}, float[4, 4] w = {{{W}}}> {{
        v = Gather (table, k)
        z = Constant <value = float {{0.0}}> ()
        p = Greater (v, z)
        c = And (p, cond)
        {DIFFERENT}
    }}"""
    m = onnx.parser.parse_model(text)
    onnx.checker.check_model(m, full_check=True)
    (decision,) = decisions(build_graph(m)).values()
    assert decision.decided_by == "model" and decision.sources == ("table",)


def branches(then_weights: str, else_weights: str) -> onnx.ModelProto:
    """An If on the model's own condition whose branches run the same operator on a weight each
    branch holds under one name, `w`."""
    return model("model", f"""
        y = If (c) <
            then_branch = t () => (float[B, 4] ty) <float[4, 4] w = {{{then_weights}}}> {{ ty = MatMul (x, w) }},
            else_branch = e () => (float[B, 4] ey) <float[4, 4] w = {{{else_weights}}}> {{ ey = MatMul (x, w) }}
        >""")


def test_branches_with_other_weights_inside_them_are_not_the_same_compute():
    mg = build_graph(branches(W, W2))
    node = mg.nodes["If#1"]
    assert same_compute(mg, node) == 0 and switches(mg) == {}
    report = audit_static(load_model(branches(W, W2)))
    assert report.conditional_execution and report.dynamic
    assert not any("same weights" in c.detail for c in report.controls)
    # the same weights in each (by content) are the same compute: a switch, nothing skipped
    same = build_graph(branches(W, W))
    assert same_compute(same, same.nodes["If#1"]) == 1
    assert not audit_static(load_model(branches(W, W))).conditional_execution


def test_weights_in_constant_nodes_are_compared_by_content():
    def constant(values: str) -> str:
        return f"w2 = Constant <value = float[4, 4] w2 {{{values}}}> ()"

    def body(a: str, b: str) -> onnx.ModelProto:
        return model("model", f"""
        y = If (c) <
            then_branch = t () => (float[B, 4] ty) {{ {constant(a)}
                ty = MatMul (x, w2) }},
            else_branch = e () => (float[B, 4] ey) {{ {constant(b)}
                ey = MatMul (x, w2) }}
        >""")
    assert audit_static(load_model(body(W, W2))).conditional_execution
    assert not audit_static(load_model(body(W, W))).conditional_execution


LOOP = """
        m = Constant <value = int64 {{{trips}}}> ()
        yes = Constant <value = bool {{1}}> ()
        y = Loop (m, yes, x) <
            body = b (int64 i, bool c_in, float[B, 4] a) => (bool c_out, float[B, 4] a_out) {{
                a_out = MatMul (a, w)
                {cond_out}
            }}
        >"""


@pytest.mark.parametrize("trips, cond_out, conditional", [
    (1, "s = ReduceSum <keepdims = 0> (a_out)\n                c_out = Greater (s, zero)", False),
    (3, "c_out = Identity (c_in)", False),
    (3, "s = ReduceSum <keepdims = 0> (a_out)\n                c_out = Greater (s, zero)", True),
])
def test_a_loop_fixed_by_constants_is_not_conditional(trips, cond_out, conditional):
    """A Loop of one iteration never reads the condition its body gives back; one that gives
    its condition back unchanged runs M times: neither is conditional execution."""
    report = audit_static(load_model(_loop(trips, cond_out)))
    (decision,) = report.decisions
    assert decision.decided_by == ("model" if conditional else "constant")
    assert report.conditional_execution == conditional and report.dynamic == conditional
    assert ("branch" in [b.verdict for b in report.blocks]) == conditional


def _loop(trips: int, cond_out: str) -> onnx.ModelProto:
    text = f"""
    <ir_version: 8, opset_import: ["" : 17]>
    g (float[B, 4] x) => (float[B, 4] y) <float[4, 4] w = {{{W}}}, float zero = {{0.0}}> {{
        {LOOP.format(trips=trips, cond_out=cond_out)}
    }}"""
    m = onnx.parser.parse_model(text)
    onnx.checker.check_model(m, full_check=True)
    return m
