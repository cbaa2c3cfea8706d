"""`graphaudit static`: can any block be skipped or shrunk, read from the graph alone."""

from __future__ import annotations

import click
from tabulate import tabulate

from graphaudit.analyses.decisions import VALUE_DECIDERS, describe
from graphaudit.analyses.static import CLAIMS, BlockReport, FlopSummary, StaticReport, audit_static
from graphaudit.load.data import data_shapes, input_specs
from graphaudit.errors import UsageError
from graphaudit.cli import axes_option, feeding_of, feeding_options, graph_only_option, with_axes
from graphaudit.load.model import load_for_audit
from graphaudit.load.repair import repair_note
from graphaudit.runtime.sessions import custom_operators
from graphaudit.limits import check_shape
from graphaudit.wording import counted, flops_cell, total_bound
from graphaudit.report.jsondoc import command_json


@click.command("static")
@click.argument("model", type=click.Path(dir_okay=False, path_type=str))
@click.option("--block-pattern", metavar="REGEX",
              help="Regex that names a block in node names, name scopes or initializer names "
                   "(its first numeric group, or a group named `index`, is the block number).")
@click.option("--coefficients", "coefficients", multiple=True, metavar="NAME_OR_GLOB",
              help="A coefficient tensor, by name or glob pattern (repeatable); added to the ones "
                   "the model's metadata declares.")
@axes_option
@click.option("--shape", "shapes", multiple=True, metavar="NAME=DIMS",
              help="Concrete shape of a graph input for FLOP counting, e.g. input_ids=1,128 (repeatable).")
@click.option("--data", type=click.Path(dir_okay=False, path_type=str),
              help="An .npz file whose arrays (named after graph inputs) give the input shapes.")
@feeding_options
@graph_only_option
@click.option("--format", "fmt", type=click.Choice(["text", "json"]), default="text", show_default=True,
              help="Output format.")
@click.option("--expect", type=click.Choice(CLAIMS),
              help="A claim to check: exit with status 3 when the graph contradicts it.")
@click.pass_context
def static_cmd(ctx, model, block_pattern, coefficients, axes, shapes, data, set_values, input_axes, graph_only, fmt,
               expect) -> None:
    """Audit MODEL's execution statically: blocks, per-block verdicts, coefficients and FLOPs.

    Verdicts: always, gated, masked (every path computed, then masked), subset (runs on a
    value-dependent subset of tokens) and branch (can be skipped). Only subset and branch
    can save compute.
    """
    loaded = load_for_audit(model, graph_only=graph_only)
    feeding = feeding_of(set_values, input_axes)
    specs = input_specs(loaded.model, feeding=feeding)  # names the model lacks are refused, --data or not
    given = data_shapes(data, specs, feeding) if data else {}
    given.update(_parse_shape(s) for s in shapes)
    report = audit_static(loaded, block_pattern=block_pattern, coefficients=with_axes(coefficients, axes),
                          shapes=given or None)
    # operators ONNX Runtime lacks: the graph is audited, but replay / profile / run cannot run it
    lacking = custom_operators(loaded.model)
    if fmt == "json":
        click.echo(command_json({**report.to_json(), "runtime_lacks": lacking}))
    else:
        click.echo(render_text(report) + (f"\nONNX Runtime lacks {', '.join(lacking)}: graphaudit replay, profile "
                                          "and run cannot run this model" if lacking else ""))
    problem = report.contradiction(expect) if expect else None
    if problem:
        click.echo(f"graphaudit: claim refuted: {problem}", err=True)
        ctx.exit(3)


def _parse_shape(text: str) -> tuple[str, tuple[int, ...]]:
    name, sep, dims = text.partition("=")
    try:
        values = tuple(int(d) for d in dims.replace("x", ",").split(",") if d.strip())
    except ValueError:
        values = ()
    if not sep or not name or not values or any(v <= 0 for v in values):
        raise UsageError(f"expected --shape NAME=DIMS with positive integer dims (e.g. input_ids=1,128), found {text!r}")
    return name, check_shape(values, f"--shape {name}", least=1, exit_code=2)


def _flops(n: int | None) -> str:
    if n is None:
        return "-"
    for unit, scale in (("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if n >= scale:
            return f"{n / scale:.2f} {unit}"
    return str(n)


def _block_flops(b: BlockReport) -> str:
    """A block's FLOPs cell: "≥" where some compute has a size the graph does not fix, "≤" for the
    count with every row of a value-dependent selection selected."""
    return flops_cell(b.flops, b.uncounted, b.flops_every_row, b.flops_full_size, b.skippable_flops, _flops)


def _flop_lines(f: FlopSummary) -> list[str]:
    """The FLOPs: the most expensive run, what the cheapest saves, and how they were counted."""
    share = "-" if f.skippable_share is None else f"{100 * f.skippable_share:.1f}%"
    unknown = [n for n in f.count.unknown_shape if n not in set(f.every_row)]
    bound = {"most": "≤ ", "least": "≥ "}.get(total_bound(bool(f.every_row), bool(unknown), f.skippable), "")
    how = f" ({'; '.join(f.basis)})" if f.basis else ""
    if f.skippable_uncounted:
        lines = [f"FLOPs: {bound}{_flops(f.total)} counted{how}, at least {_flops(f.skippable)} skippable ({share}): "
                 f"{f.skippable_uncounted} skippable compute nodes have a value-dependent size and are not counted"]
    else:
        at_most = "≤ " if bound == "≤ " else ""
        lines = [f"FLOPs: {bound}{_flops(f.total)} in total{how}, {at_most}{_flops(f.skippable)} "
                 f"skippable ({share}, "
                 "the upper bound on savings: the most expensive run less the cheapest)"]
    for loop in f.loops:
        counted = "" if loop.trips.most is not None else "; counted once in the total"
        lines.append(f"  {loop.trips.op} `{loop.trips.node}`: {_flops(loop.per_iteration)} per iteration, "
                     f"{loop.trips.how}{counted}")
    c = f.capacity
    if c is not None and c.blocks:
        lines.append(f"  fixed capacity: {', '.join(c.blocks)} run {_flops(c.flops)} at their selected size, against "
                     f"{_flops(c.full_size)} on every row: {_flops(c.saving)} saved on every input, whatever the "
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


def render_text(r: StaticReport) -> str:
    """The report as terminal text."""
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
    return "\n".join(lines)
