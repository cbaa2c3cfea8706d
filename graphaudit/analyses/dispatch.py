"""A one-hot dispatch written as an Einsum: a capacity-factor MoE's (GShard, Switch Transformer,
DeepSpeed's `einsum("sec,sm->ecm", dispatch_mask, x)`).

The router's ArgMax / TopK, one-hot encoded and compared with each token's place in its
expert's queue (cumsum − 1 < C, == range(C)), gives a mask of 0s and 1s, tokens × experts ×
slots: an *indicator*. An Einsum that contracts the hidden state's token axis with such a
mask, keeping the hidden state's other axes and putting the mask's expert and slot axes in
the token axis's place, copies at most C tokens per expert into a buffer of fixed size: a
selection, not a mask over results computed in full. A mask weighted by the router's scores
(the combine's) holds values other than 0 and 1, and Soft MoE's dispatch is a softmax over
tokens: neither is an indicator, and an Einsum by either selects nothing.
"""

from __future__ import annotations

from graphaudit.graph.model import ModelGraph, Node, TensorRef

_BOOL = 9  # TensorProto.BOOL
# Ops whose result holds only 0s and 1s where their inputs do: the first input's layout, a cast,
# a product or minimum of indicators.
_KEEPS_FIRST = frozenset({"Cast", "Reshape", "Transpose", "Squeeze", "Unsqueeze", "Flatten", "Identity", "Expand"})
_KEEPS_ALL = frozenset({"Mul", "Min", "And"})


def indicates(mg: ModelGraph, node: Node, mask, indicator) -> bool:
    """Whether `node`'s results hold only 0s and 1s that a routing decision set: a comparison (a
    boolean result) of a value `mask` holds (one computed from a routing decision), a OneHot of
    one, or a cast, reshape or product of values `indicator` holds."""
    ins = [r for r in node.inputs if r is not None]
    if not ins or node.domain not in ("", "ai.onnx"):
        return False
    op = node.op_type
    if op in _KEEPS_FIRST and ins[0] in indicator:
        return True
    if op in _KEEPS_ALL and all(r in indicator for r in ins):
        return True
    if op == "OneHot":
        return ins[0] in mask
    outs = [mg.tensors.get(r) for r in node.outputs if r is not None]
    return bool(outs) and all(o is not None and o.elem_type == _BOOL for o in outs) \
        and any(r in mask for r in ins)


def dispatch_operands(node: Node, indicator) -> tuple[TensorRef, TensorRef] | None:
    """(mask, data) of an Einsum that dispatches `data`'s rows into slots by an indicator `mask`:
    it contracts exactly one axis of `data`, not its last (the features), with `mask`, and gives
    back every other axis of `data` and every other axis of `mask`, two or more of which `data`
    has not (the experts and their slots, in the token axis's place: `ne,nd->ed` would sum each
    expert's tokens, no pick of rows); None for any other node."""
    found = _terms(node)
    if found is None:
        return None
    terms, out = found
    ins = node.inputs
    for m, d in ((0, 1), (1, 0)):
        mask, data, ms, ds = ins[m], ins[d], terms[m], terms[d]
        if mask not in indicator or data in indicator or not ds or len(set(ds)) != len(ds):
            continue
        contracted = [c for c in ds if c not in out]
        if len(contracted) != 1 or contracted[0] not in ms or ds[-1] == contracted[0]:
            continue
        brought = [c for c in ms if c not in ds]  # the experts and their slots
        if len(brought) >= 2 and all(c in out for c in ms if c != contracted[0]):
            assert mask is not None and data is not None  # _terms takes only an Einsum given both operands
            return mask, data
    return None


def combines(node: Node, selected, activation) -> bool:
    """Whether `node` is an Einsum that gives rows back to their tokens from slots (a dispatch's
    combine, `einsum("nec,ecd->nd", combine_weights, expert_out)`): it contracts axes of a value
    `selected` holds, not its last (the features), with an `activation` (a routing mask, weighted
    by the router's scores or not) that brings an axis the selected value has not (the tokens).
    What follows runs on every token again."""
    terms = _terms(node)
    if terms is None:
        return False
    (a, b), out = terms
    for m, d in ((0, 1), (1, 0)):
        if node.inputs[m] in selected or node.inputs[d] not in selected or not activation(node.inputs[m]):
            continue
        ms, ds = (a, b) if m == 0 else (b, a)
        contracted = [c for c in ds if c not in out]
        if contracted and ds[-1] not in contracted and all(c in ms for c in contracted) \
                and any(c not in ds and c in out for c in ms):
            return True
    return False


def _terms(node: Node) -> tuple[tuple[str, str], str] | None:
    """((first operand's axes, second's), result's) of a two-operand Einsum with an explicit
    result and no ellipsis; None for any other node."""
    if node.op_type != "Einsum" or node.domain not in ("", "ai.onnx") or len(node.inputs) != 2 \
            or None in node.inputs:
        return None
    equation = next((a.s.decode() for a in node.proto.attribute if a.name == "equation"), "").replace(" ", "")
    if "..." in equation or equation.count("->") != 1:
        return None
    lhs, out = equation.split("->")
    terms = lhs.split(",")
    return ((terms[0], terms[1]), out) if len(terms) == 2 else None
