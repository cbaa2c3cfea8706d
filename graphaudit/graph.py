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

import gc
from collections import Counter
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Iterable, Iterator, NamedTuple

import networkx as nx
import onnx

CONTROL_FLOW_OPS = frozenset({"If", "Loop", "Scan"})
_GRAPH, _GRAPHS = onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS


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


@dataclass(frozen=True)
class Node:
    """One operator node of the model, wherever it is nested."""

    id: str
    name: str
    op_type: str
    domain: str
    inputs: tuple[TensorRef | None, ...]  # None for an omitted optional input
    outputs: tuple[TensorRef | None, ...]
    scopes: tuple[Scope, ...]
    metadata: tuple[tuple[str, str], ...]
    proto: onnx.NodeProto = field(compare=False, repr=False, hash=False)

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


@dataclass(frozen=True)
class TensorInfo:
    """What is known about one value: where it comes from, its type and shape."""

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
    edge_list: tuple[tuple[str, str, str, dict], ...] = field(default=(), repr=False)  # (u, v, key, data)

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
        info = self.tensors.get(tensor)
        if info is None or info.kind != "node_output" or info.producer is None:
            return None
        return self.nodes[info.producer]

    def consumers(self, tensor: TensorRef) -> list[Node]:
        return [self.nodes[n] for n in self._consumers.get(tensor, ())]

    def top_level(self) -> Iterator[Node]:
        return (n for n in self.nodes.values() if not n.scopes)

    def inside(self, owner: str) -> list[Node]:
        """Nodes nested (at any depth) inside the control-flow node or call `owner`."""
        return [n for n in self.nodes.values() if any(s.owner == owner for s in n.scopes)]

    def find_tensor(self, name: str) -> TensorRef | None:
        """The tensor called `name`, preferring the main graph, else the shallowest scope."""
        top = TensorRef(name)
        if top in self.tensors:
            return top
        found = [r for r in self.tensors if r.name == name]
        return min(found, key=lambda r: (r.scope.count("/"), r.scope)) if found else None

    @property
    def _consumers(self) -> dict[TensorRef, tuple[str, ...]]:
        cache = self.__dict__.get("_consumer_cache")
        if cache is None:
            table: dict[TensorRef, list[str]] = {}
            for node in self.nodes.values():
                for ref in node.inputs:
                    if ref is not None:
                        table.setdefault(ref, []).append(node.id)
            cache = {k: tuple(v) for k, v in table.items()}
            object.__setattr__(self, "_consumer_cache", cache)
        return cache


def build_graph(model: onnx.ModelProto) -> ModelGraph:
    """Return the ModelGraph of `model` (which is read, never changed)."""
    with paused_gc():
        return _Builder(model).build()


@contextmanager
def paused_gc():
    """Pause the cyclic garbage collector while a large, acyclic structure is built.

    Building a graph allocates a few objects per node and frees none; every collection
    the allocations trigger would walk all of them again, which makes the build
    quadratic-looking on large models (measured in benchmarks/static_bench.py).
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def _shape_of(type_proto: onnx.TypeProto) -> tuple[int | None, tuple | None]:
    if type_proto.WhichOneof("value") != "tensor_type":
        return None, None
    tt = type_proto.tensor_type
    if not tt.HasField("shape"):
        return tt.elem_type or None, None
    dims: list[int | str | None] = []
    for d in tt.shape.dim:
        which = d.WhichOneof("value")
        dims.append(d.dim_value if which == "dim_value" else d.dim_param if which == "dim_param" else None)
    return tt.elem_type or None, tuple(dims)


def _scope_key(scopes: tuple[Scope, ...]) -> str:
    return "/".join(s.key for s in scopes)


def _unique_ids(names: Iterable[tuple[str, str]]) -> list[str]:
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


class _Builder:
    def __init__(self, model: onnx.ModelProto):
        self.model = model
        self.functions = {(f.domain, f.name): f for f in model.functions}
        self.nodes: dict[str, Node] = {}
        self.tensors: dict[TensorRef, TensorInfo] = {}
        self.value_info: dict[str, onnx.ValueInfoProto] = {}
        self.scope_depth: dict[str, int] = {"": 0}
        self.bodies: dict[str, tuple[Body, ...]] = {}
        self._scope_keys: dict[tuple[Scope, ...], str] = {(): ""}
        self._shapes: dict[bytes, tuple] = {}  # serialized TypeProto -> (elem, shape): types repeat
        self._graph_edges: list[tuple[str, str, str, dict]] = []
        # Pre-order list of every node occurrence (function bodies expanded per call) so
        # that ids are decided once, over the whole model, before edges are drawn.
        self._ids: Iterator[str] | None = None

    def build(self) -> ModelGraph:
        graph = self.model.graph
        for vi in [*graph.value_info, *graph.input, *graph.output]:
            self.value_info[vi.name] = vi
        occurrences = list(self._walk(graph, function_stack=()))
        self._ids = iter(_unique_ids(occurrences))
        initializers = frozenset(
            [t.name for t in graph.initializer] + [t.values.name for t in graph.sparse_initializer]
        )
        env: dict[str, TensorRef] = {}
        for t in graph.initializer:
            self._define(TensorRef(t.name), "initializer", None, env, dims=tuple(t.dims), elem=t.data_type)
        for vi in graph.input:
            if vi.name not in initializers:
                self._define(TensorRef(vi.name), "input", None, env, vi=vi)
        self._add_graph(graph, scopes=(), env=[env], function_stack=())
        outputs = tuple(self._lookup([env], o.name) or TensorRef(o.name) for o in graph.output)
        inputs = tuple(TensorRef(vi.name) for vi in graph.input if vi.name not in initializers)
        return ModelGraph(self.nodes, self.tensors, inputs, outputs, initializers, self.bodies,
                          tuple(self._graph_edges))

    # -- ids -------------------------------------------------------------------------------
    def _walk(self, graph: onnx.GraphProto, function_stack: tuple) -> Iterator[tuple[str, str]]:
        for node in graph.node:
            yield node.name, node.op_type
            yield from self._walk_node(node, function_stack)

    def _walk_node(self, node: onnx.NodeProto, function_stack: tuple) -> Iterator[tuple[str, str]]:
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.GRAPH:
                yield from self._walk(attr.g, function_stack)
            elif attr.type == onnx.AttributeProto.GRAPHS:
                for sub in attr.graphs:
                    yield from self._walk(sub, function_stack)
        fn = self.functions.get((node.domain, node.op_type))
        if fn is not None and (node.domain, node.op_type) not in function_stack:
            for inner in fn.node:
                yield inner.name, inner.op_type
                yield from self._walk_node(inner, function_stack + ((node.domain, node.op_type),))

    # -- tensors ---------------------------------------------------------------------------
    def _define(self, ref, kind, producer, env, *, vi=None, dims=None, elem=None):
        if vi is None:
            vi = self.value_info.get(ref.name)
        shape = tuple(dims) if dims is not None else None
        if vi is not None:
            key = vi.type.SerializeToString()
            known = self._shapes.get(key)
            if known is None:
                known = self._shapes[key] = _shape_of(vi.type)
            elem, shape = known
        self.tensors[ref] = TensorInfo(ref, kind, producer, elem, shape)
        env[ref.name] = ref

    @staticmethod
    def _lookup(envs: list[dict[str, TensorRef]], name: str) -> TensorRef | None:
        for env in reversed(envs):
            if name in env:
                return env[name]
        return None

    # -- nodes -----------------------------------------------------------------------------
    def _add_graph(self, graph: onnx.GraphProto, scopes: tuple[Scope, ...], env, function_stack):
        for vi in graph.value_info:
            self.value_info.setdefault(vi.name, vi)
        for proto in graph.node:
            self._add_node(proto, scopes, env, function_stack)

    def _key(self, scopes: tuple[Scope, ...]) -> str:
        key = self._scope_keys.get(scopes)
        if key is None:
            key = self._scope_keys[scopes] = _scope_key(scopes)
            self.scope_depth[key] = len(scopes)
        return key

    def _add_node(self, proto: onnx.NodeProto, scopes, env, function_stack):
        node_id = next(self._ids)
        scope_key = self._key(scopes)
        if len(env) == 1:  # the main graph or a function body: one table of names
            names = env[0]
            inputs = tuple(names.get(n) or self._resolve(n, env) if n else None for n in proto.input)
        else:
            inputs = tuple(self._resolve(name, env) for name in proto.input)
        outputs = tuple(TensorRef(o, scope_key) if o else None for o in proto.output)
        node = Node(
            id=node_id,
            name=proto.name,
            op_type=proto.op_type,
            domain=proto.domain,
            inputs=inputs,
            outputs=outputs,
            scopes=scopes,
            metadata=tuple((p.key, p.value) for p in proto.metadata_props),
            proto=proto,
        )
        self.nodes[node_id] = node
        for ref in inputs:
            if ref is not None:
                self._edge_from(ref, node_id, scopes)
        local = env[-1]
        for ref in outputs:
            if ref is not None:
                self._define(ref, "node_output", node_id, local)
        for attr in proto.attribute:
            if attr.type == _GRAPH:
                self._add_subgraph(node, attr.name, attr.g, scopes, env, function_stack)
            elif attr.type == _GRAPHS:
                for sub in attr.graphs:
                    self._add_subgraph(node, attr.name, sub, scopes, env, function_stack)
        if self.functions:
            fn_key = (proto.domain, proto.op_type)
            fn = self.functions.get(fn_key)
            if fn is not None and fn_key not in function_stack:
                self._add_call(node, fn, scopes, env, function_stack + (fn_key,))

    def _resolve(self, name: str, env) -> TensorRef | None:
        if not name:
            return None
        found = self._lookup(env, name)
        if found is None:
            # Dangling: an input nothing defines. Record it so analyses can report it.
            found = TensorRef(name)
            self.tensors.setdefault(found, TensorInfo(found, "undefined", None, None, None))
        return found

    def _edge_from(self, ref: TensorRef, consumer: str, scopes: tuple[Scope, ...]) -> None:
        info = self.tensors.get(ref)
        # Subgraph formal inputs come from their owner: drawing that edge would close a
        # cycle (owner -> body -> owner), so the tensor table records it instead.
        if info is None or info.producer is None or info.kind != "node_output":
            return
        depth = self.scope_depth.get(ref.scope, 0) if ref.scope else 0
        if depth == len(scopes):
            via = "tensor"
        else:  # the first scope entered between the value's definition and its reader
            via = "function_input" if scopes[depth].kind == "function" else "outer"
        self._graph_edges.append((info.producer, consumer, str(ref), {"tensor": ref, "via": via}))

    def _add_subgraph(self, owner: Node, attr: str, sub: onnx.GraphProto, scopes, env, function_stack):
        scope = Scope(kind=attr, owner=owner.id, owner_op=owner.op_type)
        inner_scopes = scopes + (scope,)
        key = _scope_key(inner_scopes)
        self.scope_depth[key] = len(inner_scopes)
        local: dict[str, TensorRef] = {}
        formal: list[TensorRef] = []
        for t in sub.initializer:
            self._define(TensorRef(t.name, key), "initializer", None, local, dims=tuple(t.dims), elem=t.data_type)
        for vi in sub.input:
            ref = TensorRef(vi.name, key)
            self._define(ref, "subgraph_input", owner.id, local, vi=vi)
            formal.append(ref)
        self._add_graph(sub, inner_scopes, env + [local], function_stack)
        results = tuple(self._lookup(env + [local], out.name) for out in sub.output)
        self._add_body(Body(attr, owner.id, key, tuple(formal), results))
        for out, ref in zip(sub.output, results):
            info = self.tensors.get(ref) if ref else None
            if info is not None and info.kind == "node_output" and info.producer is not None:
                self._graph_edges.append(
                    (info.producer, owner.id, f"{key}->{out.name}", {"tensor": ref, "via": "subgraph_output"}))

    def _add_body(self, body: Body) -> None:
        self.bodies[body.owner] = self.bodies.get(body.owner, ()) + (body,)

    def _add_call(self, call: Node, fn: onnx.FunctionProto, scopes, env, function_stack):
        scope = Scope(kind="function", owner=call.id, owner_op=fn.name)
        inner_scopes = scopes + (scope,)
        key = _scope_key(inner_scopes)
        self.scope_depth[key] = len(inner_scopes)
        # A function body sees only its formal parameters (the caller's tensors) and its own
        # values, never the caller's other names.
        local: dict[str, TensorRef] = {
            formal: actual for formal, actual in zip(fn.input, call.inputs) if actual is not None
        }
        for proto in fn.node:
            self._add_node(proto, inner_scopes, [local], function_stack)
        results = tuple(local.get(out) for out in fn.output)
        self._add_body(Body("function", call.id, key, call.inputs[: len(fn.input)], results))
        for out, ref in zip(fn.output, results):
            info = self.tensors.get(ref) if ref else None
            if info is not None and info.kind == "node_output" and info.producer is not None:
                self._graph_edges.append(
                    (info.producer, call.id, f"{key}->{out}", {"tensor": ref, "via": "function_output"}))
