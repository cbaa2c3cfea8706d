"""A detected coefficient's layer: the block it serves (`detected_layer`), else, where no layer names tell it,
its place along the network's depth (`with_layers`).

Blocks found by names (a transformer's `layers.3`, a timm CNN's `blocks.3`) say which layer a
coefficient serves. Blocks cut from structure do not, in a CNN: its residual Adds come in short
runs between the stages that change its width (MobileNetV3's four in a row, of fifteen
bottlenecks), so most of its gates lie in no block, and the nearest block upstream, or the
number its name ends in (Paddle's `hardsigmoid_6.tmp_0`), would give many of them one layer.
There, a coefficient's layer is the rank, among its family's, of the depth of the node it
weights, routes or decides: the most layers of learned weights (`LAYER_OPS`) on a path to it
from the graph inputs, so that how an exporter spells what lies between (Identity, Reshape, a
bias Add of its own) does not move it. Gates one after the other each get their own, parallel
ones at the same depth share one. So too where blocks are named but serve none of a family:
a table recogniser's SE gates ahead of a decoder whose Loop is the only block.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from graphaudit.analyses.blockmap import BlockMap
from graphaudit.analyses.coefficient_reach import DECIDING, GATING, block_index, named_layer, reached_consumers, routes
from graphaudit.analyses.declared_coefficients import Coefficient
from graphaudit.graph.model import ModelGraph, TensorRef

# The operators that apply a layer of learned weights: each adds one to the depth of what follows it.
LAYER_OPS = frozenset({
    ("", "Conv"), ("", "ConvTranspose"), ("", "ConvInteger"), ("", "QLinearConv"), ("", "Gemm"),
    ("", "MatMul"), ("", "MatMulInteger"), ("", "QLinearMatMul"), ("", "RNN"), ("", "GRU"), ("", "LSTM"),
    ("com.microsoft", "FusedConv"), ("com.microsoft", "FusedGemm"), ("com.microsoft", "FusedMatMul"),
    ("com.microsoft", "QGemm"), ("com.microsoft", "MatMulNBits"), ("com.microsoft", "MatMulIntegerToFloat"),
})


def named_layers(blocks: BlockMap | None) -> bool:
    """Whether `blocks` name the model's layers: found from names, metadata, weights or control
    flow, not cut from the residual chain alone, nor none at all."""
    return blocks is not None and bool(blocks.blocks) and any(source != "structure" for source, _ in blocks.sources)


def by_depth(mg: ModelGraph, found: Sequence[Coefficient]) -> tuple[Coefficient, ...]:
    """`found` with each coefficient's layer the rank of its depth among its family's depths."""
    depths = _node_depths(mg)
    at = {c.tensor: _depth(mg, c.tensor, depths) for c in found}
    ranks: dict[str, dict[int, int]] = {}
    for family in {c.family for c in found}:
        levels = sorted({at[c.tensor] for c in found if c.family == family})
        ranks[family] = {d: i for i, d in enumerate(levels)}
    return tuple(replace(c, layer=ranks[c.family][at[c.tensor]]) for c in found)


def _depth(mg: ModelGraph, tensor: str, depths: dict[str, int]) -> int:
    """The depth of the nearest node `tensor` weights, routes or decides, else of its producer."""
    ref = mg.find_tensor(tensor)
    if ref is None:
        return 0
    for consumer, current in reached_consumers(mg, ref, limit=16, nearest_first=True):
        if consumer.op_type in GATING or consumer.op_type in DECIDING or routes(consumer, current):
            return depths.get(consumer.id, 0)
    producer = mg.producer(ref)
    return depths.get(producer.id, 0) if producer is not None else 0


def _node_depths(mg: ModelGraph) -> dict[str, int]:
    """Each main-graph node's depth: the most layers of learned weights (`LAYER_OPS`) on a path
    from the graph inputs to it, itself included (in file order, which ONNX keeps topological)."""
    depths: dict[str, int] = {}
    for node in mg.nodes.values():
        if node.scopes:
            continue
        before = [depths.get(p.id, 0) for r in node.inputs if r is not None for p in [mg.producer(r)] if p is not None]
        own = (("" if node.domain in ("", "ai.onnx") else node.domain), node.op_type) in LAYER_OPS
        depths[node.id] = max(before, default=0) + own
    return depths


def detected_layer(mg: ModelGraph, ref: TensorRef, blocks: BlockMap | None, fallback: int, placed: set[str]) -> int:
    """`layer_of` the detected coefficient `ref`, added to `placed` where a block gives its layer."""
    index = block_index(mg, ref, blocks)
    if index is None:
        return named_layer(ref.name, fallback)
    placed.add(ref.name)
    return index


def with_layers(mg: ModelGraph, found: Sequence[Coefficient], blocks: BlockMap | None,
                placed: set[str]) -> tuple[Coefficient, ...]:
    """`found`, detected, with the layers they keep (`detected_layer`; `placed`: those a block
    gave) or take from depth: every one where no block names a layer (a CNN's gates, mostly in
    no block); else each of a family that no block serves whose names number no layers."""
    if not named_layers(blocks):
        return by_depth(mg, found)
    # A family that no block serves keeps the numbers its names end in (`exit.1`, `exit.2`) where
    # they tell its coefficients apart. Where they do not, they number values, not layers (the
    # `0` of Paddle's `hardsigmoid_2.tmp_0` and `hardsigmoid_3.tmp_0`, SE gates ahead of a decoder
    # whose Loop is the only block), and its layers are its places along the depth.
    families: dict[str, list[Coefficient]] = {}
    for c in found:
        families.setdefault(c.family, []).append(c)
    alike = [c for cs in families.values()
             if placed.isdisjoint(x.tensor for x in cs) and len({x.layer for x in cs}) < len(cs) for c in cs]
    if not alike:  # the usual case: by_depth walks every node
        return tuple(found)
    ranked = {c.tensor: c for c in by_depth(mg, alike)}
    return tuple(ranked.get(c.tensor, c) for c in found)
