"""A first look at a model: its inputs, outputs, operators, nesting and declared coefficients."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import onnx

from graphaudit.analyses.declared_coefficients import Coefficient, declared_coefficients
from graphaudit.analyses.dependence import CONTRIB_LOOPS
from graphaudit.graph.build import build_graph
from graphaudit.graph.model import CONTROL_FLOW_OPS, ModelGraph
from graphaudit.load.model import LoadedModel


@dataclass(frozen=True)
class ValueSummary:
    name: str
    elem_type: str
    shape: tuple[int | str | None, ...] | None


@dataclass(frozen=True)
class GraphSummary:
    """What `graphaudit inspect` shows about one model."""

    model: str
    opsets: tuple[tuple[str, int], ...]
    weights_loaded: bool
    weights: str  # LoadedModel.weights: inline, read, checked or unread
    inputs: tuple[ValueSummary, ...]
    outputs: tuple[ValueSummary, ...]
    node_count: int
    nested_node_count: int
    op_counts: tuple[tuple[str, int], ...]
    control_flow: tuple[tuple[str, str, int], ...]  # (node id, op, nodes inside)
    functions: tuple[str, ...]
    coefficients: tuple[Coefficient, ...]
    inlined_calls: int = 0  # calls of `functions` inlined at load (graphaudit.load.inline)
    repairs: tuple[str, ...] = ()  # what the loader repaired in memory (graphaudit.load.repair), in words

    def to_json(self) -> dict:
        return {
            "model": self.model,
            "opsets": dict(self.opsets),
            "weights_loaded": self.weights_loaded,
            "weights": self.weights,
            "inputs": [_value_json(v) for v in self.inputs],
            "outputs": [_value_json(v) for v in self.outputs],
            "node_count": self.node_count,
            "nested_node_count": self.nested_node_count,
            "op_counts": dict(self.op_counts),
            "control_flow": [{"node": n, "op": op, "nodes_inside": k} for n, op, k in self.control_flow],
            "functions": list(self.functions),
            "inlined_function_calls": self.inlined_calls,
            "repairs": list(self.repairs),
            "coefficients": [c.to_json() for c in self.coefficients],
        }


def summarize(loaded: LoadedModel, graph: ModelGraph | None = None) -> GraphSummary:
    """Return the GraphSummary of a loaded model."""
    mg = graph or build_graph(loaded.model)
    model = loaded.model
    ops = Counter(n.op_type if not n.domain else f"{n.domain}.{n.op_type}" for n in mg.nodes.values())
    control = tuple(
        (n.id, n.op_type, len(mg.inside(n.id)))
        for n in mg.nodes.values()
        if (n.op_type in CONTROL_FLOW_OPS and not n.domain) or (n.domain == "com.microsoft" and n.op_type in CONTRIB_LOOPS)
    )
    return GraphSummary(
        model=loaded.name,
        opsets=tuple((o.domain or "ai.onnx", o.version) for o in model.opset_import),
        weights_loaded=loaded.weights_loaded,
        weights=loaded.weights,
        inputs=tuple(_value(mg, r) for r in mg.inputs),
        outputs=tuple(_value(mg, r) for r in mg.outputs),
        node_count=len(mg.nodes),
        nested_node_count=sum(1 for n in mg.nodes.values() if n.scopes),
        op_counts=tuple(sorted(ops.items(), key=lambda kv: (-kv[1], kv[0]))),
        control_flow=control,
        functions=loaded.inlined_functions
        or tuple(f"{f.domain}.{f.name}" if f.domain else f.name for f in model.functions),
        coefficients=declared_coefficients(model),
        inlined_calls=loaded.inlined_calls,
        repairs=loaded.repairs,
    )


def _value(mg: ModelGraph, ref) -> ValueSummary:
    info = mg.tensors.get(ref)
    elem = onnx.TensorProto.DataType.Name(info.elem_type) if info and info.elem_type else "?"
    return ValueSummary(ref.name, elem.lower(), info.shape if info else None)


def _value_json(v: ValueSummary) -> dict:
    return {"name": v.name, "dtype": v.elem_type, "shape": list(v.shape) if v.shape is not None else None}
