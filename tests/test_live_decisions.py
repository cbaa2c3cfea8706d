"""Decisions the frozen graph still makes from the input: control flow whose condition the fed
coefficients do not decide (an early exit's confidence computed inside an earlier exit's
branch, which no coefficient can expose). The replay names them, as the controllers that make
them run in every condition."""

import numpy as np
import onnx
from onnx import TensorProto, helper

from graphaudit.analyses.declared_coefficients import Coefficient
from graphaudit.replay.pipeline import replay
from graphaudit.replay.surgery import live_decisions

from support.models import gated_lm, token_ids

FED = [Coefficient("c", "exit", 0, ("batch", "token"))]


def frozen_like() -> onnx.ModelProto:
    # `c` is fed (a coefficient input of a frozen graph); `x` is the model's own input. If `fed`
    # is decided by c alone; `own` by x; `inner`, inside fed's else-branch, by x again; the
    # Loop's trip count by c
    text = """
    <ir_version: 8, opset_import: ["" : 18]>
    g (float[batch, seq, 2] x, float[batch, seq] c) => (float[batch, seq, 2] y, float[batch, seq, 2] z) <float thr = {0.5}> {
        cm = ReduceMin <keepdims = 0> (c)
        go = Greater (cm, thr)
        ["fed"] y = If (go) <
            then_branch = t () => (float[batch, seq, 2] a) { a = Identity (x) },
            else_branch = e () => (float[batch, seq, 2] b) {
                xm = ReduceMax <keepdims = 0> (x)
                again = Greater (xm, thr)
                ["inner"] b = If (again) <
                    then_branch = t2 () => (float[batch, seq, 2] a2) { a2 = Identity (x) },
                    else_branch = e2 () => (float[batch, seq, 2] b2) { b2 = Neg (x) }
                >
            }
        >
        xs = ReduceSum <keepdims = 0> (x)
        own_go = Greater (xs, thr)
        ["own"] z0 = If (own_go) <
            then_branch = t3 () => (float[batch, seq, 2] a3) { a3 = Identity (x) },
            else_branch = e3 () => (float[batch, seq, 2] b3) { b3 = Neg (x) }
        >
        cs = ReduceSum <keepdims = 0> (c)
        n = Cast <to = 7> (cs)
        yes = Constant <value = bool {1}> ()
        ["steps"] z = Loop (n, yes, z0) <
            body = l (int64 i, bool k, float[batch, seq, 2] v) => (bool k2, float[batch, seq, 2] v2) {
                k2 = Identity (k)
                v2 = Neg (v)
            }
        >
    }"""
    model = onnx.parser.parse_model(text)
    onnx.checker.check_model(model)
    return model


def test_decisions_the_fed_coefficients_do_not_make_are_live():
    assert live_decisions(frozen_like(), FED) == ("inner", "own")
    # with nothing fed, every decision here depends on the input's values
    assert set(live_decisions(frozen_like(), [])) == {"fed", "inner", "own", "steps"}


def test_the_replay_names_a_decision_it_leaves_live(tmp_path):
    # the gated LM with its head behind an If decided by the input ids themselves: the gates
    # replay as ever (parity holds), and the note says the If ran on live values throughout
    model = gated_lm()
    head = next(n for n in model.graph.node if n.name == "head")
    model.graph.node.remove(head)
    branch = lambda name: helper.make_graph(  # noqa: E731
        [helper.make_node("MatMul", [head.input[0], "head"], [f"{name}_logits"], name=f"{name}/head")],
        name, [], [helper.make_tensor_value_info(f"{name}_logits", TensorProto.FLOAT, None)])
    model.graph.node.extend([
        helper.make_node("ReduceSum", ["input_ids"], ["ids_sum"], name="ids_sum", keepdims=0),
        helper.make_node("Constant", [], ["zero_ids"], name="zero_ids", value_int=0),
        helper.make_node("Greater", ["ids_sum", "zero_ids"], ["some_ids"], name="some_ids"),
        helper.make_node("If", ["some_ids"], ["logits"], name="route", then_branch=branch("then"),
                         else_branch=branch("else")),
    ])
    onnx.checker.check_model(model)
    onnx.save(model, tmp_path / "routed.onnx")
    np.savez(tmp_path / "calib.npz", input_ids=token_ids(8, seed=1))
    np.savez(tmp_path / "eval.npz", input_ids=token_ids(8, seed=2))
    report = replay(tmp_path / "routed.onnx", tmp_path / "calib.npz", tmp_path / "eval.npz", resamples=20)
    assert report.parity.ok
    assert report.settings["live_decisions"] == ["route"]
    (_about, note), = [(a, n) for a, n in report.setting_notes() if a == "freezing"]
    assert note.startswith("1 decision of control flow in the frozen graph (`route`) still depends on the input's values")
    plain = replay(_saved(gated_lm(), tmp_path), tmp_path / "calib.npz", tmp_path / "eval.npz", resamples=20)
    assert "live_decisions" not in plain.settings and not [a for a, _ in plain.setting_notes() if a == "freezing"]


def _saved(model: onnx.ModelProto, folder) -> str:
    path = folder / "gated.onnx"
    onnx.save(model, path)
    return str(path)
