"""A policy that hands each block one column: one coefficient per block, not one for all.

BlockDrop's policy network (and any controller that decides for every block at once) computes
one tensor (batch, blocks) and each block takes its own column, `policy[:, i]`, a Gather by a
constant index. Read as one coefficient, that tensor would sit in one layer, and the replay's
variance decomposition would see a single layer. Each column is what one block is weighted
by: a coefficient of its own, in its block's layer, frozen and fed apart.
"""

from __future__ import annotations

from collections.abc import Sequence

from graphaudit.analyses.blockmap import BlockMap
from graphaudit.analyses.coefficient_reach import weighted_block
from graphaudit.analyses.dependence import CONST, DependenceMap
from graphaudit.graph.model import ModelGraph, Node, TensorRef
from graphaudit.vocabulary import PER_INPUT


def block_columns(mg: ModelGraph, ref: TensorRef, axes: Sequence[str], blocks: BlockMap | None,
                  dm: DependenceMap) -> list[tuple[TensorRef, tuple[str, ...], int]] | None:
    """(column, its axes, its block's index) for each reader of `ref` when every reader is a
    Gather of one constant index along an axis that is not the batch's or the tokens', and
    each column weights a block of its own (two or more); else None."""
    readers = mg.consumers(ref)
    if blocks is None or len(readers) < 2:
        return None
    found: list[tuple[TensorRef, tuple[str, ...], int]] = []
    for reader in readers:
        axis = _column_axis(mg, reader, ref, len(axes), dm)
        if axis is None or axes[axis] in PER_INPUT or reader.outputs[0] is None:
            return None
        column = reader.outputs[0]
        block = weighted_block(mg, column, blocks)
        if block is None:
            return None
        found.append((column, tuple(a for i, a in enumerate(axes) if i != axis), block.index))
    if len({index for *_, index in found}) != len(found):
        return None
    return found


def _column_axis(mg: ModelGraph, node: Node, ref: TensorRef, rank: int, dm: DependenceMap) -> int | None:
    """The axis `node` takes one constant index of `ref` along, or None."""
    if node.op_type != "Gather" or node.domain not in ("", "ai.onnx") or len(node.inputs) != 2 or node.inputs[0] != ref:
        return None
    index = node.inputs[1]
    info = mg.tensors.get(index) if index is not None else None
    if info is None or info.shape != () or dm.of(index) != CONST:
        return None
    axis = next((a.i for a in node.proto.attribute if a.name == "axis"), 0)
    axis = axis + rank if axis < 0 else axis
    return axis if 0 <= axis < rank else None
