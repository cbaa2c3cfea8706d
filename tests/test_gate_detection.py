"""Gates detected where the graph does not declare them: which squashed tensor is the gate,
which block it serves (applied between the blocks, deciding an If, dividing the output after
the last block), hard gates cast to 0 / 1, and gates inside a Loop body, which cannot be
frozen. Helpers and block templates are test_static.py's."""

import pytest

from graphaudit.analyses.static import audit_static
from graphaudit.graph.build import build_graph
from graphaudit.load.model import load_model

from support.text_graphs import DENSE, DENSE_W, EYE, GATED, GATED_W, audit, graph, model_of, verdicts


def test_a_gate_applied_between_the_blocks_belongs_to_the_block_it_weights():
    # SkipNet's gates computed and applied in the model's forward, x + g·block(x), for blocks 1
    # and 2 only: outside every block, named /Sigmoid and /Sigmoid_1 by the exporter (numbered
    # by occurrence, not by layer); their weights `gate.1`, `gate.2` are numbered too, but they
    # run between the layers, so they are no second stack of blocks
    gated = """
        ["/model/layers.@/fc/MatMul"] h@ = MatMul (x@, "model.layers.@.fc.weight")
        ["/gate@/MatMul"] gl@ = MatMul (x@, "gate.@.weight")
        ["SIGMOID"] g@ = Sigmoid (gl@)
        ["MUL"] m@ = Mul (g@, h@)
        ["ADD"] x@+1 = Add (x@, m@)
"""
    # the second as x + g·(block(x) − x): the Sub is in no block either. The gates' tensor names
    # carry no number that could tell their layer.
    blocks = [DENSE, gated.replace("SIGMOID", "/Sigmoid").replace("MUL", "/Mul").replace("ADD", "/Add").replace(
                  "g@", "gateA"),
              gated.replace("SIGMOID", "/Sigmoid_1").replace("MUL", "/Mul_1").replace("ADD", "/Add_1").replace(
                  "m@ = Mul (g@, h@)", 'd@ = Sub (h@, x@)\n        ["/Mul_1"] m@ = Mul (g@, d@)').replace(
                  '["/Mul_1"] d@', '["/Sub"] d@').replace("g@", "gateB")]
    weights = [DENSE_W, DENSE_W + f', float[2, 2] "gate.@.weight" = {EYE}', DENSE_W + f', float[2, 2] "gate.@.weight" = {EYE}']
    text = graph(blocks, weights, inputs="float[batch, seq, 2] x0").replace("float[T, 2] y", "float[batch, seq, 2] y")
    report = audit(text)
    assert [(c.tensor, c.layer) for c in report.coefficients] == [("gateA", 1), ("gateB", 2)]
    assert verdicts(report) == ["always", "gated", "gated"]
    assert report.block_method == "node names: 3 blocks under `model.layers`"
    assert [e.node for e in report.blocks[1].evidence] == ["/Mul"]


@pytest.mark.parametrize("hard", [
    'hard@ = Greater ("gate.@", half)\n        on@ = Cast <to = 1> (hard@)',  # SkipNet, BlockDrop: σ > ½
    'on@ = Round ("gate.@")',  # a straight-through estimator's forward pass
])
def test_a_hard_gate_thresholded_from_a_squashed_score_is_detected(hard):
    # the block is computed for every input and multiplied by 0 or 1: gated, no compute saved
    block = GATED.replace('["/model/layers.@/Mul"] m@ = Mul ("gate.@", h@)',
                          f'{hard}\n        ["/model/layers.@/Mul"] m@ = Mul (on@, h@)')
    text = graph([block] * 2, [GATED_W] * 2, inputs="float[batch, seq, 2] x0").replace(
        "float[T, 2] y", "float[batch, seq, 2] y").replace("> {", ", float half = {0.5}> {", 1)
    report = audit(text)
    assert [(c.tensor, c.source) for c in report.coefficients] == [("gate.0", "detected"), ("gate.1", "detected")]
    assert verdicts(report) == ["gated", "gated"] and not report.dynamic


TANH_UNDER_GATE = GATED.replace('m@ = Mul ("gate.@", h@)', 'ht@ = Tanh (h@)\n        ["/model/layers.@/Mul"] m@ = Mul ("gate.@", ht@)')


def test_a_tanh_weighted_by_a_sigmoid_is_content_not_a_second_gate():
    # a block ending in Tanh under its sigmoid gate, or WaveNet's tanh(a)·σ(b): each squashed
    # tensor weights the other, but only the Sigmoid is the gate
    text = graph([TANH_UNDER_GATE] * 2, [GATED_W] * 2, inputs="float[batch, seq, 2] x0").replace(
        "float[T, 2] y", "float[batch, seq, 2] y")
    assert "Tanh" in text
    report = audit(text)
    assert [(c.tensor, c.source) for c in report.coefficients] == [("gate.0", "detected"), ("gate.1", "detected")]
    assert verdicts(report) == ["gated", "gated"]
    # two Tanh weighting each other are still both taken: nothing tells gate from content
    both = audit(text.replace('"gate.@" = Sigmoid'.replace("@", "0"), '"gate.0" = Tanh'))
    assert [c.tensor for c in both.coefficients] == ["gate.0", "ht0", "gate.1"]


def test_a_gate_that_decides_whether_a_block_runs_is_a_coefficient_of_that_block():
    # SkipNet with real control flow: σ of a pooled projection, computed between the blocks,
    # decides the If whose then-branch is block 1 (one input at a time: its condition is a scalar)
    text = f"""
    <ir_version: 8, opset_import: ["" : 18]>
    g (float[batch, seq, 2] x0) => (float[batch, seq, 2] y) <{DENSE_W.replace("@", "0")}, {DENSE_W.replace("@", "1")},
        float[2, 1] "skip.weight" = {{0.5, -0.5}}, int64[1] tokens = {{1}}, int64[0] scalar = {{}}, float half = {{0.5}}> {{
        {DENSE.replace("@+1", "1").replace("@", "0")}
        ["/pool"] pooled = ReduceMean <keepdims = 0> (x1, tokens)
        ["/skip/MatMul"] score = MatMul (pooled, "skip.weight")
        ["/Sigmoid"] p = Sigmoid (score)
        ["/Reshape"] ps = Reshape (p, scalar)
        ["/Greater"] go = Greater (ps, half)
        ["/If"] x2 = If (go) <
            then_branch = t () => (float[batch, seq, 2] x2a) {{
                ["/model/layers.1/fc/MatMul"] h1 = MatMul (x1, "model.layers.1.fc.weight")
                ["/model/layers.1/Add"] x2a = Add (x1, h1)
            }},
            else_branch = e () => (float[batch, seq, 2] same) {{ same = Identity (x1) }}
        >
        y = Identity (x2)
    }}"""
    report = audit(text)
    assert [(c.tensor, c.family, c.layer, c.source) for c in report.coefficients] == [("p", "gate", 1, "detected")]
    assert verdicts(report) == ["always", "branch"]


def test_a_gate_inside_a_loop_body_is_not_detected():
    # one layer applied by a Loop as often as the input says, gated inside the body: the gate can
    # be neither exposed nor fed from the main graph, so it is no coefficient to replay
    text = """
    <ir_version: 8, opset_import: ["" : 18]>
    g (float[batch, seq, 2] x0) => (float[batch, seq, 2] y) <float[2, 2] w = {0.9, -0.3, 0.2, 0.8},
        float[2, 2] wg = {0.5, 0.1, -0.2, 0.4}, int64 most = {6}> {
        total = ReduceSum <keepdims = 0> (x0)
        size = Abs (total)
        steps_f = Floor (size)
        steps_all = Cast <to = 7> (steps_f)
        steps = Min (steps_all, most)
        go = Constant <value = bool {1}> ()
        ["/ponder/Loop"] y = Loop (steps, go, x0) <body = step (int64 i, bool c, float[batch, seq, 2] h)
                => (bool c_out, float[batch, seq, 2] h_out) {
            c_out = Identity (c)
            m = MatMul (h, w)
            t = Relu (m)
            gl = MatMul (h, wg)
            gate = Sigmoid (gl)
            h_out = Mul (gate, t)
        }>
    }"""
    report = audit(text)
    assert report.coefficients == ()
    assert [(b.name, b.verdict) for b in report.blocks] == [("/ponder/Loop", "branch")]


def test_a_gate_that_also_divides_is_shown_and_placed_by_what_it_weights():
    # ACT written out densely: each block's halting probability weights its output (Mul) and is
    # summed into the normaliser the result is divided by at the end (Div, after the last block)
    gated = """
        ["/model/layers.@/fc/MatMul"] f@ = MatMul (x@, "model.layers.@.fc.weight")
        ["/model/layers.@/act/Relu"] h@ = Relu (f@)
        ["/halt@/MatMul"] hl@ = MatMul (x@, "halt.@.weight")
        ["/halt@/Sigmoid"] haltA@ = Sigmoid (hl@)
        ["/Mul_@"] m@ = Mul (haltA@, h@)
        ["/Add_@"] x@+1 = Add (x@, m@)
"""
    weights = DENSE_W + f', float[2, 2] "halt.@.weight" = {EYE}'
    text = graph([gated] * 3, [weights] * 3, inputs="float[batch, seq, 2] x0").replace(
        "float[T, 2] y", "float[batch, seq, 2] y").replace('["/model/head/Identity"] y = Identity (x3)', """
        ["/Add_cum"] total1 = Add (haltA0, haltA1)
        ["/Add_cum_1"] total = Add (total1, haltA2)
        ["/Div"] y = Div (x3, total)""")
    report = audit(text)
    assert report.block_method.startswith("node names: 3 blocks under `model.layers`")
    assert [(c.tensor, c.layer) for c in report.coefficients] == [("haltA0", 0), ("haltA1", 1), ("haltA2", 2)]
    assert [b.evidence[0].op for b in report.blocks] == ["Mul", "Mul", "Mul"]


# A dense connection after each block, MUDD's as MUDDPythia writes it: a linear projection of the
# block's output into one weight per source (here 2: the block's input and its output), plus a
# static bias, each source weighted by its slice and summed (dw[..., j, None] * hids[j]).
MIXED = """
        ["/model/layers.@/fc/MatMul"] h@ = MatMul (x@, "model.layers.@.fc.weight")
        ["/model/layers.@/Add"] b@ = Add (x@, h@)
        ["/model/mix.@/w/MatMul"] p@ = MatMul (b@, "model.mix.@.w.weight")
        ["/model/mix.@/Add"] "dw.@" = Add (p@, "model.mix.@.bias")
        ["/model/mix.@/Gather"] d0@ = Gather <axis = 2> ("dw.@", zero)
        ["/model/mix.@/Gather_1"] d1@ = Gather <axis = 2> ("dw.@", one)
        ["/model/mix.@/Unsqueeze"] u0@ = Unsqueeze (d0@, last)
        ["/model/mix.@/Unsqueeze_1"] u1@ = Unsqueeze (d1@, last)
        ["/model/mix.@/Mul"] m0@ = Mul (u0@, x@)
        ["/model/mix.@/Mul_1"] m1@ = Mul (u1@, b@)
        ["/model/mix.@/Add_1"] x@+1 = Add (m0@, m1@)
"""
MIXED_W = ('float[4, 4] "model.layers.@.fc.weight" = {' + ", ".join(["0.5"] * 16) + '}, '
           'float[4, 2] "model.mix.@.w.weight" = {0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8}, '
           'float[2] "model.mix.@.bias" = {0.0, 1.0}')
MIXED_CONSTANTS = "int64 zero = {0}, int64 one = {1}, int64[1] last = {-1}, "


def mixed_graph(blocks: list[str]) -> str:
    text = graph(blocks, [MIXED_W] * len(blocks), inputs="float[batch, seq, 4] x0")
    return text.replace("float[T, 2] y", "float[batch, seq, 4] y").replace("<float", f"<{MIXED_CONSTANTS}float", 1)


@pytest.mark.parametrize("shape_read", [False, True], ids=["plain", "its shape read too"])
def test_an_unsquashed_projection_that_mixes_the_sources_is_detected(shape_read):
    # no Sigmoid / Softmax: the weights are the projection plus its bias, detected by what they
    # weight (each layer's earlier outputs, at the hidden width), and placed in their layer. The
    # real MUDDFormer's einops rearrange reads the projection's shape first: a Shape reads no
    # values, and the coefficient is still the sum with the bias
    block = MIXED.replace('        ["/model/mix.@/Add"]', '        ps@ = Shape (p@)\n        ["/model/mix.@/Add"]') \
        if shape_read else MIXED
    report = audit(mixed_graph([block] * 3))
    assert [(c.tensor, c.family, c.layer, c.source) for c in report.coefficients] == [
        (f"dw.{i}", "mix", i, "detected") for i in range(3)]
    assert report.coefficients[0].axes == ("batch", "token", "slot")
    assert verdicts(report) == ["gated"] * 3 and not report.dynamic


@pytest.mark.parametrize("change", [
    # the projection as wide as the hidden state: a layer's own linear map, not weights
    ('float[4, 2] "model.mix.@.w.weight" = {0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8}, float[2] "model.mix.@.bias" = {0.0, 1.0}',
     'float[4, 4] "model.mix.@.w.weight" = {' + ", ".join(["0.1"] * 16) + '}, float[4] "model.mix.@.bias" = {0.0, 1.0, 0.0, 1.0}'),
    # the narrow output added to the sources, not weighting them (a shift, as a bias is)
    ("m0@ = Mul (u0@, x@)", "m0@ = Add (u0@, x@)"),
])
def test_a_projection_that_weights_no_hidden_state_or_is_not_narrower_is_not_a_coefficient(change):
    old, new = change
    text = mixed_graph([MIXED] * 2)
    for i in "01":
        assert old.replace("@", i) in text
        text = text.replace(old.replace("@", i), new.replace("@", i))
    if old.startswith("m0@"):
        text = text.replace("Mul (u1", "Add (u1")
    report = audit(text)
    assert report.coefficients == ()


# CALM as usually written: after each block but the last, the exit head's most probable
# class's probability per token; tokens past the threshold stay exited (exited |= c > thr), and
# every later block's result is kept only for tokens not exited: where(exited, h, block(h)).
CALM = """
        ["/model/layers.@/fc/MatMul"] f@ = MatMul (x@, "model.layers.@.fc.weight")
        ["/model/layers.@/Add"] h@ = Add (x@, f@)
        ["/Where_@"] x@+1 = Where (gone@, x@, h@)
        ["/exit@/MatMul"] e@ = MatMul (x@+1, "exit.@.weight")
        ["/exit@/Softmax"] p@ = Softmax <axis = -1> (e@)
        ["/exit@/ReduceMax"] c@ = ReduceMax <keepdims = 1> (p@, last)
        ["/exit@/Greater"] over@ = Greater (c@, thr)
        ["/exit@/Or"] gone@+1 = Or (gone@, over@)
"""


def test_a_per_token_exit_computed_densely_has_its_confidence_detected():
    # the confidence after block i decides, through the exited mask, which tokens every later
    # block's result is kept for: an `exit` coefficient of layer i, per token, like an early
    # exit's that decides an If. The last block's decides nothing: no block follows it
    text = graph([CALM] * 3, [DENSE_W + f', float[2, 2] "exit.@.weight" = {EYE}'] * 3,
                 inputs="float[batch, seq, 2] x0, bool[batch, seq, 1] gone0", opsets='"" : 18')
    text = text.replace("float[T, 2] y", "float[batch, seq, 2] y").replace(
        "<float", "<int64[1] last = {-1}, float thr = {0.6}, float", 1)
    report = audit(text)
    assert [(c.tensor, c.family, c.layer, c.axes) for c in report.coefficients] == [
        (f"c{i}", "exit", i, ("batch", "token", "slot")) for i in range(2)]
    assert verdicts(report) == ["masked"] * 3 and not report.dynamic


@pytest.mark.parametrize("decide", ["go = Greater (m, thr)", "sure = Greater (m, thr)\n        go = Not (sure)"])
def test_an_exit_confidence_deciding_an_if_is_detected_through_a_not(decide):
    # "skip the rest if confident" (then: skip) or TorchScript's "run the rest unless confident"
    # (a Not of the comparison): the same confidence, the most probable class's probability per token
    from support.text_graphs import SKIPPABLE

    exit_head = f"""
        ["/exit/MatMul"] e = MatMul (x1, "exit.weight")
        ["/exit/Softmax"] p = Softmax <axis = -1> (e)
        ["/exit/ReduceMax"] c = ReduceMax <keepdims = 0> (p, last)
        ["/exit/ReduceMean"] m = ReduceMean <keepdims = 0> (c)
        {decide}"""
    text = graph([DENSE, exit_head + SKIPPABLE], [DENSE_W, DENSE_W + f', float[2, 2] "exit.weight" = {EYE}'],
                 inputs="float[batch, seq, 2] x0", opsets='"" : 18')
    text = text.replace("float[T, 2] y", "float[batch, seq, 2] y").replace(
        "<float", "<int64[1] last = {-1}, float thr = {0.6}, float", 1).replace("float[T, 2]", "float[batch, seq, 2]")
    report = audit(text)
    assert [(c.tensor, c.family, c.layer, c.axes) for c in report.coefficients] == [("c", "exit", 0, ("batch", "token"))]
    assert verdicts(report) == ["always", "branch"]


@pytest.mark.parametrize("scale", ['s@ = Mul ("gate.@", "scale.@")', 's@ = Mul ("scale.@", "gate.@")',
                                   's@ = Div ("gate.@", "scale.@")',
                                   'su@ = Unsqueeze ("scale.@", zero)\n        s@ = Mul ("gate.@", su@)'])
def test_a_gate_scaled_by_a_learned_constant_before_it_weights_is_detected(scale):
    # Dynamic Hyper-Connections: tanh(·)·s + b with a learned scale s and static part b, then
    # weighting the streams; the scale (a weight, or computed from weights alone) is no hidden state
    block = GATED.replace('Sigmoid (gl@)', 'Tanh (gl@)').replace(
        '["/model/layers.@/Mul"] m@ = Mul ("gate.@", h@)',
        f'{scale}\n        b@ = Add (s@, "static.@")\n        ["/model/layers.@/Mul"] m@ = Mul (b@, h@)')
    weights = GATED_W + ', float[1] "scale.@" = {0.5}, float[2] "static.@" = {1.0, 0.0}'
    text = graph([block] * 2, [weights] * 2, inputs="float[batch, seq, 2] x0").replace(
        "float[T, 2] y", "float[batch, seq, 2] y").replace("<float", "<int64[1] zero = {0}, float", 1)
    report = audit(text)
    assert [(c.tensor, c.family, c.layer) for c in report.coefficients] == [("gate.0", "gate", 0), ("gate.1", "gate", 1)]
    assert verdicts(report) == ["gated", "gated"]


def test_a_gate_scaled_by_a_value_is_not_passed_through_as_a_constant():
    # the same Mul by something computed from the input is a gating node of its own: what the
    # Tanh meets there is no hidden state (width 1), so the walk stops and nothing is detected
    block = GATED.replace('Sigmoid (gl@)', 'Tanh (gl@)').replace(
        '["/model/layers.@/Mul"] m@ = Mul ("gate.@", h@)',
        'r@ = ReduceMean <keepdims = 1> (x@, last)\n        s@ = Mul ("gate.@", r@)\n'
        '        ["/model/layers.@/Mul"] m@ = Mul (s@, h@)')
    text = graph([block] * 2, [GATED_W] * 2, inputs="float[batch, seq, 2] x0", opsets='"" : 18').replace(
        "float[T, 2] y", "float[batch, seq, 2] y").replace("<float", "<int64[1] last = {-1}, float", 1)
    assert audit(text).coefficients == ()


def test_a_gate_whose_width_inference_leaves_unnamed_is_measured_at_the_probe():
    # a reshape to a shape ONNX's inference does not evaluate (TorchScript's expand to a shape
    # from a Where, a float Range of the length): every dimension after it is `unk__N`, the
    # gate's width too. At the probe's input sizes the shape is computed: a fixed width of 2,
    # the same at a second token length, so the gate is one like any other
    block = GATED.replace(
        '["/model/layers.@/gate/Sigmoid"] "gate.@" = Sigmoid (gl@)',
        'sh@ = Shape (gl@)\n        to@ = Mod (sh@, big)\n        wide@ = Reshape (gl@, to@)\n'
        '        ["/model/layers.@/gate/Sigmoid"] "gate.@" = Sigmoid (wide@)')
    text = graph([block] * 2, [GATED_W] * 2, inputs="float[batch, seq, 2] x0").replace(
        "float[T, 2] y", "float[batch, seq, 2] y").replace("<float", "<int64[3] big = {100000, 100000, 100000}, float", 1)
    loaded = load_model(model_of(text))
    mg = build_graph(loaded.model)
    assert isinstance(mg.tensors[mg.find_tensor("gate.0")].shape[-1], str)  # what inference left: the case at hand
    report = audit_static(loaded)
    assert [(c.tensor, c.layer, c.axes) for c in report.coefficients] == [
        ("gate.0", 0, ("batch", "token", "slot")), ("gate.1", 1, ("batch", "token", "slot"))]
    assert verdicts(report) == ["gated", "gated"]


def test_soft_moe_weights_normalised_over_tokens_are_a_family_apart():
    # Soft MoE: dispatch weights softmax over the tokens (each slot a mix of the tokens),
    # combine weights softmax over the slots (each token a mix of the slots). One global mean
    # cannot stand for both normalisations, so they are two families
    text = """
    <ir_version: 8, opset_import: ["" : 18]>
    g (float[batch, seq, 4] x0) => (float[batch, seq, 4] y) <float[4, 4] "model.layers.0.fc.weight" = {
        1.0, 0.0, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 0.0, 1.0},
        float[4, 3] "model.layers.0.moe.phi" = {0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0, 1.1, 1.2},
        float[4, 4] "model.layers.0.moe.expert" = {
        0.5, 0.0, 0.0, 0.0, 0.0, 0.5, 0.0, 0.0, 0.0, 0.0, 0.5, 0.0, 0.0, 0.0, 0.0, 0.5}> {
        ["/model/layers.0/fc/MatMul"] h = MatMul (x0, "model.layers.0.fc.weight")
        ["/model/layers.0/Add"] x1 = Add (x0, h)
        ["/model/layers.0/norm/LayerNormalization"] n = LayerNormalization <axis = -1> (x1, ones, zeros)
        ["/model/layers.0/moe/MatMul"] s = MatMul (n, "model.layers.0.moe.phi")
        ["/model/layers.0/moe/Softmax"] dispatch = Softmax <axis = 1> (s)
        ["/model/layers.0/moe/Softmax_1"] combine = Softmax <axis = -1> (s)
        ["/model/layers.0/moe/Transpose"] dt = Transpose <perm = [0, 2, 1]> (dispatch)
        ["/model/layers.0/moe/MatMul_1"] slots = MatMul (dt, n)
        ["/model/layers.0/moe/expert/MatMul"] e = MatMul (slots, "model.layers.0.moe.expert")
        ["/model/layers.0/moe/MatMul_2"] back = MatMul (combine, e)
        ["/model/layers.0/Add_1"] y = Add (x1, back)
    }""".replace("<float[4, 4]", "<float[4] ones = {1.0, 1.0, 1.0, 1.0}, float[4] zeros = {0.0, 0.0, 0.0, 0.0}, float[4, 4]", 1)
    report = audit(text)
    assert [(c.tensor, c.family, c.layer) for c in report.coefficients] == [
        ("dispatch", "token-mix", 0), ("combine", "mix", 0)]
