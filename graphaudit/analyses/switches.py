"""An If that is a switch between two modes of one model, not a decision of the model's.

An exported decoder with and without its key/value cache, merged into one graph (Hugging
Face Optimum's `decoder_model_merged.onnx`), holds the whole network twice, once in each
branch of an If on a `use_cache_branch` input. Two kinds of If are switches:

- its branches run the same compute: the same compute nodes (operator and the values it
  reads from outside the If, the weights) in each, as many times. Whichever branch runs,
  every block runs: nothing is skipped, whatever decides the condition;
- its condition is a graph input passed on as it is (reshaped, cast, negated, compared with
  a constant: `reach.inputs_alone`): the caller chooses the mode, as it chooses the input
  shapes; the branches may differ (T5's cached cross-attention keys are read, not computed).

Neither is dynamic inference. An If whose condition the model computes from the data, with
branches that differ (an early exit's pass-through, a cheaper expert), is, and stays so.
"""

from __future__ import annotations

from collections import Counter

from graphaudit.analyses.flops import is_counted
from graphaudit.analyses.reach import inputs_alone
from graphaudit.graph import ModelGraph, Node

SWITCH = "switch"  # Evidence.kind of such an If


def switches(mg: ModelGraph) -> dict[str, str]:
    """If node id -> why it is a switch, in words, for every If of either kind."""
    found: dict[str, str] = {}
    for node in mg.nodes.values():
        if node.op_type != "If" or node.domain not in ("", "ai.onnx"):
            continue
        same = _same_compute(mg, node)
        if same:
            found[node.id] = (f"both branches run the same {same} compute nodes on the same weights, a switch "
                              "between two spellings of one computation (an exported decoder with and without its "
                              "cache): nothing is skipped")
            continue
        caller = inputs_alone(mg, node)
        if caller:
            names = ", ".join(f"`{name}`" for name in caller)
            found[node.id] = (f"its condition is the graph input{'s' if len(caller) > 1 else ''} {names} passed on as "
                              "it is: the caller chooses the branch, as it chooses a mode of the model (a decoder "
                              "with or without its cache), not the model")
    return found


def switched_nodes(mg: ModelGraph) -> dict[str, str]:
    """Node id -> the switch it lies in (the outermost), for every node inside a switch's branches."""
    found = switches(mg)
    return {inner.id: owner for owner in found for inner in mg.inside(owner)
            if next(s.owner for s in inner.scopes if s.owner in found) == owner}


def _same_compute(mg: ModelGraph, node: Node) -> int:
    """The number of compute nodes in each branch of the If `node` when both branches run the
    same compute on the same outside values; 0 when they do not, or run none."""
    branches: dict[str, Counter] = {"then_branch": Counter(), "else_branch": Counter()}
    bodies = tuple(b.scope for b in mg.bodies(node.id))
    for inner in mg.inside(node.id):
        if is_counted(inner):
            kind = next(s.kind for s in inner.scopes if s.owner == node.id)
            if kind in branches:
                branches[kind][_signature(inner, bodies)] += 1
    then, other = branches.values()
    return sum(then.values()) if then and then == other else 0


def _signature(node: Node, bodies: tuple[str, ...]) -> tuple:
    """A compute node as it reads: its operator and, of its inputs, those defined outside the If
    (by name: the weights both branches share) or, for its own branch's values, only that they
    are local."""
    def local(scope: str) -> bool:
        return any(scope == key or scope.startswith(key + "/") for key in bodies)

    return (node.domain, node.op_type, tuple(
        "" if ref is None else "local" if local(ref.scope) else str(ref) for ref in node.inputs))
