"""A model's local functions inlined at load: each call replaced by its body, named by its call.

A model that writes its blocks as calls of local functions (torch's
`export_modules_as_functions`, onnxscript) hides every value of a block inside a function
body, where a coefficient can be neither exposed nor fed, and ONNX Runtime inlines each
call under names of its own that are the same for every call (`_inlfunc_Block_MatMul_30`),
so a profile cannot tell the calls apart. graphaudit inlines them itself, once, as it
loads the model (ONNX's own inliner, `onnx.inliner`), and names each inlined node by the
path of calls it came through and its own name (`/model/blocks.0/Block/MatMul_30`): the
blocks are then found from those names, and every command sees the same plain graph.
"""

from __future__ import annotations

from itertools import count
from typing import Iterator

import onnx
import onnx.inliner

from graphaudit.graph_build import node_ids
from graphaudit.protos import all_nodes

_GRAPH, _GRAPHS = onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS


def inline_functions(model: onnx.ModelProto) -> tuple[onnx.ModelProto, int] | None:
    """A copy of `model` with every call of a local function replaced by its body, and how
    many calls were; None where ONNX's inliner refuses or leaves a call in place (a function
    declared at another opset than the model's), and the caller keeps the functions."""
    functions = {(f.domain, f.name): f for f in model.functions}
    ids = [node_id for _, node_id in node_ids(model)]
    kept: list[tuple[onnx.NodeProto, str]] = []  # the nodes that stay, with their new names
    calls = 0
    for index, proto, path in _occurrences(model.graph.node, functions, (), (), count()):
        if (proto.domain, proto.op_type) in functions:
            calls += 1
        else:
            own = proto.name or proto.op_type
            kept.append((proto, "/".join([ids[i] for i in path] + [own]) if path else proto.name))
    try:
        inlined = onnx.inliner.inline_local_functions(model)
    except Exception:  # noqa: BLE001 - the functions stay; every analysis reads through them
        return None
    nodes = list(all_nodes(inlined.graph))
    if inlined.functions or len(nodes) != len(kept) or any(
            (node.op_type, _domain(node)) != (proto.op_type, _domain(proto)) for node, (proto, _) in zip(nodes, kept)):
        return None
    for node, (_, name) in zip(nodes, kept):
        node.name = name
    return inlined, calls


def _occurrences(nodes, functions, stack, path, counter) -> Iterator[tuple[int, onnx.NodeProto, tuple[int, ...]]]:
    """(index, node, indices of the calls around it) for every node occurrence, in the order
    `graph_build.node_ids` numbers them: nested bodies after their owner, a function's body
    after each call of it."""
    for proto in nodes:
        index = next(counter)
        yield index, proto, path
        for attr in proto.attribute:
            for sub in (attr.g,) if attr.type == _GRAPH else attr.graphs if attr.type == _GRAPHS else ():
                yield from _occurrences(sub.node, functions, stack, path, counter)
        key = (proto.domain, proto.op_type)
        fn = functions.get(key)
        if fn is not None and key not in stack:
            yield from _occurrences(fn.node, functions, stack + (key,), path + (index,), counter)


def _domain(node: onnx.NodeProto) -> str:
    return "" if node.domain == "ai.onnx" else node.domain
