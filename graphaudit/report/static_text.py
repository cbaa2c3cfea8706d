"""`graphaudit static`'s report as terminal text: blocks and verdicts, coefficients, FLOPs."""

from __future__ import annotations

from collections.abc import Sequence

from tabulate import tabulate

from graphaudit.analyses.decisions import VALUE_DECIDERS, describe
from graphaudit.analyses.static import BlockReport, FlopSummary, StaticReport
from graphaudit.load.repair import repair_note
from graphaudit.wording import counted, flops_cell, pct, si, total_bound

_BOUND_MARKS: dict[str | None, str] = {"most": "≤ ", "least": "≥ "}  # of total_bound; None: one count


def _block_flops(b: BlockReport) -> str:
    """A block's FLOPs cell: "≥" where some compute has a size the graph does not fix, "≤" for the
    count with every row of a value-dependent selection selected."""
    return flops_cell(b.flops, b.uncounted, b.flops_every_row, b.flops_full_size, b.skippable_flops, si)


def _flop_lines(f: FlopSummary) -> list[str]:
    """The FLOPs: the most expensive run, what the cheapest saves, and how they were counted."""
    share = pct(f.skippable_share, missing="-", small=False)
    unknown = [n for n in f.count.unknown_shape if n not in set(f.every_row)]
    bound = _BOUND_MARKS.get(total_bound(bool(f.every_row), bool(unknown), f.skippable), "")
    how = f" ({'; '.join(f.basis)})" if f.basis else ""
    if f.skippable_uncounted:
        lines = [f"FLOPs: {bound}{si(f.total)} counted{how}, at least {si(f.skippable)} skippable ({share}): "
                 f"{f.skippable_uncounted} skippable compute nodes have a value-dependent size and are not counted"]
    else:
        at_most = "≤ " if bound == "≤ " else ""
        lines = [f"FLOPs: {bound}{si(f.total)} in total{how}, {at_most}{si(f.skippable)} "
                 f"skippable ({share}, "
                 "the upper bound on savings: the most expensive run less the cheapest)"]
    for loop in f.loops:
        counted = "" if loop.trips.most is not None else "; counted once in the total"
        lines.append(f"  {loop.trips.op} `{loop.trips.node}`: {si(loop.per_iteration)} per iteration, "
                     f"{loop.trips.how}{counted}")
    c = f.capacity
    if c is not None and c.blocks:
        lines.append(f"  fixed capacity: {', '.join(c.blocks)} run {si(c.flops)} at their selected size, against "
                     f"{si(c.full_size)} on every row: {si(c.saving)} saved on every input, whatever the "
                     "input (not skippable)")
    if c is not None and c.unsized:
        lines.append(f"  fixed capacity: {', '.join(c.unsized)} run at their selected size on every input (not "
                     "skippable); their size with every row selected was not found")
    if f.every_row:
        lines.append(f"  counted with every row selected (value-dependent size): {len(f.every_row)} nodes, "
                     f"e.g. {', '.join(f.every_row[:3])}")
    if unknown:
        lines.append(f"  not counted, size unknown (value-dependent or not inferred): "
                     f"{len(unknown)} nodes, e.g. {', '.join(unknown[:3])}")
    if f.count.uncounted:
        lines.append("  operators without a FLOP formula: " + ", ".join(f"{op} {n}" for op, n in f.count.uncounted))
    return lines


def _conditional_line(r: StaticReport) -> str:
    """Whether some compute runs or not as an input decides, who decides each, and the model's part."""
    who = [f"{d.op} `{d.node}` by {describe(d)}" for d in r.decisions if d.conditional and d.decided_by in VALUE_DECIDERS]
    shown = "; ".join(who[:4]) + (f"; {len(who) - 4} more" if len(who) > 4 else "")
    return (f"conditional execution: {'yes' if r.conditional_execution else 'no'}"
            + (f" (decided {shown})" if who else "")
            + f"; the model's own decisions: {'yes' if r.model_decides else 'no'}"
            + f"; data-dependent compute: {'yes' if r.data_dependent_compute else 'no'}")


def render_text(r: StaticReport, runtime_lacks: Sequence[str] = ()) -> str:
    """Return the static report as terminal text; `runtime_lacks`: the operators ONNX Runtime
    lacks, which the last line names (replay, profile and run cannot run the model)."""
    lines = [
        f"model: {r.model}  ({r.node_count} nodes, {r.nested_node_count} inside control flow or functions"
        + (f"; {counted(r.inlined_calls, 'call')} of local functions inlined" if r.inlined_calls else "") + ")",
        *([f"note: {repair_note(r.repairs)}"] if r.repairs else []),
        f"blocks: {r.block_method}",
        "",
    ]
    if r.blocks:
        rows = [(b.index, b.name, b.verdict, _block_flops(b), b.evidence[0].detail if b.evidence else "")
                for b in r.blocks]
        lines.append(tabulate(rows, headers=["#", "block", "verdict", "FLOPs", "evidence"],
                              maxcolwidths=[None, None, None, None, 80]))
        if any(b.flops_every_row is not None for b in r.blocks):
            lines.append("(≤: with every row of each value-dependent selection selected)")
        lines.append("")
    if r.coefficients:
        lines.append(tabulate([(c.tensor, c.family, c.layer, " × ".join(c.axes), c.source) for c in r.coefficients],
                              headers=["coefficient", "family", "layer", "axes", "source"]))
    else:
        lines.append("coefficients: none declared, named or detected")
    lines.append("")
    for ev in r.controls:
        lines.append(f"control flow: {ev.detail}")
    for ev in r.outside_blocks:
        lines.append(f"outside blocks: {ev.detail}")
    for reading in r.outputs:
        lines.append(f"output {reading.describe()}")
    lines.append(_conditional_line(r))
    if r.flops is None:
        lines.append("FLOPs: not counted (give --shape NAME=DIMS or --data FILE.npz)")
    else:
        lines.extend(_flop_lines(r.flops))
    text = "\n".join(lines)
    if runtime_lacks:
        text += (f"\nONNX Runtime lacks {', '.join(runtime_lacks)}: graphaudit replay, profile and run cannot run "
                 "this model")
    return text
