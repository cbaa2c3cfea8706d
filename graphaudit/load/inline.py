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

import onnx
import onnx.inliner

from graphaudit.load.node_ids import node_ids
from graphaudit.load.protos import all_nodes


def inline_functions(model: onnx.ModelProto) -> tuple[onnx.ModelProto, int] | None:
    """A copy of `model` with every call of a local function replaced by its body, and how
    many calls were; None where ONNX's inliner refuses or leaves a call in place (a function
    declared at another opset than the model's), and the caller keeps the functions."""
    functions = {(f.domain, f.name) for f in model.functions}
    occurrences = node_ids(model)
    kept: list[tuple[onnx.NodeProto, str]] = []  # the nodes that stay, with their new names
    for proto, _, caller in occurrences:
        if (proto.domain, proto.op_type) in functions:
            continue
        path = []  # the calls it was read through, innermost first
        while caller is not None:
            path.append(occurrences[caller][1])
            caller = occurrences[caller][2]
        kept.append((proto, "/".join([*reversed(path), proto.name or proto.op_type]) if path else proto.name))
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
    return inlined, len(occurrences) - len(kept)


def _domain(node: onnx.NodeProto) -> str:
    return "" if node.domain == "ai.onnx" else node.domain
