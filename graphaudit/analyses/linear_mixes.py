"""Mixing weights a controller projects without squashing them (MUDD's dynamic dense
connections: Linear → GELU → Linear of the hidden state, rearranged, plus a learned static
bias, weighting every earlier layer's output), found by what the projection does: a constant
weight taking the input's values into fewer features than it reads. `coefficients` asks it of
every projection, and whether the tensor the chain ends in weights hidden states (`_use`).
"""

from __future__ import annotations

from graphaudit.analyses.dependence import VALUE, DependenceMap
from graphaudit.graph.model import ModelGraph, Node, TensorRef

# What a projection's output may pass through and still be the same coefficients, rearranged:
# MUDD's view (batch, token, way·source) → permute (way, batch, token, source), plus its bias.
_REARRANGING = frozenset({"Reshape", "Transpose", "Unsqueeze", "Squeeze", "Flatten", "Identity", "Cast"})
_AFFINE = frozenset({"Add", "Sub", "Mul"})
PROJECTING = frozenset({"MatMul", "Gemm", "MatMulInteger"})  # the last, dynamically quantized: see `_dequantized`


def linear_mix(mg: ModelGraph, node: Node, dm: DependenceMap, hidden: int | None) -> TensorRef | None:
    """Unsquashed mixing weights (MUDD's dynamic dense connections: Linear → GELU → Linear of
    the hidden state, rearranged, plus a learned static bias, weighting every earlier layer's
    output): where `node` projects the input's values by a constant weight into fewer features
    than it reads and than the hidden state, the tensor its chain ends in — through rearranging
    ops and an Add / Sub / Mul with a constant, while each tensor has one reader of its values.
    Whether that tensor weights a hidden-state tensor is `_use`'s to tell. Only with a hidden
    width to compare with (a token axis): a CNN's narrow Gemm is its classifier."""
    if hidden is None or node.op_type not in PROJECTING or node.domain or not node.outputs:
        return None
    ref = node.outputs[0]
    width = last_width(mg, ref) if ref is not None else None
    if ref is None or width is None or width >= hidden or not linear_router(mg, node, dm):
        return None
    if node.op_type == "MatMulInteger" and (ref := _dequantized(mg, node, dm)) is None:
        return None
    for _ in range(8):  # a Shape or Size reads no values (einops' rearrange reads x.shape first)
        readers = [r for r in mg.consumers(ref) if r.op_type not in ("Shape", "Size") or r.domain]
        if len(readers) != 1 or readers[0].domain or not readers[0].outputs or readers[0].outputs[0] is None:
            break
        reader, after = readers[0], readers[0].outputs[0]
        if reader.op_type in _AFFINE:
            if any(r is not None and r != ref and dm.value(r) == VALUE for r in reader.inputs):
                break
        elif reader.op_type not in _REARRANGING:
            break
        ref = after
    return ref


def _dequantized(mg: ModelGraph, node: Node, dm: DependenceMap) -> TensorRef | None:
    """The float result of the dynamically quantized projection `node` (ONNX Runtime's
    `quantize_dynamic`: DynamicQuantizeLinear of the input, MatMulInteger, Cast to float, Mul by
    the input's scale times the weight's), or None where it is not written so. The input's
    scale is a value, but the quantization's own: the projection's, not a second input mixed in."""
    source = mg.producer(node.inputs[0]) if node.inputs and node.inputs[0] is not None else None
    if source is None or source.op_type != "DynamicQuantizeLinear" or source.domain or len(source.outputs) < 2:
        return None
    scale, ref = source.outputs[1], node.outputs[0]
    for _ in range(4):
        readers = mg.consumers(ref) if ref is not None else []
        if len(readers) != 1 or readers[0].domain or not readers[0].outputs:
            return None
        reader = readers[0]
        if reader.op_type == "Cast":
            ref = reader.outputs[0]
            continue
        if reader.op_type != "Mul" or len(reader.inputs) != 2:
            return None
        other = reader.inputs[1] if reader.inputs[0] == ref else reader.inputs[0]
        made = mg.producer(other) if other is not None and other != scale else None
        if other == scale or (made is not None and made.op_type == "Mul" and scale in made.inputs
                              and all(r == scale or dm.value(r) != VALUE for r in made.inputs)):
            return reader.outputs[0]
        return None
    return None


def linear_router(mg: ModelGraph, node: Node, dm: DependenceMap) -> bool:
    # (a missing first input is no value: dm.value(None) is CONST)
    if len(node.inputs) < 2 or node.inputs[0] is None or node.inputs[1] is None or not node.outputs \
            or node.outputs[0] is None:
        return False
    if dm.value(node.inputs[0]) != VALUE or dm.value(node.inputs[1]) == VALUE:
        return False
    width, features = last_width(mg, node.inputs[0]), last_width(mg, node.outputs[0])
    return width is not None and features is not None and features < width


def last_width(mg: ModelGraph, ref: TensorRef) -> int | None:
    """The last dimension of `ref`, where it is a number."""
    info = mg.tensors.get(ref)
    return info.shape[-1] if info and info.shape and isinstance(info.shape[-1], int) else None
