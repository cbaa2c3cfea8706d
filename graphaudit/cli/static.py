"""`graphaudit static`: can any block be skipped or shrunk, read from the graph alone."""

from __future__ import annotations

import click

from graphaudit.cli import graph_only_option
from graphaudit.cli.options import coefficient_options, feeding_options, output_options
from graphaudit.errors import UsageError
from graphaudit.limits import check_shape
from graphaudit.vocabulary import EXPECTED_EXECUTION, STATIC_CLAIMS


@click.command("static")
@click.argument("model", type=click.Path(dir_okay=False, path_type=str))
@click.option("--block-pattern", metavar="REGEX",
              help="Regex that names a block in node names, name scopes or initializer names "
                   "(its first numeric group, or a group named `index`, is the block number).")
@coefficient_options("A coefficient tensor, by name or glob pattern (repeatable); added to the ones the model's "
                     "metadata declares.", "NAME_OR_GLOB")
@click.option("--shape", "shapes", multiple=True, metavar="NAME=DIMS",
              help="Concrete shape of a graph input for FLOP counting, e.g. input_ids=1,128 (repeatable).")
@click.option("--data", type=click.Path(dir_okay=False, path_type=str),
              help="An .npz file whose arrays (named after graph inputs) give the input shapes.")
@feeding_options
@graph_only_option
@output_options(["text", "json"], "Output format.", quiet="No line on stderr saying where the report went.")
@click.option("--claim", "claims", multiple=True, type=click.Choice(list(STATIC_CLAIMS)),
              help="A claim to check, as run --claim does: exit with status 3 when the graph contradicts it "
                   "(repeatable). dynamic-inference: the model itself can skip or shrink some compute; "
                   "static-execution: it cannot.")
@click.option("--expect", type=click.Choice(EXPECTED_EXECUTION), hidden=True,
              help="The older spelling of --claim: dynamic is dynamic-inference, static is static-execution.")
@click.pass_context
def static_cmd(ctx, model, block_pattern, coefficients, shapes, data, feeding, graph_only, out, claims,
               expect) -> None:
    """Audit MODEL's execution statically: blocks, per-block verdicts, coefficients and FLOPs.

    Verdicts: always, gated, masked (every path computed, then masked), subset (runs on a
    value-dependent subset of tokens) and branch (can be skipped). Only subset and branch
    can save compute.
    """
    from graphaudit.analyses.static import audit_static
    from graphaudit.load.data import data_shapes, input_specs
    from graphaudit.load.model import load_for_audit
    from graphaudit.report.jsondoc import command_json
    from graphaudit.report.static_text import render_text
    from graphaudit.runtime.sessions import custom_operators

    out.check((model, data))
    loaded = load_for_audit(model, graph_only=graph_only)
    specs = input_specs(loaded.model, feeding=feeding)  # names the model lacks are refused, --data or not
    given = data_shapes(data, specs, feeding) if data else {}
    given.update(_parse_shape(s) for s in shapes)
    report = audit_static(loaded, block_pattern=block_pattern, coefficients=coefficients.entries,
                          shapes=given or None)
    # operators ONNX Runtime lacks: the graph is audited, but replay / profile / run cannot run it
    lacking = custom_operators(loaded.model)
    out.emit(command_json({**report.to_json(), "runtime_lacks": lacking}) if out.fmt == "json"
             else render_text(report, lacking))
    asked = [*claims, *(c for c, execution in STATIC_CLAIMS.items() if execution == expect)]
    problem = next(filter(None, (report.contradiction(STATIC_CLAIMS[c]) for c in dict.fromkeys(asked))), None)
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
