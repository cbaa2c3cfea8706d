"""The nodes block names leave out, placed (graphaudit.analyses.blocks): a node nested in a body
takes its owner's block, an unnamed node its neighbours' (the latest block among what it reads,
else the earliest among its readers, within the blocks its owner's metadata names), and an If
or Loop whose bodies' nodes all lie in one block is that block's.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from graphaudit.analyses.flops import is_counted
from graphaudit.graph.model import ModelGraph, Node
from graphaudit.graph.visit_order import execution_order

Candidates = tuple[str, list[tuple[str, int, str]]]  # (source, [(container key, index, display name)])


def place_owners(mg: ModelGraph, assigned: dict[str, int], how: dict[str, str]) -> None:
    """An If / Loop in no block whose bodies' nodes are all in one block is that block's (a
    TorchScript `/If` around one layer): its own time is the layer's, as in a dynamo export
    whose If is named after the layer."""
    inside: dict[str, set[int]] = {}
    for nid, node in mg.nodes.items() if mg.body_table else ():
        if nid in assigned:
            for scope in node.scopes:
                if scope.owner not in assigned:
                    inside.setdefault(scope.owner, set()).add(assigned[nid])
    for owner, found in inside.items():
        if len(found) == 1 and owner in mg.nodes:
            assigned[owner], how[owner] = found.pop(), "neighbours"


def fill_unnamed(mg: ModelGraph, assigned: dict[str, int], how: dict[str, str], informative: set[str],
                 stacks: dict[str, int], candidates: Callable[[Node], Iterable[Candidates]]) -> None:
    """Attribute nested or unnamed nodes through their owner, else their neighbours. `assigned`
    and `how`: the nodes the names placed (block, source), added to here; `informative`: nodes
    whose names or metadata say they are in no block; `stacks`: each container's offset;
    `candidates`: a node's (source, [(container key, index, name)]), most trusted first."""
    # owner id -> the blocks its metadata names and those its nested nodes were put in
    allowed: dict[str, set[int]] = {}
    for nid, node in mg.nodes.items() if mg.body_table else ():
        if mg.bodies(nid) and nid not in assigned:
            cands = candidates(node)
            allowed[nid] = {i + stacks[k] for _, cs in cands for k, i, _ in cs if k in stacks}
    for nid, node in mg.nodes.items() if allowed else ():
        for scope in node.scopes:
            if nid in assigned and scope.owner in allowed:
                allowed[scope.owner].add(assigned[nid])
    pending = [n for n in mg.nodes.values() if n.id not in assigned and n.id not in informative]
    for node in pending:
        for scope in reversed(node.scopes):
            if scope.owner in assigned:
                assigned[node.id], how[node.id] = assigned[scope.owner], "owner"
                break
    pending = [n for n in pending if n.id not in assigned]
    if not pending:
        return
    waiting = {n.id for n in pending}
    order = [n for n in execution_order(mg) if n.id in waiting]
    for node in order:  # forward: the latest block among what it reads
        if not node.scopes and not any(mg.consumers(r) for r in node.outputs if r is not None):
            continue  # an unnamed sink at the top (e.g. an Identity to an output) is no block's
        found = [assigned[p.id] for r in node.inputs if r is not None
                 for p in [mg.producer(r)] if p is not None and p.id in assigned]
        if found:
            assigned[node.id], how[node.id] = _clip(max(found), node, allowed), "neighbours"
    for node in reversed(order):  # backward: the earliest block among its readers
        if node.id in assigned or _source(mg, node):
            continue
        found = [assigned[c.id] for r in node.outputs if r is not None
                 for c in mg.consumers(r) if c.id in assigned]
        if found:
            assigned[node.id], how[node.id] = _clip(min(found), node, allowed), "neighbours"


def _source(mg: ModelGraph, node: Node) -> bool:
    """Whether `node` is unnamed compute at the top that reads only the model's inputs and
    weights (a patch embedding's Conv): it starts the model, as an unnamed sink ends it."""
    if node.scopes or not is_counted(node):
        return False
    return all(r is None or mg.producer(r) is None for r in node.inputs)


def _clip(index: int, node: Node, allowed: dict[str, set[int]]) -> int:
    for scope in reversed(node.scopes):
        names = allowed.get(scope.owner)
        if names:
            if index in names:
                return index
            return min(names) if index < min(names) else max(n for n in names if n <= index)
    return index
