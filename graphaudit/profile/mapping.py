"""Profiler event names mapped back to the model's graph nodes, and nodes to blocks.

Two ways, and the report says which one it used:

- `one_to_one`: the model was profiled at ORT_DISABLE_ALL, so every event names a node of
  the graph as written (unique names are ensured before the session is made).
- `through_optimised`: with graph optimisations on, ORT fuses, inserts and renames nodes.
  The optimised graph ORT saves (`optimized_model_filepath`) says what each event's node
  is; it is matched to the original graph by name, else by an output tensor it shares
  with an original node (fusions keep the last fused node's output), else by the longest
  name scope (`/blocks.3/attn/...`) it shares with an original node, else by an input.

Blocks come from the static analyses (`graphaudit.analyses.blocks.find_blocks`) when
they are installed; a node in no block belongs to OTHER.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping

import onnx

from graphaudit.graph import ModelGraph
from graphaudit.protos import all_nodes

OTHER = "(other)"
UNMAPPED = "(unmapped)"
MATCH_KINDS = ("name", "output", "scope", "input", "consumer")


@dataclass(frozen=True)
class NodeMap:
    """Which graph node each profiler event name stands for, and how that was decided."""

    method: str  # "one-to-one" | "optimised-model"
    opt_level: str
    nodes: Mapping[str, str] = field(repr=False)  # event name -> node id
    how: Mapping[str, str] = field(repr=False)  # event name -> one of MATCH_KINDS
    fused: Mapping[str, str] = field(repr=False)  # event name -> op type, where it differs from the node's

    def node_of(self, event_name: str) -> str | None:
        return self.nodes.get(event_name)

    def describe(self) -> str:
        if self.method == "one-to-one":
            return "one-to-one: profiled at ORT_DISABLE_ALL, every event names a node of the graph"
        return (f"through the optimised model ORT saved at {self.opt_level}: by node name, else shared "
                "output tensor, else name scope, else input tensor, else consumer")

    def counts(self) -> dict[str, int]:
        found = {kind: 0 for kind in MATCH_KINDS}
        for kind in self.how.values():
            found[kind] += 1
        return found


@dataclass(frozen=True)
class BlockAssignment:
    """Each node's block, the blocks in order, and where the blocks came from."""

    names: tuple[str, ...]  # in model order, OTHER last
    of_node: Mapping[str, str] = field(repr=False)
    method: str

    def block_of(self, node_id: str | None) -> str:
        if node_id is None:
            return UNMAPPED
        return self.of_node.get(node_id, OTHER)

    def nodes_of(self, block: str) -> list[str]:
        return [n for n, b in self.of_node.items() if b == block]


def one_to_one(mg: ModelGraph, event_names: Iterable[str]) -> NodeMap:
    """Events named exactly as the graph's nodes (ORT_DISABLE_ALL)."""
    nodes = {name: name for name in event_names if name in mg.nodes}
    return NodeMap("one-to-one", "ORT_DISABLE_ALL", nodes, {n: "name" for n in nodes}, {})


def through_optimised(mg: ModelGraph, optimised: onnx.ModelProto, opt_level: str,
                      event_names: Iterable[str] = ()) -> NodeMap:
    """Events of a profile taken with optimisations on, mapped through ORT's optimised graph."""
    producer: dict[str, str] = {}
    for node in mg.nodes.values():
        for ref in node.outputs:
            if ref is not None:
                producer.setdefault(ref.name, node.id)
    scopes = _scope_table(mg)
    nodes: dict[str, str] = {}
    how: dict[str, str] = {}
    fused: dict[str, str] = {}
    protos = list(all_nodes(optimised.graph))
    for proto in protos:
        found = _match(proto, mg, producer, scopes)
        if found is not None:
            nodes[proto.name], how[proto.name] = found
    consumers: dict[str, list[str]] = {}
    for proto in protos:
        for name in proto.input:
            consumers.setdefault(name, []).append(proto.name)
    for proto in protos:
        if proto.name not in nodes:
            fed = [c for out in proto.output for c in consumers.get(out, ()) if c in nodes]
            if fed:
                nodes[proto.name], how[proto.name] = nodes[fed[0]], "consumer"
    for proto in protos:
        if proto.name in nodes and proto.op_type != mg.nodes[nodes[proto.name]].op_type:
            fused[proto.name] = proto.op_type
    # Events whose node the saved graph lacks (it can differ from the one run): by name only.
    for name in event_names:
        if name not in nodes and name in mg.nodes:
            nodes[name], how[name] = name, "name"
    return NodeMap("optimised-model", opt_level, nodes, how, fused)


def assign_blocks(mg: ModelGraph, block_map: Any | None = None, pattern: str | None = None) -> BlockAssignment:
    """Each node's block, from `block_map` (a BlockMap) or from the static block finder."""
    method = "given"
    if block_map is None:
        try:
            from graphaudit.analyses.blocks import find_blocks
        except ImportError:
            return BlockAssignment((OTHER,), {}, "none (graphaudit.analyses.blocks is not available)")
        block_map = find_blocks(mg, pattern)
        method = str(getattr(block_map, "method", "find_blocks"))
    of_node: dict[str, str] = {}
    ordered = sorted(block_map.blocks, key=lambda b: b.index)
    for block in ordered:
        for node_id in block.node_ids:
            of_node.setdefault(node_id, block.name)
    return BlockAssignment(tuple(b.name for b in ordered) + (OTHER,), of_node, method)


def _match(proto: onnx.NodeProto, mg: ModelGraph, producer: Mapping[str, str],
           scopes: Mapping[str, str]) -> tuple[str, str] | None:
    if proto.name in mg.nodes:
        return proto.name, "name"
    for out in proto.output:
        if out in producer:
            return producer[out], "output"
    parts = proto.name.split("/")
    for k in range(len(parts) - 1, 0, -1):
        prefix = "/".join(parts[:k])
        if prefix.strip("/") and prefix in scopes:
            return scopes[prefix], "scope"
    for name in proto.input:
        if name in producer:
            return producer[name], "input"
    return None


def _scope_table(mg: ModelGraph) -> dict[str, str]:
    """Name-scope prefix ("/blocks.3/attn") -> the first node whose name lies under it; a node's
    own name -> the node."""
    table: dict[str, str] = {node.name: node.id for node in mg.nodes.values() if node.name}
    for node in mg.nodes.values():
        parts = node.name.split("/")
        for k in range(1, len(parts)):
            table.setdefault("/".join(parts[:k]), node.id)
    return table
