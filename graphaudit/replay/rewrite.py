"""Rewrites of the replay's frozen graph into operators ONNX Runtime's CPU runs faster.

The replay runs the frozen graph once per condition and batch, so its slowest operators are
paid six times over. Four patterns that exporters write and ONNX Runtime 1.32's CPU handles
slowly (benchmarks/NOTES.md, replay: the rewrites) are replaced by the same computation:

- *masked fill*: `Where(mask, -inf, scores)` feeding only a Softmax (a causal or padding
  mask) becomes `Add(scores, Where(mask, -inf, 0))`. ONNX Runtime's three-way broadcast in
  `Where` took 0.32 ms per (16, 4, 64, 64) call; the bias is made on the mask's own shape and
  broadcast by `Add`. For finite scores the two give the same bits: s + 0 is s, s + -inf is
  -inf (a -0.0 score turns +0.0, which a Softmax cannot tell apart). Hugging Face's fill,
  float32's lowest value, is taken too: s + finfo.min is finfo.min for any |s| < 2^103.
- *Einsum as MatMul*: a two-operand Einsum with batch indices and one free index on each side
  and one summed (`cbtl,lbtd->cbtd`, MUDD's dense connections) becomes Transpose, MatMul,
  Transpose, which is what ONNX Runtime's Einsum does inside, without its own overhead
  (0.27 against 0.40 ms per call at batch 16, the same bits on the zoo).
- *bias as Gemm*: `Add(MatMul(x, W), b)` on rows x of rank 3 or more (a linear layer on
  (batch, seq, d)) becomes a Gemm on x's rows, which adds the bias inside the product instead
  of in a pass of its own; ONNX Runtime fuses this only for rank 2. Only where the product is
  at most GEMM_EXACT_DEPTH deep, where the two give the same bits.
- *attention*: a multi-head attention spelled out in reshapes, transposes, products, scale,
  mask and softmax becomes ONNX's `Attention` (graphaudit.replay.rewrite_attention), after the masked
  fills above have become the additive masks it takes.

`Rewrite` is a pass (graphaudit.replay.passes): it gives a new model (the one handed in changed
only when handed over) and how many of each kind it made. The replay's parity check compares
the rewritten graph's `correct` run with the unrewritten live model; a rewritten graph that
fails it is replaced by the graph as exported, with a note (`replay`).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection, Mapping
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import helper, numpy_helper

from graphaudit.load.protos import body_reads, readers_of, scalar_constants, with_nodes
from graphaudit.replay.fresh_names import FreshNames
from graphaudit.replay.passes import PassResult
from graphaudit.replay.rewrite_attention import RewriteAttention

_SOFTMAX = frozenset({"Softmax", "LogSoftmax"})
_MATMUL_TYPES = frozenset({onnx.TensorProto.FLOAT, onnx.TensorProto.DOUBLE})
# The deepest product whose Gemm with a bias gives the bits of MatMul then Add: ONNX Runtime's
# CPU Gemm (MLAS) starts from the bias and adds the product in blocks of 256 of the inner
# dimension, so a deeper product takes the bias in before its last blocks (a rounding apart).
GEMM_EXACT_DEPTH = 256


KINDS = ("masked_fill", "einsum", "matmul_bias", "attention")


@dataclass(frozen=True)
class Rewrite:
    """The pass that rewrites masked fills, plain Einsums, biased MatMuls and spelled-out
    attentions (module docstring; `kinds`: only those)."""

    kinds: Collection[str] = KINDS

    def __call__(self, model: onnx.ModelProto, *, owned: bool = False) -> PassResult[Mapping[str, int]]:
        """Return `model` rewritten and the count of each kind made (`model` itself when none)."""
        out, made = _rewritten(model, self.kinds, owned)
        return PassResult(out, bool(made), made)


def _rewritten(model: onnx.ModelProto, kinds: Collection[str],
               owned: bool) -> tuple[onnx.ModelProto, dict[str, int]]:
    """`model` with the `kinds` rewritten (itself, changed, when `owned`; itself when there is
    none), and the count of each kind made, in KINDS' order."""
    graph = model.graph
    names = FreshNames(model)
    constants = scalar_constants(graph)
    original = list(graph.node)  # held, so that each node's id() stays its own
    readers = readers_of(original)
    outer = {o.name for o in graph.output} | body_reads(graph)  # values read past the main graph's nodes
    softmax_only = _read_only_by_softmax(readers, outer)
    biased = _biased_matmuls(model, original, readers, outer, names) if "matmul_bias" in kinds else _Biased()
    nodes: list[onnx.NodeProto] = []
    made: Counter[str] = Counter()
    for node in original:
        new = None
        if id(node) in biased.done:
            continue  # the bias Add of a MatMul already rewritten
        if id(node) in biased.pairs:
            new = _matmul_bias(node, *biased.pairs[id(node)], biased, names)
            biased.done.add(id(biased.pairs[id(node)][0]))
            kind = "matmul_bias"
        elif node.op_type == "Where" and node.domain in ("", "ai.onnx") and "masked_fill" in kinds:
            new = _masked_fill(node, constants, softmax_only, names)
            kind = "masked_fill"
        elif node.op_type == "Einsum" and node.domain in ("", "ai.onnx") and "einsum" in kinds:
            new = _einsum(node, names)
            kind = "einsum"
        if new is None:
            nodes.append(node)
        else:
            nodes.extend(new)
            made[kind] += 1
    out = model
    if made:
        out = with_nodes(model, nodes, owned)
        # the new values' element types (and shapes where known), so that a cut through them
        # (graphaudit.replay.prefix) can type it
        out.graph.value_info.extend(helper.make_tensor_value_info(name, kind, names.shapes.get(name))
                                    for name, kind in names.typed)
    if "attention" in kinds:
        # its fresh names clash with none made above; `out` is handed over when it is a copy made here
        done = RewriteAttention(names)(out, owned=owned or out is not model)
        out, made["attention"] = done.model, done.details
    return out, {kind: made[kind] for kind in KINDS if made[kind]}


def _read_only_by_softmax(readers: dict[str, list[onnx.NodeProto]], outer: set[str]) -> set[str]:
    """The values every reader of which is a Softmax or LogSoftmax of the main graph, and that
    no subgraph reads and the graph does not give out (`outer`)."""
    return {name for name, nodes in readers.items() if name not in outer
            and all(n.op_type in _SOFTMAX and n.domain in ("", "ai.onnx") for n in nodes)}


def _masked_fill(node, constants, softmax_only, names):
    """`Where(mask, fill, scores)` with an infinite or lowest constant fill (`_fill`), read by Softmax alone, as
    `Add(scores, Where(mask, fill, 0))` (either branch may hold the fill); None otherwise."""
    if len(node.input) != 3 or node.output[0] not in softmax_only:
        return None
    mask, a, b = node.input
    side = next((k for k, name in ((1, a), (2, b)) if name in constants and _fill(constants[name])), None)
    if side is None or (a in constants and b in constants):
        return None
    fill = constants[node.input[side]]
    scores = node.input[3 - side]
    zero = names.fresh(f"{node.output[0]}/zero")  # a Constant node, not an initializer: IR 3 lists those as inputs
    bias = names.value(f"{node.output[0]}/bias", node.output[0])
    if mask in names.dims:  # the bias has the mask's shape, broadcast with the fill's
        rank = max(len(names.dims[mask]), fill.ndim)
        names.shapes[bias] = (1,) * (rank - len(names.dims[mask])) + names.dims[mask]
    branches = [node.input[side], zero] if side == 1 else [zero, node.input[side]]
    return [helper.make_node("Constant", [], [zero], name=names.fresh(f"{node.name}/zero"),
                             value=numpy_helper.from_array(np.zeros((), fill.dtype))),
            helper.make_node("Where", [mask, *branches], [bias], name=names.fresh(f"{node.name}/bias")),
            helper.make_node("Add", [scores, bias], [node.output[0]], name=names.fresh(f"{node.name}/add"))]


class _Biased:
    """The MatMuls of a batch of rows by a weight matrix whose only reader adds a bias vector."""

    def __init__(self) -> None:
        self.pairs: dict[int, tuple[onnx.NodeProto, str]] = {}  # id(MatMul) -> (its Add, the bias)
        self.weights: dict[str, tuple[int, ...]] = {}  # constant matrices and vectors: shapes
        self.done: set[int] = set()  # id()s of the Adds rewritten with their MatMul
        self.shapes: dict[tuple, str] = {}  # (leading dimensions, width) -> the value holding that shape
        self.sources: dict[tuple, tuple[str, int]] = {}  # leading dimensions -> a graph input that starts with them


def _biased_matmuls(model: onnx.ModelProto, nodes: list[onnx.NodeProto], readers: dict[str, list[onnx.NodeProto]],
                    outer: set[str], names: FreshNames) -> _Biased:
    """`MatMul(x, W)` with x of rank 3 or more and W a constant matrix, read only by
    `Add(·, b)` with b a constant vector of W's width (opset 15 and later: Shape's `end`)."""
    graph, found = model.graph, _Biased()
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)
    if opset < 15:
        return found
    inputs = {i.name for i in graph.input}
    found.weights = {t.name: tuple(t.dims) for t in graph.initializer if t.name not in inputs and len(t.dims) in (1, 2)
                     and t.data_type == onnx.TensorProto.FLOAT}
    weights = {t.name for t in graph.initializer}  # an older IR lists them among the inputs too
    for value in graph.input:
        dims = names.dims.get(value.name, ())
        if value.name not in weights:
            for k in range(1, len(dims) + 1):
                if all(dims[:k]):
                    found.sources.setdefault(dims[:k], (value.name, k))
    for node in nodes:
        if node.op_type != "MatMul" or node.domain not in ("", "ai.onnx") or node.output[0] in outer:
            continue
        x, w = node.input
        after = readers.get(node.output[0], [])
        if len(found.weights.get(w, ())) != 2 or found.weights[w][0] > GEMM_EXACT_DEPTH or len(names.dims.get(x, ())) < 3 \
                or len(after) != 1:
            continue
        add = after[0]
        bias = next((b for b in add.input if b != node.output[0]), None)
        if add.op_type == "Add" and not add.domain and len(add.input) == 2 and node.output[0] in add.input \
                and bias is not None and found.weights.get(bias) == (found.weights[w][1],):
            found.pairs[id(node)] = (add, bias)
    return found


def _matmul_bias(node, add, bias, biased: _Biased, names):
    """`Add(MatMul(x, W), b)` as one Gemm on x's rows: Reshape to (rows, d), Gemm, Reshape back.
    The shape to go back to is made once for all products whose inputs the graph says share
    their leading dimensions (the same names or sizes: a transformer's (batch, seq))."""
    x, w = node.input
    d, e = biased.weights[w]
    out = add.output[0]
    rows, product = names.value(f"{x}/rows", out), names.value(f"{out}/rows", out)
    flat = names.fresh(f"{out}/flat")
    steps = [helper.make_node("Constant", [], [flat], name=names.fresh(f"{node.name}/flat"),
                              value=numpy_helper.from_array(np.array([-1, d], np.int64))),
             helper.make_node("Reshape", [x, flat], [rows], name=names.fresh(f"{node.name}/rows")),
             helper.make_node("Gemm", [rows, w, bias], [product], name=names.fresh(f"{node.name}/gemm"))]
    lead = names.dims[x][:-1]
    key = (lead, e) if all(lead) else None  # a dimension the graph does not name or size is nobody's twin
    shape = biased.shapes.get(key) if key is not None else None
    if shape is None:
        # read the leading dimensions off a graph input that has them (a transformer's input ids),
        # which every part of a cut graph can read (graphaudit.replay.prefix), else off x itself
        source, end = biased.sources.get(lead, (x, -1)) if key is not None else (x, -1)
        lead_value, width, shape = (names.fresh(f"{out}/{part}") for part in ("lead", "width", "shape"))
        steps += [helper.make_node("Shape", [source], [lead_value], name=names.fresh(f"{node.name}/lead"), end=end),
                  helper.make_node("Constant", [], [width], name=names.fresh(f"{node.name}/width"),
                                   value=numpy_helper.from_array(np.array([e], np.int64))),
                  helper.make_node("Concat", [lead_value, width], [shape], name=names.fresh(f"{node.name}/shape"),
                                   axis=0)]
        if key is not None:
            biased.shapes[key] = shape
    return [*steps, helper.make_node("Reshape", [product, shape], [out], name=names.fresh(f"{add.name}/reshape"))]


def _fill(value: np.ndarray) -> bool:
    """Whether `value` is a masked fill whose sum with any score of a sane size is itself: an
    infinity, or float32's or float64's lowest value (Hugging Face's `torch.finfo(dtype).min`).
    s + finfo.min rounds to finfo.min for |s| < 2^103 in float32; not in float16, whose lowest,
    -65504, moves with a score of 16 (a fully masked row would then be weighted unevenly)."""
    if value.dtype.kind != "f":
        return False
    if np.isinf(value).all():
        return True
    return value.dtype in (np.float32, np.float64) and bool((value == np.finfo(value.dtype).min).all())


def _einsum(node, names):
    """A two-operand Einsum `batch… l k, batch… k r -> (batch…, l, r in any order)` with one
    free index per side and one summed, as Transpose, MatMul, Transpose; None otherwise."""
    equation = next((a.s.decode() for a in node.attribute if a.name == "equation"), "").replace(" ", "")
    if len(node.input) != 2 or "->" not in equation or "." in equation:
        return None
    if names.types.get(node.input[0]) not in _MATMUL_TYPES:  # Einsum takes integers MatMul has no kernel for
        return None
    operands, out = equation.split("->")
    parts = operands.split(",")
    if len(parts) != 2:
        return None
    left, right = parts
    letters = (left, right, out)
    if not all(s.isalpha() and len(set(s)) == len(s) for s in letters):
        return None
    batch = [c for c in out if c in left and c in right]
    free_left = [c for c in left if c in out and c not in right]
    free_right = [c for c in right if c in out and c not in left]
    summed = [c for c in left if c in right and c not in out]
    alone = (set(left) | set(right)) - set(out) - set(summed)
    if len(free_left) != 1 or len(free_right) != 1 or len(summed) != 1 or alone or set(out) - set(left + right):
        return None
    product = [*batch, free_left[0], free_right[0]]
    steps: list[onnx.NodeProto] = []
    inputs: list[str] = []
    for operand, name, order in ((left, node.input[0], [*batch, free_left[0], summed[0]]),
                                 (right, node.input[1], [*batch, summed[0], free_right[0]])):
        inputs.append(_transposed(name, operand, order, node, names, steps))
    result = node.output[0] if product == list(out) else names.value(f"{node.output[0]}/product", node.output[0])
    steps.append(helper.make_node("MatMul", inputs, [result], name=names.fresh(f"{node.name}/matmul")))
    if result != node.output[0]:
        steps.append(helper.make_node("Transpose", [result], [node.output[0]], name=names.fresh(f"{node.name}/out"),
                                      perm=[product.index(c) for c in out]))
    return steps


def _transposed(name: str, axes: str, order: list[str], node, names, steps) -> str:
    if list(axes) == order:
        return name
    moved = names.value(f"{name}/{''.join(order)}", name)
    steps.append(helper.make_node("Transpose", [name], [moved], name=names.fresh(f"{node.name}/{''.join(order)}"),
                                  perm=[axes.index(c) for c in order]))
    return moved
