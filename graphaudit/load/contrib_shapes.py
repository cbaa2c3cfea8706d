"""Shapes through ONNX Runtime's fused operators, for ONNX's shape inference.

ONNX's shape inference knows no `com.microsoft` operator (nor the ones ONNX Runtime adds to
the default domain, such as `SimplifiedLayerNormalization`): past the first of them, a model
that ONNX Runtime's transformer optimizer fused (SkipLayerNormalization, FastGelu,
Attention, FusedMatMul, ...) has no shapes left, and so no FLOPs. `with_shape_functions`
gives inference a copy in which each such node whose output shapes follow from its inputs
calls a model-local function of its own, written in standard operators that give the same
output shapes (a FastGelu's output is shaped as its input; an Attention's as the input's
rows by the value width). Inference then runs through them in one pass; only the shapes it
finds are kept (`load.inference.with_inferred_shapes`), never the copy.

A node with an output whose shape cannot be written that way (an unknown weight width, a
present cache) is left as it is: its outputs stay unknown, as before; a dimension that
depends on the data (a KV cache's length, past and new positions or a shared buffer's) is
made unknown on purpose, so that a graph output's declared size stands.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import onnx
from onnx import helper

from graphaudit.load.protos import NodeFields

DOMAIN = "graphaudit.shapes"  # the functions' domain, in the copy only
MS = "com.microsoft"
_SKIP_NORMS = ("SkipLayerNormalization", "SkipSimplifiedLayerNormalization")


def with_shape_functions(model: onnx.ModelProto, *, copy: bool) -> onnx.ModelProto:
    """`model` (or, with `copy`, a copy of it) whose fused ONNX Runtime nodes of the main graph
    call shape functions; `model` itself when it has none."""
    if not may_need_shape_functions(model):
        return model
    dims = _known_dims(model.graph)
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 17)
    plans = []
    for index, node in enumerate(model.graph.node):
        rule = _RULES.get((node.domain or "", node.op_type))
        if rule is None or any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for a in node.attribute):
            continue  # (a node holding a body keeps it: the bodies are matched by their order)
        try:
            body = rule(node, dims)
        except (IndexError, KeyError, TypeError, ValueError):  # a node not as ONNX Runtime defines it
            body = None  # (too few inputs, an attribute of another type): left unknown, as ORT would refuse it
        if body is not None:
            plans.append((index, body))
    if not plans:
        return model
    if copy:
        duplicate = onnx.ModelProto()
        duplicate.CopyFrom(model)
        model = duplicate
    for k, (index, body) in enumerate(plans):
        node = model.graph.node[index]
        name = f"{node.op_type}_{k}"
        inputs = [f"i{j}" for j in range(len(node.input))]
        outputs = [f"o{j}" for j in range(len(node.output))]
        model.functions.append(helper.make_function(DOMAIN, name, inputs, outputs, body,
                                                    [helper.make_opsetid("", opset)]))
        node.domain, node.op_type = DOMAIN, name
        del node.attribute[:]
    model.opset_import.append(helper.make_opsetid(DOMAIN, 1))
    return model


def may_need_shape_functions(model: onnx.ModelProto, fields: Sequence[NodeFields] | None = None) -> bool:
    """Whether the main graph may hold a fused ONNX Runtime node (`with_shape_functions` gives
    those it can shape a function of their own): it imports ONNX Runtime's domain, or holds one
    of the operators ONNX Runtime adds to the default domain. `fields`: the main graph's nodes'
    fields, as `protos.walk_graphs` reads them, where the caller has them."""
    if any(o.domain in (MS, "com.ms.internal.nhwc") for o in model.opset_import):
        return True
    if fields is None:
        return any(n.op_type in _DEFAULT_DOMAIN_EXTRAS and not n.domain for n in model.graph.node)
    return any(op in _DEFAULT_DOMAIN_EXTRAS and not domain for _, op, domain in fields)


def _known_dims(graph: onnx.GraphProto) -> dict[str, tuple[int | None, ...]]:
    """The dimensions of the weights and graph inputs, by name (None where not a number)."""
    dims: dict[str, tuple[int | None, ...]] = {t.name: tuple(t.dims) for t in graph.initializer}
    for value in graph.input:
        if value.type.HasField("tensor_type") and value.type.tensor_type.HasField("shape"):
            dims[value.name] = tuple(d.dim_value if d.HasField("dim_value") else None
                                     for d in value.type.tensor_type.shape.dim)
    return dims


def _attr(node: onnx.NodeProto, name: str, default=None):
    for a in node.attribute:
        if a.name == name:
            return helper.get_attribute_value(a)
    return default


def _present(node: onnx.NodeProto, k: int) -> bool:
    return k < len(node.input) and bool(node.input[k])


def _outputs(node: onnx.NodeProto) -> list[int]:
    return [j for j, name in enumerate(node.output) if name]


def _const(name: str, values: Sequence[int]) -> onnx.NodeProto:
    return helper.make_node("Constant", [], [name], value=helper.make_tensor(name, onnx.TensorProto.INT64,
                                                                               [len(values)], list(values)))


def _like_first(node: onnx.NodeProto, dims) -> list[onnx.NodeProto] | None:
    """Output 0 shaped as input 0 (an activation, a rotary embedding, a normalisation)."""
    if _outputs(node) != [0]:
        return None
    return [helper.make_node("Identity", ["i0"], ["o0"])]


def _bias_add(node, dims):
    """BiasGelu(A, B) / BiasAdd(X, bias, skip): shaped as the broadcast of the inputs."""
    if _outputs(node) != [0]:
        return None
    other = "i2" if node.op_type == "BiasAdd" and _present(node, 2) else "i1"
    return [helper.make_node("Add", ["i0", other], ["o0"])]


def _skip_norm(node, dims):
    """SkipLayerNormalization: output and input_skip_bias_sum shaped as input + skip; mean and
    inverse standard deviation with the last axis kept as 1."""
    body = [helper.make_node("Add", ["i0", "i1"], ["sum"])]
    for j in _outputs(node):
        if j in (0, 3):
            body.append(helper.make_node("Identity", ["sum"], [f"o{j}"]))
        else:
            body += [_const(f"last{j}", [-1]), helper.make_node("ReduceMean", ["sum", f"last{j}"], [f"o{j}"])]
    return body


def _fused_matmul(node, dims):
    if _outputs(node) != [0] or _attr(node, "transBatchA", 0) or _attr(node, "transBatchB", 0):
        return None
    a = "...ji" if _attr(node, "transA", 0) else "...ij"
    rank_b = len(dims[node.input[1]]) if node.input[1] in dims else None
    b_term = "kj" if _attr(node, "transB", 0) else "jk"
    if rank_b == 2:
        b = b_term
    elif rank_b is None or rank_b > 2:
        b = f"...{b_term}"
    else:
        return None
    return [helper.make_node("Einsum", ["i0", "i1"], ["o0"], equation=f"{a},{b}->...ik")]


def _gemm_fast_gelu(node, dims):
    if _outputs(node) != [0]:
        return None
    return [helper.make_node("MatMul", ["i0", "i1"], ["o0"])]


def _quantized_matmul(node, dims):
    """DynamicQuantizeMatMul(A, B, ...) / MatMulIntegerToFloat(A, B, a_scale, ...): A times B, in
    A's float type (in the scale's, for integer A)."""
    if _outputs(node) != [0]:
        return None
    like = "i0" if node.op_type == "DynamicQuantizeMatMul" else "i2"
    return [helper.make_node("CastLike", ["i0", like], ["a"]), helper.make_node("CastLike", ["i1", like], ["b"]),
            helper.make_node("MatMul", ["a", "b"], ["o0"])]


def _with_attributes(op: str, kept: Sequence[str]) -> Callable:
    """A fused Conv / Gemm: the standard operator with the node's own attributes of `kept`."""
    def rule(node, dims):
        if _outputs(node) != [0]:
            return None
        attributes = {a.name: helper.get_attribute_value(a) for a in node.attribute if a.name in kept}
        inputs = [f"i{j}" for j in range(len(node.input)) if _present(node, j)][:3]
        if inputs != [f"i{j}" for j in range(len(inputs))]:
            return None
        return [helper.make_node(op, inputs, ["o0"], **attributes)]
    return rule


def _quantized_binary(op: str, second: int) -> Callable:
    """QLinearAdd / QLinearMul (A, A's scale and zero point, B, ...) and QLinearWhere
    (condition, X, ..., Y, ...): the standard operator on the quantized operands, which gives
    their broadcast shape in A's (X's) integer type."""
    def rule(node, dims):
        if _outputs(node) != [0] or not _present(node, second):
            return None
        inputs = (["i0"] if op == "Where" else []) + [f"i{1 if op == 'Where' else 0}", f"i{second}"]
        return [helper.make_node(op, inputs, ["o0"])]
    return rule


def _quantized_concat(node, dims):
    """QLinearConcat(Y's scale, Y's zero point, then each input with its scale and zero point)."""
    if _outputs(node) != [0] or (len(node.input) - 2) % 3 or len(node.input) < 5:
        return None
    return [helper.make_node("Concat", [f"i{j}" for j in range(2, len(node.input), 3)], ["o0"],
                             axis=_attr(node, "axis", 0))]


def _quantized_pool(op: str, kept: Sequence[str]) -> Callable:
    """QLinearGlobalAveragePool / QLinearAveragePool on a channels-first X: the float pool's shape."""
    def rule(node, dims):
        if _outputs(node) != [0] or _attr(node, "channels_last", 0):
            return None
        attributes = {a.name: helper.get_attribute_value(a) for a in node.attribute if a.name in kept}
        return [helper.make_node(op, ["i0"], ["o0"], **attributes)]
    return rule


def _quantized_gemm(node, dims):
    """QGemm(A, ..., B, ..., C, ...) with transA / transB: A times B."""
    if _outputs(node) != [0] or not _present(node, 3):
        return None
    return [helper.make_node("CastLike", ["i3", "i0"], ["b"]),
            helper.make_node("Gemm", ["i0", "b"], ["o0"], transA=_attr(node, "transA", 0),
                             transB=_attr(node, "transB", 0))]


def _matmul_nbits(node, dims):
    """MatMulNBits(A, packed B, scales, ...) with attributes K and N: A's rows by N."""
    k, n = _attr(node, "K"), _attr(node, "N")
    if _outputs(node) != [0] or not k or not n:
        return None
    return [_const("kn", [k, n]), helper.make_node("ConstantOfShape", ["kn"], ["w"]),
            helper.make_node("CastLike", ["w", "i0"], ["wt"]), helper.make_node("MatMul", ["i0", "wt"], ["o0"])]


def _ort_attention(node, dims):
    """Attention(input, weights, bias, mask_index, past, ...): the input's rows by the value
    width (the third of qkv_hidden_sizes, else a third of the weights' columns); `present`,
    given a `past` (2, batch, heads, positions, head size), shaped as the past with its
    positions left unknown (past and new ones: `_gqa` says why Compress)."""
    outputs = _outputs(node)
    if outputs not in ([0], [0, 1]) or (outputs == [0, 1] and not _present(node, 4)):
        return None
    sizes = _attr(node, "qkv_hidden_sizes")
    if sizes:
        start, stop = int(sizes[0]) + int(sizes[1]), sum(int(s) for s in sizes[:3])
    else:
        columns = dims.get(node.input[1], (None, None))[-1]
        if not columns or columns % 3:
            return None
        start, stop = 0, columns // 3
    body = [helper.make_node("MatMul", ["i0", "i1"], ["qkv"]), _const("start", [start]), _const("stop", [stop]),
            _const("axis", [-1]), helper.make_node("Slice", ["qkv", "start", "stop", "axis"], ["o0"])]
    if outputs == [0, 1]:  # a condition computed from the input's values: its length is not known
        body += [helper.make_node("ReduceMax", ["i0"], ["peak"], keepdims=0), _const("one", [1]),
                 helper.make_node("Reshape", ["peak", "one"], ["peak1"]),
                 helper.make_node("Cast", ["peak1"], ["keep"], to=onnx.TensorProto.BOOL),
                 helper.make_node("Compress", ["i4", "keep"], ["o1"], axis=3)]
    return body


def _mha(node, dims):
    """MultiHeadAttention(query, key, value, ...): the query's rows by the value's width. The
    value may come packed: with the query (no key and value; the query is (batch, seq, heads, 3,
    head size)), or with the key (no value; the key is (batch, positions, heads, 2, head size))."""
    if _outputs(node) != [0] or (_present(node, 2) and not _present(node, 1)):
        return None
    if not _present(node, 1):  # packed QKV: the value is index 2 of axis 3
        return [_const("v_at", [2]), _const("merge_heads", [0, 0, -1]),
                helper.make_node("Gather", ["i0", "v_at"], ["v"], axis=3),
                helper.make_node("Reshape", ["v", "merge_heads"], ["o0"])]
    if len(dims.get(node.input[0], "qkv")) != 3:
        return None
    if not _present(node, 2):  # packed KV: the value is index 1 of axis 3
        value = [_const("v_at", [1]), _const("merge_heads", [0, 0, -1]),
                 helper.make_node("Gather", ["i1", "v_at"], ["v"], axis=3),
                 helper.make_node("Reshape", ["v", "merge_heads"], ["value"])]
    elif len(dims.get(node.input[2], "qkv")) != 3:
        return None
    else:
        value = [helper.make_node("Identity", ["i2"], ["value"])]
    return value + [helper.make_node("Einsum", ["i0", "value"], ["o0"], equation="bsd,blv->bsv")]


def _gqa(node, dims):
    """GroupQueryAttention(query, key, value, past_key, past_value, seqlens_k, ...): the output
    is shaped as the query, or for packed QKV (no key and value: the query holds num_heads +
    2 kv_num_heads heads) as its query heads; each present cache as its past (batch, kv heads,
    positions, head size), else as the new keys or values in that layout, with its positions
    left unknown (past and new ones, or a shared buffer's length: the `Compress` by a
    condition read from seqlens_k says only that they depend on the data)."""
    heads, kv_heads = _attr(node, "num_heads"), _attr(node, "kv_num_heads")
    packed = not _present(node, 1) and not _present(node, 2)
    if not (packed or (_present(node, 1) and _present(node, 2))) or not _present(node, 5) or not kv_heads \
            or (packed and not heads):
        return None
    body = [helper.make_node("Cast", ["i5"], ["positions"], to=onnx.TensorProto.BOOL)]
    if packed:  # (batch, seq, heads of q, k and v, head size), the heads taken apart by Slice
        body += [_const("split_heads", [0, 0, heads + 2 * kv_heads, -1]),
                 helper.make_node("Reshape", ["i0", "split_heads"], ["qkv"]), _const("head_axis", [2]),
                 _const("q0", [0]), _const("q1", [heads]), _const("k1", [heads + kv_heads]),
                 _const("v1", [heads + 2 * kv_heads]), _const("merge_heads", [0, 0, -1]),
                 helper.make_node("Slice", ["qkv", "q0", "q1", "head_axis"], ["q"]),
                 helper.make_node("Reshape", ["q", "merge_heads"], ["o0"]),
                 helper.make_node("Slice", ["qkv", "q1", "k1", "head_axis"], ["bsnh1"]),
                 helper.make_node("Slice", ["qkv", "k1", "v1", "head_axis"], ["bsnh2"])]
    else:
        body.append(helper.make_node("Identity", ["i0"], ["o0"]))
    for j, new, past in ((1, "i1", 3), (2, "i2", 4)):
        if j not in _outputs(node):
            continue
        if _present(node, past):
            base = f"i{past}"
        else:
            base = f"bnsh{j}"
            if not packed:
                body += [_const(f"heads{j}", [0, 0, kv_heads, -1]),
                         helper.make_node("Reshape", [new, f"heads{j}"], [f"bsnh{j}"])]
            body.append(helper.make_node("Transpose", [f"bsnh{j}"], [base], perm=[0, 2, 1, 3]))
        body.append(helper.make_node("Compress", [base, "positions"], [f"o{j}"], axis=2))
    return body


def _embed_norm(node, dims):
    """EmbedLayerNormalization(input_ids, segment_ids, word_embedding, ...): a row of the
    embedding per token; mask_index, one per input."""
    body = [helper.make_node("Gather", ["i2", "i0"], ["o0"])]
    for j in _outputs(node)[1:]:
        if j == 1:
            body += [_const("tokens", [1]), helper.make_node("ReduceSum", ["i0", "tokens"], ["count"], keepdims=0),
                     helper.make_node("Cast", ["count"], ["o1"], to=onnx.TensorProto.INT32)]
        elif j == 2:  # embedding_sum
            body.append(helper.make_node("Identity", ["o0"], ["o2"]))
    return body


_DEFAULT_DOMAIN_EXTRAS = frozenset({"SimplifiedLayerNormalization"})  # ONNX Runtime's, in the default domain
_RULES: dict[tuple[str, str], Callable] = {
    (MS, "Gelu"): _like_first, (MS, "FastGelu"): _like_first, (MS, "QuickGelu"): _like_first,
    (MS, "BiasGelu"): _bias_add, (MS, "BiasAdd"): _bias_add,
    (MS, "RotaryEmbedding"): _like_first,
    (MS, "SkipLayerNormalization"): _skip_norm, (MS, "SkipSimplifiedLayerNormalization"): _skip_norm,
    (MS, "SimplifiedLayerNormalization"): _like_first, ("", "SimplifiedLayerNormalization"): _like_first,
    (MS, "FusedMatMul"): _fused_matmul, (MS, "GemmFastGelu"): _gemm_fast_gelu,
    (MS, "MatMulNBits"): _matmul_nbits,
    (MS, "DynamicQuantizeMatMul"): _quantized_matmul, (MS, "MatMulIntegerToFloat"): _quantized_matmul,
    (MS, "FusedConv"): _with_attributes("Conv", ("auto_pad", "dilations", "group", "kernel_shape", "pads",
                                                 "strides")),
    (MS, "FusedGemm"): _with_attributes("Gemm", ("alpha", "beta", "transA", "transB")),
    (MS, "Attention"): _ort_attention, (MS, "MultiHeadAttention"): _mha, (MS, "GroupQueryAttention"): _gqa,
    (MS, "EmbedLayerNormalization"): _embed_norm,
    # a static quantization in ONNX Runtime's operator form (QuantFormat.QOperator)
    (MS, "QLinearAdd"): _quantized_binary("Add", 3), (MS, "QLinearMul"): _quantized_binary("Mul", 3),
    (MS, "QLinearWhere"): _quantized_binary("Where", 4),
    (MS, "QLinearSigmoid"): _like_first, (MS, "QLinearLeakyRelu"): _like_first, (MS, "QLinearSoftmax"): _like_first,
    (MS, "QLinearConcat"): _quantized_concat,
    (MS, "QLinearGlobalAveragePool"): _quantized_pool("GlobalAveragePool", ()),
    (MS, "QLinearAveragePool"): _quantized_pool("AveragePool", ("auto_pad", "ceil_mode", "count_include_pad",
                                                                "kernel_shape", "pads", "strides")),
    (MS, "QGemm"): _quantized_gemm,
}
