"""Shape inference as the loader runs it, and at given input sizes.

`with_inferred_shapes` gives a model ONNX's inferred shapes (with data propagation), handing
inference its large inline weights as typed inputs only (its external ones too, where it takes
the encoding the ONNX checker was handed), ONNX Runtime's fused operators as shape functions
(graphaudit.load.contrib_shapes), and each body's values under names of their own where names
repeat across bodies; `typed_outputs` types the outputs a graph leaves untyped, as ONNX
Runtime does; `infer_at` finds the concrete shape of every value with the inputs at given
sizes, computing the shape arguments data propagation leaves unknown
(graphaudit.load.shape_values).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import onnx
from onnx import shape_inference

from graphaudit.errors import brief
from graphaudit.load import external_data, repair
from graphaudit.load.contrib_shapes import may_need_shape_functions, with_shape_functions
from graphaudit.load.node_ids import node_ids
from graphaudit.load.protos import (
    NodeFields,
    graphs,
    has_bodies,
    names_repeat_across_graphs,
    rename_body_values,
    restore_names,
)
from graphaudit.load.shape_values import fold_shape_arguments

# Inline initializers larger than this reach shape inference as typed inputs (with_inferred_shapes)
INFER_WEIGHTS_OVER = 64 * 2**10
# Rounds of inference at most, each after writing in the shape arguments the last one left
# unknown; they end sooner where a round finds none to write (a TorchScript export of token
# pruning needed 7: each pruning step's sizes are computed from the shape the last one made)
_FOLD_ROUNDS = 32


def typed_outputs(model: onnx.ModelProto) -> tuple[onnx.ModelProto, tuple[str, ...]]:
    """`model` with each main-graph output that declares no type typed as shape inference finds
    it, and the outputs so typed; an output inference cannot type stays as it was."""
    untyped = repair.untyped_outputs(model.graph)
    inferred, _, _ = with_inferred_shapes(model)  # inference writes the outputs' types it finds
    still = set(repair.untyped_outputs(inferred.graph))
    return inferred, tuple(name for name in untyped if name not in still)


def with_inferred_shapes(model: onnx.ModelProto, every: list[onnx.GraphProto] | None = None,
                         checked: tuple[onnx.ModelProto, bytes] | None = None,
                         fields: Sequence[NodeFields] | None = None) -> tuple[onnx.ModelProto, bool, str | None]:
    """`model` with ONNX's inferred shapes, whether inference succeeded, and its error if not
    (`_inferred`); where a value name repeats across bodies, inferred with each body's values
    under names of their own (`protos.rename_body_values`), given back after. `every`: the
    model's graphs, as `graphs` lists them, where the caller has them. `checked`: what the ONNX
    checker was handed of `model` and its encoding (`load.checker.handed`), where the model has
    not changed since. `fields`: the main graph's nodes' fields (`protos.walk_graphs`), where the
    caller has them."""
    every = every if every is not None else list(graphs(model.graph))
    back = rename_body_values(model.graph) if names_repeat_across_graphs(model.graph, every) else {}
    result = _inferred(model, every, None if back else checked, fields)
    if back:
        for graph in {id(g): g for g in (model.graph, result[0].graph)}.values():
            restore_names(graph, back)
    return result


def _inferred(model: onnx.ModelProto, every: list[onnx.GraphProto],
              checked: tuple[onnx.ModelProto, bytes] | None = None,
              fields: Sequence[NodeFields] | None = None) -> tuple[onnx.ModelProto, bool, str | None]:
    """`model` with ONNX's inferred shapes, whether inference succeeded, and its error if not.

    Inline initializers past INFER_WEIGHTS_OVER bytes are not handed to inference: it needs
    their types and shapes only (a value that sets a shape is a handful of integers, and
    those stay), so it runs on a copy that declares them as graph inputs, and what it adds
    (the value types and output shapes of every graph and body) is written into `model`
    itself, which the caller owns. Encoding, parsing and copying the weights was most of
    inference's time on a model that holds them.

    The checker's copy (`checked`) is such a copy already, its external weights typed inputs
    too: inference reads no value of theirs either way, and where one sets a shape it carries on
    past it with that shape unknown (handed the external reference, it typed nothing after it).
    Inference takes that copy's encoding, unless a node needs a shape function or a weight it
    would not be handed is still inline there.
    """
    if checked is not None and not may_need_shape_functions(model, fields) and not heavy_weights(checked[0]):
        return _inferred_from(model, every, *checked)
    plain = _without_weights(model)
    skeleton = with_shape_functions(plain, copy=plain is model)  # ONNX Runtime's fused operators
    try:
        inferred = shape_inference.infer_shapes(skeleton, check_type=False, strict_mode=False, data_prop=True)
    except Exception as err:  # noqa: BLE001 - inference failure is reported, the graph still loads
        if skeleton is plain:
            return model, False, brief(err)
        try:  # a shape function ONNX would not take: inference as before, without them
            skeleton, inferred = plain, shape_inference.infer_shapes(plain, check_type=False, strict_mode=False,
                                                                     data_prop=True)
        except Exception as err:  # noqa: BLE001
            return model, False, brief(err)
    if skeleton is model:
        return inferred, True, None
    _written_back(every, inferred)
    return model, True, None


def _inferred_from(model: onnx.ModelProto, every: list[onnx.GraphProto], handed: onnx.ModelProto,
                   encoding: bytes) -> tuple[onnx.ModelProto, bool, str | None]:
    """`_inferred`, inference run on `encoding`, that of `handed`: `model` itself or a copy whose
    weights are typed graph inputs."""
    try:
        inferred = shape_inference.infer_shapes(encoding, check_type=False, strict_mode=False, data_prop=True)
    except Exception as err:  # noqa: BLE001 - inference failure is reported, the graph still loads
        return model, False, brief(err)
    if handed is model:
        return inferred, True, None
    if all(t.data_location == onnx.TensorProto.EXTERNAL for t in model.graph.initializer):
        # each weight a reference of a few bytes: given back to the inferred copy (the inputs
        # they became come last), in less than half the time of writing its value types back
        del inferred.graph.input[len(model.graph.input):]
        inferred.graph.initializer.extend(model.graph.initializer)
        return inferred, True, None
    _written_back(every, inferred)
    return model, True, None


def _written_back(every: list[onnx.GraphProto], inferred: onnx.ModelProto) -> None:
    """Write what inference found in a copy of the model (`inferred`) into the model's own graphs
    (`every`): each graph's value types and output types."""
    # the same bodies, in the same order (inference adds none: a graph without any has one)
    for mine, found in zip(every, graphs(inferred.graph) if len(every) > 1 else [inferred.graph]):
        del mine.value_info[:]
        mine.value_info.extend(found.value_info)
        for output, typed in zip(mine.output, found.output):
            output.CopyFrom(typed)


def infer_at(model: onnx.ModelProto, shapes: Mapping[str, Sequence[int]]) -> dict[str, tuple[int, ...]]:
    """The concrete shape of every main-graph value ONNX's shape inference finds with the graph
    inputs at `shapes`, by name; {} when inference fails. With every input size a number, data
    propagation turns shapes computed from input shapes (Shape, Gather, Concat into a Reshape,
    as exporters without symbolic shapes write them) into numbers too, where inference on the
    symbolic graph leaves them unknown; shape arguments that data propagation cannot compute
    are computed and written in as constants, and inference runs again (`shape_values`, up to
    _FOLD_ROUNDS rounds). `model` is not changed."""
    skeleton = _without_weights(model)
    if skeleton is model:
        skeleton = onnx.ModelProto()
        skeleton.CopyFrom(model)
    skeleton = with_shape_functions(skeleton, copy=False)
    for value in skeleton.graph.input:
        if value.name in shapes and value.type.HasField("tensor_type"):
            dims = value.type.tensor_type.shape.dim
            del dims[:]
            for size in shapes[value.name]:
                dims.add().dim_value = int(size)
    found: dict[str, tuple[int, ...]] = {}
    bodies = has_bodies(skeleton.graph)  # (folding adds constants, never bodies)
    back = rename_body_values(skeleton.graph) if bodies and names_repeat_across_graphs(skeleton.graph) else {}
    inferred = None
    for _ in range(_FOLD_ROUNDS):
        del skeleton.graph.value_info[:]  # shapes from before would stand against the numbers
        for output in skeleton.graph.output:
            if output.type.HasField("tensor_type"):
                output.type.tensor_type.ClearField("shape")
        try:
            inferred = shape_inference.infer_shapes(skeleton, check_type=False, strict_mode=False, data_prop=True)
        except Exception:  # noqa: BLE001 - the symbolic shapes stand; what they leave unknown is listed
            break
        found = _concrete_shapes(inferred.graph)
        # a shape argument inference could not compute (a Slice's ends from a Div of a Shape):
        # computed here, written in as a constant, and inferred again
        if not fold_shape_arguments(inferred, {**found, **{k: tuple(v) for k, v in shapes.items()}}):
            break
        skeleton = inferred
    found = {name: shape for name, shape in found.items() if not name.endswith("__folded")}
    if inferred is not None and bodies:
        occurrences = node_ids(inferred)  # held, so that each node's wrapper (and its id()) lives on
        ids = {id(proto): node_id for proto, node_id, _ in occurrences}  # the graph model's ids, by node
        found.update(_body_shapes(inferred.graph, "", ids, back))
        del occurrences
    return found


def _body_shapes(graph: onnx.GraphProto, scope: str, ids: Mapping[int, str], back: Mapping[str, str]) -> dict:
    """The concrete shapes of the values of the bodies nested in `graph`, keyed as the graph
    model writes their TensorRef (`<owner id>/<attribute>::<name>`, nested owners joined by
    `/`; `ids`: each node's id, by the node); `back`: the names `protos.rename_body_values` gave
    their values, to give back."""
    found: dict[str, tuple[int, ...]] = {}
    for node in graph.node:
        owner = ids.get(id(node))
        for attr in node.attribute if owner is not None else ():
            bodies = [attr.g] if attr.type == onnx.AttributeProto.GRAPH else attr.graphs
            for body in bodies:
                key = f"{scope}/{owner}/{attr.name}" if scope else f"{owner}/{attr.name}"
                found.update((f"{key}::{back.get(name, name)}", shape)
                             for name, shape in _concrete_shapes(body, body.input).items())
                found.update(_body_shapes(body, key, ids, back))
    return found


def _concrete_shapes(graph: onnx.GraphProto, inputs: Sequence[onnx.ValueInfoProto] = ()) -> dict[str, tuple[int, ...]]:
    """The values of `graph` (and `inputs`: a body's own, as declared) whose shapes are numbers."""
    found = {}
    for value in (*inputs, *graph.value_info, *graph.output):
        tensor = value.type.tensor_type
        if value.type.HasField("tensor_type") and tensor.HasField("shape") and \
                all(d.HasField("dim_value") for d in tensor.shape.dim):
            found[value.name] = tuple(d.dim_value for d in tensor.shape.dim)
    return found


def _without_weights(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of `model` whose inline initializers past INFER_WEIGHTS_OVER bytes are typed graph
    inputs (none copied); `model` itself when it has none."""
    heavy = heavy_weights(model)
    return external_data.as_inputs(model, lambda t: t.name in heavy) if heavy else model


def heavy_weights(model: onnx.ModelProto) -> set[str]:
    """The main graph's inline initializers past INFER_WEIGHTS_OVER bytes, which inference is
    handed as typed inputs only."""
    return {t.name for t in model.graph.initializer if t.data_location != onnx.TensorProto.EXTERNAL
            and (external_data.tensor_bytes(t) or 0) > INFER_WEIGHTS_OVER}
