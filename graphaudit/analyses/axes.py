"""Which axis of a tensor is the batch, which the token: read from the graph inputs.

An input's example axis is the batch (its first, or the one `feeding.example_axis` reads from
the graph: a recurrent state's second) and the second input dimension the token; a tensor's axis is one of
them where shape inference carried the input's symbolic name to it, where a probe at unusual
input sizes (`load.inference.infer_at`) gives it the batch's or the token's size, or where its size
moves with the token count; `batch*token` is the two merged, batch-major (a MoE router's
flattened tokens). In an export without dynamic shapes, where sizes are numbers, an axis is
one of them by its size at a leading position, or where a Transpose, a Reshape or an
elementwise operator carried such an axis to it (`_carried_names`).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import onnx

from graphaudit.graph.model import ModelGraph, TensorRef
from graphaudit.load.feeding import example_axes
from graphaudit.vocabulary import BATCH, MERGED, TOKEN

# batch, token, any other symbolic input dimension (see InputAxes). The last, an image's height
# and width, divides by a CNN's strides (17 · 32: a detector's neck adds each stage to the next
# one upsampled, which at 13 → 7 → 4 → 8 shape inference cannot do), and halved on and on it
# never passes through the batch's or the token's size.
PROBE_SIZES = (7, 11, 17 * 32)
LONGER = 23  # the token size of the second probe

# Normalisations: what they output is the residual stream, at the hidden width.
NORMALISATIONS = frozenset({"LayerNormalization", "SimplifiedLayerNormalization", "RMSNormalization",
                            "SkipLayerNormalization", "SkipSimplifiedLayerNormalization"})


@dataclass
class InputAxes:
    """What marks a tensor's batch and token axes, read from the graph inputs (their first
    dimension is the batch, their second the token):

    - the symbolic names shape inference carries, wherever they stand;
    - a dimension inference could only call `unk__N` (past a Reshape to a size computed from
      Shape, as the TorchScript exporter writes them): what it becomes when shape inference
      runs again with the inputs at the unusual sizes PROBE_SIZES (`load.inference.infer_at`), for the
      tensor asked about — the batch's size there makes it a batch axis, the token's a token axis,
      and an axis whose size changes again when only the token size does (LONGER) is a token
      axis too: the tokens plus a class token, or the half of them a pruning step kept;
    - for inputs whose sizes are numbers (an export without dynamic shapes), those sizes, at
      the same leading positions only, a token axis only after a batch axis and only from
      inputs of rank 2 or 3 (an image's second axis is its channels), since a number
      alone may be any axis's;
    - where the inputs carry no token axis at all (a vision transformer's pixels), the length of
      the sequence its normalisations run over: the fixed second axis of their (batch, length,
      width) outputs, the patches (and a class token), at that position only.
    """

    batch: frozenset[str]
    token: frozenset[str]
    batch_size: int | None
    token_size: int | None
    model: onnx.ModelProto | None = None  # for the probe; None: no probe
    probe_shapes: tuple[tuple[str, tuple[int, ...]], ...] = ()
    _probed: dict | None = None

    @classmethod
    def of(cls, mg: ModelGraph, model: onnx.ModelProto | None = None) -> InputAxes:
        named = [(r.name, shape) for r in mg.inputs if r in mg.tensors and (shape := mg.tensors[r].shape)]
        shapes = [s for _, s in named]
        # the batch is each input's example axis (its first, or a state's own: graphaudit.load.feeding)
        where = example_axes(dict(named))
        examples = [s[axis] for n, s in named if (axis := where[n]) is not None]
        batch = {d for d in examples if isinstance(d, str)}
        token = {s[1] for s in shapes if len(s) >= 2 and isinstance(s[1], str)} - batch
        sizes = {s[0] for s in shapes if isinstance(s[0], int) and s[0] > 0}
        # a fixed second size is a length only for token ids or embeddings: an image's are its channels
        lengths = {s[1] for s in shapes if len(s) in (2, 3) and isinstance(s[1], int) and s[1] > 0}
        probe = tuple((name, tuple(d if isinstance(d, int) and d > 0 else
                                   PROBE_SIZES[0] if d in batch else PROBE_SIZES[1] if d in token else PROBE_SIZES[2]
                                   for d in shape)) for name, shape in named)
        batch_size = next(iter(sizes)) if len(sizes) == 1 else None
        length = next(iter(lengths)) if len(lengths) == 1 else None
        if not token and not lengths:
            length = _normalised_length(mg, batch_size)
        return cls(frozenset(batch), frozenset(token), batch_size, length, model if batch or token else None, probe)

    def _probe(self, name: str, longer: bool = False) -> tuple[int, ...] | None:
        if self.model is None:
            return None
        key = "longer" if longer else "probe"
        if self._probed is None:
            self._probed = {}
        if key not in self._probed:
            from graphaudit.load.inference import infer_at

            shapes = dict(self.probe_shapes)
            if longer:
                shapes = {name: tuple(LONGER if d == PROBE_SIZES[1] and axis == 1 else d for axis, d in enumerate(shape))
                          for name, shape in shapes.items()}
            self._probed[key] = infer_at(self.model, shapes)
        return self._probed[key].get(name)

    def width(self, shape, tensor: str | None) -> int | None:
        """The last dimension of `shape`: its number, or where inference could only call it
        `unk__N` (an Expand to a shape computed from Shape), its size at the probe when that size
        is no probe size and stays when the token size changes (a fixed feature width)."""
        if not shape:
            return None
        if isinstance(shape[-1], int):
            return shape[-1] if shape[-1] > 0 else None
        if tensor is None or shape[-1] in self.batch or shape[-1] in self.token:
            return None
        probed, longer = self._probe(tensor), self._probe(tensor, longer=True)
        if probed is None or longer is None or len(probed) != len(shape) or len(longer) != len(shape):
            return None
        size = probed[-1]
        return size if size == longer[-1] and size > 0 and size not in (*PROBE_SIZES, LONGER) else None

    def _moves_with_tokens(self, tensor: str | None, axis: int, rank: int, size: int | None) -> bool:
        """Whether the axis's size at the probe changes when only the token size does."""
        if tensor is None or size is None or not self.token:
            return False
        longer = self._probe(tensor, longer=True)
        return longer is not None and len(longer) == rank and longer[axis] != size

    def _merged(self, dim: str) -> bool:
        """Whether a symbolic dimension is the product of the batch and the token ("seq*batch")."""
        parts = [p.strip() for p in dim.split("*")]
        return len(parts) == 2 and sum(p in self.batch for p in parts) == 1 and sum(p in self.token for p in parts) == 1

    def names(self, shape, tensor: str | None = None) -> list[str | None]:
        names: list[str | None] = []
        for axis, d in enumerate(shape):
            if isinstance(d, str) and (d in self.batch or d in self.token):
                names.append(BATCH if d in self.batch else TOKEN)
            elif isinstance(d, str) and self._merged(d):
                names.append(MERGED)
            elif isinstance(d, str):
                probed = self._probe(tensor) if tensor is not None else None
                size = probed[axis] if probed is not None and len(probed) == len(shape) else None
                names.append(BATCH if size == PROBE_SIZES[0] else TOKEN if size == PROBE_SIZES[1] else
                             MERGED if size == PROBE_SIZES[0] * PROBE_SIZES[1] else
                             TOKEN if self._moves_with_tokens(tensor, axis, len(shape), size) else None)
            elif axis == 0 and d == self.batch_size:
                names.append(BATCH)
            elif axis == 1 and d == self.token_size and names[0] == BATCH:
                names.append(TOKEN)
            else:
                names.append(None)
        return names


def _normalised_length(mg: ModelGraph, batch_size: int | None) -> int | None:
    """The most common fixed second axis of the (batch, length, width) tensors that the graph's
    normalisations output, or None: the sequence of a model whose inputs have none. Their first
    axis is the batch's size, or symbolic (`batch`, or `unk__N` past a TorchScript reshape)."""
    found: Counter = Counter()
    for node in mg.nodes.values():
        if node.op_type not in NORMALISATIONS or not node.outputs or node.outputs[0] is None:
            continue
        info = mg.tensors.get(node.outputs[0])
        shape = info.shape if info is not None else None
        if shape and len(shape) == 3 and isinstance(shape[1], int) and shape[1] > 1 \
                and (isinstance(shape[0], str) or (batch_size is not None and shape[0] == batch_size)):
            found[shape[1]] += 1
    return found.most_common(1)[0][0] if found else None


def axes_of(mg: ModelGraph, ref: TensorRef | None, axes: InputAxes | None = None) -> tuple[str, ...]:
    """Axis names for `ref` from its dimensions (`InputAxes`): batch, token, then slot axes. In an
    export without dynamic shapes, where a number alone may be any axis's, from where its axes
    came from too (`_carried_names`)."""
    info = mg.tensors.get(ref) if ref is not None else None
    if ref is None or info is None or info.shape is None:
        return ()
    axes = axes or InputAxes.of(mg)
    names = axes.names(info.shape, None if ref.scope else ref.name)
    if not axes.batch and not axes.token and axes.batch_size is not None:
        names = _carried_names(mg, ref, axes, names)
    slots = names.count(None)
    counter = iter(range(slots))
    return tuple(n if n is not None else ("slot" if slots == 1 else f"slot{next(counter)}") for n in names)


# Operators whose output keeps the layout of an input of its own shape (broadcasting the others)
_KEEPS_LAYOUT = frozenset({"Identity", "Cast", "Add", "Sub", "Mul", "Div", "Relu", "Sigmoid", "Tanh", "Gelu", "Erf",
                           "Softmax", "LogSoftmax", "Neg", "Exp", "Log", "Sqrt", "Pow", "Clip", "Where"})
_CARRY_DEPTH = 16


def _carried_names(mg: ModelGraph, ref: TensorRef, axes: InputAxes, names: list, depth: int = 0) -> list:
    """`names` of `ref` (read from its sizes at their positions) as the axes it was made from
    name them, for an export whose input sizes are numbers: through a Transpose, each axis
    where its permutation takes it; through a Reshape that keeps the leading sizes, those axes;
    through an operator that keeps an input's layout (a bias added, an activation), that
    input's. A MUDD controller's (way, batch, token, source) weights, permuted from a (batch,
    token, way, source) projection, have no batch at their first position; with one way, their
    way axis has the batch's size there. Any name the walk leaves unset keeps the one its
    position gives, where no other axis took it."""
    found = _from_producer(mg, ref, axes, depth)
    if found is None or (BATCH not in found and TOKEN not in found):
        return names
    return [f if f is not None else (n if n not in found else None) for f, n in zip(found, names)]


def _from_producer(mg: ModelGraph, ref: TensorRef, axes: InputAxes, depth: int) -> list | None:
    info = mg.tensors.get(ref)
    node = mg.producer(ref)
    if depth > _CARRY_DEPTH or info is None or not info.shape or node is None or node.domain not in ("", "ai.onnx"):
        return None
    shape, op = info.shape, node.op_type
    source = node.inputs[0] if node.inputs else None
    if op in ("Transpose", "Reshape") and source is not None and (src := mg.tensors.get(source)) and src.shape:
        inner = _carried_names(mg, source, axes, axes.names(src.shape, None if source.scope else source.name),
                               depth + 1)
        if op == "Transpose":
            perm = next((list(a.ints) for a in node.proto.attribute if a.name == "perm"), None)
            perm = perm or list(reversed(range(len(src.shape))))
            return [inner[p] for p in perm] if len(perm) == len(shape) == len(inner) else None
        kept = 0  # a Reshape keeps the names of the leading sizes it leaves alone
        while kept < min(len(shape), len(src.shape)) and shape[kept] == src.shape[kept]:
            kept += 1
        return inner[:kept] + [None] * (len(shape) - kept)
    if op in _KEEPS_LAYOUT:
        same = next((r for r in node.inputs if r is not None and (i := mg.tensors.get(r)) and i.shape == shape), None)
        if same is not None:
            return _carried_names(mg, same, axes, axes.names(shape, None if same.scope else same.name), depth + 1)
    return None


def batch_major(mg: ModelGraph, ref: TensorRef, axes: InputAxes, limit: int = 32) -> bool:
    """Whether the `batch*token` axis of `ref` was made batch-major: going up through the inputs
    that carry it, the Reshape or Flatten that made it merged a (batch, token, ...) tensor.
    (A (token, batch, ...) one, as sequence-first models keep, would need the other order.)"""
    for _ in range(limit):
        node = mg.producer(ref)
        if node is None:
            return False
        if node.op_type in ("Reshape", "Flatten") and node.inputs and node.inputs[0] is not None:
            source = mg.tensors.get(node.inputs[0])
            names = axes.names(source.shape, node.inputs[0].name) if source and source.shape else []
            if names[:1] != [MERGED]:  # not a reshape of the merged tensor itself: the one that merged
                return names[:2] == [BATCH, TOKEN]
        carrying = [r for r in node.inputs if r is not None and (info := mg.tensors.get(r)) is not None
                    and info.shape and axes.names(info.shape, r.name if not r.scope else None)[0] == MERGED]
        if not carrying:
            return False
        ref = carrying[0]
    return False
