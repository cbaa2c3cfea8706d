"""The order in which an analysis visits nodes: producers first, bodies before their owner.

ONNX keeps every graph's nodes topologically sorted. Visiting the main graph in file order,
and the bodies of an If / Loop / Scan / function call just before the node that owns them,
means every value a node reads has been visited before it, including the results a body
hands back to its owner.
"""

from __future__ import annotations

from collections.abc import Iterator

from graphaudit.graph.model import ModelGraph, Node


def nodes_by_scope(mg: ModelGraph) -> dict[str, list[Node]]:
    """The nodes of each scope (keyed by scope path, "" for the main graph), in file order."""
    if not mg.body_table:  # no bodies: every node is top-level (as in execution_order)
        return {"": list(mg.nodes.values())}
    top: list[Node] = []
    table: dict[str, list[Node]] = {"": top}
    keys: dict[tuple, str] = {}
    for node in mg.nodes.values():
        if not node.scopes:
            top.append(node)
            continue
        key = keys.get(node.scopes)
        if key is None:
            key = keys[node.scopes] = node.scope_path
        table.setdefault(key, []).append(node)
    return table


def execution_order(mg: ModelGraph, by_scope: dict[str, list[Node]] | None = None) -> Iterator[Node]:
    """Every node once, each body's nodes just before the node that owns the body."""
    if not mg.body_table:  # no bodies: every node is top-level, already in file order
        return iter(mg.nodes.values())
    return _nested_order(mg, by_scope if by_scope is not None else nodes_by_scope(mg))


def _nested_order(mg: ModelGraph, by_scope: dict[str, list[Node]]) -> Iterator[Node]:
    # An explicit stack instead of recursion: deep nesting must not hit the recursion limit.
    stack: list[tuple[Iterator[Node], Node | None]] = [(iter(by_scope.get("", ())), None)]
    while stack:
        nodes, owner = stack[-1]
        node = next(nodes, None)
        if node is None:
            stack.pop()
            if owner is not None:
                yield owner
            continue
        bodies = mg.bodies(node.id)
        if not bodies:
            yield node
            continue
        inner = [n for body in bodies for n in by_scope.get(body.scope, ())]
        stack.append((iter(inner), node))
