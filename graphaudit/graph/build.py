"""Building a ModelGraph: two passes over the model, subgraphs and function bodies included.

The first pass (graphaudit.load.node_ids) decides every node's unique id over the whole model; the second defines
tensors scope by scope (the edges are drawn from the tables on first use: see graphaudit.graph.model).
"""

from __future__ import annotations

import gc
from collections import ChainMap
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from itertools import chain

import onnx

from graphaudit.errors import GraphAuditError
from graphaudit.graph.function_types import body_types
from graphaudit.graph.model import Body, ModelGraph, Node, Scope, TensorInfo, TensorRef, _scope_key, made_by
from graphaudit.load.node_ids import Occurrences

_new_tuple = tuple.__new__  # a TensorRef, TensorInfo or Node without the named tuple's Python-level __new__
_UNTYPED = (None, None)  # (element type, shape) of a value no graph declares


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


def shape_of(type_proto: onnx.TypeProto) -> tuple[int | None, tuple | None]:
    """(element type, dims) of a tensor type: each dim an int, a symbolic name, or None; (None, None) if not a tensor."""
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


def _declared(graph: onnx.GraphProto) -> Iterator[onnx.ValueInfoProto]:
    """The types `graph` itself declares: its value_info, inputs and outputs (a later one of a
    name over an earlier).

    Each graph, subgraph or function body is its own scope: a name declared in one says
    nothing about a value of the same name in another.
    """
    return chain(graph.value_info, graph.input, graph.output)


def _metadata(proto: onnx.NodeProto, node_id: str) -> tuple[tuple[str, str], ...]:
    """The node's metadata as (key, value) text; read here, where every node's is read anyway.

    Protobuf hands back bytes that are not UTF-8 as bytes, which `+` refuses: a damaged file.
    """
    metadata = tuple([(p.key, p.value) for p in proto.metadata_props])
    try:
        "".join([key + value for key, value in metadata])
    except TypeError:
        raise GraphAuditError(f"expected node metadata that is UTF-8 text, found keys or values that are not on "
                              f"node {node_id!r} (the file is damaged or not ONNX)") from None
    return metadata


def made_frozen(cls, fields: dict):
    """An instance of the frozen dataclass `cls` with `fields` (every field, by name), without
    its __init__.

    A frozen dataclass's __init__ sets each field through object.__setattr__, about half as
    long again as this for the objects the profile's readers make per event.
    """
    obj = object.__new__(cls)
    obj.__dict__.update(fields)
    return obj


class _Builder:
    """Builds a ModelGraph in two passes over the model.

    The first reads every node occurrence in pre-order (function bodies expanded per call),
    so that ids are decided over the whole model; the second makes the nodes, tensors and
    bodies from what the first read, in the same order.
    """

    def __init__(self, model: onnx.ModelProto):
        self.model = model
        self.functions = {(f.domain, f.name): f for f in model.functions}
        self.nodes: dict[str, Node] = {}
        self.tensors: dict[TensorRef, TensorInfo] = {}
        self.scope_depth: dict[str, int] = {"": 0}
        self.bodies: dict[str, tuple[Body, ...]] = {}
        self._scope_keys: dict[tuple[Scope, ...], str] = {(): ""}
        self._shapes: dict[bytes, tuple] = {}  # serialized TypeProto -> (elem, shape): types repeat
        self._inferred_bodies: dict[tuple, dict] = {}  # function_types.body_types per kind of call, as _types
        # (nodes added before it, (u, v, key, tensor, via)) for each body result flowing back
        # to its owner; the edges between nodes are read off the tables (ModelGraph.edge_records)
        self._body_edges: list[tuple[int, tuple]] = []
        self._subgraphs: dict = {}  # node id -> its subgraphs, from pass 1
        self._next: Iterator[tuple[onnx.NodeProto, str, str, str, str]] | None = None

    def build(self) -> ModelGraph:
        graph = self.model.graph
        value_info = self._types(_declared(graph))
        read = Occurrences(self.model)  # pass 1
        ids = read.ids()
        self._subgraphs = {ids[i]: subgraphs for i, subgraphs in read.subgraphs.items()}
        self._next = zip(read.protos, read.names, read.op_types, read.domains, ids)
        env: dict[str, TensorRef] = {}
        for t in graph.initializer:
            name = t.name
            ref = env[name] = _new_tuple(TensorRef, (name, ""))
            typed = value_info.get(name)
            self.tensors[ref] = _new_tuple(TensorInfo, (ref, "initializer", None, *(typed or (t.data_type, tuple(t.dims)))))
        initializers = frozenset(list(env) + [t.values.name for t in graph.sparse_initializer])
        for vi in graph.input:
            if vi.name not in initializers:
                self._define(TensorRef(vi.name), "input", None, env, self._type(vi))
        self._add_graph(graph, scopes=(), env=[env], function_stack=(), value_info=value_info)
        outputs = tuple(self._lookup([env], o.name) or TensorRef(o.name) for o in graph.output)
        inputs = tuple(TensorRef(vi.name) for vi in graph.input if vi.name not in initializers)
        return ModelGraph(self.nodes, self.tensors, inputs, outputs, initializers, self.bodies,
                          scope_depth=self.scope_depth, body_edges=tuple(self._body_edges))

    # -- tensors ---------------------------------------------------------------------------
    def _define(self, ref, kind, producer, env, typed: tuple) -> None:
        """Record `ref`, of (element type, shape) `typed`, in the tensor table and in `env`."""
        self.tensors[ref] = _new_tuple(TensorInfo, (ref, kind, producer, *typed))
        env[ref.name] = ref

    def _type(self, vi: onnx.ValueInfoProto) -> tuple:
        """(element type, shape) of `vi`'s type."""
        return self._types((vi,))[vi.name]

    def _types(self, declared: Iterable[onnx.ValueInfoProto]) -> dict[str, tuple]:
        """(element type, shape) by name of each of `declared` (a later one of a name over an
        earlier), read in one pass: read where each node's outputs are made, the types of a
        large graph cost a quarter of building it, the type of each value a jump in memory."""
        shapes = self._shapes
        table: dict[str, tuple] = {}
        for vi in declared:
            type_proto = vi.type
            known = shapes.get(key := type_proto.SerializeToString())
            if known is None:
                known = shapes[key] = shape_of(type_proto)
            table[vi.name] = known
        return table

    @staticmethod
    def _lookup(envs: list[dict[str, TensorRef]], name: str) -> TensorRef | None:
        for env in reversed(envs):
            if name in env:
                return env[name]
        return None

    # -- pass 2: nodes ---------------------------------------------------------------------
    def _add_graph(self, graph: onnx.GraphProto, scopes: tuple[Scope, ...], env, function_stack, value_info):
        self._add_nodes(len(graph.node), scopes, env, function_stack, value_info)

    def _key(self, scopes: tuple[Scope, ...]) -> str:
        key = self._scope_keys.get(scopes)
        if key is None:
            key = self._scope_keys[scopes] = _scope_key(scopes)
            self.scope_depth[key] = len(scopes)
        return key

    def _add_nodes(self, count: int, scopes, env, function_stack, value_info: Mapping) -> None:
        """Add the next `count` nodes read in pass 1, all in `scopes` (this loop is the hot one).

        `value_info` maps the names this scope may declare a type for to their (element type, shape).
        """
        scope_key = self._key(scopes)
        occurrences, nodes, tensors, bodies = self._next, self.nodes, self.tensors, self._subgraphs
        assert occurrences is not None  # build() reads pass 1 before it adds any node
        functions = self.functions
        # The main graph or a function body: one table of names, read directly (unless it
        # holds an empty name, which stands for an omitted input, not a value).
        names = env[0] if len(env) == 1 and "" not in env[0] else None
        local = env[-1]
        for _ in range(count):
            proto, name, op_type, domain, node_id = next(occurrences)
            in_names, out_names = proto.input[:], proto.output[:]
            metadata = _metadata(proto, node_id) if proto.metadata_props else ()
            if names is not None:
                inputs = tuple(map(names.get, in_names))
                if None in inputs:  # an omitted optional input, or a name nothing defines
                    inputs = tuple(names.get(n) or self._resolve(n, env) if n else None for n in in_names)
            else:
                inputs = tuple(self._resolve(n, env) for n in in_names)
            outputs: list[TensorRef | None] = []
            for o in out_names:
                if not o:  # an omitted optional output
                    outputs.append(None)
                    continue
                outputs.append(ref := _new_tuple(TensorRef, (o, scope_key)))
                tensors[ref] = _new_tuple(TensorInfo, (ref, "node_output", node_id, *value_info.get(o, _UNTYPED)))
                local[o] = ref
            nodes[node_id] = node = _new_tuple(Node, (node_id, name, op_type, domain, inputs, tuple(outputs), scopes,
                                                      metadata, proto))
            subgraphs = bodies.get(node_id) if bodies else None
            if subgraphs is not None:
                for attr, graphs in subgraphs:
                    for sub in graphs:
                        self._add_subgraph(node, attr, sub, scopes, env, function_stack, value_info)
            if functions:
                fn_key = (domain, op_type)
                fn = functions.get(fn_key)
                if fn is not None and fn_key not in function_stack:
                    self._add_call(node, fn, scopes, env, function_stack + (fn_key,))

    def _resolve(self, name: str, env) -> TensorRef | None:
        if not name:
            return None
        found = self._lookup(env, name)
        if found is None:
            # Dangling: an input nothing defines. Record it so analyses can report it.
            found = TensorRef(name)
            if found not in self.tensors:
                self.tensors[found] = _new_tuple(TensorInfo, (found, "undefined", None, None, None))
        return found

    def _add_subgraph(self, owner: Node, attr: str, sub: onnx.GraphProto, scopes, env, function_stack, outer_info):
        """Add the body `sub` of `owner`, whose types are declared in `sub` itself first, then
        in the graphs around it (a body may read their values by name)."""
        scope = Scope(kind=attr, owner=owner.id, owner_op=owner.op_type)
        inner_scopes = scopes + (scope,)
        key = _scope_key(inner_scopes)
        self.scope_depth[key] = len(inner_scopes)
        local: dict[str, TensorRef] = {}
        formal: list[TensorRef] = []
        value_info = ChainMap(self._types(_declared(sub)), outer_info)
        for t in sub.initializer:
            self._define(TensorRef(t.name, key), "initializer", None, local,
                         value_info.get(t.name) or (t.data_type, tuple(t.dims)))
        for vi in sub.input:
            ref = TensorRef(vi.name, key)
            self._define(ref, "subgraph_input", owner.id, local, self._type(vi))
            formal.append(ref)
        self._add_graph(sub, inner_scopes, env + [local], function_stack, value_info)
        results = tuple(self._lookup(env + [local], out.name) for out in sub.output)
        self._add_body(Body(attr, owner.id, key, tuple(formal), results))
        for out, result in zip(sub.output, results):
            producer = made_by(self.tensors.get(result)) if result is not None else None
            if producer is not None:
                self._body_edges.append((len(self.nodes), (producer, owner.id, f"{key}->{out.name}", result,
                                                           "subgraph_output")))

    def _body_types(self, call: Node, fn: onnx.FunctionProto) -> dict[str, tuple]:
        """The types ONNX infers in `fn`'s body at this call, shared by calls alike in
        argument types and attributes (a model's layers, as a rule)."""
        args = tuple((info.elem_type, info.shape) if ref is not None and (info := self.tensors.get(ref)) is not None
                     else None
                     for ref in call.inputs[: len(fn.input)])
        key = (fn.domain, fn.name, args, tuple(a.SerializeToString() for a in call.proto.attribute))
        found = self._inferred_bodies.get(key)
        if found is None:
            found = self._inferred_bodies[key] = self._types(body_types(self.model, fn, call.proto, args).values())
        return found

    def _add_body(self, body: Body) -> None:
        self.bodies[body.owner] = self.bodies.get(body.owner, ()) + (body,)

    def _add_call(self, call: Node, fn: onnx.FunctionProto, scopes, env, function_stack):
        scope = Scope(kind="function", owner=call.id, owner_op=fn.name)
        inner_scopes = scopes + (scope,)
        key = _scope_key(inner_scopes)
        self.scope_depth[key] = len(inner_scopes)
        # A function body sees only its formal parameters (the caller's tensors) and its own
        # values, never the caller's other names, nor the types the caller declares for them.
        local: dict[str, TensorRef] = {
            formal: actual for formal, actual in zip(fn.input, call.inputs) if actual is not None
        }
        value_info = {**self._body_types(call, fn), **self._types(fn.value_info)}
        self._add_nodes(len(fn.node), inner_scopes, [local], function_stack, value_info)
        results = tuple(local.get(out) for out in fn.output)
        self._add_body(Body("function", call.id, key, call.inputs[: len(fn.input)], results))
        for out, ref in zip(fn.output, results):
            producer = made_by(self.tensors.get(ref)) if ref is not None else None
            if producer is not None:
                self._body_edges.append((len(self.nodes), (producer, call.id, f"{key}->{out}", ref, "function_output")))
