"""The graph transforms' one contract (graphaudit.replay.passes): what a pass gives back, who may
change a model, and how passes compose."""

import onnx
import pytest
from onnx import helper, parser

from graphaudit.analyses.declared_coefficients import Coefficient, declared_coefficients
from graphaudit.errors import GraphAuditError
from graphaudit.load.model import load_for_runtime
from graphaudit.metrics.tasks import LOG_PROBS, Task
from graphaudit.replay.passes import PassResult, Steps, run_passes
from graphaudit.replay.prefix import CutPrefix
from graphaudit.replay.rewrite import Rewrite
from graphaudit.replay.rewrite_attention import RewriteAttention
from graphaudit.replay.steps import replay_passes
from graphaudit.replay.surgery import Freeze, LogProbs, Trace

from support.models import gated_lm
from support.zoo import FIXTURES

# A graph none of the rewrites, nor the cut, applies to: its only node reads the coefficient `gate`
_PLAIN = """
<ir_version: 9, opset_import: ["" : 20]>
plain (float[batch, 4] x, float[batch, 4] gate) => (float[batch, 4] logits) {
    logits = Mul(x, gate)
}
"""


def _plain() -> onnx.ModelProto:
    model = parser.parse_model(_PLAIN)
    onnx.checker.check_model(model, full_check=True)
    return model


def _keeps_the_contract(graph_pass, model: onnx.ModelProto) -> PassResult:
    """The pass's result on `model`, checked against the contract: the argument left alone, and
    a new model exactly when modified."""
    before = model.SerializeToString()
    result = graph_pass(model)
    assert model.SerializeToString() == before, "a pass not handed its model leaves it alone"
    assert (result.model is not model) == result.modified
    return result


def _traced_gated():
    model = gated_lm()
    coefs = declared_coefficients(model)
    return Trace(coefs)(model).model, coefs


@pytest.mark.parametrize("graph_pass, build", [
    (lambda coefs: Trace(coefs), _traced_gated),  # every coefficient an output already
    (lambda coefs: LogProbs("logits", "logits"), _traced_gated),  # the output holds log-probabilities
    (lambda coefs: Rewrite(), lambda: (_plain(), ())),
    (lambda coefs: RewriteAttention(), lambda: (_plain(), ())),
    (lambda coefs: CutPrefix(["gate"]), lambda: (_plain(), ())),
], ids=["trace", "log_probs", "rewrite", "rewrite_attention", "cut_prefix"])
def test_a_pass_that_changes_nothing_says_so_and_gives_back_the_model_it_was_handed(graph_pass, build):
    model, coefs = build()
    result = _keeps_the_contract(graph_pass(coefs), model)
    assert not result.modified and result.model is model
    assert result.details in ((), None, 0, {})


def test_freezing_a_graph_it_does_not_apply_to_is_refused_not_a_no_op():
    model, coefs = _traced_gated()
    with pytest.raises(GraphAuditError, match="at least one coefficient"):
        Freeze([])(model)
    with pytest.raises(GraphAuditError, match="already frozen"):
        Freeze(coefs)(Freeze(coefs)(model).model)


@pytest.mark.skipif(not (FIXTURES / "featuregate" / "model.onnx").is_file(), reason="no zoo fixtures")
def test_each_pass_on_a_zoo_model_says_it_changed_it_and_what_it_did():
    live = load_for_runtime(FIXTURES / "featuregate" / "model.onnx").model
    coefs = declared_coefficients(live)
    names = tuple(c.tensor for c in coefs)
    trace = _keeps_the_contract(Trace(coefs), live)
    assert trace.modified and trace.details == names
    assert [o.name for o in trace.model.graph.output][-len(names):] == list(names)
    frozen = _keeps_the_contract(Freeze(coefs), live)
    assert frozen.modified and frozen.details.coefficients == coefs and frozen.details.removed
    assert not {n.name for n in frozen.model.graph.node} & set(frozen.details.removed)
    scored = _keeps_the_contract(LogProbs("logits", LOG_PROBS), frozen.model)
    assert scored.modified and scored.details == LOG_PROBS
    rewritten = _keeps_the_contract(Rewrite(), frozen.model)
    assert rewritten.modified and rewritten.details["attention"] == 4
    filled = Rewrite(kinds=("masked_fill",))(frozen.model).model  # the masks Attention takes, made additive
    attention = _keeps_the_contract(RewriteAttention(), filled)
    assert attention.modified and attention.details == 4
    cut = _keeps_the_contract(CutPrefix(names), frozen.model)
    assert cut.modified and cut.model is cut.details.suffix and cut.details.cut


class _Recording:
    """A pass that records how it was called and adds node `name` (or changes nothing: `name` None)."""

    def __init__(self, name, calls):
        self.name, self.calls = name, calls

    def __call__(self, model, *, owned=False):
        self.calls.append((self.name, owned))
        if self.name is None:
            return PassResult(model, False, None)
        out = model if owned else onnx.ModelProto()
        if not owned:
            out.CopyFrom(model)
        out.graph.node.append(helper.make_node("Identity", ["logits"], [self.name], name=self.name))
        return PassResult(out, True, self.name)


def test_run_passes_runs_them_in_order_and_hands_over_only_the_models_they_made():
    model, calls = _plain(), []
    before = model.SerializeToString()
    result = run_passes(model, [_Recording(None, calls), _Recording("a", calls), _Recording(None, calls),
                                _Recording("b", calls)])
    # a pass that changed nothing hands on the caller's model, still the caller's; after one made a copy, owned
    assert calls == [(None, False), ("a", False), (None, True), ("b", True)]
    assert [n.name for n in result.model.graph.node][-2:] == ["a", "b"]
    assert model.SerializeToString() == before and result.modified
    assert [(s.modified, s.details) for s in result.details.steps] == [(False, None), (True, "a"), (False, None),
                                                                     (True, "b")]
    run_passes(model, [_Recording("c", calls)], owned=True)
    assert calls[-1] == ("c", True) and model.graph.node[-1].name == "c", "handed over, changed in place"


def test_the_order_of_the_passes_is_the_order_they_apply():
    model = _plain()
    chained = run_passes(model, [LogProbs("logits", "a"), LogProbs("a", "b")])
    assert [o.name for o in chained.model.graph.output] == ["logits", "a", "b"]
    onnx.checker.check_model(chained.model, full_check=True)
    with pytest.raises(GraphAuditError, match="expected a graph output named 'a'"):
        run_passes(model, [LogProbs("a", "b"), LogProbs("logits", "a")])


def test_no_passes_give_back_the_model_unchanged_and_steps_find_a_pass_by_kind():
    model = _plain()
    empty = run_passes(model, [])
    assert empty.model is model and not empty.modified and empty.details == Steps()
    steps = run_passes(model, [LogProbs("logits", "a"), Rewrite()]).details
    assert steps.of(LogProbs) == "a" and steps.of(Rewrite) == {}
    assert steps.of(CutPrefix) is None and steps.of(CutPrefix, "none") == "none"


@pytest.mark.skipif(not (FIXTURES / "featuregate" / "model.onnx").is_file(), reason="no zoo fixtures")
def test_the_replays_passes_are_the_log_probabilities_then_the_rewrites():
    live = load_for_runtime(FIXTURES / "featuregate" / "model.onnx").model
    frozen = Freeze(declared_coefficients(live))(live).model
    lm = Task("causal_lm", "logits", "input_ids")
    assert replay_passes(lm, rewrite=False) == [LogProbs("logits", LOG_PROBS, "logits")]
    result = run_passes(frozen, replay_passes(lm, rewrite=True))
    assert result.details.of(LogProbs) == LOG_PROBS and result.details.of(Rewrite)["masked_fill"] == 4
    by_hand = Rewrite()(LogProbs("logits", LOG_PROBS)(frozen).model).model
    assert result.model.SerializeToString() == by_hand.SerializeToString()
    values = Task("regression", "logits")  # scored as it is: nothing to add
    (step,) = run_passes(frozen, replay_passes(values, rewrite=False)).details.steps
    assert not step.modified


def test_coefficients_are_held_as_a_tuple_so_a_pass_is_a_value():
    coefs = [Coefficient("gate.0", "gate", 0, ("batch", "token", "feature"))]
    assert Trace(coefs) == Trace(tuple(coefs)) and Freeze(coefs).coefficients == tuple(coefs)
    assert CutPrefix(["gate"]) == CutPrefix(("gate",))
