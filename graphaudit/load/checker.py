"""The ONNX checker, and what the loader does with its objections.

`check_model` runs ONNX's checker on a model (external weights already turned into graph inputs by
the caller) and turns its objection into a one-line GraphAuditError, with two exceptions it
settles itself: a main graph that is acyclic but written out of order raises `Unsorted`, so
that the loader can put it in order (`sort_nodes`) and check again; and operators ONNX Runtime
defines in the default domain, which ONNX does not know, are checked apart in a copy.
`handed` says what of a model the checker is given: its large weights as typed inputs, where
it would only count their values.
"""

from __future__ import annotations

import functools
import re
import tempfile
from collections.abc import Sequence
from pathlib import Path

import onnx

from graphaudit.errors import GraphAuditError, brief
from graphaudit.load import external_data
from graphaudit.load.protos import node_lists
from graphaudit.load.raw_offsets import raw_data_spans
from graphaudit.load.repair import reassigned, untyped_input, untyped_outputs

# Protobuf refuses to serialise a message past 2 GiB; larger models must keep weights outside.
_PROTOBUF_LIMIT = 2**31 - 1


def check_model(model: onnx.ModelProto, path: Path | None, nested: Sequence[str] = (),
           payload: bytes | None = None) -> None:
    """Run the ONNX checker on `model`, whose external weights (if any) are graph inputs but for
    tensors nested in subgraphs, attributes or functions, stored in the files `nested` names.
    `payload`: `model`'s encoding when the caller has it (as `handed` gives it)."""
    where = f" in {path}" if path else ""
    try:
        if payload is None or len(payload) > _PROTOBUF_LIMIT:
            payload = _serialised(model)
        if payload is None:
            # check_model cannot take a proto past 2 GiB; its graph-only checks still apply.
            onnx.checker.check_graph(model.graph, onnx.checker.DEFAULT_CONTEXT)
        elif nested:
            _check_beside_placeholders(payload, nested, path)
        else:
            onnx.checker.check_model(payload)
    except (onnx.checker.ValidationError, onnx.onnx_cpp2py_export.checker.ValidationError) as err:
        relabelled = _runtime_ops_apart(model, str(err))
        if relabelled is not None:  # ONNX Runtime's own operators in the default domain: checked apart
            return check_model(relabelled, path, nested)
        unsorted = "topologically sorted" in str(err)
        problem = order_problem(model) if unsorted else None
        if unsorted and problem is None and not in_order(model.graph):
            raise Unsorted from None
        if unsorted and problem is None:  # the main graph is in order: a body is not
            raise GraphAuditError(f"expected the nodes of every body in order{where} (ONNX Runtime sorts only the "
                                  f"main graph's), found the ONNX checker's objection: {brief(err)}") from None
        if problem:
            raise GraphAuditError(f"expected an acyclic ONNX graph whose inputs are all defined{where}, found {problem}") from None
        said = _refused_by_runtime_too(model, str(err))
        if said:
            raise GraphAuditError(f"expected {said[0]}{where}, found {said[1]}") from None
        raise GraphAuditError(
            f"expected a valid ONNX model{where}, found the ONNX checker's objection: {brief(err)}"
        ) from None
    except UnicodeDecodeError:
        # The checker's message quotes a name whose bytes are not UTF-8: the file is damaged.
        raise GraphAuditError(
            f"expected a valid ONNX model{where}, found names or strings that are not valid UTF-8 "
            "(the file is damaged or not ONNX)"
        ) from None


def handed(model: onnx.ModelProto, data: bytes | None, over: int) -> tuple[onnx.ModelProto, bytes | None]:
    """What the checker is handed of `model`, and its encoding (None past protobuf's limit): a copy
    whose external weights, and whose inline weights past `over` bytes the checker would only
    count (`_only_counted`), are typed graph inputs; else `model`, encoded as `data` where that is
    it (the file's bytes, None where the model changed). Shape inference takes the same encoding
    while the model stays as it was checked (`load.inference.with_inferred_shapes`).

    The checker reads no weight's values: it checks a tensor's type, its one value field and
    that field's size. Handed the file's bytes, it parsed every inline weight again in C++, the
    bytes copied twice on the way: 1.8 s of each 650 MB model at Pythia-160M's shape in an audit.
    Each weight's size is read off the file's encoding where `data` is given (`raw_data_spans`):
    asking the proto for its raw_data copied it, 0.18 s a 650 MB model."""
    outside = any(t.data_location == onnx.TensorProto.EXTERNAL for t in model.graph.initializer)
    inline = any(t.data_location != onnx.TensorProto.EXTERNAL and (external_data.tensor_bytes(t) or 0) > over
                 for t in model.graph.initializer)
    if not outside and not inline:
        return model, data if data is not None else _serialised(model)
    # the walk reads every field of the graph: only where an inline weight's size is asked
    spans = raw_data_spans(data) if inline and data is not None else None
    copy = external_data.as_inputs(
        model, lambda t: t.data_location == onnx.TensorProto.EXTERNAL or _only_counted(t, over, spans))
    return copy, _serialised(copy)


# TensorProto's value fields besides raw_data
_TYPED_VALUES = ("float_data", "int32_data", "string_data", "int64_data", "double_data", "uint64_data")


def _only_counted(tensor: onnx.TensorProto, over: int,
                  spans: dict[str, tuple[int, int]] | None = None) -> bool:
    """Whether every check the checker makes of `tensor` holds without handing it the values: an
    inline weight past `over` bytes of a fixed-size type, its values in raw_data alone, with at
    least the bytes its type and shape need (the checker's own test of the size). Any other
    tensor is the checker's to judge, in its own words. `spans`: where the model's encoding keeps
    each initializer's raw_data (`raw_data_spans`), whose lengths spare reading the field."""
    need = external_data.tensor_bytes(tensor)
    if need is None or need <= over or tensor.data_location == onnx.TensorProto.EXTERNAL \
            or any(len(getattr(tensor, name)) for name in _TYPED_VALUES):
        return False
    span = spans.get(tensor.name) if spans is not None else None
    return (span[1] if span is not None else len(tensor.raw_data)) >= need


def _refused_by_runtime_too(model: onnx.ModelProto, objection: str) -> tuple[str, str] | None:
    """What was expected and what was found, for the checker's objections that ONNX Runtime
    makes too and the checker words without naming what it objects to; None for the others."""
    if "used as output names multiple times" in objection and (found := reassigned(model)):
        return "every value name assigned once (single static assignment)", f"{found}; ONNX Runtime refuses it too"
    if "Field 'type' of 'value_info' is required" in objection:
        name = untyped_input(model)
        if name is not None:
            return "a type for every graph input", f"none for input {name!r}; ONNX Runtime refuses it too"
        name = next(iter(untyped_outputs(model.graph)), None)
        if name is not None:
            return "a type for every graph output", f"none for output {name!r}, and shape inference found none to give it"
    return None


class Unsorted(Exception):
    """The main graph is acyclic and every input is defined, but its nodes are out of order."""


def in_order(graph: onnx.GraphProto) -> bool:
    """Whether each node of `graph` comes after the nodes whose outputs it reads."""
    defined = {i.name for i in graph.input} | {t.name for t in graph.initializer} | {""}
    for node in graph.node:
        if any(name not in defined for name in node.input):
            return False
        defined.update(node.output)
    return True


def sort_nodes(graph: onnx.GraphProto) -> int:
    """How many of the main graph's nodes moved as they were put in an order where each comes
    after what it reads, keeping the file's order wherever it already is one (the graph is
    known to be acyclic)."""
    import networkx as nx

    producer = {out: index for index, node in enumerate(graph.node) for out in node.output if out}
    order = nx.DiGraph()
    order.add_nodes_from(range(len(graph.node)))
    order.add_edges_from((producer[name], index) for index, node in enumerate(graph.node)
                         for name in node.input if name in producer)
    nodes = list(graph.node)
    ordered = list(nx.lexicographical_topological_sort(order))
    del graph.node[:]
    graph.node.extend(nodes[i] for i in ordered)
    return sum(1 for place, index in enumerate(ordered) if place != index)


_RUNTIME_DOMAIN = "graphaudit.runtime.sessions-default"  # where the checker's copy puts them


def _runtime_ops_apart(model: onnx.ModelProto, objection: str) -> onnx.ModelProto | None:
    """A copy of `model` for the checker whose nodes of ONNX Runtime's own operators in the
    default domain (SimplifiedLayerNormalization, as ONNX Runtime GenAI writes every decoder)
    are put in a domain of their own, which the checker leaves to the runtime; None when the
    checker's objection is not about such an operator."""
    found = re.search(r"No Op registered for (\w+) with domain_version", objection)
    if not found or found.group(1) not in _runtime_default_ops():
        return None
    ops = _runtime_default_ops()
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    moved = 0
    for nodes in node_lists(copy):  # the graph, its bodies, and the local functions' bodies
        for node in nodes:
            if node.domain in ("", "ai.onnx") and node.op_type in ops:
                node.domain = _RUNTIME_DOMAIN
                moved += 1
    if not moved:  # the objection is about no node here: the checker's own words stand
        return None
    for imports in (copy.opset_import, *(f.opset_import for f in copy.functions)):
        imports.add(domain=_RUNTIME_DOMAIN, version=1)
    return copy


@functools.cache
def _runtime_default_ops() -> frozenset[str]:
    """The operators ONNX Runtime runs in the default domain that ONNX does not define."""
    from onnxruntime.capi import onnxruntime_pybind11_state as ort_state

    return frozenset(s.name for s in ort_state.get_all_operator_schema()
                     if s.domain in ("", "ai.onnx") and not onnx.defs.has(s.name))


def _check_beside_placeholders(payload: bytes, locations: Sequence[str], path: Path | None) -> None:
    """The checker on a model whose nested tensors are external: it only asks that each named file
    exists beside the model, so it checks a copy in a temporary folder with an empty file at each
    location; the real files may be absent (a graph-only load) and are never opened."""
    with tempfile.TemporaryDirectory(prefix="graphaudit-check-") as folder:
        base = Path(folder).resolve()
        for location in locations:
            external_data.check_location(location, base, path)
            target = base / location
            target.parent.mkdir(parents=True, exist_ok=True)
            target.touch()
        (base / "model.onnx").write_bytes(payload)
        onnx.checker.check_model(str(base / "model.onnx"))


def _serialised(model: onnx.ModelProto) -> bytes | None:
    """The model's bytes, or None past protobuf's 2 GiB limit (encoded once, not sized then encoded)."""
    try:
        payload = model.SerializeToString()
    except Exception:  # noqa: BLE001 - upb raises EncodeError past its limit
        return None
    return payload if len(payload) <= _PROTOBUF_LIMIT else None


def order_problem(model: onnx.ModelProto) -> str | None:
    """Say whether the main graph has a cycle or an input nothing defines (None if neither)."""
    import networkx as nx

    defined = {i.name for i in model.graph.input} | {t.name for t in model.graph.initializer}
    producer = {}
    for index, node in enumerate(model.graph.node):
        for out in node.output:
            producer[out] = index
    g = nx.DiGraph()
    for index, node in enumerate(model.graph.node):
        for name in node.input:
            if not name or name in defined:
                continue
            if name not in producer:
                label = node.name or f"#{index} ({node.op_type})"
                return f"node {label} reads {name!r}, which no node, input or initializer defines"
            g.add_edge(producer[name], index)
    try:
        cycle = nx.find_cycle(g)
    except nx.NetworkXNoCycle:
        return None
    names = [model.graph.node[a].name or f"#{a} ({model.graph.node[a].op_type})" for a, _ in cycle]
    return "a cycle through nodes " + " -> ".join(names)
