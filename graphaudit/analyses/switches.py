"""An If that is a switch between two modes of one model, not a decision of the model's.

An exported decoder with and without its key/value cache, merged into one graph (Hugging
Face Optimum's `decoder_model_merged.onnx`), holds the whole network twice, once in each
branch of an If on a `use_cache_branch` input. Two kinds of If are switches:

- its branches run the same compute: the same compute nodes (operator, and the weights it
  reads: those defined outside the If by name, those each branch holds by their content) in
  each, as many times. Whichever branch runs, every block runs: nothing is skipped, whatever
  decides the condition;
- the caller decides its condition (`decisions`: a graph input passed on through no learned
  computation, a sample rate compared with 16000): the caller chooses the mode, as it chooses
  the input shapes; the branches may differ (T5's cached cross-attention keys are read, not
  computed; a detector's 16 kHz and 8 kHz branches hold other weights). What runs then does
  depend on an input, and the report says so (conditional execution, decided by the caller),
  but it is no decision of the model's.

Neither is dynamic inference. An If whose condition the model computes from the data, with
branches that differ (an early exit's pass-through, a cheaper expert), is, and stays so.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Mapping

from graphaudit.analyses.decisions import CALLER, Decision, decisions
from graphaudit.analyses.flops import is_counted
from graphaudit.graph.model import ModelGraph, Node, TensorRef

SWITCH = "switch"  # Evidence.kind of such an If
_DEPTH = 8


def switches(mg: ModelGraph, decided: Mapping[str, Decision] | None = None) -> dict[str, str]:
    """If node id -> why it is a switch, in words, for every If of either kind. `decided`: the
    graph's `decisions`, when the caller has them."""
    found: dict[str, str] = {}
    ifs = [n for n in mg.nodes.values() if n.op_type == "If" and n.domain in ("", "ai.onnx")]
    if not ifs:
        return found
    if decided is None:
        decided = decisions(mg)
    for node in ifs:
        same = same_compute(mg, node)
        if same:
            found[node.id] = (f"both branches run the same {same} compute nodes on the same weights, a switch "
                              "between two spellings of one computation (an exported decoder with and without its "
                              "cache): nothing is skipped")
            continue
        decision = decided.get(node.id)
        if decision is not None and decision.decided_by == CALLER:
            found[node.id] = ("the caller chooses the branch, as it chooses a mode of the model (a decoder with "
                              "or without its cache, a sample rate), not the model; its branches differ in compute, "
                              "so what runs depends on that input")
    return found


def switched_nodes(mg: ModelGraph) -> dict[str, str]:
    """Node id -> the switch it lies in (the outermost), for every node inside a switch's branches."""
    found = switches(mg)
    return {inner.id: owner for owner in found for inner in mg.inside(owner)
            if next(s.owner for s in inner.scopes if s.owner in found) == owner}


def same_compute(mg: ModelGraph, node: Node) -> int:
    """The number of compute nodes in each branch of the If `node` when both branches run the
    same compute on the same weights; 0 when they do not, or run none."""
    then, other = branch_compute(mg, node)
    return sum(then.values()) if then and then == other else 0


def branches_differ(mg: ModelGraph, node: Node) -> bool:
    """Whether the branches of the If `node` run other compute (operators or weights), so that
    which one runs decides what compute runs."""
    then, other = branch_compute(mg, node)
    return then != other


def branch_compute(mg: ModelGraph, node: Node) -> tuple[Counter, Counter]:
    """The compute nodes of each branch of the If `node` (then, else), each as `_signature` reads it."""
    branches: dict[str, Counter] = {"then_branch": Counter(), "else_branch": Counter()}
    bodies = tuple(b.scope for b in mg.bodies(node.id))
    weights = _branch_weights(mg, node)
    for inner in mg.inside(node.id):
        if is_counted(inner):
            kind = next(s.kind for s in inner.scopes if s.owner == node.id)
            if kind in branches:
                branches[kind][_signature(mg, inner, bodies, weights)] += 1
    return branches["then_branch"], branches["else_branch"]


def _signature(mg: ModelGraph, node: Node, bodies: tuple[str, ...], weights: Mapping[TensorRef, str]) -> tuple:
    """A compute node as it reads: its operator and, of its inputs, those defined outside the If
    by name (the weights both branches share), the weights its own branch holds (an initializer,
    a Constant node, as they are or reshaped) by their content, and its branch's other values
    only as local."""
    return (node.domain, node.op_type, tuple(_input(mg, ref, bodies, weights) for ref in node.inputs))


def _input(mg: ModelGraph, ref: TensorRef | None, bodies: tuple[str, ...], weights: Mapping[TensorRef, str],
           depth: int = 0):
    """How `_signature` reads one input `ref`. A function of its own, not a closure calling itself:
    that would hold itself, and `mg`, in a reference cycle only the cyclic collector frees."""
    if ref is None:
        return ""
    if not any(ref.scope == key or ref.scope.startswith(key + "/") for key in bodies):
        return str(ref)
    if ref in weights:
        return weights[ref]
    producer = mg.producer(ref)
    if producer is None or depth > _DEPTH or is_counted(producer):
        return "local"
    if producer.op_type == "Constant":
        return _digest(b"".join(a.name.encode() + (_unnamed(a.t) if a.HasField("t") else a.SerializeToString())
                                for a in producer.proto.attribute))
    return (producer.op_type, tuple(_input(mg, r, bodies, weights, depth + 1) for r in producer.inputs))


def _branch_weights(mg: ModelGraph, node: Node) -> dict[TensorRef, str]:
    """The initializers the branches of `node` hold (nested bodies' too), by TensorRef: a digest
    of their type, shape and content."""
    found: dict[TensorRef, str] = {}
    for owner in [node] + [n for n in mg.inside(node.id) if mg.bodies(n.id)]:
        graphs = {a.name: a.g for a in owner.proto.attribute if a.HasField("g")}
        for body in mg.bodies(owner.id):
            for t in graphs[body.kind].initializer if body.kind in graphs else ():
                found[TensorRef(t.name, body.scope)] = _digest(_unnamed(t))
    return found


def _unnamed(tensor) -> bytes:
    """A TensorProto's bytes without its name: two copies of one weight under two names are one."""
    copy = type(tensor)()
    copy.CopyFrom(tensor)
    copy.ClearField("name")
    return copy.SerializeToString()


def _digest(data: bytes) -> str:
    """The content of a serialised tensor or Constant node, in short."""
    return "weight:" + hashlib.sha1(data).hexdigest()
