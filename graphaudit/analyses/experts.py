"""A tighter bound on the rows a mixture of experts runs: at most k experts per routed row.

With every row of each value-dependent selection selected, every expert runs on every row
it could be handed: a loose bound. Where a TopK of constant k picks each row's experts and
each expert takes the rows whose indices equal its own number (`nonzero(chosen == e)`,
as the exporters write a dispatch loop over experts), the graph proves more:

- the experts' masks compare one index tensor with distinct constants, so no element of it
  is in two masks: the experts' rows add up to at most its elements, k per routed row;
- a TopK's indices in a row are distinct, so an expert gets at most one element per routed
  row: at most the routed rows;
- where the experts' numbers are every index the TopK can give (0 … choices − 1), every
  element is in exactly one mask: the rows add up to exactly k per routed row, whatever the
  input, and the cheapest run is the cheapest experts taking them, not no expert at all.

The FLOPs behind each expert's NonZero must grow in proportion to its rows for the bound to
follow from the rows; that is checked on the widest variant at 1, 2 and 3 times every row
(a count of non-negative powers of the rows that doubles and triples with them is
proportional to them). Where anything here cannot be shown, the loose bound stands.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from fractions import Fraction

from graphaudit.analyses.dependence import VALUE, DependenceMap
from graphaudit.analyses.loop_trips import Value
from graphaudit.graph.model import ModelGraph, Node, TensorRef

# Ops that keep every element of the indices (their count of each value), reordered or reshaped.
_KEEPS_ELEMENTS = frozenset({"Identity", "Reshape", "Squeeze", "Unsqueeze", "Flatten", "Transpose"})
_WIDE_INTS = frozenset({6, 7})  # INT32, INT64: casting expert indices to them keeps them apart
_DEPTH = 16


@dataclass(frozen=True)
class ExpertRows:
    """Experts that a TopK routes: their rows add up to at most k per routed row."""

    topk: str
    k: int
    choices: int  # experts to choose from: the TopK's axis
    experts: tuple[str, ...]  # the NonZero that picks each expert's rows
    routed: int  # rows routed: the TopK's index slices
    every_row: int  # their FLOPs with every row of each selection selected (the loose bound)
    bound: int  # their FLOPs with at most k experts per routed row
    least: int | None  # with exactly k per routed row (every index an expert's), else None: none may run


@dataclass(frozen=True)
class _Group:
    topk: Node
    k: int
    choices: int
    elements: int  # indices routed: k per routed row
    experts: tuple[Node, ...]  # NonZero nodes, one per expert number
    numbers: tuple[float, ...]  # the expert numbers, in the order of `experts`


def expert_bounds(mg: ModelGraph, dm: DependenceMap, value: Value,
                  resolve: Callable[[TensorRef], tuple[int, ...] | None],
                  wide: Mapping[str, tuple[int, ...]], every_row: Mapping[str, int],
                  count_at: Callable[[Mapping[str, int]], Mapping[str, int]]
                  ) -> tuple[dict[str, int], dict[str, int], tuple[ExpertRows, ...]]:
    """The FLOPs of the nodes behind routed experts' selections with at most k experts per row,
    by node id, in place of their count with every row selected (`every_row`); the least they
    run, by node id, where every index is an expert's (exactly k per row; elsewhere none may
    run); and the groups of experts bounded so. `resolve` gives a value's shape at the given input shapes, `wide`
    the shapes found on the widest variant, and `count_at(scale)` the FLOPs per node on that
    variant with each NonZero in `scale` giving that many times every element."""
    groups = _groups(mg, dm, value, resolve)
    reached = {nz.id: _behind(mg, dm, nz) for g in groups for nz in g.experts}
    behind = {g.topk.id: [reached[nz.id][0] & every_row.keys() for nz in g.experts] for g in groups}
    groups = [g for g, per in ((g, behind[g.topk.id]) for g in groups) if _apart(per) and all(
        _unwidened(mg, n, reached[nz.id][1], wide, resolve) for nz, nodes in zip(g.experts, per) for n in nodes)]
    if not groups:
        return {}, {}, ()
    scaled = {m: count_at({nz.id: m for g in groups for nz in g.experts}) for m in (2, 3)}
    tight: dict[str, int] = {}
    floor: dict[str, int] = {}
    found = []
    for g in groups:
        nodes = behind[g.topk.id]
        if not all(scaled[m].get(n) == m * every_row[n] for per in nodes for n in per for m in scaled):
            continue
        flops = [sum(every_row[n] for n in per) for per in nodes]
        rows = [_columns(wide, nz) for nz in g.experts]
        if None in rows or not all(rows) or not sum(flops):
            continue
        costs = sorted(Fraction(f, r) for f, r in zip(flops, rows))
        ids = sorted(n for per in nodes for n in per)
        bound = _filled(costs[::-1], g.elements, g.elements // g.k)
        _share_out(ids, every_row, min(Fraction(1), bound / sum(flops)), tight, math.ceil)
        every = set(g.numbers) == set(range(g.choices))  # each element in exactly one mask
        least = _filled(costs, g.elements, g.elements // g.k) if every else None
        if least is not None:
            _share_out(ids, every_row, min(Fraction(1), least / sum(flops)), floor, math.floor)
        found.append(ExpertRows(g.topk.id, g.k, g.choices, tuple(nz.id for nz in g.experts), g.elements // g.k,
                                sum(flops), sum(tight[n] for n in ids),
                                sum(floor[n] for n in ids) if least is not None else None))
    return tight, floor, tuple(found)


def _filled(per_row: list[Fraction], elements: int, each: int) -> Fraction:
    """The FLOPs experts of these costs per row run when, in this order, each takes as many of
    the `elements` rows as it may (`each` at most): costliest first, the most they can run;
    cheapest first, the least where all the rows must be taken."""
    total, left = Fraction(0), elements
    for cost in per_row:
        rows = min(each, left)
        total, left = total + cost * rows, left - rows
    return total


def _share_out(ids: list[str], every_row: Mapping[str, int], share: Fraction, into: dict[str, int], whole) -> None:
    """`share` of each node's FLOPs in whole FLOPs (`whole`: ceil for a bound from above, floor
    from below), adding up to the share of their sum."""
    exact, counted = Fraction(0), 0
    for n in ids:
        exact += every_row[n] * share
        into[n], counted = whole(exact) - counted, whole(exact)


def _groups(mg: ModelGraph, dm: DependenceMap, value: Value, resolve) -> list[_Group]:
    """NonZero nodes of `indices == e`, e a distinct constant for each, grouped by the TopK of
    constant k whose indices they read."""
    found: dict[str, tuple[Node, int, int, int, dict]] = {}
    for node in mg.top_level():
        if node.op_type != "NonZero" or node.domain not in ("", "ai.onnx") or not node.inputs:
            continue
        read = _expert_mask(mg, value, node.inputs[0])
        topk = _topk_indices(mg, read[0], 0) if read else None
        if read is None or topk is None or dm.value(topk.inputs[0]) != VALUE or len(topk.inputs) < 2:
            continue
        k, indices, scores = value(topk.inputs[1]), resolve(topk.outputs[1]), resolve(topk.inputs[0])
        mask = resolve(node.inputs[0])
        if k is None or k.size != 1 or indices is None or scores is None or mask is None \
                or math.prod(mask) != math.prod(indices):
            continue
        axis = next((a.i for a in topk.proto.attribute if a.name == "axis"), -1)
        entry = found.setdefault(topk.id, (topk, int(k.reshape(-1)[0]), scores[axis], math.prod(indices), {}))
        entry[4].setdefault(read[1], []).append(node)
    return [_Group(topk, k, choices, elements, tuple(nodes[0] for nodes in by_number.values()), tuple(by_number))
            for topk, k, choices, elements, by_number in found.values()
            if k > 0 and elements % k == 0 and len(by_number) > 1
            and all(len(nodes) == 1 for nodes in by_number.values())]  # one mask per expert number


def _expert_mask(mg: ModelGraph, value: Value, ref: TensorRef | None) -> tuple[TensorRef, float] | None:
    """(indices, e) where `ref` is `indices == e`, e a one-element constant (through Identity
    and Cast, which keep what is non-zero)."""
    for _ in range(_DEPTH):
        node = mg.producer(ref) if ref is not None else None
        if node is None or node.domain not in ("", "ai.onnx"):
            return None
        if node.op_type in ("Identity", "Cast") and node.inputs:
            ref = node.inputs[0]
            continue
        if node.op_type != "Equal" or len(node.inputs) != 2:
            return None
        a, b = node.inputs
        if a is None or b is None:
            return None
        for indices, number in ((a, b), (b, a)):
            constant = value(number)
            if constant is not None and constant.size == 1 and value(indices) is None:
                return indices, constant.reshape(-1)[0].item()
        return None
    return None


def _topk_indices(mg: ModelGraph, ref: TensorRef, depth: int) -> Node | None:
    """The TopK whose indices `ref` holds, every element kept (reshaped, reordered, cast wider)."""
    node = mg.producer(ref)
    if node is None or node.scopes or node.domain not in ("", "ai.onnx") or depth > _DEPTH:
        return None
    if node.op_type == "TopK":
        return node if len(node.outputs) > 1 and node.outputs[1] == ref else None
    to = next((a.i for a in node.proto.attribute if a.name == "to"), None)
    if node.op_type in _KEEPS_ELEMENTS or (node.op_type == "Cast" and to in _WIDE_INTS):
        return _topk_indices(mg, node.inputs[0], depth + 1) if node.inputs and node.inputs[0] is not None else None
    return None


def _behind(mg: ModelGraph, dm: DependenceMap, nonzero: Node) -> tuple[set[str], set[TensorRef]]:
    """The nodes whose size follows from `nonzero`'s rows, and the values they size: reached
    through values whose extent depends on input values."""
    nodes, values, stack = set(), set(), [nonzero]
    while stack:
        for out in stack.pop().outputs:
            if out is None or dm.shape(out) != VALUE or out in values:
                continue
            values.add(out)
            for consumer in mg.consumers(out):
                if consumer.id not in nodes:
                    nodes.add(consumer.id)
                    stack.append(consumer)
    return nodes, values


def _apart(behind: list[set[str]]) -> bool:
    """Whether no node runs behind two experts' selections, and some behind one."""
    return any(behind) and sum(map(len, behind)) == len(set().union(*behind))


def _unwidened(mg: ModelGraph, nid: str, sized: set[TensorRef], wide, resolve) -> bool:
    """Whether the inputs of node `nid` that its expert's rows do not size (`sized`) have a known
    shape, the same on the widest variant as at the given shapes (no other selection widens
    them, so the FLOPs there vary with this expert's rows alone)."""
    for ref in mg.nodes[nid].inputs:
        if ref is None or ref in sized:
            continue
        shape = resolve(ref)
        if shape is None or (not ref.scope and ref.name in wide and tuple(wide[ref.name]) != tuple(shape)):
            return False
    return True


def _columns(wide: Mapping[str, tuple[int, ...]], nonzero: Node) -> int | None:
    """The rows a NonZero gives on the widest variant (its output's second axis)."""
    shape = wide.get(nonzero.outputs[0].name) if nonzero.outputs and nonzero.outputs[0] is not None else None
    return shape[1] if shape is not None and len(shape) == 2 else None
