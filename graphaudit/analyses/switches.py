"""An If whose branches run the same compute: a switch between two spellings of one computation.

An exported decoder with and without its key/value cache, merged into one graph (Hugging
Face Optimum's `decoder_model_merged.onnx`), holds the whole network twice, once in each
branch of an If on `use_cache_branch`. Whichever branch runs, every block runs: nothing is
skipped, whatever decides the condition. Such an If is told by its branches: the same
compute nodes (operator and the values it reads from outside the If, the weights) in each,
the same number of times. Two branches that differ in what they compute, or in the weights
they compute it with (a cheaper expert, a slimmer layer, an early exit's pass-through), are
real conditional execution, and stay so.
"""

from __future__ import annotations

from collections import Counter

from graphaudit.analyses.flops import is_counted
from graphaudit.graph import ModelGraph, Node

SWITCH = "switch"  # Evidence.kind of such an If


def switches(mg: ModelGraph) -> dict[str, int]:
    """If node id -> the number of compute nodes in each of its branches, for every If whose
    branches run the same compute on the same outside values (at least one compute node)."""
    found: dict[str, int] = {}
    for node in mg.nodes.values():
        if node.op_type != "If" or node.domain not in ("", "ai.onnx"):
            continue
        branches: dict[str, Counter] = {"then_branch": Counter(), "else_branch": Counter()}
        bodies = tuple(b.scope for b in mg.bodies(node.id))
        for inner in mg.inside(node.id):
            if is_counted(inner):
                kind = next(s.kind for s in inner.scopes if s.owner == node.id)
                if kind in branches:
                    branches[kind][_signature(mg, inner, bodies)] += 1
        then, other = branches.values()
        if then and then == other:
            found[node.id] = sum(then.values())
    return found


def switched_nodes(mg: ModelGraph) -> dict[str, str]:
    """Node id -> the switch it lies in (the outermost), for every node inside a switch's branches."""
    found = switches(mg)
    return {inner.id: owner for owner in found for inner in mg.inside(owner)
            if next(s.owner for s in inner.scopes if s.owner in found) == owner}


def _signature(mg: ModelGraph, node: Node, bodies: tuple[str, ...]) -> tuple:
    """A compute node as it reads: its operator and, of its inputs, those defined outside the If
    (by name: the weights both branches share) or, for its own branch's values, only that they
    are local."""
    def local(scope: str) -> bool:
        return any(scope == key or scope.startswith(key + "/") for key in bodies)

    return (node.domain, node.op_type, tuple(
        "" if ref is None else "local" if local(ref.scope) else str(ref) for ref in node.inputs))
