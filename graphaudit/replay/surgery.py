"""Graph surgery for Frozen-Controller Auditing: the trace graph and the frozen graph.

`Trace` is the pass (graphaudit.replay.passes) that makes the trace graph: the live model
with its coefficient tensors as extra graph outputs, so one run yields the model's outputs and
the coefficients that produced them. `Freeze` makes the frozen graph: every coefficient tensor
a graph input instead, and the controller nodes that no longer feed any output gone, so the
coefficients can be fed from anywhere and the controller never runs. Both give new models that
pass the ONNX checker. `LogProbs` adds the log-probabilities of a distribution the replay
scores as an output.

A coefficient must be a value computed in the main graph. One that lives inside an If /
Loop / Scan body or a function body cannot be exposed or fed without rewriting control
flow, so it is refused with an error that says where it was found.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import helper, shape_inference

from graphaudit.analyses.declared_coefficients import Coefficient
from graphaudit.analyses.dependence import VALUE, analyse_dependence
from graphaudit.errors import GraphAuditError
from graphaudit.graph.build import build_graph
from graphaudit.load.protos import names_repeat_across_graphs, node_reads
from graphaudit.replay.passes import PassResult
from graphaudit.vocabulary import BATCH, TOKEN
from graphaudit.wording import counted, listed

# Suffix given to a controller output that the frozen graph replaces with a graph input.
_DETACHED = "__graphaudit_controller"


@dataclass(frozen=True)
class Trace:
    """The pass that makes the trace graph: each coefficient tensor added as a graph output."""

    coefficients: tuple[Coefficient, ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "coefficients", tuple(self.coefficients))

    def __call__(self, model: onnx.ModelProto, *, owned: bool = False) -> PassResult[tuple[str, ...]]:
        """Return the trace graph of `model`, and the coefficient tensors it added as outputs
        (none: every one is an output already, and `model` comes back as it is)."""
        typed = _typed_copy(model, self.coefficients)
        graph = typed.graph
        types = _value_types(graph)
        added: list[str] = []
        for c in self.coefficients:
            if c.tensor not in {o.name for o in graph.output}:
                graph.output.append(_value_info(c, types, graph))
                added.append(c.tensor)
        # with every coefficient an output already the copy was not shape-inferred: it is `model`
        return PassResult(typed, True, tuple(added)) if added else PassResult(model, False, ())


@dataclass(frozen=True)
class Freezing:
    """What freezing did: the coefficient tensors made graph inputs, and the controller nodes
    (names, or `op#index`) that only fed them, removed."""

    coefficients: tuple[Coefficient, ...]
    removed: tuple[str, ...]


@dataclass(frozen=True)
class Freeze:
    """The pass that makes the frozen graph: the coefficients as graph inputs, dead controller nodes removed."""

    coefficients: tuple[Coefficient, ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "coefficients", tuple(self.coefficients))

    def __call__(self, model: onnx.ModelProto, *, owned: bool = False) -> PassResult[Freezing]:
        """Return the frozen graph of `model` and what freezing did; always modified (a model
        with no coefficient to freeze is refused)."""
        frozen, removed = _freeze(model, self.coefficients)
        return PassResult(frozen, True, Freezing(self.coefficients, removed))


def _freeze(model: onnx.ModelProto, coefficients: Sequence[Coefficient]) -> tuple[onnx.ModelProto, tuple[str, ...]]:
    frozen = _typed_copy(model, coefficients)
    graph = frozen.graph
    types = _value_types(graph)
    names = {c.tensor for c in coefficients}
    inputs = [_value_info(c, types, graph) for c in coefficients]
    for node in graph.node:
        for i, out in enumerate(node.output):
            if out in names:
                node.output[i] = out + _DETACHED  # the value now comes from the graph input
    removed = remove_dead(graph)
    graph.input.extend(inputs)
    produced = {o for n in graph.node for o in n.output}
    kept_info = [v for v in graph.value_info if v.name not in names and v.name in produced]
    del graph.value_info[:]
    graph.value_info.extend(kept_info)
    return frozen, removed


@dataclass(frozen=True)
class LogProbs:
    """The pass that adds the log-probabilities of graph output `output` as output `name`:
    the log-softmax (last axis) of logits (`scale` "logits"), or the log of probabilities
    ("probs") clipped at float32's smallest normal number, as `metrics.outputs` clips them.
    `name` equal to `output`: the output holds log-probabilities already, nothing is added."""

    output: str
    name: str
    scale: str = "logits"

    def __call__(self, model: onnx.ModelProto, *, owned: bool = False) -> PassResult[str | None]:
        """Return `model` with output `name` added, and `name` (None: nothing added)."""
        if self.name == self.output:
            return PassResult(model, False, None)
        return PassResult(_with_log_probs(model, self.output, self.name, self.scale, owned), True, self.name)


def _with_log_probs(model: onnx.ModelProto, output: str, name: str, scale: str, owned: bool) -> onnx.ModelProto:
    copy = model if owned else onnx.ModelProto()
    if not owned:  # the copy of a large model's weights is most of the call's time
        copy.CopyFrom(model)
    found = next((o for o in copy.graph.output if o.name == output), None)
    if found is None:
        raise GraphAuditError(f"expected a graph output named {output!r}, found {[o.name for o in copy.graph.output]}")
    elem = found.type.tensor_type.elem_type
    if scale == "logits":
        copy.graph.node.append(helper.make_node("LogSoftmax", [output], [name], name=name, axis=-1))
    else:
        value = output
        if elem not in (onnx.TensorProto.FLOAT, onnx.TensorProto.DOUBLE):  # float16's smallest is 6e-5
            value = f"{name}/float"
            copy.graph.node.append(helper.make_node("Cast", [output], [value], name=value, to=onnx.TensorProto.FLOAT))
            elem = onnx.TensorProto.FLOAT
        tiny = helper.make_tensor(f"{name}/tiny", elem, [], [float(np.finfo(np.float32).tiny)])
        copy.graph.node.extend([
            helper.make_node("Constant", [], [f"{name}/tiny"], name=f"{name}/tiny", value=tiny),
            helper.make_node("Max", [value, f"{name}/tiny"], [f"{name}/clipped"], name=f"{name}/clipped"),
            helper.make_node("Log", [f"{name}/clipped"], [name], name=name)])
    out = copy.graph.output.add()
    out.CopyFrom(found)
    out.name = name
    out.type.tensor_type.elem_type = elem
    return copy


class UnfreezableError(GraphAuditError):
    """A coefficient the graph computes inside control flow or a function: a fact about the
    model (it cannot be exposed or fed from the main graph), not bad input."""


def check_coefficients(model: onnx.ModelProto, coefficients: Sequence[Coefficient]) -> None:
    """Raise GraphAuditError unless every coefficient is a value computed in the main graph."""
    if not coefficients:
        raise GraphAuditError("expected at least one coefficient tensor to expose or freeze, found none")
    mg = build_graph(model)
    initializers = {t.name for t in model.graph.initializer}
    inputs = {i.name for i in model.graph.input} - initializers
    for c in coefficients:
        ref = mg.find_tensor(c.tensor)
        if c.tensor in inputs:
            raise GraphAuditError(
                f"expected coefficient {c.tensor!r} to be computed by a controller in the live model, "
                "found it as a graph input: the model is already frozen; give the live model instead"
            )
        if c.tensor in initializers:
            raise GraphAuditError(
                f"expected coefficient {c.tensor!r} to be computed from the input, found a constant initializer"
            )
        if ref is None:
            raise GraphAuditError(
                f"expected a tensor named {c.tensor!r} in the model, found none "
                f"({len(mg.tensors)} values, e.g. {', '.join(sorted(r.name for r in mg.tensors)[:4])})"
            )
        if ref.scope:
            producer = mg.producer(ref)
            where = producer.describe_scope() if producer is not None else ref.scope
            raise UnfreezableError(
                f"expected coefficient {c.tensor!r} in the main graph, found it inside the {where}; "
                "a coefficient inside control flow or a function cannot be exposed or frozen"
            )
        if mg.producer(ref) is None:
            raise GraphAuditError(f"expected coefficient {c.tensor!r} to be a node's output, found none producing it")


def _typed_copy(model: onnx.ModelProto, coefficients: Sequence[Coefficient]) -> onnx.ModelProto:
    """A copy of `model`, checked for `coefficients`, with inferred value types."""
    check_coefficients(model, coefficients)
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    known = {v.name for v in copy.graph.value_info} | {o.name for o in copy.graph.output}
    if any(c.tensor not in known for c in coefficients):
        with contextlib.suppress(Exception):  # types may still be found below, else a clear error
            copy = shape_inference.infer_shapes(copy, check_type=False, strict_mode=False,
                                                data_prop=not names_repeat_across_graphs(copy.graph))
    return copy


def _value_types(graph: onnx.GraphProto) -> dict[str, onnx.TypeProto]:
    return {v.name: v.type for v in [*graph.value_info, *graph.output, *graph.input]}


def _value_info(c: Coefficient, types: dict[str, onnx.TypeProto], graph: onnx.GraphProto) -> onnx.ValueInfoProto:
    """The value info of coefficient `c`, its batch and token axes named like the data's."""
    found = types.get(c.tensor)
    if found is None or not found.tensor_type.elem_type:
        raise GraphAuditError(
            f"expected shape inference to give the element type of coefficient {c.tensor!r}, found none; "
            "the model may use operators the installed onnx cannot infer"
        )
    value = helper.make_tensor_value_info(c.tensor, found.tensor_type.elem_type, None)
    batch, seq = _data_dims(graph)
    dims = list(found.tensor_type.shape.dim) if found.tensor_type.HasField("shape") else None
    rank = len(dims) if dims is not None else len(c.axes)
    shape = value.type.tensor_type.shape
    for i in range(rank):
        dim = shape.dim.add()
        axis = c.axes[i] if i < len(c.axes) else None
        if dims is not None and dims[i].HasField("dim_value"):
            dim.dim_value = dims[i].dim_value
        elif axis in (BATCH, TOKEN):
            dim.dim_param = batch if axis == BATCH else seq
        elif dims is not None and dims[i].dim_param:
            dim.dim_param = dims[i].dim_param
    return value


def _data_dims(graph: onnx.GraphProto) -> tuple[str, str]:
    """The symbolic names of the first data input's batch and sequence axes."""
    initializers = {t.name for t in graph.initializer}
    for vi in graph.input:
        if vi.name in initializers:
            continue
        dims = [d.dim_param for d in vi.type.tensor_type.shape.dim]
        if len(dims) >= 2 and dims[0] and dims[1]:
            return dims[0], dims[1]
    return BATCH, "seq"


def remove_dead(graph: onnx.GraphProto) -> tuple[str, ...]:
    """Drop nodes (and initializers) that feed no graph output, in place; return what went."""
    needed = {o.name for o in graph.output}
    kept: list[onnx.NodeProto] = []
    removed: list[str] = []
    for index in range(len(graph.node) - 1, -1, -1):
        node = graph.node[index]
        if any(o in needed for o in node.output if o):
            kept.append(node)
            needed.update(node_reads(node))
        else:
            removed.append(node.name or f"{node.op_type}#{index}")
    del graph.node[:]
    graph.node.extend(reversed(kept))
    weights = {t.name for t in graph.initializer}
    inits = [t for t in graph.initializer if t.name in needed]
    del graph.initializer[:]
    graph.initializer.extend(inits)
    # the user's inputs stay, read or not; a weight an older IR lists among them goes with the weight
    inputs = [i for i in graph.input if i.name in needed or i.name not in weights]
    del graph.input[:]
    graph.input.extend(inputs)
    return tuple(reversed(removed))


def live_decisions(frozen: onnx.ModelProto, coefficients: Sequence[Coefficient]) -> tuple[str, ...]:
    """The If / Loop nodes of the frozen graph whose decision still depends on the input's values
    once the coefficients it is fed count as given: made by controllers the freezing could not
    reach (an early exit's confidence computed inside an earlier exit's branch, a halting score
    inside a Loop body), or from the input itself. They run live in every condition."""
    mg = build_graph(frozen)
    dm = analyse_dependence(mg, frozenset(c.tensor for c in coefficients))
    return tuple(c.node for c in dm.controls.values() if c.dependence == VALUE)


def live_note(live: Sequence[str]) -> str:
    return (f"{counted(len(live), 'decision')} of control flow in the frozen graph ({listed(live)}) still "
            f"depend{'s' if len(live) == 1 else ''} on the input's values, not on the fed coefficients alone: "
            "what makes them ran live in every condition, so the replay measures the dependence on the "
            "coefficients it feeds only")
