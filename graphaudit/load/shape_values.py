"""The values of the small integer tensors that shape a graph, at concrete input shapes.

ONNX's shape inference, even with data propagation, gives up on a shape argument computed
through an operator it does not propagate (a `Slice` whose ends come from a `Div` of a
`Shape`, a `Range` of a sequence length, as the TorchScript exporter writes rotary
embeddings and attention masks): everything downstream is left unknown, and so are the
FLOPs of the MatMuls there. With every input size a number, those arguments are numbers too.
`fold_shape_arguments` computes them with ONNX's reference evaluator and writes them into
the graph as `Constant` nodes, so that the next round of inference can use them
(`load.inference.infer_at`).

Only what can matter is evaluated: the integer and boolean tensors that feed a shape argument
(SHAPE_ARGUMENTS) of a node whose output shape is still unknown, computed from small inline
constants and from `Shape` / `Size` of values whose shape is known. Control flow, random
sources and operators outside the default domain are never evaluated. A shape computation may
pass through float or double (`torch.arange(T, dtype=torch.float32)` is a `Range` of a `Cast`
of the sequence length), but only through operators whose results IEEE arithmetic fixes to the
bit, so that numpy gives what ONNX Runtime gives, and a float value is written in only as a
`Range` argument, once the three settle its length (`_settled`); a float `Range` itself is never
evaluated: ONNX's inference gives its length.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np
import onnx
from onnx import numpy_helper

# Inputs whose *values* set the output's extent.
SHAPE_ARGUMENTS: dict[str, tuple[int, ...]] = {
    "Reshape": (1,), "Expand": (1,), "Tile": (1,), "Range": (0, 1, 2), "Slice": (1, 2, 3, 4),
    "Pad": (1, 3), "Resize": (1, 2, 3), "Upsample": (1,), "TopK": (1,), "OneHot": (1,),
    "Unsqueeze": (1,), "Squeeze": (1,), "Split": (1,), "ConstantOfShape": (0,),
    "CenterCropPad": (1,), "ReduceSum": (1,), "ReduceMean": (1,), "ReduceMax": (1,),
    "ReduceMin": (1,), "ReduceProd": (1,), "ReduceL1": (1,), "ReduceL2": (1,),
    "ReduceLogSum": (1,), "ReduceLogSumExp": (1,), "ReduceSumSquare": (1,), "Col2Im": (1, 2),
    "DFT": (1,), "STFT": (1, 3),
}


# Element types a shape computation runs in.
_SHAPE_TYPES = frozenset({
    onnx.TensorProto.INT64, onnx.TensorProto.INT32, onnx.TensorProto.INT16, onnx.TensorProto.INT8,
    onnx.TensorProto.UINT64, onnx.TensorProto.UINT32, onnx.TensorProto.UINT16, onnx.TensorProto.UINT8,
    onnx.TensorProto.BOOL,
})
# Floating-point types a shape computation may pass through, and the operators that give the same
# bits in numpy as in ONNX Runtime on them: exact IEEE arithmetic and data movement (no Sqrt,
# Pow or transcendental functions, whose last bit differs between libraries; no Range)
_FLOAT_TYPES = frozenset({onnx.TensorProto.FLOAT, onnx.TensorProto.DOUBLE})
_EXACT_FLOAT_OPS = frozenset({
    "Cast", "CastLike", "Identity", "Add", "Sub", "Mul", "Div", "Neg", "Abs", "Floor", "Ceil", "Min", "Max",
    "Where", "Reshape", "Unsqueeze", "Squeeze", "Flatten", "Concat", "Gather", "Slice", "Expand",
    "ConstantOfShape",
})
_NEVER = frozenset({"If", "Loop", "Scan", "RandomNormal", "RandomUniform", "RandomNormalLike",
                    "RandomUniformLike", "Multinomial", "Bernoulli"})
MAX_ELEMENTS = 2**16  # a constant or computed value past this is not a shape computation
FLOAT_ELEMENTS = 64  # nor a float constant past this


def fold_shape_arguments(model: onnx.ModelProto, shapes: Mapping[str, tuple[int, ...]]) -> int:
    """Write into `model`'s main graph, as `Constant` nodes, the values of the shape arguments
    that `shapes` (the concrete shapes found so far, by name) leave unknown and that can be
    computed; return how many were written (0: nothing more to find)."""
    graph = model.graph
    types = _element_types(graph)
    producer = {out: i for i, node in enumerate(graph.node) for out in node.output if out}
    constants = _small_constants(graph)
    unsized = [node for node in graph.node if not node.domain and node.op_type in SHAPE_ARGUMENTS
               and any(out and out not in shapes for out in node.output)]
    wanted = [
        node.input[k] for node in unsized for k in SHAPE_ARGUMENTS[node.op_type]
        if k < len(node.input) and node.input[k] and node.input[k] not in constants and node.input[k] in producer
        and (node.op_type == "Range" or types.get(node.input[k]) not in _FLOAT_TYPES)  # float: a Range's only
    ]
    plan = _plan(graph, dict.fromkeys(wanted), producer, constants, shapes, types)
    if plan is None:
        return 0
    nodes, read_shapes, targets = plan
    values = _evaluate(model, nodes, read_shapes, constants, shapes, targets)
    values = _settled(values, [n for n in unsized if n.op_type == "Range"], constants)
    if not values:
        return 0
    for name in values:  # the old producer keeps running, under a name nothing reads
        node = graph.node[producer[name]]
        node.output[list(node.output).index(name)] = f"{name}__folded"
    made = [onnx.helper.make_node("Constant", [], [name], value=numpy_helper.from_array(value, name))
            for name, value in values.items()]
    kept = list(graph.node)
    del graph.node[:]
    graph.node.extend(made + kept)
    return len(made)


def _plan(graph: onnx.GraphProto, wanted: dict, producer: dict, constants: dict, shapes: Mapping, types: dict):
    """The nodes to evaluate (in graph order), the Shape/Size values to read off `shapes`, and
    the wanted tensors that can be computed; None when none can."""
    need: set[int] = set()
    read: dict[str, tuple[str, onnx.NodeProto]] = {}
    computable: dict[str, bool] = {}

    def can(name: str) -> bool:  # iterative: shape chains can be long
        stack = [name]
        while stack:
            current = stack[-1]
            if current in computable:
                stack.pop()
                continue
            if current == "" or current in constants:
                computable[current] = True
                stack.pop()
                continue
            index = producer.get(current)
            if index is None or (node := graph.node[index]).domain or node.op_type in _NEVER \
                    or not _exact(node.op_type, types.get(current)) \
                    or any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for a in node.attribute):
                computable[current] = False
                stack.pop()
                continue
            if node.op_type in ("Shape", "Size"):
                ok = node.input[0] in shapes
                if ok:
                    read[current] = (node.input[0], node)
                computable[current] = ok
                stack.pop()
                continue
            pending = [i for i in node.input if i not in computable]
            if pending:
                stack.extend(pending)
                continue
            ok = all(computable[i] for i in node.input)
            if ok:
                need.add(index)
            computable[current] = ok
            stack.pop()
        return computable[name]

    targets = [w for w in wanted if can(w)]
    if not targets:
        return None
    nodes = [graph.node[i] for i in sorted(need)]
    return nodes, read, targets


def _exact(op_type: str, elem_type: int | None) -> bool:
    """Whether an `op_type` node's output of type `elem_type` is computed here exactly as ONNX Runtime computes it."""
    return elem_type in _SHAPE_TYPES or (elem_type in _FLOAT_TYPES and op_type in _EXACT_FLOAT_OPS)


def _evaluate(model, nodes, read, constants, shapes, targets) -> dict[str, np.ndarray]:
    from onnx.reference import ReferenceEvaluator  # imported on first use: it loads every operator

    used = {name for node in nodes for name in node.input}
    feeds = {name: _shape_of(node, shapes[source]) for name, (source, node) in read.items()}
    if not nodes:
        return {t: feeds[t] for t in targets if t in feeds}
    sub = onnx.helper.make_graph(
        nodes, "shape_values",
        [onnx.helper.make_tensor_value_info(n, onnx.helper.np_dtype_to_tensor_dtype(v.dtype), v.shape)
         for n, v in feeds.items()],
        [onnx.helper.make_tensor_value_info(t, onnx.TensorProto.UNDEFINED, None) for t in targets if t not in feeds],
        [numpy_helper.from_array(v, n) for n, v in constants.items() if n in used],
    )
    sub_model = onnx.helper.make_model(sub, opset_imports=model.opset_import, ir_version=model.ir_version)
    try:
        out = ReferenceEvaluator(sub_model).run(None, feeds)
    except Exception:  # noqa: BLE001 - an argument the evaluator cannot compute stays unknown
        return {}
    values = dict(zip([t for t in targets if t not in feeds], out))
    values.update({t: feeds[t] for t in targets if t in feeds})
    return {n: np.asarray(v) for n, v in values.items() if np.asarray(v).size <= MAX_ELEMENTS}


def _settled(values: dict[str, np.ndarray], ranges: list, constants: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """`values` less the float arguments of a Range in `ranges` whose length they do not settle:
    one whose other arguments are still unknown, or whose length depends on how `limit - start`
    is rounded. ONNX's inference, which gives the length once they are written in, takes it in
    float; ONNX Runtime's build (1.32, x86-64) in double, from the same source line,
    `ceil((1.0 * (limit - start)) / delta)`; the two agree on a whole-number range, as
    `torch.arange(T, dtype=torch.float32)` is, and may not on another (0.1 to 3 by 0.1: 30
    against 29)."""
    for node in ranges:
        names = list(node.input[:3])
        args = [values.get(n, constants.get(n)) for n in names]
        if not any(n in values and values[n].dtype == np.float32 for n in names):
            continue
        scalars = [a for a in args if a is not None and a.size == 1]
        if len(scalars) < len(args) or not _one_length(*(float(a.reshape(-1)[0]) for a in scalars)):
            values = {n: v for n, v in values.items() if n not in names}
    return values


def _one_length(start: float, limit: float, delta: float) -> bool:
    """Whether a float32 Range has one length with `limit - start` rounded to float32 or to double."""
    if delta == 0 or not all(math.isfinite(x) for x in (start, limit, delta)):
        return False
    narrow = float(np.float32(limit) - np.float32(start))
    return max(math.ceil(narrow / delta), 0) == max(math.ceil((limit - start) / delta), 0)


def _shape_of(node: onnx.NodeProto, shape: tuple[int, ...]) -> np.ndarray:
    if node.op_type == "Size":
        return np.array(int(np.prod(shape, dtype=np.int64)), dtype=np.int64)
    attrs = {a.name: a.i for a in node.attribute}
    rank = len(shape)
    start, end = attrs.get("start", 0), attrs.get("end", rank)
    return np.array(shape[slice(start, end)], dtype=np.int64)


def _small_constants(graph: onnx.GraphProto) -> dict[str, np.ndarray]:
    """Inline integer and boolean initializers and Constant nodes of at most MAX_ELEMENTS values,
    and float ones of at most FLOAT_ELEMENTS (a shape computation's floats are scalars; a norm's
    weight is not one, and there may be hundreds of those inline)."""
    def small(tensor: onnx.TensorProto) -> bool:
        limit = MAX_ELEMENTS if tensor.data_type in _SHAPE_TYPES else FLOAT_ELEMENTS if tensor.data_type in _FLOAT_TYPES else -1
        return tensor.data_location != onnx.TensorProto.EXTERNAL and int(np.prod(tensor.dims, dtype=np.int64)) <= limit

    found = {}
    for tensor in graph.initializer:
        if small(tensor):
            found[tensor.name] = numpy_helper.to_array(tensor)
    for node in graph.node:
        if node.op_type == "Constant" and not node.domain and len(node.output) == 1:
            for a in node.attribute:
                if a.name == "value" and small(a.t):
                    found[node.output[0]] = numpy_helper.to_array(a.t)
                elif a.name in ("value_int", "value_ints"):
                    found[node.output[0]] = np.array(a.i if a.name == "value_int" else list(a.ints), dtype=np.int64)
                elif a.name in ("value_float", "value_floats"):
                    found[node.output[0]] = np.array(a.f if a.name == "value_float" else list(a.floats),
                                                     dtype=np.float32)
    return found


def _element_types(graph: onnx.GraphProto) -> dict[str, int]:
    types = {}
    for value in (*graph.input, *graph.value_info, *graph.output):
        if value.type.HasField("tensor_type"):
            types[value.name] = value.type.tensor_type.elem_type
    for tensor in graph.initializer:
        types[tensor.name] = tensor.data_type
    return types
