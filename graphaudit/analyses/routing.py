"""Which coefficients route: those a TopK or an ArgMax chooses among, and how many it chooses.

A router's coefficients (a mixture of experts' gate probabilities) hold one value per expert for
each token, and the model runs the experts that a TopK of constant k (an ArgMax: k = 1) picks
from them along their last axis. Their mean is 1/E everywhere when they are probabilities, so what
says what routing does is how often each expert is chosen. `router_choices` finds, for every
coefficient, the TopK or ArgMax that reads it, through operators that keep its last axis as it
is: Identity and Cast, a Softmax or LogSoftmax over that axis (they keep the order along it), a
Reshape whose target ends in that axis's size; k read from a constant. `routing_shares` counts
the choices in the captured coefficients of the evaluation inputs.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import numpy_helper

from graphaudit.analyses.declared_coefficients import Coefficient

_KEEP = frozenset({"Identity", "Cast"})
_ORDERED = frozenset({"Softmax", "LogSoftmax"})  # along their axis: the same order, so the same choice
_DEPTH = 8
# the most (layer, expert, position) shares the JSON holds per family: past it, per layer and expert only
MOST_BY_POSITION = 20_000


@dataclass(frozen=True)
class Choice:
    """A coefficient's choosing node: the `k` largest of its last axis (`op` TopK or ArgMax)."""

    k: int
    op: str
    node: str
    size: int | None = None  # the last axis's size where a Reshape on the way says it


def router_choices(model: onnx.ModelProto, coefficients: Iterable[Coefficient]) -> dict[str, Choice]:
    """tensor -> its Choice, for each coefficient that a TopK (constant k, largest) or an ArgMax
    chooses among along its last axis."""
    consumers: dict[str, list[onnx.NodeProto]] = {}
    for node in model.graph.node:
        for name in node.input:
            consumers.setdefault(name, []).append(node)
    constants = {t.name: t for t in model.graph.initializer}
    constants.update({n.output[0]: a.t for n in model.graph.node if n.op_type == "Constant"
                      for a in n.attribute if a.name == "value"})
    found = {}
    for c in coefficients:
        choice = _chooser(c.tensor, len(c.axes), consumers, constants)
        if choice is not None:
            found[c.tensor] = choice
    return found


def _chooser(tensor: str, rank: int, consumers, constants, depth: int = _DEPTH,
             size: int | None = None) -> Choice | None:
    if depth == 0:
        return None
    for node in consumers.get(tensor, []):
        if node.input[0] != tensor:
            continue
        attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
        last = attrs.get("axis", -1) in (-1, rank - 1)
        if node.op_type == "TopK" and last and attrs.get("largest", 1) == 1 and len(node.input) > 1:
            k = _constant(constants, node.input[1])
            if k is not None and k.size == 1:
                return Choice(int(k.reshape(-1)[0]), "TopK", node.name, size)
        elif node.op_type == "ArgMax" and last and attrs.get("select_last_index", 0) == 0:
            return Choice(1, "ArgMax", node.name, size)
        elif node.op_type in _KEEP or (node.op_type in _ORDERED and last):
            found = _chooser(node.output[0], rank, consumers, constants, depth - 1, size)
            if found is not None:
                return found
        elif node.op_type == "Reshape" and len(node.input) > 1:
            shape = _constant(constants, node.input[1])
            # it keeps the last axis where its target has one of a fixed size (the experts'), and another before
            if shape is not None and shape.size >= 2 and int(shape.reshape(-1)[-1]) > 0:
                found = _chooser(node.output[0], int(shape.size), consumers, constants, depth - 1,
                                 int(shape.reshape(-1)[-1]))
                if found is not None:
                    return found
    return None


def _constant(constants, name: str) -> np.ndarray | None:
    tensor = constants.get(name)
    return None if tensor is None else numpy_helper.to_array(tensor)


def routing_shares(cache, choices: Mapping[str, Choice], tokens: np.ndarray | None = None,
                   chunk: int = 64) -> dict[str, dict]:
    """Per family of routing coefficients: how often each expert was chosen (its `k` largest) in
    `cache` (batch first: inputs, positions, experts), as a share of the positions counted
    (`tokens`: False where padded, left out), per layer and expert, and per layer, expert and
    position where that stays under MOST_BY_POSITION values. A share of 1 is every token; k/E
    would be an even split."""
    routed = [c for c in cache.coefficients if c.tensor in choices and len(cache.shape(c)) == 3
              and choices[c.tensor].size in (None, cache.shape(c)[2])]
    counts = {c.tensor: np.zeros(cache.shape(c)[1:], dtype=np.float64) for c in routed}  # positions x experts
    seen = {c.tensor: np.zeros(cache.shape(c)[1], dtype=np.float64) for c in routed}
    for rows, values in cache.chunks(chunk) if routed else ():
        for c in routed:
            v = np.asarray(values[c.tensor])  # compared only: in its own type
            k = min(choices[c.tensor].k, v.shape[-1])
            top = np.argpartition(-v, k - 1, axis=-1)[..., :k]  # (inputs, positions, k)
            chosen = np.zeros(v.shape, dtype=bool)
            np.put_along_axis(chosen, top, True, axis=-1)
            keep = np.ones(v.shape[:2], dtype=bool) if tokens is None else tokens[rows][:, : v.shape[1]]
            counts[c.tensor] += (chosen & keep[..., None]).sum(axis=0)
            seen[c.tensor] += keep.sum(axis=0)
    families: dict[str, list[Coefficient]] = {}
    for c in routed:
        families.setdefault(c.family, []).append(c)
    out = {}
    for family, cs in families.items():
        per_position = [counts[c.tensor] / np.maximum(seen[c.tensor], 1)[:, None] for c in cs]
        overall = [counts[c.tensor].sum(axis=0) / max(seen[c.tensor].sum(), 1) for c in cs]
        entry: dict = {"layers": [c.layer for c in cs], "k": [choices[c.tensor].k for c in cs],
                       "chooser": [f"{choices[c.tensor].op} {choices[c.tensor].node}" for c in cs],
                       "experts": [int(cache.shape(c)[2]) for c in cs],
                       "share": [np.round(o, 6).tolist() for o in overall]}
        if sum(p.size for p in per_position) <= MOST_BY_POSITION:
            entry["by_position"] = [np.round(p.T, 6).tolist() for p in per_position]  # experts x positions
        out[family] = entry
    return out

