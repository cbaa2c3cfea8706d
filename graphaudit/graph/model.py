"""The ONNX graph as a networkx directed graph, subgraphs and local functions included.

`build_graph` gives back a ModelGraph: one networkx MultiDiGraph whose nodes are the
model's operator nodes (those inside `If` / `Loop` / `Scan` bodies and inside the bodies of
model-local functions too) and whose edges are the tensors flowing between them. Every
node knows the chain of control-flow scopes it sits in. Edges carry `via`:

- "tensor": an ordinary value from producer to consumer in the same scope;
- "outer": a subgraph reading a value of an enclosing scope;
- "subgraph_output": a body's result flowing back into the If/Loop/Scan that owns it;
- "function_input" / "function_output": the same across a function call.

Tensors are keyed by TensorRef (scope, name), so a name reused in two subgraphs stays two
tensors. Node ids are the file's node names, made unique where names repeat or are
missing; the original name stays on the node.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import NamedTuple

import networkx as nx
import onnx

CONTROL_FLOW_OPS = frozenset({"If", "Loop", "Scan"})


@dataclass(frozen=True)
class Scope:
    """One level of nesting: a branch or body of a control-flow node, or a function call."""

    kind: str  # "then_branch" | "else_branch" | "body" | "function"
    owner: str  # id of the If / Loop / Scan node, or of the function call node
    owner_op: str  # op type of the owner (the function's name for calls)

    def describe(self) -> str:
        if self.kind == "function":
            return f"function {self.owner_op} called by `{self.owner}`"
        label = {"then_branch": "then-branch", "else_branch": "else-branch"}.get(self.kind, self.kind)
        return f"{label} of {self.owner_op} `{self.owner}`"

    @property
    def key(self) -> str:
        return f"{self.owner}/{self.kind}"


class TensorRef(NamedTuple):
    """A value of the model: its name and the scope (path of Scope keys) it is defined in.

    A named tuple rather than a dataclass: analyses key dictionaries by it hundreds of
    thousands of times, and a tuple hashes in C.
    """

    name: str
    scope: str = ""  # "" for the main graph

    def __str__(self) -> str:
        return self.name if not self.scope else f"{self.scope}::{self.name}"


class Node(NamedTuple):
    """One operator node of the model, wherever it is nested.

    A named tuple, made and freed in C: a graph holds one per node, and a frozen dataclass's
    object and dictionary were a tenth of building and freeing a large model's. Equality and
    hashing leave out `proto`, as the dataclass it replaced did (a NodeProto has no hash).
    """

    id: str
    name: str
    op_type: str
    domain: str
    inputs: tuple[TensorRef | None, ...]  # None for an omitted optional input
    outputs: tuple[TensorRef | None, ...]
    scopes: tuple[Scope, ...]
    metadata: tuple[tuple[str, str], ...]
    proto: onnx.NodeProto

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Node) and self[:-1] == other[:-1]

    def __ne__(self, other: object) -> bool:
        return not self == other

    def __hash__(self) -> int:
        return hash(self[:-1])

    def __repr__(self) -> str:
        fields = ", ".join(f"{name}={value!r}" for name, value in zip(self._fields[:-1], self[:-1]))
        return f"Node({fields})"

    @property
    def depth(self) -> int:
        return len(self.scopes)

    @property
    def scope_path(self) -> str:
        return _scope_key(self.scopes)

    def describe_scope(self) -> str:
        """The scope chain in words, innermost first ("main graph" at top level)."""
        if not self.scopes:
            return "main graph"
        return ", inside ".join(s.describe() for s in reversed(self.scopes))

    def meta(self, key: str) -> str | None:
        return next((v for k, v in self.metadata if k == key), None)


class TensorInfo(NamedTuple):
    """What is known about one value: where it comes from, its type and shape (a named tuple,
    as Node is)."""

    ref: TensorRef
    kind: str  # "input" | "initializer" | "node_output" | "subgraph_input" | "function_input"
    producer: str | None  # node id, or the owner node id for subgraph / function inputs
    elem_type: int | None
    shape: tuple[int | str | None, ...] | None  # None when the rank is unknown


@dataclass(frozen=True)
class Body:
    """One body of a control-flow node or function call: its formal inputs and outputs.

    For a subgraph, `inputs` are the body's own formal inputs (in its scope); for a function
    call, the caller's tensors bound to the function's parameters. `outputs` are the values
    the body gives back, in order, resolved in its scope (None where a name is unresolved).
    """

    kind: str  # "then_branch" | "else_branch" | "body" | "function" | another graph attribute
    owner: str
    scope: str
    inputs: tuple[TensorRef | None, ...]
    outputs: tuple[TensorRef | None, ...]


@dataclass(frozen=True)
class ModelGraph:
    """The whole model as one graph of nodes, with tables of nodes and tensors.

    `graph` (the networkx view) is built on first use: the analyses read the tables, and
    handing a large model's edges to networkx costs as much as reading the model.
    """

    nodes: dict[str, Node] = field(repr=False)
    tensors: dict[TensorRef, TensorInfo] = field(repr=False)
    inputs: tuple[TensorRef, ...]
    outputs: tuple[TensorRef, ...]
    initializers: frozenset[str] = field(repr=False)
    body_table: dict[str, tuple[Body, ...]] = field(default_factory=dict, repr=False)
    # How many scopes deep each scope key is ("" for the main graph: 0).
    scope_depth: dict[str, int] = field(default_factory=lambda: {"": 0}, repr=False)
    # The edges from a body's results to the node owning the body, each with the number of
    # nodes added before it (the others are read off the tables: `edge_records`).
    body_edges: tuple[tuple[int, tuple[str, str, str, TensorRef, str]], ...] = field(default=(), repr=False)

    @property
    def edge_records(self) -> list[tuple[str, str, str | None, TensorRef, str]]:
        """Every edge as (u, v, key, tensor, via), in the order the nodes read them; key None
        stands for str(tensor). Made on first use from the node and tensor tables: no
        analysis reads the edges (they are networkx's view), and drawing each as the graph
        was built was a tenth of building a large model's."""
        return self._cached("_edge_cache", self._edge_table)

    @property
    def edge_list(self) -> list[tuple[str, str, str, dict]]:
        """The edges as networkx takes them: (u, v, key, {"tensor", "via"})."""
        return [(u, v, str(ref) if key is None else key, {"tensor": ref, "via": via})
                for u, v, key, ref, via in self.edge_records]

    @property
    def graph(self) -> nx.MultiDiGraph:
        cached = self.__dict__.get("_graph")
        if cached is None:
            cached = nx.MultiDiGraph()
            cached.add_nodes_from((nid, {"node": node}) for nid, node in self.nodes.items())
            cached.add_edges_from(self.edge_list)
            object.__setattr__(self, "_graph", cached)
        return cached

    def bodies(self, node_id: str) -> tuple[Body, ...]:
        """The bodies (If branches, Loop/Scan body, function body) owned by `node_id`."""
        return self.body_table.get(node_id, ())

    def node(self, node_id: str) -> Node:
        return self.nodes[node_id]

    def producer(self, tensor: TensorRef) -> Node | None:
        made = made_by(self.tensors.get(tensor))
        return self.nodes[made] if made is not None else None

    def consumers(self, tensor: TensorRef) -> list[Node]:
        return [self.nodes[n] for n in self._consumers.get(tensor, ())]

    def top_level(self) -> Iterator[Node]:
        return (n for n in self.nodes.values() if not n.scopes)

    def inside(self, owner: str) -> list[Node]:
        """Nodes nested (at any depth) inside the control-flow node or call `owner`."""
        return list(self._cached("_inside_cache", self._nested_by_owner).get(owner, ()))

    def find_tensor(self, name: str) -> TensorRef | None:
        """The tensor called `name`, preferring the main graph, else the shallowest scope."""
        top = TensorRef(name)
        if top in self.tensors:
            return top
        found = self._cached("_name_cache", self._nested_by_name).get(name)
        return min(found, key=lambda r: (r.scope.count("/"), r.scope)) if found else None

    # Tables built on first use and kept (the tables above are never changed after the build),
    # so that asking for each of many tensors or owners stays linear in the graph's size.
    def _cached(self, key: str, build):
        cache = self.__dict__.get(key)
        if cache is None:
            cache = build()
            object.__setattr__(self, key, cache)
        return cache

    @property
    def _consumers(self) -> dict[TensorRef, list[str]]:
        return self._cached("_consumer_cache", self._consumer_table)

    def _consumer_table(self) -> dict[TensorRef, list[str]]:
        table: dict[TensorRef, list[str]] = {}
        for node in self.nodes.values():
            for ref in node.inputs:
                if ref is not None:
                    table.setdefault(ref, []).append(node.id)
        return table

    def _edge_table(self) -> list[tuple[str, str, str | None, TensorRef, str]]:
        records: list[tuple[str, str, str | None, TensorRef, str]] = []
        later, placed = self.body_edges, 0  # the body edges, and how many of them are in `records`
        for position, node in enumerate(self.nodes.values()):
            while placed < len(later) and later[placed][0] <= position:
                records.append(later[placed][1])
                placed += 1
            for ref in filter(None, node.inputs):  # None: an omitted input
                made = made_by(self.tensors.get(ref))
                if made is not None:
                    depth = self.scope_depth.get(ref.scope, 0)
                    records.append((made, node.id, None, ref, _via(depth, node.scopes) if node.scopes else "tensor"))
        records.extend(record for _, record in later[placed:])
        return records

    def _nested_by_owner(self) -> dict[str, list[Node]]:
        table: dict[str, list[Node]] = {}
        for node in self.nodes.values():
            for owner in dict.fromkeys(s.owner for s in node.scopes):
                table.setdefault(owner, []).append(node)
        return table

    def _nested_by_name(self) -> dict[str, list[TensorRef]]:
        table: dict[str, list[TensorRef]] = {}
        for ref in self.tensors:
            if ref.scope:
                table.setdefault(ref.name, []).append(ref)
        return table


def made_by(info: TensorInfo | None) -> str | None:
    """The id of the node making the value `info` describes; None for a value no node makes (an
    input, a weight, a body's formal input, which its owner gives: an edge for it would close
    a cycle, owner -> body -> owner)."""
    return info.producer if info is not None and info.kind == "node_output" else None


def _scope_key(scopes: tuple[Scope, ...]) -> str:
    return "/".join(s.key for s in scopes)


def _via(depth: int, scopes: tuple[Scope, ...]) -> str:
    """How a value defined `depth` scopes deep reaches a node in `scopes` (the scopes it is
    defined in, and more)."""
    if depth == len(scopes):
        return "tensor"
    # the first scope entered between the value's definition and its reader
    return "function_input" if scopes[depth].kind == "function" else "outer"
