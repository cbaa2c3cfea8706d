"""Every node occurrence of a model and its unique id: the first pass of building its graph.

The ids are decided over the whole model at once (nested bodies right after their owner, a
local function's body after each call of it), so that the loader, which names inlined nodes
and checks node metadata, and the graph model read the same ids.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

import onnx

from graphaudit.load.protos import BODY_OPS

_GRAPH, _GRAPHS = onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS


def node_ids(model: onnx.ModelProto) -> list[tuple[onnx.NodeProto, str, int | None]]:
    """Every node occurrence of `model` in the order the graph's builder reads them (nested bodies right
    after their owner, a local function's body after each call of it), with its ModelGraph id
    and, inside a function's body, the position in this list of the call it was read for."""
    read = Occurrences(model)
    callers = read.callers
    return [(proto, node_id, callers.get(i)) for i, (proto, node_id) in enumerate(zip(read.protos, read.ids()))]


def unique_ids(names: Iterable[tuple[str, str]]) -> list[str]:
    """Give each (name, op_type) a unique id: the name where it is unique, else a suffix."""
    pairs = list(names)
    counts = Counter(n for n, _ in pairs if n)
    taken = {n for n, c in counts.items() if c == 1}
    seen: Counter = Counter()
    ids: list[str] = []
    for name, op in pairs:
        if name and counts[name] == 1:
            ids.append(name)
            continue
        stem = name or op
        while True:
            seen[stem] += 1
            candidate = f"{stem}#{seen[stem]}"
            if candidate not in taken:
                break
        taken.add(candidate)
        ids.append(candidate)
    return ids


class Occurrences:
    """Every node occurrence under a model's graph in pre-order, its name, op type and domain
    (read here once: the graph's builder takes them from here), and the subgraphs of those that
    have any (keyed by position)."""

    def __init__(self, model: onnx.ModelProto):
        self.functions = {(f.domain, f.name): f for f in model.functions}
        self.protos: list[onnx.NodeProto] = []
        self.names: list[str] = []
        self.op_types: list[str] = []
        self.domains: list[str] = []
        self.subgraphs: dict[int, tuple] = {}
        self.callers: dict[int, int] = {}  # occurrence in a function's body -> the occurrence of its call
        self._read(model.graph.node, function_stack=())

    def ids(self) -> list[str]:
        names = self.names
        if len(Counter(names)) == len(names) and "" not in names:
            return names  # every node named, each name once: the usual case
        return unique_ids(zip(names, self.op_types))

    def _read(self, protos, function_stack: tuple, caller: int | None = None) -> None:
        """Record every node occurrence under `protos`, nested bodies right after their owner;
        `caller`: the occurrence of the call whose function body `protos` are."""
        found, names, op_types, domains, functions = self.protos, self.names, self.op_types, self.domains, self.functions
        for proto in protos:
            op_type, domain = proto.op_type, proto.domain
            found.append(proto)
            names.append(proto.name)
            op_types.append(op_type)
            domains.append(domain)
            if caller is not None:
                self.callers[len(found) - 1] = caller
            subgraphs: tuple = ()
            # only a control-flow or a custom operator holds a body: the test skips reading the
            # attributes of every other node (a third of this pass, at 18,000 nodes)
            for attr in proto.attribute if op_type in BODY_OPS or domain else ():
                kind = attr.type
                if kind == _GRAPH:
                    subgraphs += ((attr.name, (attr.g,)),)
                elif kind == _GRAPHS:
                    subgraphs += ((attr.name, tuple(attr.graphs)),)
            if subgraphs:
                self.subgraphs[len(found) - 1] = subgraphs
                for _, graphs in subgraphs:
                    for sub in graphs:
                        self._read(sub.node, function_stack, caller)
            if functions:
                fn_key = (domain, op_type)
                fn = functions.get(fn_key)
                if fn is not None and fn_key not in function_stack:
                    self._read(fn.node, function_stack + (fn_key,), len(found) - 1)
