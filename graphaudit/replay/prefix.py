"""The frozen graph's shared prefix: what no coefficient reaches runs once per batch.

Every replay condition feeds the frozen graph the same inputs and different coefficients, so
each node that no coefficient input reaches (the embedding, the blocks before the first
controller) computes the same values in every condition. The pass `CutPrefix`
(graphaudit.replay.passes) cuts the frozen graph there: a *prefix* graph of those nodes, whose
outputs are the values the rest reads (the cut), and a *suffix* graph of the rest, which takes
the cut as graph inputs. What is computed from constants and the input's shapes alone (masks,
positions, shape arithmetic) is made in each part that reads it, not cut: cut, it became a
graph input ONNX Runtime could no longer fold, and a tiny model's replay (an HF Mixtral
classifier, hidden size 32) ran slower cut than whole. `PrefixSession` runs the prefix once for
a batch's inputs and the suffix once per condition, and answers `run` as the frozen graph's
session would. Both graphs are the frozen graph's own nodes, unchanged, so their outputs are
the frozen graph's up to what ONNX Runtime fuses across the cut (benchmarks/NOTES.md, replay).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx

from graphaudit.analyses.declared_coefficients import Coefficient
from graphaudit.load.protos import node_reads
from graphaudit.replay.passes import PassResult
from graphaudit.runtime.handed_weights import weights_apart
from graphaudit.runtime.sessions import PROVIDERS, create_session, slow_fusions

# Operators whose presence makes a prefix worth a session of its own
_COMPUTE = frozenset({"MatMul", "Gemm", "Conv", "ConvTranspose", "Einsum", "Attention", "MultiHeadAttention",
                      "FusedMatMul", "MatMulInteger", "QLinearMatMul", "LSTM", "GRU", "RNN"})


@dataclass(frozen=True)
class Split:
    """The frozen graph cut after what no coefficient reaches."""

    prefix: onnx.ModelProto = field(repr=False)
    suffix: onnx.ModelProto = field(repr=False)
    cut: tuple[str, ...]  # the prefix's outputs: values the suffix reads, or graph outputs the prefix makes
    prefix_inputs: tuple[str, ...]  # the graph inputs the prefix reads (weights listed as inputs left out)
    outputs: tuple[str, ...]  # the frozen graph's outputs, in order


@dataclass(frozen=True)
class CutPrefix:
    """The pass that cuts a frozen graph whose `coefficients` (tensor names) are graph inputs
    after the nodes no coefficient reaches (`_split`)."""

    coefficients: tuple[str, ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "coefficients", tuple(self.coefficients))

    def __call__(self, model: onnx.ModelProto, *, owned: bool = False) -> PassResult[Split | None]:
        """Return the suffix of the cut (the graph that runs once per condition, the cut among its
        inputs) and the Split; `model` itself and None where it is not worth cutting. The Split
        holds the suffix too: a pass run after this one changes both."""
        split = _split(model, self.coefficients)
        return PassResult(model, False, None) if split is None else PassResult(split.suffix, True, split)


def _split(frozen: onnx.ModelProto, coefficients: Sequence[str]) -> Split | None:
    """Cut `frozen` (a frozen graph whose `coefficients` are graph inputs) into the nodes no
    coefficient reaches and the rest; None when the first hold no matrix product or convolution
    (nothing worth running once), or the rest is empty.

    Constants and what is computed from shapes alone (a causal mask, positions, shape
    arithmetic) are cheap and let ONNX Runtime fold and specialise: they are never cut, but
    given to each part that reads them. The cut holds values computed from the input's values."""
    graph = frozen.graph
    nodes = list(graph.node)  # in topological order, as ONNX requires
    reads = {id(n): node_reads(n) for n in nodes}
    reached, cheap = set(coefficients), _cheap(graph, nodes, reads, coefficients)
    late = set()  # the nodes a coefficient reaches: id()s
    for node in nodes:
        if reads[id(node)] & reached:
            late.add(id(node))
            reached.update(o for o in node.output if o)
    early = [n for n in nodes if id(n) not in late]
    outputs = [o.name for o in graph.output]
    # the rest, with the cheap values it reads or gives out made again in it
    cheap_early = [n for n in early if _all_cheap(n, cheap)]
    suffix = _needed(nodes, reads, [n for n in nodes if id(n) in late or (
        _all_cheap(n, cheap) and set(n.output) & set(outputs))], cheap_early)
    made = {o for n in early if not _all_cheap(n, cheap) for o in n.output if o}
    suffix_made = {o for n in suffix for o in n.output if o}
    # what the rest reads, and gives out as it is (a graph input passed through to an output)
    suffix_reads = set().union(*(reads[id(n)] for n in suffix)) | (set(outputs) - suffix_made - made)
    cut = tuple(sorted(made & (suffix_reads | set(outputs))))
    prefix = _needed(nodes, reads, [n for n in early if set(n.output) & set(cut)], early)
    if not suffix or not cut or not any(n.op_type in _COMPUTE and n.domain in ("", "ai.onnx", "com.microsoft")
                                        for n in prefix):
        return None
    types = _types(frozen)
    if any(name not in types for name in cut):  # a value of unknown type cannot be a graph input
        return None
    prefix_reads = set().union(*(reads[id(n)] for n in prefix))
    weights = {t.name for t in graph.initializer}  # an older IR lists them among the inputs too
    prefix_inputs = tuple(i.name for i in graph.input if i.name in prefix_reads and i.name not in weights)
    pre = _model(frozen, prefix, [i for i in graph.input if i.name in prefix_reads], [types[c] for c in cut],
                 prefix_reads)
    suf = _model(frozen, suffix, [i for i in graph.input if i.name in suffix_reads] + [types[c] for c in cut
                                                                                       if c in suffix_reads],
                 [o for o in graph.output if o.name not in made], suffix_reads)
    return Split(pre, suf, cut, prefix_inputs, tuple(outputs))


def _cheap(graph: onnx.GraphProto, nodes, reads, coefficients: Sequence[str]) -> set[str]:
    """The values computed from constants and the inputs' shapes alone, not from any input's
    values (`Shape` and `Size` read only a shape)."""
    valued = {i.name for i in graph.input} - {t.name for t in graph.initializer}
    valued |= set(coefficients)
    cheap: set[str] = set()
    for node in nodes:
        if node.op_type in ("Shape", "Size") and not node.domain:
            outputs_valued = False
        else:
            outputs_valued = bool(reads[id(node)] & valued)
        (valued if outputs_valued else cheap).update(o for o in node.output if o)
    return cheap


def _all_cheap(node: onnx.NodeProto, cheap: set[str]) -> bool:
    return all(o in cheap for o in node.output if o)


def _needed(nodes: list[onnx.NodeProto], reads: dict[int, set[str]], wanted: list[onnx.NodeProto],
            candidates: list[onnx.NodeProto]) -> list[onnx.NodeProto]:
    """`wanted`, with the `candidates` whose values they read (and what those read), in the
    graph's order (`reads`: each node's reads by id)."""
    keep = {id(n) for n in wanted}
    allowed = {id(n) for n in candidates}
    needed = set().union(*(reads[id(n)] for n in wanted)) if wanted else set()
    for node in reversed(nodes):
        if id(node) in allowed and id(node) not in keep and set(node.output) & needed:
            keep.add(id(node))
            needed |= reads[id(node)]
    return [n for n in nodes if id(n) in keep]


def _types(model: onnx.ModelProto) -> dict[str, onnx.ValueInfoProto]:
    """Each value's type (element type at least) by name, as the frozen graph declares them
    (the loader wrote shape inference's findings into it)."""
    found: dict[str, onnx.ValueInfoProto] = {}
    for v in (*model.graph.value_info, *model.graph.output):
        if v.type.HasField("tensor_type") and v.type.tensor_type.elem_type:
            found.setdefault(v.name, v)
    return found


def _model(frozen: onnx.ModelProto, nodes, inputs, outputs, reads: set[str]) -> onnx.ModelProto:
    graph = onnx.helper.make_graph(nodes, frozen.graph.name, inputs, outputs,
                                   initializer=[t for t in frozen.graph.initializer if t.name in reads])
    graph.sparse_initializer.extend(t for t in frozen.graph.sparse_initializer if t.values.name in reads)
    model = onnx.helper.make_model(graph, opset_imports=frozen.opset_import, ir_version=frozen.ir_version)
    model.functions.extend(frozen.functions)
    return model


class PrefixSession:
    """Runs a Split as one session of the frozen graph: the prefix once for a batch's inputs,
    the suffix for every `run`. A batch's inputs are known by the arrays themselves (the
    replay hands every condition of a batch the same ones, and never changes them); the cache
    holds them, so no other array can take their place."""

    def __init__(self, split: Split, prefix_session, suffix_session) -> None:
        self.split, self.prefix, self.suffix = split, prefix_session, suffix_session
        self._key: tuple | None = None  # the arrays the cut values were computed from
        self._cut: dict[str, np.ndarray] = {}
        names = [i.name for i in suffix_session.get_inputs()]  # weights listed as inputs not among them
        self._suffix_cut = [n for n in names if n in split.cut]
        self._suffix_inputs = [n for n in names if n not in split.cut]

    def run(self, fetch: Sequence[str] | None, feeds: Mapping[str, np.ndarray]):
        arrays = tuple(feeds[name] for name in self.split.prefix_inputs)
        if self._key is None or len(arrays) != len(self._key) or any(a is not b for a, b in zip(arrays, self._key)):
            values = self.prefix.run(list(self.split.cut), {n: feeds[n] for n in self.split.prefix_inputs})
            self._key, self._cut = arrays, dict(zip(self.split.cut, values))
        fetch = list(fetch) if fetch is not None else list(self.split.outputs)
        mine = [name for name in fetch if name not in self._cut]
        fed = {**{name: feeds[name] for name in self._suffix_inputs if name in feeds},
               **{name: self._cut[name] for name in self._suffix_cut}}
        ran = dict(zip(mine, self.suffix.run(mine, fed))) if mine else {}
        return [ran[name] if name in ran else self._cut[name] for name in fetch]

    def get_outputs(self):
        """The frozen graph's outputs, in its order, from whichever graph makes each."""
        made = {o.name: o for o in (*self.prefix.get_outputs(), *self.suffix.get_outputs())}
        return [made[name] for name in self.split.outputs]

    def get_inputs(self):
        """The frozen graph's inputs: the prefix's, then the suffix's own (the cut left out)."""
        seen = set(self.split.prefix_inputs) | set(self.split.cut)
        return [*self.prefix.get_inputs(), *(i for i in self.suffix.get_inputs() if i.name not in seen)]

    def __getattr__(self, name: str):
        return getattr(self.suffix, name)


def open_frozen(frozen: onnx.ModelProto, coefficients: Sequence[Coefficient], providers: list[str],
                weights_folder=None, threads: int | None = None, flush_denormals: bool = True,
                qdq_fusions: bool = True, weights: Mapping[str, np.ndarray] | None = None,
                profile_prefix: Path | None = None):
    """The replay's session of `frozen`: on the CPU, a PrefixSession where a part no coefficient
    reaches holds compute worth running once per batch (`CutPrefix`), else one session of the
    whole graph. The prefix's threads do not spin after its run: spinning, they slowed the rest's
    runs more than the cut saved (benchmarks/NOTES.md, replay). On an accelerator the cut would move
    its values to the host and back for every condition, so the whole graph runs there.

    Large inline weights are taken out once (`weights_apart`) and handed to both parts' sessions
    as the same arrays: copied into each part, a 282 MB model's two sessions took 2 s longer to
    open than its whole graph's one. `weights`: the arrays of weights `frozen` holds as stubs
    already (taken out of the model once for the whole replay: `steps.held_apart`).
    `profile_prefix`: each session profiled by ONNX Runtime, its file at this prefix and the
    part's name (`-whole`, `-prefix`, `-suffix`)."""
    def opened(model: onnx.ModelProto, part: str, spinning: bool = True, weights=None):
        profiled = profile_prefix.with_name(f"{profile_prefix.name}-{part}") if profile_prefix is not None else None
        return create_session(model, providers, disabled_optimizers=slow_fusions(providers),
                              weights_folder=weights_folder, threads=threads, flush_denormals=flush_denormals,
                              spinning=spinning, weights=weights, qdq_fusions=qdq_fusions, profile_prefix=profiled)

    if providers[0] != PROVIDERS["cpu"]:
        return opened(frozen, "whole", weights=weights)
    skeleton, names, arrays = weights_apart(frozen)
    handed = {**(weights or {}), **dict(zip(names, arrays))}
    split = CutPrefix(tuple(c.tensor for c in coefficients))(skeleton).details
    if split is None:
        return opened(skeleton, "whole", weights=handed)
    return PrefixSession(split, opened(split.prefix, "prefix", spinning=False, weights=handed),
                         opened(split.suffix, "suffix", weights=handed))
