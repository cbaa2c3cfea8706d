"""Walking ONNX protos: every graph body and node list nested in a model, and small readers and
writers of graphs shared by the modules that change them."""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import NamedTuple

import numpy as np
import onnx
from onnx import numpy_helper

# Standard operators with graph attributes; operators of other domains are all opened.
BODY_OPS = frozenset({"If", "Loop", "Scan", "SequenceMap"})


def graphs(graph: onnx.GraphProto) -> Iterator[onnx.GraphProto]:
    """`graph` and every body nested in it, at any depth."""
    yield graph
    yield from _bodies(graph.node)


# A node's name, op type and domain, as `walk_graphs` reads them.
NodeFields = tuple[str, str, str]


class Walked(NamedTuple):
    """A model's graphs, as `graphs` lists them, and the name, op type and domain of each one's
    nodes (`fields`, by graph, in node order), each field read once."""

    graphs: list[onnx.GraphProto]
    fields: list[list[NodeFields]]

    def domains(self) -> set[str]:
        """The domains the graphs' nodes use, as the nodes spell them."""
        return {domain for nodes in self.fields for _, _, domain in nodes}


def walk_graphs(graph: onnx.GraphProto) -> Walked:
    """`graph` and every body nested in it, in `graphs`' order, with their nodes' fields.

    Each field read through protobuf costs about as much as the loop around it. The loader's
    checks (names that are text, the domains imported, ONNX Runtime's fused operators) and its
    listing of the bodies read these three of every node in four passes of their own: 190 ms
    at 100,000 nodes, 140 ms with the fields read once here (benchmarks/static_bench.py's graph).
    The bodies, few where there are any, are listed as `graphs` lists them, from the main graph's
    nodes that may hold one."""
    fields = [(n.name, n.op_type, n.domain) for n in graph.node]
    bodies = list(_bodies([graph.node[i] for i, (_, op, domain) in enumerate(fields) if op in BODY_OPS or domain]))
    return Walked([graph, *bodies], [fields, *([(n.name, n.op_type, n.domain) for n in b.node] for b in bodies)])


def has_bodies(graph: onnx.GraphProto) -> bool:
    """Whether a node of `graph` may hold a body (a control-flow or custom operator): one read of
    each node's op type and domain, where walking every attribute would cost far more."""
    return any(node.op_type in BODY_OPS or node.domain for node in graph.node)


def names_repeat_across_graphs(graph: onnx.GraphProto, every: Sequence[onnx.GraphProto] | None = None) -> bool:
    """Whether a value name is made in more than one of the graphs nested in `graph` (each If
    branch of a decoder merged with its cached twin makes `/decoder/Mul_1_output_0`).

    ONNX's shape inference with data propagation keys the values it propagates by name across
    bodies: with a name repeated, one branch's value shapes the other's (ONNX Runtime then
    refuses the shapes written in); `rename_body_values` gives each body's values names of
    their own first. `every`: `graph` and its bodies, as `graphs` lists them, where the caller has them."""
    if not (len(every) > 1 if every is not None else has_bodies(graph)):
        return False
    seen: set[str] = set()
    for body in every if every is not None else graphs(graph):
        made = {name for node in body.node for name in node.output if name} | {v.name for v in body.input}
        if not seen.isdisjoint(made):
            return True
        seen |= made
    return False


def rename_body_values(graph: onnx.GraphProto) -> dict[str, str]:
    """Give the values each body nested in `graph` makes (its inputs, initializers and node
    outputs) names no other graph uses, in place, references inside the body and the bodies it
    holds included; the main graph's names stay. Returns each new name's old one."""
    back: dict[str, str] = {}
    bodies = itertools.count()
    # every name the model already uses, read or made: a new name must be none of them
    taken = {name for g in graphs(graph) for name in (*(v.name for v in (*g.input, *g.output, *g.value_info)),
                                                       *(t.name for t in g.initializer),
                                                       *(n for node in g.node for n in (*node.input, *node.output)))}

    def rename(body: onnx.GraphProto, outer: dict[str, str]) -> None:
        tag = f"__body{next(bodies)}"
        local = dict(outer)
        own = [v.name for v in body.input] + [t.name for t in body.initializer] + \
            [name for node in body.node for name in node.output if name]
        for name in own:
            new = f"{name}{tag}"
            while new in taken:
                new += "_"
            taken.add(new)
            local[name] = new
            back[new] = name
        for value in [*body.input, *body.output, *body.value_info]:
            value.name = local.get(value.name, value.name)
        for tensor in body.initializer:
            tensor.name = local[tensor.name]
        _renamed_nodes(body.node, local, rename)

    _renamed_nodes(graph.node, {}, rename)
    return back


def restore_names(graph: onnx.GraphProto, back: Mapping[str, str]) -> None:
    """Give the values of the bodies nested in `graph` back the names `rename_body_values` took
    from them (`back`), in place, the values inference added to the bodies included."""
    def restore(body: onnx.GraphProto, names: Mapping[str, str]) -> None:
        for value in [*body.input, *body.output, *body.value_info]:
            value.name = back.get(value.name, value.name)
        for tensor in body.initializer:
            tensor.name = back.get(tensor.name, tensor.name)
        _renamed_nodes(body.node, back, restore)

    _renamed_nodes(graph.node, {}, restore)


def _renamed_nodes(nodes, names: Mapping[str, str], rename) -> None:
    for node in nodes:
        if names:
            node.input[:] = [names.get(name, name) for name in node.input]
            node.output[:] = [names.get(name, name) for name in node.output]
        for body in node_bodies(node):
            rename(body, names)


def node_lists(model: onnx.ModelProto, every: Sequence[onnx.GraphProto] | None = None
               ) -> Iterator[Sequence[onnx.NodeProto]]:
    """The nodes of the main graph, of every nested body and of every local function (`every`:
    the main graph and its bodies, as `graphs` lists them, where the caller has them)."""
    for graph in every if every is not None else graphs(model.graph):
        yield graph.node
    for function in model.functions:
        yield function.node
        for graph in _bodies(function.node):
            yield graph.node


def all_nodes(graph: onnx.GraphProto) -> Iterator[onnx.NodeProto]:
    """Every node of `graph` and of its bodies, each node before the nodes of its bodies."""
    for node in graph.node:
        yield node
        if node.op_type in BODY_OPS or node.domain:  # the test node_bodies makes, without its generator
            for body in node_bodies(node):
                yield from all_nodes(body)


def node_bodies(node: onnx.NodeProto) -> Iterator[onnx.GraphProto]:
    """The graphs `node` carries as attributes (an If's branches, a Loop's body, ...)."""
    if node.op_type not in BODY_OPS and not node.domain:
        return
    for attr in node.attribute:
        if attr.type == onnx.AttributeProto.GRAPH:
            yield attr.g
        elif attr.type == onnx.AttributeProto.GRAPHS:
            yield from attr.graphs


def node_reads(node: onnx.NodeProto) -> set[str]:
    """Every name `node` reads, including outer-scope names read inside its subgraphs."""
    names = {i for i in node.input if i}
    for body in node_bodies(node):
        for inner in body.node:
            names |= node_reads(inner)
    return names


def body_reads(graph: onnx.GraphProto) -> set[str]:
    """The names that the bodies of `graph`'s nodes read, at any depth (outer-scope names among them)."""
    return {name for node in graph.node for body in node_bodies(node) for inner in body.node
            for name in node_reads(inner)}


def scalar_constants(graph: onnx.GraphProto) -> dict[str, np.ndarray]:
    """Constants of one element: initializers (not listed as inputs) and Constant nodes' values."""
    inputs = {i.name for i in graph.input}
    found = {}
    for t in graph.initializer:
        if t.name not in inputs and math.prod(t.dims) == 1 and t.data_location != onnx.TensorProto.EXTERNAL:
            found[t.name] = numpy_helper.to_array(t)
    for node in graph.node:
        if node.op_type != "Constant" or node.domain not in ("", "ai.onnx") or len(node.attribute) != 1:
            continue
        attr = node.attribute[0]
        if attr.name == "value" and math.prod(attr.t.dims) == 1 and attr.t.data_location != onnx.TensorProto.EXTERNAL:
            found[node.output[0]] = numpy_helper.to_array(attr.t)
        elif attr.name == "value_float":
            found[node.output[0]] = np.array(attr.f, np.float32)
    return found


def with_nodes(model: onnx.ModelProto, nodes: list[onnx.NodeProto], in_place: bool) -> onnx.ModelProto:
    """`model` (in place) or a copy of it whose main graph holds `nodes`, in that order."""
    if in_place:
        nodes = [_copied(n) for n in nodes]  # before the field that holds some of them is cleared
        target = model
    else:
        target = onnx.ModelProto()
        target.CopyFrom(model)
    del target.graph.node[:]
    target.graph.node.extend(nodes)
    return target


def _copied(node: onnx.NodeProto) -> onnx.NodeProto:
    copy = onnx.NodeProto()
    copy.CopyFrom(node)
    return copy


def readers_of(nodes: Iterable[onnx.NodeProto]) -> dict[str, list[onnx.NodeProto]]:
    """Each value name the `nodes` read, with the nodes that read it, in their order."""
    readers: dict[str, list[onnx.NodeProto]] = {}
    for node in nodes:
        for name in node.input:
            readers.setdefault(name, []).append(node)
    return readers


def value_dims(graph: onnx.GraphProto) -> dict[str, tuple]:
    """Each graph input's and annotated value's dimensions (a name, a size, or None where unknown),
    where the graph gives a shape."""
    return {v.name: tuple(d.dim_param or d.dim_value or None for d in v.type.tensor_type.shape.dim)
            for v in (*graph.input, *graph.value_info) if v.type.tensor_type.HasField("shape")}


def _bodies(nodes: Iterable[onnx.NodeProto]) -> Iterator[onnx.GraphProto]:
    for node in nodes:
        if node.op_type in BODY_OPS or node.domain:  # the test node_bodies makes, without its generator
            for body in node_bodies(node):
                yield from graphs(body)


def copy_except(source, target, skip: str) -> None:
    """Copy every field of the proto `source` that is set into `target`, except the field `skip`."""
    for descriptor, value in source.ListFields():
        if descriptor.name == skip:
            continue
        if descriptor.is_repeated:
            getattr(target, descriptor.name).extend(value)
        elif descriptor.type == descriptor.TYPE_MESSAGE:
            getattr(target, descriptor.name).CopyFrom(value)
        else:
            setattr(target, descriptor.name, value)
