"""The types of a function body's values at one call: ONNX's inference run on the body alone.

ONNX's shape inference reads through a model's local functions to type each call's outputs,
but writes no type for the values inside a body (a FunctionProto's `value_info` holds only
what its author declared, and exporters declare none: torch's `export_modules_as_functions`,
onnxscript). Without them a block exported as a function had no size for its matrix
products. Here the body is made a graph of its own, its inputs typed as the call's actual
arguments, its attribute references bound to the call's attributes (or the function's
defaults), and inferred: each call gets its own types, since two calls of one function may
see different shapes.
"""

from __future__ import annotations

from collections.abc import Sequence

import onnx
from onnx import shape_inference

from graphaudit.load.protos import graphs

# (element type, dims) of one actual argument, dims as graph.build.shape_of gives them
ArgType = tuple[int | None, tuple | None]


def body_types(model: onnx.ModelProto, fn: onnx.FunctionProto, call: onnx.NodeProto,
               arg_types: Sequence[ArgType | None]) -> dict[str, onnx.ValueInfoProto]:
    """The inferred type of each value in `fn`'s body when `call` calls it with arguments of
    `arg_types`, by name; {} when ONNX's inference refuses the body (types then stay unknown,
    as the function declared them)."""
    graph = onnx.GraphProto(name=fn.name or "function")
    for formal, arg in zip(fn.input, arg_types):
        _typed(graph.input.add(), formal, arg)
    graph.node.extend(fn.node)
    given = {a.name: a for a in fn.attribute_proto}
    given.update((a.name, a) for a in call.attribute)
    for sub in graphs(graph):
        _bind(sub.node, given)
    graph.output.extend(onnx.ValueInfoProto(name=name) for name in fn.output)
    opsets = {o.domain: o.version for o in model.opset_import}
    opsets.update((o.domain, o.version) for o in fn.opset_import)  # the body's own, where it says
    body = onnx.helper.make_model(graph, ir_version=model.ir_version, functions=model.functions,
                                  opset_imports=[onnx.helper.make_opsetid(d, v) for d, v in opsets.items()])
    try:
        inferred = shape_inference.infer_shapes(body, check_type=False, strict_mode=False, data_prop=True)
    except Exception:  # noqa: BLE001 - a body inference refuses keeps the types it declared
        return {}
    found = [*inferred.graph.value_info, *inferred.graph.output]
    return {vi.name: vi for vi in found if vi.type.HasField("tensor_type")}


def _typed(vi: onnx.ValueInfoProto, name: str, arg: ArgType | None) -> None:
    vi.name = name
    elem, dims = arg if arg is not None else (None, None)
    if not elem:
        return  # untyped: inference leaves what reads it unknown
    tensor = vi.type.tensor_type
    tensor.elem_type = elem
    if dims is None:
        return
    shape = tensor.shape
    shape.SetInParent()  # a scalar has a shape with no dims
    for size in dims:
        dim = shape.dim.add()
        if isinstance(size, int):
            dim.dim_value = size
        elif isinstance(size, str):
            dim.dim_param = size


def _bind(nodes, given: dict[str, onnx.AttributeProto]) -> None:
    """Replace each attribute that refers to one of the function's (`ref_attr_name`) by the
    value `given` names, or drop it where none is given (the operator's default applies)."""
    for node in nodes:
        attrs = node.attribute
        for i in reversed(range(len(attrs))):
            ref = attrs[i].ref_attr_name
            if not ref:
                continue
            value = given.get(ref)
            if value is None:
                del attrs[i]
                continue
            name = attrs[i].name
            attrs[i].CopyFrom(value)
            attrs[i].name = name
