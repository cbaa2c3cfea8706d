"""Which tensors are the controller's coefficients: declared, named by the user, or detected.

In order (docs/design.md, "Coefficients and their axes"): the `graphaudit.coefficients` metadata
our exporters write; then names or glob patterns the user gives; and only when neither gives
any, detection — a value-dependent tensor out of Sigmoid / Softmax / Tanh (or a sigmoid or
softmax written out in elementary operators: `analyses.written_out`), with a fixed
width no wider than the hidden state, that weights a hidden-state tensor (Mul / MatMul /
Einsum with a tensor computed from the input, not a weight, nor from the squashed tensor's
own input element by element), routes one (TopK / ArgMax), scales a CNN's feature map
channel by channel, or mixes stacked weights that are then applied to one (a dynamic
convolution); or, squashed by nothing, a linear projection of the input's values into fewer
features than the hidden state, rearranged and biased, that weights one (MUDD's dense
connections, family `mix`). Axes not declared are read from the symbolic dimensions shape inference
carried from the graph inputs: the first input dimension is the batch, the second the
token (`batch*token` where the two are one axis); in a graph exported without dynamic
shapes, from the inputs' fixed sizes at the leading positions (`analyses.axes`).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

import onnx

from graphaudit.analyses.axes import NORMALISATIONS, InputAxes, axes_of, batch_major
from graphaudit.analyses.blockmap import BlockMap
from graphaudit.analyses.coefficient_reach import DECIDING, GATING, PLUMBING, reached_consumers, routes
from graphaudit.analyses.columns import block_columns
from graphaudit.analyses.declared_coefficients import METADATA_KEY, Coefficient, declared_coefficients
from graphaudit.analyses.dependence import VALUE, DependenceMap, analyse_dependence
from graphaudit.analyses.depth import detected_layer, with_layers
from graphaudit.analyses.linear_mixes import PROJECTING, last_width, linear_mix, linear_router
from graphaudit.analyses.named_coefficients import user_coefficients
from graphaudit.analyses.written_out import COMPLETING, InGraph
from graphaudit.errors import GraphAuditError
from graphaudit.graph.model import ModelGraph, Node, TensorRef
from graphaudit.load.model import LoadedModel
from graphaudit.vocabulary import BATCH, MERGED, TOKEN

SQUASHING = {"Sigmoid": "gate", "HardSigmoid": "gate", "Tanh": "gate", "Softmax": "mix", "LogSoftmax": "mix"}
# ONNX Runtime's quantized ones (QuantFormat.QOperator): their integer outputs are the coefficients
QUANTIZED_SQUASHING = {"QLinearSigmoid": "gate", "QLinearSoftmax": "mix"}


def resolve_coefficients(
    loaded_or_model: LoadedModel | onnx.ModelProto,
    mg: ModelGraph,
    names: Sequence[str] = (),
    *,
    blocks: BlockMap | None = None,
    dependence: DependenceMap | None = None,
) -> tuple[Coefficient, ...]:
    """Return the model's coefficient tensors: declared, then user-named, else detected."""
    model = loaded_or_model.model if isinstance(loaded_or_model, LoadedModel) else loaded_or_model
    declared = [_present(mg, c) for c in declared_coefficients(model)]
    known = {c.tensor for c in declared}
    axes = InputAxes.of(mg, model)
    # a named tensor that detection finds too keeps the family and layer detection gives it
    found = {c.tensor: c for c in detect_coefficients(mg, blocks=blocks, dependence=dependence, axes=axes,
                                                       model=model)} if names and not declared else {}
    user = [c for c in user_coefficients(mg, names, blocks, axes, found) if c.tensor not in known]
    if declared or user:
        return tuple(declared) + tuple(user)
    return detect_coefficients(mg, blocks=blocks, dependence=dependence, axes=axes, model=model)


def _present(mg: ModelGraph, c: Coefficient) -> Coefficient:
    """A declared coefficient as the graph holds it: itself, or the integer tensor ONNX Runtime's
    quantizer put in its place in operator form (`gate.0` computed by QLinearSigmoid as
    `gate.0_quantized`); a GraphAuditError when the graph has neither."""
    if mg.find_tensor(c.tensor) is not None:
        return c
    quantized = f"{c.tensor}_quantized"
    if mg.find_tensor(quantized) is not None:
        return Coefficient(quantized, c.family, c.layer, c.axes, source=c.source)
    raise GraphAuditError(f"expected the coefficient tensor {c.tensor!r} declared in the model's {METADATA_KEY!r} "
                          "metadata to be a value of the graph, found no value of that name")


def detect_coefficients(
    mg: ModelGraph, *, blocks: BlockMap | None = None, dependence: DependenceMap | None = None,
    axes: InputAxes | None = None, model: onnx.ModelProto | None = None,
) -> tuple[Coefficient, ...]:
    """Return the tensors that look like a controller's output (docs/design.md), marked detected:
    in the main graph only, as one inside an If or Loop body could not be frozen. Their layer:
    the block they serve where `blocks` name the layers, else their place along the depth
    (`analyses.depth`; so too in a family no block serves whose names number no layers). A
    sigmoid or softmax written out in elementary operators squashes as the operator does
    (`analyses.written_out`; `model`: where the constants it compares are read)."""
    dm = dependence or analyse_dependence(mg)
    axes = axes or InputAxes.of(mg)
    hidden = _hidden_width(mg, axes)
    found: list[Coefficient] = []
    order: Counter = Counter()
    placed: set[str] = set()  # coefficients whose layer a block gives
    routers = _raw_routers(mg, dm)
    spelled_in = InGraph(mg, model)
    for node in mg.nodes.values():
        if node.scopes:  # inside control flow or a function: it could be neither exposed nor fed
            continue
        family = SQUASHING.get(node.op_type) if not node.domain else \
            QUANTIZED_SQUASHING.get(node.op_type) if node.domain == "com.microsoft" else None
        out = node.outputs[0] if node.outputs else None
        # a sigmoid or softmax written out (tested here first: the recogniser is a call per node)
        spelled = spelled_in(node) if family is None and node.op_type in COMPLETING else None
        if spelled is not None:
            family = SQUASHING[spelled.op]
        if family is None and node.id in routers:
            family = "router"
        if family is None and node.op_type in PROJECTING and (end := linear_mix(mg, node, dm, hidden)) is not None:
            # the coefficient: where the projection's chain ends
            producer = mg.producer(end)
            assert producer is not None  # a node's output, which build_graph records with its producer
            family, out, node = "mix", end, producer
        if family is None or out is None or dm.of(out) != VALUE:
            continue
        # what squashes, from what, along which axis: the operator, or the one written out
        squash, squashed, axis = (node.op_type, node.inputs, _axis(node)) if spelled is None else \
            (spelled.op, (TensorRef(spelled.data),), spelled.axis)
        confidence = _exit_confidence(mg, out, axes) if squash == "Softmax" else None
        if confidence is not None:  # an early exit's: its reduction per token is the coefficient
            ref, named = confidence
            layer = detected_layer(mg, ref, blocks, order["exit"], placed)
            order["exit"] += 1
            found.append(Coefficient(ref.name, "exit", layer, named, source="detected"))
            continue
        shape = mg.tensors[out].shape if out in mg.tensors else None
        if not shape:
            continue
        named = axes_of(mg, out, axes)
        width = axes.width(shape, None if out.scope else out.name)
        # narrower than the hidden state, or one score per token (a per-token router's (batch,
        # token); not attention's probabilities over the tokens, per query token)
        if not (width is not None and not (hidden and width > hidden)) and tuple(named) != (BATCH, TOKEN):
            continue
        if BATCH not in named and TOKEN not in named and (MERGED not in named or not batch_major(mg, out, axes)):
            continue
        use = _use(mg, node, out, hidden, dm, axes, squashed)
        if use is None:
            continue
        family = "router" if use == "route" else TOKEN_MIX if _over_tokens(squash, axis, named) else family
        columns = block_columns(mg, out, named, blocks, dm)
        if columns is not None:  # a policy for every block at once: each block's column is its coefficient
            found += [Coefficient(ref.name, family, layer, kept, source="detected") for ref, kept, layer in columns]
            placed.update(ref.name for ref, _, _ in columns)
            continue
        layer = detected_layer(mg, out, blocks, order[family], placed)
        order[family] += 1
        found.append(Coefficient(out.name, family, layer, named, source="detected"))
    return with_layers(mg, found, blocks, placed)


# Weights normalised over the tokens (Soft MoE's dispatch: each slot a mix of the tokens), a
# family apart from those normalised over slots: one global mean cannot stand for both.
TOKEN_MIX = "token-mix"


def _over_tokens(squash: str, axis: int | None, named: Sequence[str]) -> bool:
    """Whether a Softmax / LogSoftmax (`squash`) along `axis` runs along the token axis of its output."""
    if squash not in ("Softmax", "LogSoftmax") or axis is None or not named:
        return False
    return -len(named) <= axis < len(named) and named[axis] == TOKEN


def _axis(node: Node) -> int | None:
    """The axis of a standard Softmax / LogSoftmax (-1 where not given); None for any other node."""
    if node.op_type not in ("Softmax", "LogSoftmax") or node.domain:
        return None
    return next((a.i for a in node.proto.attribute if a.name == "axis"), -1)


# Reductions an early exit's confidence goes through on its way to the If it decides, and the
# logic that keeps a per-token exit's mask (CALM: exited |= confidence > threshold).
REDUCING = frozenset({"ReduceMax", "ReduceMin", "ReduceMean", "ReduceSum"})
_LOGIC = frozenset({"Or", "And", "Not", "Xor"})


def _exit_confidence(mg: ModelGraph, probs: TensorRef, axes: InputAxes) -> tuple[TensorRef, tuple[str, ...]] | None:
    """An early exit's confidence: the first reduction of the class probabilities `probs` that
    keeps a batch or token axis (the most probable class's probability per token), when the
    reductions and comparisons after it decide an If or a Loop, or which tokens a Where keeps
    (a per-token exit computed densely, CALM's where(exited, h, block(h))). Its width is the
    classes', which may exceed the hidden state's: it weights nothing, it decides whether later
    blocks run, or whether their results are kept."""
    todo, seen = [probs], {probs}
    first: tuple[TensorRef, tuple[str, ...]] | None = None
    while todo:
        current = todo.pop()
        for consumer in mg.consumers(current):
            if consumer.domain or consumer.scopes:
                continue
            if (consumer.op_type in DECIDING or consumer.op_type == "Where") and current in consumer.inputs[:2] \
                    and (consumer.op_type == "Loop" or current == consumer.inputs[0]):
                return first
            if consumer.op_type not in REDUCING and consumer.op_type not in PLUMBING and consumer.op_type not in _LOGIC:
                continue
            for out in consumer.outputs:
                if out is None or out in seen:
                    continue
                seen.add(out)
                todo.append(out)
                if first is None and consumer.op_type in REDUCING and out in mg.tensors and mg.tensors[out].shape:
                    named = axes_of(mg, out, axes)
                    if BATCH in named or TOKEN in named:
                        first = (out, named)
    return None


def _raw_routers(mg: ModelGraph, dm: DependenceMap) -> set[str]:
    """The linear routers whose raw scores choose by TopK, unsquashed (Mixture-of-Depths:
    Linear(D, 1) scores every token, the top k go through the block): each a MatMul / Gemm of
    the input's values by a constant weight into fewer features than it reads (not an LM head's
    logits over a vocabulary), reaching a TopK's data through PLUMBING only. Found from the
    TopKs, which are few, up."""
    found: set[str] = set()
    for top in mg.nodes.values():
        if top.op_type != "TopK" or top.domain or top.scopes or not top.inputs or top.inputs[0] is None:
            continue
        ref = top.inputs[0]
        for _ in range(16):
            node = mg.producer(ref)
            if node is None or node.domain:
                break
            if node.op_type in ("MatMul", "Gemm"):
                if linear_router(mg, node, dm):
                    found.add(node.id)
                break
            # up through what carries the scores: of a bias Add (TorchScript writes Add(bias, x)),
            # the operand computed from the input
            onward = [r for r in node.inputs if r is not None and dm.value(r) == VALUE]
            if node.op_type not in PLUMBING or not onward:
                break
            ref = onward[0]
    return found


def _use(mg: ModelGraph, producer: Node, ref: TensorRef, hidden: int | None, dm: DependenceMap,
         axes: InputAxes | None = None, squashed: Sequence[TensorRef | None] | None = None) -> str | None:
    """"gate" when `ref` weights a hidden-state tensor or decides an If / Loop, "route" when it
    routes, else None.

    A hidden-state tensor is computed from the input's values: a squashed activation that meets
    only a weight (BERT's pooler, Tanh into the classifier's Gemm) is a layer's input, not a gate.
    Nor is one that meets what its own input was computed from, element by element: that is an
    activation function written out (SiLU's x·σ(x), the tanh form of GELU, x·½·(1 + tanh(…x…))).
    A Tanh weighted by a Sigmoid or Softmax (a gated activation, tanh(a)·σ(b); a block ending in
    Tanh under its gate) is what the gate weights: the content, not a second gate. `squashed`: what
    the squashing reads (`producer`'s inputs; x of a sigmoid written out, whose last node reads 1 + e^-x).
    """
    sources = list(producer.inputs if squashed is None else squashed)
    own: set[TensorRef] | None = None
    for consumer, current in reached_consumers(mg, ref, limit=16):
        if routes(consumer, current):
            return "route"
        if consumer.op_type in DECIDING and not consumer.domain and current in consumer.inputs[:2] \
                and (consumer.op_type == "Loop" or current == consumer.inputs[0]):
            return "gate"  # it decides whether a branch runs (SkipNet's If) or how often a body does
        if consumer.op_type in GATING:
            others = [r for r in consumer.inputs if r is not None and r != current and r not in sources
                      and (last_width(mg, r) == hidden if hidden is not None else _scales(mg, current, r, axes))
                      and dm.value(r) == VALUE
                      and not (producer.op_type == "Tanh" and _squashed_by(mg, r) in GATE_SQUASHING)]
            if others:
                if own is None:
                    own = _elementwise_sources(mg, [r for r in sources if r is not None])
                if any(own.isdisjoint(_elementwise_sources(mg, [r])) for r in others):
                    return "gate"
            if consumer.op_type in ("MatMul", "Gemm") and _mixes_weights(mg, consumer, current, dm):
                return "gate"
    return None


# What a gate is squashed by, as against Tanh, which also squashes content (a block's output).
GATE_SQUASHING = frozenset({"Sigmoid", "HardSigmoid", "Softmax"})


def _squashed_by(mg: ModelGraph, ref: TensorRef) -> str | None:
    """The op type of what made `ref`, looking up through reshapes and slices (PLUMBING)."""
    for _ in range(16):
        node = mg.producer(ref)
        if node is None or node.domain:
            return None
        if node.op_type not in PLUMBING or not node.inputs or node.inputs[0] is None:
            return node.op_type
        ref = node.inputs[0]
    return None


WEIGHT_READERS = frozenset({"MatMul", "Gemm", "Conv", "ConvTranspose", "Einsum"})


def _mixes_weights(mg: ModelGraph, mix: Node, ref: TensorRef, dm: DependenceMap) -> bool:
    """Whether `ref`, of width K, mixes a stack of K weights into per-input weights that a layer
    then applies to its input (dynamic convolution, CondConv: W = Σ_k π_k W_k): the other
    operand is a constant (K, N) with N at least 4K, and the mixture reaches, through reshapes,
    a MatMul / Conv whose other operand is computed from the input. A squashed activation fed to
    an ordinary linear layer (a classifier's) meets a weight as wide as itself and makes an
    activation, not weights."""
    k = last_width(mg, ref)
    stack = next((r for r in mix.inputs if r is not None and r != ref), None)
    info = mg.tensors.get(stack) if stack is not None else None
    if not k or info is None or info.shape is None or len(info.shape) != 2 or dm.value(stack) == VALUE:
        return False
    if info.shape[0] != k or not isinstance(info.shape[1], int) or info.shape[1] < 4 * k:
        return False
    mixed = mix.outputs[0]
    if mixed is None:  # an omitted output: nothing reads the mixture
        return False
    for consumer, current in reached_consumers(mg, mixed, limit=16):
        if consumer.op_type in WEIGHT_READERS and any(
                r is not None and r != current and dm.value(r) == VALUE for r in consumer.inputs):
            return True
    return False


# Ops that compute element by element: an activation function written out is made of them.
_ELEMENTWISE = frozenset({"Add", "Sub", "Mul", "Div", "Pow", "Sqrt", "Tanh", "Erf", "Sigmoid", "Neg", "Abs", "Exp",
                          "Cast", "Identity", "Relu", "Softplus", "Reciprocal"})


def _elementwise_sources(mg: ModelGraph, refs: Sequence[TensorRef], limit: int = 24) -> set[TensorRef]:
    """The tensors `refs` are computed from element by element (themselves included), going up
    through element-wise ops only, as far as `limit` tensors."""
    seen: set[TensorRef] = set()
    todo = list(refs)
    while todo and len(seen) < limit:
        current = todo.pop()
        if current in seen:
            continue
        seen.add(current)
        node = mg.producer(current)
        if node is not None and not node.domain and node.op_type in _ELEMENTWISE:
            todo.extend(r for r in node.inputs if r is not None and mg.tensors.get(r) is not None
                        and mg.tensors[r].kind == "node_output")
    return seen


def _scales(mg: ModelGraph, gate: TensorRef, other: TensorRef, axes: InputAxes | None = None) -> bool:
    """Without a token axis to tell the hidden state by (a CNN's feature maps): whether `gate`
    scales `other` along some of its axes, as a squeeze-and-excitation gate of shape
    (batch, channels, 1, 1) scales a (batch, channels, height, width) feature map. Their first
    axes are the same size, or both the batch (TorchScript's view(-1, 1, 1, 1) leaves `unk__N`
    where the feature map keeps `batch`; the probe tells). Past the first, an axis of the gate
    that inference could not size (timm's selective kernels, view(B, paths, C // paths, 1, 1):
    `unk__N` where the feature map has its channels) may be any of the feature map's."""
    a, b = mg.tensors.get(gate), mg.tensors.get(other)
    if a is None or b is None or a.shape is None or b.shape is None or len(a.shape) != len(b.shape):
        return False
    if len(a.shape) < 2 or not all(x == 1 or x == y or _unsized(x) for x, y in zip(a.shape[1:], b.shape[1:])):
        return False
    return a.shape[0] == b.shape[0] or (axes is not None and _first_is_batch(a.shape, gate, axes)
                                        and _first_is_batch(b.shape, other, axes))


def _unsized(dim) -> bool:
    """Whether `dim` is a size inference could not tell: none at all, or one it named itself."""
    return dim is None or (isinstance(dim, str) and dim.startswith("unk__"))


def _first_is_batch(shape, ref: TensorRef, axes: InputAxes) -> bool:
    return axes.names(shape, None if ref.scope else ref.name)[:1] == [BATCH]


def _hidden_width(mg: ModelGraph, axes: InputAxes) -> int | None:
    """The hidden width: the most common fixed last dimension of what the normalisations with
    a token axis output, else of every tensor with a token axis (an MLP written out op by op
    can outnumber the residual stream's tensors at its own, wider width)."""
    def width(info) -> int | None:
        shape = info.shape if info is not None else None
        if shape and len(shape) >= 2 and isinstance(shape[-1], int) and TOKEN in axes.names(shape[:-1]):
            return shape[-1]
        return None

    normed = Counter(w for node in mg.nodes.values() if node.op_type in NORMALISATIONS and node.outputs
                     and node.outputs[0] is not None and (w := width(mg.tensors.get(node.outputs[0]))) is not None)
    if normed:
        return normed.most_common(1)[0][0]
    widths = Counter(w for info in mg.tensors.values() if info.kind == "node_output" and (w := width(info)) is not None)
    return widths.most_common(1)[0][0] if widths else None
