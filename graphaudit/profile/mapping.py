"""Profiler event names mapped back to the model's graph nodes, and nodes to blocks.

Two ways, and the report says which one it used:

- `one_to_one`: the model was profiled at ORT_DISABLE_ALL, so every event names a node of
  the graph as written (unique names are ensured before the session is made).
- `through_optimised`: with graph optimisations on, ORT fuses, inserts and renames nodes.
  The optimised graph ORT saves (`optimized_model_filepath`) says what each event's node
  is; it is matched to the original graph by name, else by an output tensor it shares
  with an original node (fusions keep the last fused node's output), else by the tensor or
  node its ORT-given name was made from (`relu_1_nchwc` is the NCHWc convolution that
  writes `relu_1`), else by the longest name scope (`/blocks.3/attn/...`) it shares with an
  original node, else by an input, else by a consumer.
  ORT gives the nodes it creates the same name in every graph body (`Gelu`), so a node of
  a body is known by its owners' names and its own, as the events of such names are
  (`events.qualified_name`); a bare name stands for the main graph's node of that name, or
  for the one node of the bodies it names.

Blocks come from the static analyses (`graphaudit.analyses.blocks.find_blocks`) when
they are installed; a node in no block belongs to OTHER.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import onnx

from graphaudit.graph.model import ModelGraph
from graphaudit.load.protos import BODY_OPS
from graphaudit.profile.events import OWNER_SEPARATOR, qualified_name

OTHER = "(other)"
UNMAPPED = "(unmapped)"
MATCH_KINDS = ("name", "output", "renamed", "scope", "input", "consumer")
# Names ORT makes from an output's or a node's name: the layout transformers' `<output>_nchwc`
# and `<output>_nhwc`, and Graph::GenerateNodeName's `_token_<n>` when the name is taken.
_ORT_SUFFIXES = re.compile(r"(?:_nchwc|_nhwc)?(?:_token_\d+)?$")

# Where a node of the optimised graph lies: (owner's name, body) for each body around it, outermost first
Scope = tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class NodeMap:
    """Which graph node each profiler event name stands for, and how that was decided."""

    method: str  # "one-to-one" | "optimised-model"
    opt_level: str
    nodes: Mapping[str, str] = field(repr=False)  # event name (qualified inside bodies) -> node id
    how: Mapping[str, str] = field(repr=False)  # event name -> one of MATCH_KINDS
    fused: Mapping[str, str] = field(repr=False)  # event name -> op type, where it differs from the node's

    def node_of(self, event_name: str) -> str | None:
        return self.nodes.get(event_name)

    def describe(self) -> str:
        if self.method == "one-to-one":
            return "one-to-one: profiled at ORT_DISABLE_ALL, every event names a node of the graph"
        return (f"through the optimised model ORT saved at {self.opt_level}: by node name, else shared "
                "output tensor, else the name ORT made it from, else name scope, else input tensor, else consumer")

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
    located = list(_located(optimised.graph))
    keys = [qualified_name([owner for owner, _ in scope], proto.name) for scope, proto in located]
    nodes: dict[str, str] = {}
    how: dict[str, str] = {}
    for key, (_, proto) in zip(keys, located):
        found = _match(proto, mg, producer, scopes)
        if found is not None and key not in nodes:
            nodes[key], how[key] = found
    consumers = _consumers(keys, located)
    for key in keys:
        fed = [c for c in consumers.get(key, ()) if c in nodes]
        if key not in nodes and fed:
            nodes[key], how[key] = nodes[fed[0]], "consumer"
    fused: dict[str, str] = {}
    for key, (_, proto) in zip(keys, located):
        if key in nodes and proto.op_type != mg.nodes[nodes[key]].op_type:
            fused.setdefault(key, proto.op_type)
    nodes.update(_bare_names(keys, located, nodes))
    # Events whose node the saved graph lacks (it can differ from the one run): by name only.
    for name in event_names:
        own = name.rpartition(OWNER_SEPARATOR)[2]
        if name not in nodes and own in mg.nodes:
            nodes[name], how[name] = own, "name"
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
    made_from = _ORT_SUFFIXES.sub("", proto.name)
    if made_from and made_from != proto.name:
        if made_from in mg.nodes:
            return made_from, "renamed"
        if made_from in producer:
            return producer[made_from], "renamed"
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


def _located(graph: onnx.GraphProto, scope: Scope = ()) -> Iterator[tuple[Scope, onnx.NodeProto]]:
    """Every node of `graph` and of its bodies, with its Scope; each node before its bodies' nodes."""
    for node in graph.node:
        yield scope, node
        if node.op_type not in BODY_OPS and not node.domain:
            continue
        for attr in node.attribute:
            bodies = [attr.g] if attr.type == onnx.AttributeProto.GRAPH else attr.graphs
            for i, body in enumerate(bodies):
                yield from _located(body, scope + ((node.name, f"{attr.name}[{i}]"),))


def _consumers(keys: list[str], located: list[tuple[Scope, onnx.NodeProto]]) -> dict[str, list[str]]:
    """Node key -> the keys of the nodes reading its outputs, each tensor name looked up in its node's scope.

    ORT's own tensor names (`gemm_input_reshape_arg`) repeat from one body to the next too.
    """
    made_by = {(scope, out): key for key, (scope, proto) in zip(keys, located) for out in proto.output}
    consumers: dict[str, list[str]] = {}
    for key, (scope, proto) in zip(keys, located):
        for name in proto.input:
            # a body sees its own graph's tensors, else the nearest enclosing graph's
            around = (scope[:depth] for depth in range(len(scope), -1, -1))
            source = next((made_by[where, name] for where in around if (where, name) in made_by), None)
            if source is not None:
                consumers.setdefault(source, []).append(key)
    return consumers


def _bare_names(keys: list[str], located: list[tuple[Scope, onnx.NodeProto]],
                nodes: Mapping[str, str]) -> dict[str, str]:
    """A body node's bare name -> its graph node, where the main graph has no node of that name
    and the bodies' nodes of that name all stand for one graph node.

    An event keeps its bare name when ORT ran that name under one chain of owners only; if the
    main graph has a node of that name, that is the node that ran (main-graph nodes always run).
    """
    top = {proto.name for scope, proto in located if not scope}
    inside: dict[str, set[str | None]] = {}
    for key, (scope, proto) in zip(keys, located):
        if scope and proto.name not in top:
            inside.setdefault(proto.name, set()).add(nodes.get(key))
    return {name: node for name, found in inside.items() if len(found) == 1 for node in found if node is not None}
