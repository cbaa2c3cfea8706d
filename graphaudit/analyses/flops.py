"""Floating-point operations per node, for the operators that dominate transformers.

`node_flops(node, input_shapes, output_shapes)` counts one node at concrete shapes (a
multiply-add is two operations) and gives back None for an operator it does not count.
The static audit calls it with the shapes inferred for concrete input sizes; the runtime
profiler calls it with the shapes a node actually ran at.

Counted: MatMul and its quantised / fused forms, Gemm, Conv, ConvTranspose, Einsum, the
attention operators (ONNX `Attention`, ONNX Runtime's `Attention`, `MultiHeadAttention`,
`GroupQueryAttention`) and ONNX Runtime's `MoE` (top-k experts per token). Everything else
(element-wise, normalisation, data movement) is not counted and is listed as such.
"""

from __future__ import annotations

import ast
import math
import operator
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
from onnx import helper

from graphaudit.errors import UsageError
from graphaudit.graph.model import ModelGraph, TensorRef
from graphaudit.limits import check_shape

Shape = tuple[int, ...]


class _Unknown(Exception):
    """A shape the rule needs is missing."""


def _need(shapes: Sequence[Shape | None], i: int) -> Shape:
    shape = shapes[i] if i < len(shapes) else None
    if shape is None:
        raise _Unknown
    return tuple(shape)


def _attr(proto, name: str, default=None):
    for a in proto.attribute:
        if a.name == name:
            if a.type == a.INT:
                return a.i
            if a.type == a.STRING:
                return a.s.decode()
            if a.type == a.FLOAT:
                return a.f
    return default


def _matmul(a_index: int = 0, b_index: int = 1):
    def rule(proto, ins, outs):
        a = _need(ins, a_index)
        try:  # from both operands, with numpy's broadcasting of the batch dimensions
            b = _need(ins, b_index)
            a2 = a if len(a) >= 2 else (1,) + a
            b2 = b if len(b) >= 2 else b + (1,)
            batch_a, batch_b = a2[:-2], b2[:-2]
            width = max(len(batch_a), len(batch_b))
            batch_a = (1,) * (width - len(batch_a)) + batch_a
            batch_b = (1,) * (width - len(batch_b)) + batch_b
            batch = math.prod(max(x, y) for x, y in zip(batch_a, batch_b))
            return 2 * batch * a2[-2] * a2[-1] * b2[-1]
        except _Unknown:
            return 2 * math.prod(_need(outs, 0)) * (a[-1] if a else 1)
    return rule


def _matmul_nbits(proto, ins, outs):
    return 2 * math.prod(_need(outs, 0)) * int(_attr(proto, "K") or _need(ins, 0)[-1])


def _fused_matmul(proto, ins, outs):
    a = _need(ins, 0)
    k = a[-2] if _attr(proto, "transA", 0) and len(a) >= 2 else a[-1]
    return 2 * math.prod(_need(outs, 0)) * k


def _gemm(proto, ins, outs):
    a = _need(ins, 0)
    k = a[0] if _attr(proto, "transA", 0) else a[-1]
    return 2 * math.prod(_need(outs, 0)) * k


def _conv(w_index: int = 1):
    def rule(proto, ins, outs):
        return 2 * math.prod(_need(outs, 0)) * math.prod(_need(ins, w_index)[1:])
    return rule


def _conv_transpose(proto, ins, outs):
    return 2 * math.prod(_need(ins, 0)) * math.prod(_need(ins, 1)[1:])


def _einsum(proto, ins, outs):
    equation = (_attr(proto, "equation") or "").replace(" ", "")
    lhs = equation.split("->")[0].split(",")
    sizes: dict[str, int] = {}
    for i, term in enumerate(lhs):
        shape = _need(ins, i)
        letters = _einsum_letters(term, len(shape))
        if len(letters) != len(shape):
            raise _Unknown
        for letter, size in zip(letters, shape):
            sizes[letter] = max(sizes.get(letter, 1), size)
    return (2 if len(lhs) > 1 else 1) * math.prod(sizes.values())


def _einsum_letters(term: str, rank: int) -> list[str]:
    """The label of each axis of an operand of rank `rank` written as `term`.

    The axes `...` stands for are labelled by their place from the right, as broadcasting
    aligns them: in `...ij` of rank 4 and `...jk` of rank 3 the axes just before `i` and
    `j` are the same one.
    """
    if "..." not in term:
        return list(term)
    head, tail = term.split("...")
    middle = rank - len(head) - len(tail)
    return list(head) + [f"...{middle - j}" for j in range(middle)] + list(tail)


def _key_length(ins, outs, past_index: int, current: int) -> int:
    """The key positions each query attends to, a KV cache's included.

    A decode step with a cache attends to every cached position, not only the new ones:
    the present key cache (output 1) holds them all, with its sequence axis second from the
    right; without its shape, the past cache (input `past_index`) plus the `current` ones.
    """
    present = outs[1] if len(outs) > 1 else None
    if present is not None and len(present) >= 2:
        return present[-2]
    past = ins[past_index] if len(ins) > past_index else None
    return current + (past[-2] if past is not None else 0)


def _onnx_attention(proto, ins, outs):
    q, k, v = _need(ins, 0), _need(ins, 1), _need(ins, 2)
    if len(q) == 4:  # (batch, heads, seq, head_dim)
        b, h, s, d = q
        length = _key_length(ins, outs, 4, k[-2])
        return 2 * b * h * s * length * d + 2 * b * h * s * length * v[-1]
    b, s, hidden = q
    length = _key_length(ins, outs, 4, k[1])
    return 2 * b * s * length * hidden + 2 * b * s * length * v[-1]


def _ort_attention(proto, ins, outs):
    x, w = _need(ins, 0), _need(ins, 1)
    b, s, hidden_in = x
    hidden = w[-1] // 3
    length = _key_length(ins, outs, 4, s)
    return 2 * b * s * hidden_in * w[-1] + 4 * b * s * length * hidden


def _mha(proto, ins, outs):
    q = _need(ins, 0)
    b, s = q[0], q[1]
    key = ins[1] if len(ins) > 1 and ins[1] is not None else None
    # key (batch, positions, hidden), packed with the value (batch, positions, heads, 2, head
    # size), or (batch, heads, positions, head size); none with a packed query
    length = key[1] if key is not None and len(key) in (3, 5) else (key[2] if key is not None and len(key) == 4 else s)
    d = math.prod(_need(outs, 0)[2:])
    return 4 * b * s * _key_length(ins, outs, 6, length) * d


def _gqa(proto, ins, outs):
    out = _need(outs, 0)
    b, s, d = out
    return 4 * b * s * _key_length(ins, outs, 3, s) * d


def _moe(proto, ins, outs):
    x = _need(ins, 0)
    tokens = math.prod(x[:-1])
    k = int(_attr(proto, "k", 1) or 1)
    per_expert = sum(math.prod(_need(ins, i)[1:]) for i in (2, 4)) + (
        math.prod(ins[6][1:]) if len(ins) > 6 and ins[6] is not None else 0)
    return 2 * tokens * k * per_expert


RULES: dict[tuple[str, str], Callable] = {
    ("", "MatMul"): _matmul(),
    ("", "MatMulInteger"): _matmul(),
    ("", "QLinearMatMul"): _matmul(0, 3),
    ("", "Gemm"): _gemm,
    ("", "Conv"): _conv(),
    ("", "ConvInteger"): _conv(),
    ("", "QLinearConv"): _conv(3),
    ("", "ConvTranspose"): _conv_transpose,
    ("", "Einsum"): _einsum,
    ("", "Attention"): _onnx_attention,
    ("com.microsoft", "FusedMatMul"): _fused_matmul,
    ("com.microsoft", "MatMulNBits"): _matmul_nbits,
    ("com.microsoft", "MatMulIntegerToFloat"): _matmul(),
    ("com.microsoft", "DynamicQuantizeMatMul"): _matmul(),
    ("com.microsoft", "FusedConv"): _conv(),
    ("com.microsoft", "QGemm"): _gemm,  # (A, A's scale and zero point, B, ...): A and the output suffice
    ("com.microsoft", "Attention"): _ort_attention,
    ("com.microsoft", "MultiHeadAttention"): _mha,
    ("com.microsoft", "GroupQueryAttention"): _gqa,
    ("com.microsoft", "MoE"): _moe,
}


def _rule(node):
    proto = getattr(node, "proto", node)
    domain = "" if proto.domain in ("", "ai.onnx") else proto.domain
    return proto, RULES.get((domain, proto.op_type))


def is_counted(node) -> bool:
    """Whether node_flops has a formula for this node's operator."""
    # A Node and a NodeProto both carry op_type and domain; a Node's are plain attributes,
    # far cheaper to read than its proto's.
    domain = node.domain
    return (("" if domain in ("", "ai.onnx") else domain), node.op_type) in RULES


def node_flops(node, input_shapes: Sequence[Shape | None], output_shapes: Sequence[Shape | None]) -> int | None:
    """Return the FLOPs of `node` (a Node or NodeProto) at these shapes, or None when its
    operator is not counted or a shape the count needs is missing."""
    proto, rule = _rule(node)
    if rule is None:
        return None
    try:
        return int(rule(proto, list(input_shapes), list(output_shapes)))
    except (_Unknown, ValueError, TypeError, IndexError, ZeroDivisionError):
        return None


@dataclass(frozen=True)
class FlopCount:
    """FLOPs per node at concrete input shapes, with what could not be counted."""

    per_node: Mapping[str, int] = field(repr=False)
    total: int
    uncounted: tuple[tuple[str, int], ...]  # (operator, nodes) with no formula
    unknown_shape: tuple[str, ...]  # counted operators whose shapes stayed unknown (node ids)
    dims: tuple[tuple[str, int], ...]  # the symbolic dimensions bound by the input shapes

    def to_json(self) -> dict:
        return {
            "total": self.total,
            "uncounted_ops": dict(self.uncounted),
            "unknown_shape_nodes": list(self.unknown_shape),
            "dims": dict(self.dims),
        }


def count_flops(mg: ModelGraph, shapes: Mapping[str, Sequence[int]],
                known: Mapping[str, Shape] | None = None, *, prefer_known: bool = False) -> FlopCount:
    """Return the FlopCount of every node of `mg` with the graph inputs at `shapes`.

    `known`: concrete shapes of main-graph values by name (`load.inference.infer_at`), for the values
    whose inferred shapes stay unknown once the input dimensions are bound; with
    `prefer_known`, for every value they name (shapes inferred on a variant of the graph,
    `analyses.concrete_shapes`, stand over the graph's own)."""
    dims = bind_dims(mg, shapes)
    resolve = resolver(mg, dims, known, prefer_known=prefer_known)
    per_node: dict[str, int] = {}
    uncounted: dict[str, int] = {}
    unknown: list[str] = []
    bodies = mg.body_table
    for node in mg.nodes.values():
        if not is_counted(node):
            if node.id in bodies and bodies[node.id][0].kind == "function":
                continue  # a call of a local function: its body's nodes are counted
            op = node.op_type if not node.domain else f"{node.domain}.{node.op_type}"
            uncounted[op] = uncounted.get(op, 0) + 1
            continue
        ins = [resolve(r) if r is not None else None for r in node.inputs]
        outs = [resolve(r) if r is not None else None for r in node.outputs]
        flops = node_flops(node, ins, outs)
        if flops is None:
            unknown.append(node.id)
        else:
            per_node[node.id] = flops
    return FlopCount(
        per_node=per_node,
        total=sum(per_node.values()),
        uncounted=tuple(sorted(uncounted.items(), key=lambda kv: (-kv[1], kv[0]))),
        unknown_shape=tuple(unknown),
        dims=tuple(sorted(dims.items())),
    )


def resolver(mg: ModelGraph, dims: Mapping[str, int], known: Mapping[str, Shape] | None = None, *,
             prefer_known: bool = False) -> Callable[[TensorRef], Shape | None]:
    """The concrete shape of a value of `mg` (None when unknown) with the symbolic dimensions
    bound to `dims`, `known` filling in main-graph values (standing over them with
    `prefer_known`)."""
    bound = ShapeResolver(dims)
    known = known or {}

    def resolve(ref: TensorRef) -> Shape | None:
        key = str(ref)  # the name in the main graph, `<scope>::<name>` in a body (`load.inference.infer_at`)
        if prefer_known and key in known:
            return known[key]
        shape = bound(mg.tensors[ref].shape) if ref in mg.tensors else None
        return known.get(key) if shape is None else shape
    return resolve


def bind_dims(mg: ModelGraph, shapes: Mapping[str, Sequence[int]]) -> dict[str, int]:
    """Bind the graph inputs' symbolic dimensions to the sizes in `shapes` (checked)."""
    inputs = {r.name: mg.tensors[r].shape if r in mg.tensors else None for r in mg.inputs}
    dims: dict[str, int] = {}
    # a symbol written on axes the sizes give apart: ONNX Runtime does not hold them equal, so it
    # stands for no one size, and what is computed from it is not counted
    apart: set[str] = set()
    for name, given in shapes.items():
        if name not in inputs:
            raise UsageError(
                f"expected --shape to name a graph input ({', '.join(inputs) or 'none'}), found {name!r}"
            )
        declared = inputs[name]
        given = check_shape(given, f"--shape {name}", itemsize=_itemsize(mg, name), exit_code=2)
        if declared is None:
            continue
        if len(declared) != len(given):
            raise UsageError(
                f"expected {len(declared)} dimensions for input {name!r} "
                f"({_show(declared)}), found {len(given)} ({_show(given)})"
            )
        for axis, (want, size) in enumerate(zip(declared, given)):
            if isinstance(want, int) and want >= 0 and want != size:  # a negative size is free
                raise UsageError(f"expected dimension {axis} of input {name!r} to be {want}, found {size}")
            if isinstance(want, str):
                if dims.get(want, size) != size:
                    apart.add(want)
                dims[want] = size
    return {d: size for d, size in dims.items() if d not in apart}


def _itemsize(mg: ModelGraph, name: str) -> int:
    """Bytes per element of the graph input `name` (1 where its type has no fixed size)."""
    info = next((mg.tensors[r] for r in mg.inputs if r.name == name and r in mg.tensors), None)
    try:
        return np.dtype(helper.tensor_dtype_to_np_dtype(info.elem_type)).itemsize if info and info.elem_type else 1
    except (KeyError, TypeError, ValueError):
        return 1


def _show(shape) -> str:
    return "[" + ", ".join("?" if d is None else str(d) for d in shape) + "]"


_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
        ast.FloorDiv: operator.floordiv, ast.Div: operator.floordiv, ast.Mod: operator.mod}


class ShapeResolver:
    """Concrete shapes from inferred ones: symbolic names and expressions (`seq*batch`)."""

    def __init__(self, dims: Mapping[str, int]):
        self.dims = dict(dims)
        self.cache: dict[str, int | None] = {}

    def __call__(self, shape) -> Shape | None:
        if shape is None:
            return None
        out = []
        for d in shape:
            value = d if isinstance(d, int) else self.dim(d) if isinstance(d, str) else None
            if value is None:
                return None
            out.append(value)
        return tuple(out)

    def dim(self, text: str) -> int | None:
        if text not in self.cache:
            try:
                self.cache[text] = self._eval(ast.parse(text, mode="eval").body)
            except (SyntaxError, KeyError, ZeroDivisionError, ValueError, TypeError):
                self.cache[text] = None
        return self.cache[text]

    def _eval(self, node) -> int:
        if isinstance(node, ast.Constant) and isinstance(node.value, int):
            return node.value
        if isinstance(node, ast.Name):
            return self.dims[node.id]
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](self._eval(node.left), self._eval(node.right))
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            return -self._eval(node.operand)
        raise ValueError(ast.dump(node))
