"""Multi-head attention written out in primitive operators, as ONNX's own `Attention` (opset 23).

Exporters write a multi-head attention as: each of q, k and v (batch, seq, heads·d) reshaped
to (batch, seq, heads, d) and transposed to put the heads first (k also its last two axes),
`MatMul(q, kᵀ)`, a scale (`Div` or `Mul` by a constant), an additive mask (`Add`: the masked
fill rewritten by graphaudit.replay.rewrite, or a padding bias), `Softmax` over the last axis,
`MatMul` by v, and the heads transposed and reshaped back to (batch, seq, heads·d). ONNX
Runtime runs the twelve or so nodes one by one, the four transposes as copies; its kernel for
`Attention` runs the same products, scale, mask and softmax on the heads where they lie. On a
(16, 64, 64) batch of 4 heads one layer took 0.37 against 0.55 ms and gave the same bits
(benchmarks/NOTES.md, replay: the rewrites).

`Attention` needs the default domain at opset 23, and an ONNX Runtime with its CPU kernel
(`runtime_has_attention`; without one the attentions are left as they are). Between opsets 20 and 23 the standard
operators only gained element types, so a model at opset 20 to 22 is declared at 23 as it is;
one older than 20 is left alone (opset 20 changed `DFT` and `GridSample`, 18 the reductions).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field

import numpy as np
import onnx
import onnxruntime as ort
from onnx import helper

from graphaudit.load.protos import body_reads, readers_of, scalar_constants, value_dims, with_nodes
from graphaudit.replay.fresh_names import FreshNames
from graphaudit.replay.passes import PassResult
from graphaudit.replay.surgery import remove_dead

ATTENTION_OPSET = 23
_OLDEST_OPSET = 20  # from here to 23 the standard operators changed only in the types they take
_HEADS_FIRST = [0, 2, 1, 3]


@dataclass(frozen=True)
class _Match:
    """One attention's nodes (to drop) and what `Attention` reads and makes instead."""

    nodes: tuple[int, ...]  # id()s of the nodes from the heads' transposes to the reshape back
    last: int  # id() of the reshape back: the Attention takes its place
    q: str
    k: str
    v: str
    mask: str | None
    scale: float
    heads: int
    kv_heads: int
    output: str


@dataclass(frozen=True)
class RewriteAttention:
    """The pass that rewrites each multi-head attention a model spells out as one `Attention`
    node. `names`: the fresh names to draw from, when an earlier rewrite of the same model
    (graphaudit.replay.rewrite's `Rewrite`) has drawn some; else the model's own."""

    names: FreshNames | None = field(default=None, compare=False)

    def __call__(self, model: onnx.ModelProto, *, owned: bool = False) -> PassResult[int]:
        """Return `model` with its attentions rewritten and how many (`model` itself when none)."""
        out, made = _rewritten(model, FreshNames(model) if self.names is None else self.names, owned)
        return PassResult(out, bool(made), made)


def _rewritten(model: onnx.ModelProto, names: FreshNames, owned: bool) -> tuple[onnx.ModelProto, int]:
    """`model` with its attentions rewritten (itself, changed, when `owned`; itself when there is
    none), and how many; the heads' shape arithmetic nothing reads any more removed."""
    imports = [o for o in (*model.opset_import, *(o for f in model.functions for o in f.opset_import))
               if o.domain in ("", "ai.onnx")]
    if not imports or not all(_OLDEST_OPSET <= o.version <= ATTENTION_OPSET for o in imports) \
            or not runtime_has_attention():
        return model, 0
    graph = model.graph
    nodes = list(graph.node)  # held, so that each node's id() stays its own
    matches = _matches(graph, nodes)
    if not matches:
        return model, 0
    dropped = {i for m in matches for i in m.nodes}
    at = {m.last: m for m in matches}
    kept = []
    for node in nodes:
        if id(node) in at:
            m = at[id(node)]
            inputs = [m.q, m.k, m.v] + ([m.mask] if m.mask else [])
            kept.append(helper.make_node("Attention", inputs, [m.output], name=names.fresh(f"{node.name}/attention"),
                                         q_num_heads=m.heads, kv_num_heads=m.kv_heads, scale=m.scale))
        elif id(node) not in dropped:
            kept.append(node)
    out = with_nodes(model, kept, owned)
    remove_dead(out.graph)  # the heads' shape arithmetic nothing reads any more
    for entry in (*out.opset_import, *(o for f in out.functions for o in f.opset_import)):
        if entry.domain in ("", "ai.onnx"):  # the model's functions too: the checker wants them alike
            entry.version = ATTENTION_OPSET
    out.ir_version = max(out.ir_version, 11)  # the IR of opset 23
    return out, len(matches)


@functools.cache
def runtime_has_attention() -> bool:
    """Whether this ONNX Runtime runs `Attention` (opset 23) on the CPU as the rewrite uses it:
    3-D q, k, v of 2 heads and an additive 2-D mask (ONNX Runtime before 1.23 has no kernel)."""
    t = onnx.TensorProto
    values = [helper.make_tensor_value_info(x, t.FLOAT, [1, 2, 4]) for x in "qkv"]
    values.append(helper.make_tensor_value_info("mask", t.FLOAT, [2, 2]))
    node = helper.make_node("Attention", ["q", "k", "v", "mask"], ["y"], q_num_heads=2, kv_num_heads=2, scale=0.5)
    model = helper.make_model(helper.make_graph([node], "probe", values, [helper.make_tensor_value_info(
        "y", t.FLOAT, [1, 2, 4])]), opset_imports=[helper.make_opsetid("", ATTENTION_OPSET)], ir_version=11)
    feeds = {x: np.ones((1, 2, 4), np.float32) for x in "qkv"} | {"mask": np.zeros((2, 2), np.float32)}
    try:
        session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
        return bool(np.allclose(session.run(None, feeds)[0], 1.0))
    except Exception:  # noqa: BLE001 - no kernel, an unknown opset: either way not this runtime
        return False


def _matches(graph: onnx.GraphProto, nodes: list[onnx.NodeProto]) -> list[_Match]:
    made = {o: n for n in nodes for o in n.output if o}
    readers = readers_of(nodes)
    outer = {o.name for o in graph.output} | body_reads(graph)
    dims = value_dims(graph)
    types = {v.name: v.type.tensor_type.elem_type for v in (*graph.input, *graph.value_info, *graph.output)}
    constants = scalar_constants(graph)

    def only(value: str, op: str) -> onnx.NodeProto | None:
        """The node that makes `value`, if it is a standard `op` and `value` has no other reader."""
        node = made.get(value)
        if node is None or node.op_type != op or node.domain not in ("", "ai.onnx") or value in outer \
                or len(readers.get(value, ())) != 1:
            return None
        return node

    found = []
    for softmax in nodes:
        if softmax.op_type != "Softmax" or softmax.domain not in ("", "ai.onnx"):
            continue
        match = _match(softmax, only, readers, outer, dims, types, constants)
        if match is not None:
            found.append(match)
    return found


def _match(softmax, only, readers, outer, dims, types, constants) -> _Match | None:
    scores = softmax.input[0]
    if _axis(softmax) not in (-1, 3) or len(dims.get(scores, ())) != 4 or types.get(scores) != onnx.TensorProto.FLOAT:
        return None
    chain = [softmax]
    mask, scaled = None, scores
    add = only(scores, "Add")
    if add is not None:
        product = next((i for i in add.input if _is_scaled_product(i, only)), None)
        if product is None:
            return None
        mask = next(i for i in add.input if i != product)
        if len(dims.get(mask, (None,) * 5)) not in (2, 4):  # the mask shapes Attention takes here
            return None
        chain.append(add)
        scaled = product
    found = _scale(scaled, only, constants, chain)
    if found is None:
        return None
    scale, qk = found
    q4 = _heads(qk.input[0], [_HEADS_FIRST], only, chain)
    k4 = _heads(qk.input[1], [[0, 2, 3, 1]], only, chain) or _two_transposes(qk.input[1], only, chain)
    after = readers.get(softmax.output[0], [])
    if q4 is None or k4 is None or len(after) != 1 or after[0].op_type != "MatMul" or after[0].domain \
            or softmax.output[0] in outer or after[0].input[0] != softmax.output[0]:
        return None
    weighted = after[0]
    v4 = _heads(weighted.input[1], [_HEADS_FIRST], only, chain)
    back = readers.get(weighted.output[0], [])
    if v4 is None or len(back) != 1 or back[0].op_type != "Transpose" or _perm(back[0]) != _HEADS_FIRST \
            or weighted.output[0] in outer:
        return None
    merge = readers.get(back[0].output[0], [])
    if len(merge) != 1 or merge[0].op_type != "Reshape" or merge[0].domain or back[0].output[0] in outer:
        return None
    q_dims, k_dims, v_dims = (dims.get(n.output[0], ()) for n in (q4, k4, v4))
    out_dims = dims.get(merge[0].output[0], ())
    if not all(len(d) == 4 and isinstance(d[2], int) and isinstance(d[3], int) for d in (q_dims, k_dims, v_dims)):
        return None
    heads, kv_heads = q_dims[2], k_dims[2]
    if v_dims[2] != kv_heads or q_dims[3] != k_dims[3] or heads % kv_heads or len(out_dims) != 3 \
            or out_dims[2] != heads * v_dims[3] or q_dims[:2] != out_dims[:2]:
        return None
    q, k, v = (_source(n, d, dims) for n, d in ((q4, q_dims), (k4, k_dims), (v4, v_dims)))
    if q is None or k is None or v is None:
        return None
    chain += [weighted, back[0], merge[0]]
    return _Match(tuple(id(n) for n in chain), id(merge[0]), q, k, v, mask, scale, heads, kv_heads,
                  merge[0].output[0])


def _is_scaled_product(value: str, only) -> bool:
    node = only(value, "Div") or only(value, "Mul") or only(value, "MatMul")
    return node is not None


def _scale(value: str, only, constants, chain) -> tuple[float, onnx.NodeProto] | None:
    """The scale of the scores (1.0: none applied, MatMul straight) and the MatMul of q by kᵀ; None if no such."""
    for op in ("Div", "Mul"):
        node = only(value, op)
        if node is None:
            continue
        constant = next((i for i in node.input if i in constants), None)
        if constant is None or (op == "Div" and node.input[1] != constant):
            return None
        c = np.float32(constants[constant].reshape(-1)[0])  # one element, of any shape
        product = only(next(i for i in node.input if i != constant), "MatMul")
        if product is None or c == 0 or not np.isfinite(c):
            return None
        chain += [node, product]
        return float(np.float32(1) / c) if op == "Div" else float(c), product
    product = only(value, "MatMul")
    if product is not None:
        chain.append(product)
        return 1.0, product
    return None


def _heads(value: str, perms, only, chain) -> onnx.NodeProto | None:
    """The Reshape to (batch, seq, heads, d) whose transpose by one of `perms` is `value`."""
    transpose = only(value, "Transpose")
    if transpose is None or _perm(transpose) not in perms:
        return None
    reshape = only(transpose.input[0], "Reshape")
    if reshape is None:
        return None
    chain += [transpose, reshape]
    return reshape


def _two_transposes(value: str, only, chain) -> onnx.NodeProto | None:
    """kᵀ written as the heads' transpose then a swap of the last two axes."""
    swap = only(value, "Transpose")
    if swap is None or _perm(swap) != [0, 1, 3, 2]:
        return None
    reshape = _heads(swap.input[0], [_HEADS_FIRST], only, chain)
    if reshape is not None:
        chain.append(swap)
    return reshape


def _source(reshape: onnx.NodeProto, heads_dims: tuple, dims) -> str | None:
    """The (batch, seq, heads·d) value `reshape` splits into heads, checked by its dimensions."""
    value = reshape.input[0]
    d = dims.get(value, ())
    if len(d) != 3 or d[2] != heads_dims[2] * heads_dims[3] or d[:2] != heads_dims[:2] or None in d[:2]:
        return None
    return value


def _perm(node: onnx.NodeProto) -> list[int] | None:
    return next((list(a.ints) for a in node.attribute if a.name == "perm"), None)


def _axis(node: onnx.NodeProto) -> int:
    return next((a.i for a in node.attribute if a.name == "axis"), -1)
