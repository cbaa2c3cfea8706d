"""The static execution audit: every analysis of the graph alone, assembled in one report.

`audit_static(loaded)` builds the graph, finds its blocks and coefficients, reads what every
tensor depends on, gives each block a verdict with its evidence and, for concrete input
shapes, counts FLOPs per block and the share that sits where compute can be skipped or
shrunk (the upper bound on what dynamic execution could save): the most expensive run of
the graph against the cheapest one that input values can choose (`analyses.flop_paths`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

import onnx

from graphaudit.analyses.block_verdicts import Evidence, execution_verdicts
from graphaudit.analyses.blocks import find_blocks
from graphaudit.analyses.coefficients import resolve_coefficients
from graphaudit.analyses.decisions import MODEL, Decision
from graphaudit.analyses.declared_coefficients import Coefficient
from graphaudit.analyses.dependence import analyse_dependence
from graphaudit.analyses.flops import FlopCount
from graphaudit.analyses.loop_trips import constant_values
from graphaudit.analyses.output_kinds import OutputKind, read_outputs
from graphaudit.analyses.static_flops import Capacity, LoopFlops, small_initializers, static_flops
from graphaudit.analyses.switches import SWITCH
from graphaudit.graph.build import build_graph, paused_gc
from graphaudit.graph.model import ModelGraph
from graphaudit.load.model import LoadedModel, load_model
from graphaudit.vocabulary import SAVES_COMPUTE


@dataclass(frozen=True)
class BlockReport:
    """One block: its verdict, evidence, size in nodes and, given shapes, its FLOPs."""

    index: int
    name: str
    verdict: str
    evidence: tuple[Evidence, ...]
    nodes: int
    flops: int | None  # in the most expensive run (the larger branch of an If, a loop's most iterations)
    skippable_flops: int | None  # what the cheapest run that input values can choose saves against it
    uncounted: int = 0  # the block's compute nodes of unknown size, left out of `flops`
    flops_every_row: int | None = None  # with every row of each value-dependent selection selected
    flops_full_size: int | None = None  # a block of fixed capacity: its FLOPs on every row

    def to_json(self) -> dict:
        return {
            "index": self.index,
            "name": self.name,
            "verdict": self.verdict,
            "flops": self.flops,
            "flops_uncounted_nodes": self.uncounted,
            "flops_every_row_selected": self.flops_every_row,
            "flops_full_size": self.flops_full_size,
            "skippable_flops": self.skippable_flops,
            "nodes": self.nodes,
            "evidence": [e.to_json() for e in self.evidence],
        }


@dataclass(frozen=True)
class FlopSummary:
    """FLOPs at the given input shapes: in total, in blocks, and where they can be saved.

    `total` is the most expensive run (`basis` says how it is counted), `skippable` what the
    cheapest run that input values can choose saves against it."""

    shapes: tuple[tuple[str, tuple[int, ...]], ...]
    total: int
    skippable: int
    outside_blocks: int
    count: FlopCount
    skippable_uncounted: int = 0  # skippable compute nodes whose size is unknown, in no count
    every_row: tuple[str, ...] = ()  # nodes of a value-dependent size, counted with every row selected
    loops: tuple[LoopFlops, ...] = ()
    capacity: Capacity | None = None
    basis: tuple[str, ...] = ()

    @property
    def skippable_share(self) -> float | None:
        return self.skippable / self.total if self.total else None

    @property
    def open_loops(self) -> tuple[str, ...]:
        """Loops with no bound on their trip count: the total counts one iteration of each."""
        return tuple(loop.trips.node for loop in self.loops if loop.trips.most is None)

    def to_json(self) -> dict:
        return {
            "shapes": {name: list(dims) for name, dims in self.shapes},
            "total": self.total,
            "least": self.total - self.skippable,
            "skippable": self.skippable,
            "skippable_share": self.skippable_share,
            "skippable_uncounted_nodes": self.skippable_uncounted,
            "outside_blocks": self.outside_blocks,
            **{k: v for k, v in self.count.to_json().items() if k != "total"},
            "every_row_selected_nodes": list(self.every_row),
            "loops": [loop.to_json() for loop in self.loops],
            "open_loops": list(self.open_loops),
            "fixed_capacity": self.capacity.to_json() if self.capacity else None,
            "counted_as": list(self.basis),
            "note": "the most expensive run at these shapes: "
                    + ("; ".join(self.basis) if self.basis else "every node once (no control flow with compute)"),
        }


@dataclass(frozen=True)
class StaticReport:
    """What the graph alone says about execution: blocks, verdicts, coefficients, FLOPs."""

    model: str
    node_count: int
    nested_node_count: int
    block_method: str
    blocks: tuple[BlockReport, ...]
    coefficients: tuple[Coefficient, ...]
    conditional_execution: bool
    data_dependent_compute: bool
    controls: tuple[Evidence, ...]
    outside_blocks: tuple[Evidence, ...]
    flops: FlopSummary | None
    inlined_calls: int = 0  # calls of local functions inlined at load (graphaudit.load.inline)
    repairs: tuple[str, ...] = ()  # what the loader repaired in memory (graphaudit.load.repair), in words
    decisions: tuple[Decision, ...] = ()  # who decides each If and Loop
    model_decides: bool = False  # some conditional execution is the model's own decision
    outputs: tuple[OutputKind, ...] = ()  # what each graph output holds, read from the graph

    @property
    def dynamic(self) -> bool:
        """Whether the model itself can skip or shrink some compute for some inputs (its own
        decisions, not the caller's switches)."""
        return self.model_decides or self.data_dependent_compute

    @property
    def fixed_work(self) -> bool:
        """Whether every run fed the counted shapes executes the whole FLOP count: each node
        counted once at a size those shapes fix, and nothing the input values decide (no
        conditional If or Loop, whoever decides it; no selection, capacity or loop; no compute
        node of unknown size)."""
        flops = self.flops
        if flops is None or self.dynamic or self.conditional_execution or self.outside_blocks:
            return False
        if any(d.conditional for d in self.decisions):
            return False
        # `basis` empty: the total needed no word on how it was counted (a branch, a trip count,
        # every row selected, a node left out), so it is every node once
        return (not flops.basis and flops.skippable == 0 and not flops.skippable_uncounted and not flops.every_row
                and not flops.loops and flops.capacity is None and not flops.count.unknown_shape)

    @property
    def deciders(self) -> dict[str, str]:
        """If / Loop id -> who decides it (caller, shape, constant, model)."""
        return {d.node: d.decided_by for d in self.decisions}

    def contradiction(self, claim: str) -> str | None:
        """Why the graph contradicts `claim` ("dynamic" or "static"), or None when it does not."""
        if claim == "static" and self.dynamic:
            found = [e for e in self.controls if e.dependence == "value" and e.kind != SWITCH
                     and self.deciders.get(e.node, MODEL) == MODEL] + [
                e for b in self.blocks if b.verdict in SAVES_COMPUTE for e in b.evidence[:1]
            ] + list(self.outside_blocks)
            where = "; ".join(dict.fromkeys(f"{e.op} `{e.node}`" for e in found))
            where = "; ".join(where.split("; ")[:3])
            what = "conditional execution the model decides" if self.model_decides else "data-dependent compute"
            return f"expected static execution, found {what} ({where})"
        if claim == "dynamic" and not self.dynamic:
            verdicts = sorted({b.verdict for b in self.blocks}) or ["no blocks"]
            return (f"expected dynamic execution, found every node running at a size set by input shapes "
                    f"(block verdicts: {', '.join(verdicts)}; no value-dependent If, Loop or selection)")
        return None

    def to_json(self) -> dict:
        return {
            "model": self.model,
            "nodes": self.node_count,
            "nested_nodes": self.nested_node_count,
            "inlined_function_calls": self.inlined_calls,
            "repairs": list(self.repairs),
            "block_method": self.block_method,
            "blocks": [b.to_json() for b in self.blocks],
            "coefficients": [c.to_json() for c in self.coefficients],
            "conditional_execution": self.conditional_execution,
            "decided_by": {d.node: d.decided_by for d in self.decisions if d.conditional},
            "decisions": [d.to_json() for d in self.decisions],
            "data_dependent_compute": self.data_dependent_compute,
            "dynamic": self.dynamic,
            "control_flow": [e.to_json() for e in self.controls],
            "outside_blocks": [e.to_json() for e in self.outside_blocks],
            "flops": self.flops.to_json() if self.flops else None,
            "outputs": [{"output": o.output, **o.to_json()} for o in self.outputs],
        }


def audit_static(
    loaded: LoadedModel | onnx.ModelProto,
    *,
    block_pattern: str | None = None,
    coefficients: Sequence[str] = (),
    shapes: Mapping[str, Sequence[int]] | None = None,
    graph: ModelGraph | None = None,
) -> StaticReport:
    """Return the StaticReport of `loaded`; FLOPs are counted when `shapes` are given (or
    every input shape is fixed). `graph`: the graph model of `loaded`, when the caller has built it."""
    if isinstance(loaded, onnx.ModelProto):
        loaded = load_model(loaded, weights=False)  # the graph is all a static audit reads
    with paused_gc():
        return _audit(loaded, block_pattern, coefficients, shapes, graph)


def _audit(loaded: LoadedModel, block_pattern, coefficients, shapes, mg: ModelGraph | None) -> StaticReport:
    mg = mg or build_graph(loaded.model)
    dm = analyse_dependence(mg)
    blocks = find_blocks(mg, block_pattern)
    coefs = resolve_coefficients(loaded, mg, coefficients, blocks=blocks, dependence=dm)
    verdicts = execution_verdicts(mg, blocks, coefs, dm, constant_values(mg, small_initializers(loaded.model)))
    input_shapes = [mg.tensors[r].shape for r in mg.inputs if r in mg.tensors]
    fixed = all(s is not None and all(isinstance(d, int) for d in s) for s in input_shapes)
    at = shapes or ({r.name: mg.tensors[r].shape for r in mg.inputs if r in mg.tensors} if fixed else None)
    counted = static_flops(loaded.model, mg, dm, verdicts, shapes or {}, at) if shapes is not None or fixed else None
    reports = []
    for bv in verdicts.blocks:
        b = counted.blocks[bv.block.index] if counted else None
        reports.append(BlockReport(bv.block.index, bv.block.name, bv.verdict, bv.evidence, len(bv.block.node_ids),
                                   b.flops if b else None, b.skippable if b else None, b.uncounted if b else 0,
                                   b.every_row if b else None, b.full_size if b else None))
    summary = None
    if counted is not None:
        summary = FlopSummary(
            shapes=tuple((k, tuple(int(d) for d in v)) for k, v in (shapes or {}).items()),
            total=counted.run.most,
            skippable=counted.run.varies,
            outside_blocks=counted.outside_blocks,
            count=counted.count,
            skippable_uncounted=counted.skippable_uncounted,
            every_row=counted.every_row,
            loops=counted.loops,
            capacity=counted.capacity,
            basis=counted.basis,
        )
    return StaticReport(
        model=loaded.name,
        node_count=len(mg.nodes),
        nested_node_count=sum(1 for n in mg.nodes.values() if n.scopes),
        block_method=blocks.method,
        blocks=tuple(reports),
        coefficients=coefs,
        conditional_execution=verdicts.conditional_execution,
        data_dependent_compute=verdicts.data_dependent_compute,
        controls=verdicts.controls,
        outside_blocks=verdicts.outside,
        flops=summary,
        inlined_calls=loaded.inlined_calls,
        repairs=loaded.repairs,
        decisions=tuple(replace(d, blocks=_blocks_inside(mg, d.node, verdicts)) for d in verdicts.decisions),
        model_decides=verdicts.model_decides,
        outputs=tuple(read_outputs(loaded.model, graph_model=mg).values()),
    )


def _blocks_inside(mg: ModelGraph, owner: str, verdicts) -> tuple[str, ...]:
    """The blocks with compute nodes inside the If or Loop `owner`."""
    inside = {n.id for n in mg.inside(owner)}
    return tuple(bv.block.name for bv in verdicts.blocks if not inside.isdisjoint(bv.block.node_ids))
