"""A selection the graph's caller decides: rows picked by a NonZero of the attention mask, a
graph input, with no learned computation in between (padding removal). Still `subset`, since
the compute does shrink with the input, but the evidence says that the input decides, not the
model; a router's choice (learned scores) does not say so."""

from pathlib import Path

import onnx.parser

from graphaudit.analyses.static import audit_static
from graphaudit.load.model import load_model

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
WEIGHTS = ", ".join(["0.1"] * 16)


def unpadding(scored: bool) -> onnx.ModelProto:
    """Two residual layers run on the rows the mask keeps (NonZero → GatherND), scattered back;
    with `scored`, the mask is first multiplied by a learned score of the tokens."""
    score = ('["/model/score/MatMul"] sc = MatMul (x, "model.score.w")\n'
             '        ["/model/score/ReduceSum"] s = ReduceSum <keepdims = 0> (sc, last)\n'
             '        ["/model/Greater"] keep = Greater (s, zero)\n'
             '        ["/model/Cast"] kf = Cast <to = 7> (keep)\n'
             '        ["/model/Mul"] m = Mul (attention_mask, kf)') if scored else \
        '["/model/Identity"] m = Identity (attention_mask)'
    model = onnx.parser.parse_model(f"""
    <ir_version: 8, opset_import: ["" : 17]>
    g (float[B, T, 4] x, int64[B, T] attention_mask) => (float[B, T, 4] y)
      <float[4, 4] "model.layers.0.w" = {{{WEIGHTS}}}, float[4, 4] "model.layers.1.w" = {{{WEIGHTS}}},
       float[4, 4] "model.score.w" = {{{WEIGHTS}}}, int64[2] flat = {{-1, 4}}, int64[1] minus1 = {{-1}},
       int64[1] last = {{-1}}, float zero = {{0.0}}> {{
        {score}
        ["/model/Reshape"] xf = Reshape (x, flat)
        ["/model/Reshape_1"] mf = Reshape (m, minus1)
        ["/model/NonZero"] nz = NonZero (mf)
        ["/model/Transpose"] idx = Transpose <perm = [1, 0]> (nz)
        ["/model/GatherND"] rows = GatherND (xf, idx)
        ["/model/layers.0/MatMul"] m0 = MatMul (rows, "model.layers.0.w")
        ["/model/layers.0/Add"] h0 = Add (rows, m0)
        ["/model/layers.1/MatMul"] m1 = MatMul (h0, "model.layers.1.w")
        ["/model/layers.1/Add"] h1 = Add (h0, m1)
        ["/model/ScatterND"] back = ScatterND (xf, idx, h1)
        ["/model/Shape"] shape = Shape (x)
        ["/model/Reshape_2"] y = Reshape (back, shape)
    }}""")
    onnx.checker.check_model(model, full_check=True)
    return model


def test_rows_picked_by_the_attention_mask_alone_are_the_callers_choice():
    report = audit_static(load_model(unpadding(scored=False)))
    assert [b.verdict for b in report.blocks] == ["subset", "subset"]
    detail = report.blocks[0].evidence[0].detail
    assert "chosen by the graph input `attention_mask` alone, through no learned computation" in detail


def test_rows_picked_by_a_learned_score_are_the_models_choice():
    report = audit_static(load_model(unpadding(scored=True)))
    assert [b.verdict for b in report.blocks] == ["subset", "subset"]
    assert "alone" not in report.blocks[0].evidence[0].detail


def test_a_routers_choice_is_not_the_callers():
    report = audit_static(load_model(FIXTURES / "moe" / "model.onnx"))
    subsets = [b for b in report.blocks if b.verdict == "subset"]
    assert subsets and not any("alone" in ev.detail for b in subsets for ev in b.evidence)
