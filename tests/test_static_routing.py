"""Routing verdicts on tiny graphs in ONNX text syntax: selection by value (`subset`, with a
fixed capacity or a data-dependent size), every path computed then masked, combined or picked
(`masked`), a Where choosing between computed results, and ONNX Runtime's routing operators."""

import numpy as np
import pytest
from onnx.reference import ReferenceEvaluator

from support.text_graphs import (
    CONDITIONS,
    DENSE,
    DENSE_W,
    DISPATCH,
    EYE,
    MOE_W,
    PICK_CAPACITY,
    PICK_NONZERO,
    ROUTE,
    audit,
    graph,
    model_of,
    verdicts,
)

# -- routing -----------------------------------------------------------------------------------


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


BATCHED = """
        ["/model/layers.@/router/MatMul"] logits = MatMul (x@, "model.layers.@.router.weight")
        ["/model/layers.@/router/Softmax"] probs = Softmax <axis = -1> (logits)
        k1 = Constant <value = int64[1] {1}> ()
        ["/model/layers.@/router/TopK"] top, choice = TopK (probs, k1)
        ["/model/layers.@/experts/Gather"] w = Gather <axis = 0> ("model.layers.@.experts.weight", choice)
        rows = Constant <value = int64[4] {-1, 1, 1, 2}> ()
        ["/model/layers.@/experts/Reshape"] xr = Reshape (x@, rows)
        ["/model/layers.@/experts/MatMul"] yr = MatMul (xr, w)
        flat = Constant <value = int64[2] {-1, 2}> ()
        ["/model/layers.@/experts/Reshape_1"] ye = Reshape (yr, flat)
        ["/model/layers.@/Mul"] weighted = Mul (ye, top)
        ["/model/layers.@/Add"] x@+1 = Add (x@, weighted)
"""
BATCHED_W = (f'float[2, 2] "model.layers.@.router.weight" = {EYE}, '
             f'float[2, 2, 2] "model.layers.@.experts.weight" = {{1.0, 0.0, 0.0, 1.0, 2.0, 0.0, 0.0, 2.0}}')


def test_batched_moe_picking_experts_weights_is_subset_of_fixed_size():
    # each token's expert weights are gathered by its TopK index and multiplied in (a batched MoE,
    # as transformers' batched_mm experts export): only the routed experts run, at a fixed size,
    # and only that MatMul is skippable, not what follows the combine
    report = audit(graph([DENSE, BATCHED, DENSE], [DENSE_W, BATCHED_W, DENSE_W]))
    assert verdicts(report) == ["always", "subset", "always"]
    ev = report.blocks[1].evidence[0]
    assert (ev.kind, ev.op, ev.size) == ("selection", "Gather", "fixed (capacity)")
    assert "experts' weights" in ev.detail and "/model/layers.1/experts/MatMul" in ev.detail
    assert report.blocks[2].evidence == () and report.outside_blocks == ()
    # a stack computed from the input is no weights: picked from, it is a selection of rows (data-
    # dependent rows of activations), and nothing past the combine is taken for expert compute
    computed = BATCHED.replace('w = Gather <axis = 0> ("model.layers.@.experts.weight", choice)',
                               'stack@ = Mul ("model.layers.@.experts.weight", mean@)\n'
                               '        w = Gather <axis = 0> (stack@, choice)').replace(
        '["/model/layers.@/router/MatMul"]', 'xu@ = Unsqueeze (x@, zero1)\n        mean@ = ReduceMean <keepdims = 1> (xu@)\n'
        '        ["/model/layers.@/router/MatMul"]')
    mixed = audit(graph([DENSE, computed, DENSE], [DENSE_W, BATCHED_W + ", int64[1] zero1 = {0}", DENSE_W]))
    assert "experts' weights" not in " ".join(e.detail for b in mixed.blocks for e in b.evidence)
    assert verdicts(mixed)[2] == "always"
    (y,) = ReferenceEvaluator(model_of(graph([BATCHED], [BATCHED_W]))).run(
        None, {"x0": np.array([[1.0, 2.0], [3.0, 1.0]], dtype=np.float32)})
    assert y.shape == (2, 2)


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


MIXTURE_OF_DEPTHS = """
        ["/model/layers.@/router/MatMul"] s@ = MatMul (x@, "model.layers.@.router.weight")
        axis@ = Constant <value = int64[1] {1}> ()
        ["/model/layers.@/router/Squeeze"] score@ = Squeeze (s@, axis@)
        k@ = Constant <value = int64[1] {2}> ()
        ["/model/layers.@/TopK"] top@, idx@ = TopK <axis = 0> (score@, k@)
        ["/model/layers.@/TopK_1"] sorted@, order@ = TopK <axis = 0, largest = 0> (idx@, k@)
        ["/model/layers.@/Gather"] sel@ = Gather <axis = 0> (x@, sorted@)
        ["/model/layers.@/block/MatMul"] out@ = MatMul (sel@, "model.layers.@.expert.weight")
        ["/model/layers.@/Gather_1"] w@ = Gather <axis = 0> (score@, sorted@)
        ["/model/layers.@/Sigmoid"] ws@ = Sigmoid (w@)
        wu@ = Unsqueeze (ws@, axis@)
        ["/model/layers.@/Sub"] d@ = Sub (out@, sel@)
        ["/model/layers.@/Mul"] upd@ = Mul (d@, wu@)
        at@ = Unsqueeze (sorted@, axis@)
        ["/model/layers.@/ScatterND"] x@+1 = ScatterND <reduction = "add"> (x@, at@, upd@)
"""


def test_mixture_of_depths_blocks_run_on_their_chosen_tokens():
    # Mixture-of-Depths: each routed block takes its top-k tokens, in their order (torch.sort of
    # the indices exports as a second TopK), and adds its residual branch, weighted by the picked
    # router scores, back to those rows. Two such blocks in a row: the stream the first one's
    # scatter writes is no routing mask, so the second's weighting is no masking
    text = graph([DENSE, MIXTURE_OF_DEPTHS, MIXTURE_OF_DEPTHS, DENSE], [DENSE_W, MOE_W, MOE_W, DENSE_W])
    x = np.array([[1.0, 2.0], [-3.0, -1.0], [0.5, 0.5], [2.0, 0.0]], dtype=np.float32)
    (y,) = ReferenceEvaluator(model_of(text)).run(None, {"x0": x})
    assert y.shape == (4, 2)
    report = audit(text)
    assert verdicts(report) == ["always", "subset", "subset", "always"]
    for block in report.blocks[1:3]:
        assert [(e.kind, e.op, e.size) for e in block.evidence] == [("selection", "Gather", "fixed (capacity)")]
    # the routers' raw scores (a linear layer's, unsquashed, straight into TopK) are coefficients
    assert [(c.tensor, c.family, c.layer) for c in report.coefficients] == [("s1", "router", 1), ("s2", "router", 2)]
    # not an LM head's logits over a vocabulary wider than the hidden state, whatever picks from them
    head = text.replace('["/model/head/Identity"] y = Identity (x4)', """
        ["/model/head/MatMul"] logits = MatMul (x4, "head.weight")
        k3 = Constant <value = int64[1] {3}> ()
        ["/model/head/TopK"] best, y = TopK (logits, k3)""").replace("=> (float[T, 2] y)", "=> (int64[T, 3] y)").replace(
        "> {", ', float[2, 8] "head.weight" = {1.0, 0.0, 0.5, 0.0, 1.0, 0.0, 0.5, 0.0, 0.0, 1.0, 0.0, 0.5, 0.0, 1.0, '
        '0.0, 0.5}> {', 1)
    assert [c.tensor for c in audit(head).coefficients] == ["s1", "s2"]
    # TorchScript adds the router's bias first, Add(bias, scores): still the same router
    biased = text.replace('["/model/layers.1/router/Squeeze"] score1 = Squeeze (s1, axis1)',
                          '["/model/layers.1/router/Add"] sb1 = Add (bias, s1)\n'
                          '        ["/model/layers.1/router/Squeeze"] score1 = Squeeze (sb1, axis1)').replace(
        "> {", ", float[1] bias = {0.25}> {", 1)
    assert "sb1 = Add (bias, s1)" in biased
    assert [(c.tensor, c.layer) for c in audit(biased).coefficients] == [("s1", 1), ("s2", 2)]


@pytest.mark.parametrize("squash", ["log_softmax", "sigmoid"])
def test_a_token_pruners_score_is_a_router_of_the_block_it_prunes_for(squash):
    # DynamicViT: a predictor (outside the blocks, run before block 1) scores each token with a
    # LogSoftmax over keep / drop; TopK of the keep column picks the tokens block 1 runs on. Or
    # one σ per token, of shape (batch, seq): as wide as the sequence, still a router
    text = f"""
    <ir_version: 8, opset_import: ["" : 18]>
    g (float[batch, seq, 2] x0) => (float[batch, two, 2] y) <{DENSE_W.replace("@", "0")}, {DENSE_W.replace("@", "1")},
        float[2, 2] "score_predictor.0.weight" = {EYE}, int64[1] keep = {{0}}, int64[1] k = {{2}},
        int64[3] wide = {{1, 1, 2}}, int64[1] last = {{2}}> {{
        {DENSE.replace("@+1", "1").replace("@", "0")}
        ["/score_predictor.0/MatMul"] s = MatMul (x1, "score_predictor.0.weight")
        ["/score_predictor.0/LogSoftmax"] score = LogSoftmax <axis = -1> (s)
        ["/Gather"] kept = Gather <axis = 2> (score, keep)
        ["/Squeeze"] kept2 = Squeeze (kept, last)
        ["/TopK"] top, idx = TopK <axis = 1> (kept2, k)
        ["/Unsqueeze"] idx3 = Unsqueeze (idx, last)
        ["/Expand"] rows = Expand (idx3, wide)
        ["/GatherElements"] picked = GatherElements <axis = 1> (x1, rows)
        ["/model/layers.1/fc/MatMul"] h1 = MatMul (picked, "model.layers.1.fc.weight")
        ["/model/layers.1/Add"] y = Add (picked, h1)
    }}"""
    if squash == "sigmoid":
        text = text.replace('score = LogSoftmax <axis = -1> (s)', 'score = Identity (s)').replace(
            '["/Squeeze"] kept2 = Squeeze (kept, last)', '["/Squeeze"] kept1 = Squeeze (kept, last)\n'
            '        ["/score_predictor.0/Sigmoid"] kept2 = Sigmoid (kept1)')
    report = audit(text)
    expected = ("score", "router", 1, ("batch", "token", "slot")) if squash == "log_softmax" else \
        ("kept2", "router", 1, ("batch", "token"))
    assert [(c.tensor, c.family, c.layer, c.axes) for c in report.coefficients] == [expected]
    assert verdicts(report) == ["always", "subset"]


def test_a_gate_over_the_tokens_and_a_class_token_has_a_token_axis():
    # a class token put before the tokens: the gate's second axis is seq + 1, which inference calls
    # unk; it grows with the token count, so it is the token axis (token_shuffle, static_position)
    text = f"""
    <ir_version: 8, opset_import: ["" : 18]>
    g (float[batch, seq, 2] x0) => (float[batch, more, 2] y) <{DENSE_W.replace("@", "0")},
        float[1, 1, 2] cls = {{0.5, -0.5}}, float[2, 2] "gate.weight" = {EYE}, int64[2] one_two = {{1, 2}}> {{
        ["/Shape"] b = Shape <end = 1> (x0)
        ["/Concat"] size = Concat <axis = 0> (b, one_two)
        ["/Expand"] c = Expand (cls, size)
        ["/Concat_1"] xc = Concat <axis = 1> (c, x0)
        ["/model/layers.0/fc/MatMul"] h0 = MatMul (xc, "model.layers.0.fc.weight")
        ["/model/layers.0/gate/MatMul"] gl = MatMul (xc, "gate.weight")
        ["/model/layers.0/gate/Sigmoid"] gate = Sigmoid (gl)
        ["/model/layers.0/Mul"] m = Mul (gate, h0)
        ["/model/layers.0/Add"] y = Add (xc, m)
    }}"""
    report = audit(text)
    assert [(c.tensor, c.axes) for c in report.coefficients] == [("gate", ("batch", "token", "slot"))]


def test_attention_probabilities_over_the_tokens_are_no_coefficient():
    # softmax(q·kᵀ) of shape (batch, seq, seq) weights the values: its last axis is the tokens
    # too, but one score per token of a (batch, seq) router is what counts, not this
    text = f"""
    <ir_version: 8, opset_import: ["" : 18]>
    g (float[batch, seq, 2] x0) => (float[batch, seq, 2] y) <{DENSE_W.replace("@", "0")}, int64[3] swap = {{0, 2, 1}}> {{
        ["/model/layers.0/q/MatMul"] q = MatMul (x0, "model.layers.0.fc.weight")
        ["/model/layers.0/Transpose"] kt = Transpose <perm = [0, 2, 1]> (x0)
        ["/model/layers.0/scores/MatMul"] scores = MatMul (q, kt)
        ["/model/layers.0/Softmax"] probs = Softmax <axis = -1> (scores)
        ["/model/layers.0/mix/MatMul"] mixed = MatMul (probs, x0)
        ["/model/layers.0/Add"] y = Add (x0, mixed)
    }}"""
    report = audit(text)
    assert report.coefficients == () and verdicts(report) == ["always"]


@pytest.mark.parametrize("select", ["nonzero", "compress", "forced"])
def test_a_score_thresholded_into_a_token_selection_is_a_router(select):
    # threshold pruning at batch 1: σ(score) > ½ keeps the tokens block 1 runs on, through NonZero
    # and a Gather, or a Compress; the kept count depends on the values. Or the mask has its first
    # token forced in by a scatter first (DynamicViT's class token: keep[0] = True)
    forced = """
        ["/ScatterND"] keepf = ScatterND (keep, first, yes)
        ["/NonZero"] nz = NonZero (keepf)""" if select == "forced" else """
        ["/NonZero"] nz = NonZero (keep)"""
    pick = (forced + """

        ["/Reshape"] idx = Reshape (nz, flat)
        ["/Gather"] picked = Gather <axis = 1> (x1, idx)""" if select != "compress" else """
        ["/Reshape"] keep1 = Reshape (keep, flat)
        ["/Compress"] picked = Compress <axis = 1> (x1, keep1)""")
    text = f"""
    <ir_version: 8, opset_import: ["" : 18]>
    g (float[1, seq, 2] x0) => (float[1, kept, 2] y) <{DENSE_W.replace("@", "0")}, {DENSE_W.replace("@", "1")},
        float[2, 1] "score.weight" = {{1.0, -1.0}}, float half = {{0.5}}, int64[1] flat = {{-1}}, int64[1] last = {{2}},
        int64[1, 2] first = {{0, 0}}, bool[1] yes = {{1}}> {{
        {DENSE.replace("@+1", "1").replace("@", "0")}
        ["/score/MatMul"] s = MatMul (x1, "score.weight")
        ["/score/Sigmoid"] p = Sigmoid (s)
        ["/Greater"] keep2 = Greater (p, half)
        ["/Squeeze"] keep = Squeeze (keep2, last)
        {pick}
        ["/model/layers.1/fc/MatMul"] h1 = MatMul (picked, "model.layers.1.fc.weight")
        ["/model/layers.1/Add"] y = Add (picked, h1)
    }}"""
    report = audit(text)
    assert [(c.tensor, c.family, c.layer) for c in report.coefficients] == [("p", "router", 1)]
    assert verdicts(report) == ["always", "subset"]
    assert report.blocks[1].evidence[0].size == "data-dependent"


def test_a_per_token_exit_that_still_computes_every_token_is_masked():
    # CALM as most code writes it: after each block, tokens whose exit head is confident enough
    # keep their state, where(exited, h, block(h)), but the block ran on every token. The exit
    # head's MatMul and the Where sit between the blocks
    step = """
        ["/model/layers.@/fc/MatMul"] f@ = MatMul (x@, "model.layers.@.fc.weight")
        ["/model/layers.@/Add"] h@ = Add (x@, f@)
        ["/exit@/MatMul"] e@ = MatMul (x@, "exit.@.weight")
        ["/exit@/Softmax"] p@ = Softmax <axis = -1> (e@)
        ["/exit@/ReduceMax"] c@ = ReduceMax <keepdims = 1> (p@, last@)
        ["/exit@/Greater"] done@ = Greater (c@, thr@)
        ["/Where_@"] x@+1 = Where (done@, x@, h@)
"""
    weights = DENSE_W + (f', float[2, 2] "exit.@.weight" = {EYE}, int64[1] "last@" = {{-1}}, '
                         f'float "thr@" = {{0.6}}')
    text = graph([step] * 3, [weights] * 3, inputs="float[batch, seq, 2] x0", opsets='"" : 18').replace(
        "float[T, 2] y", "float[batch, seq, 2] y")
    x = np.array([[[1.0, 2.0], [3.0, -1.0], [0.5, 0.5]]], dtype=np.float32)
    (y,) = ReferenceEvaluator(model_of(text)).run(None, {"x0": x})
    assert y.shape == (1, 3, 2)
    report = audit(text)
    assert verdicts(report) == ["masked", "masked", "masked"] and not report.dynamic
    ev = report.blocks[1].evidence[0]
    assert (ev.kind, ev.op, ev.node) == ("routing mask", "Where", "/Where_1")
    assert "keeps `x1` or takes `h1`" in ev.detail
