"""`graphaudit profile`: latency, per-block time, what ran per input, ratio to a baseline."""

from __future__ import annotations

import click

from graphaudit.cli import check_output
from graphaudit.cli.options import feeding_options, output_options, rounds_options
from graphaudit.errors import UsageError
from graphaudit.limits import MAX_THREADS
from graphaudit.profile.settings import OPT_LEVEL_NAMES, ProfileSettings
from graphaudit.progress import ProgressBar


@click.command("profile")
@click.argument("model", type=click.Path(dir_okay=False, path_type=str))
@click.option("--data", required=True, type=click.Path(dir_okay=False, path_type=str),
              help="Inputs (.npz keyed by graph-input name); each batch is one profiled input.")
@feeding_options
@click.option("--baseline", type=click.Path(dir_okay=False, path_type=str),
              help="A dense model taking the same inputs, timed in alternation with MODEL.")
@rounds_options()
@click.option("--decide-at", type=float, metavar="RATIO",
              help="With --baseline, the timed rounds may also stop short of --precision once the latency "
                   "ratio's interval lies wholly on one side of RATIO (0.95: is the model at least 5% faster?), "
                   "each check read wider so that together they miss at most half as often as a 95% interval, "
                   "as run's --profile-until answer does at 0.95 (default: only at --precision or the budget).")
@click.option("--batch-size", type=int,
              help="Examples per run; default 1, which shows per-input decisions (an If decides per batch), "
                   "or the model's own batch when its inputs fix their first dimension.")
@click.option("--limit", type=int, help="Use only the first N examples of the data.")
@click.option("--provider", type=click.Choice(["cpu", "cuda", "auto"]), default="auto", show_default=True,
              help="Execution provider; cuda fails when ONNX Runtime has no CUDA.")
@click.option("--opt-level", type=click.Choice(list(OPT_LEVEL_NAMES)), default="all", show_default=True,
              help="ORT graph optimisation level; 'disable' maps events one-to-one to nodes.")
@click.option("--threads", type=click.IntRange(1, MAX_THREADS), help="ORT intra-op threads (default: ORT's choice).")
@click.option("--block-pattern", help="Regex naming blocks (see graphaudit static); default: found from names.")
@click.option("--trace", type=click.Path(dir_okay=False, path_type=str),
              help="Write a Chrome-trace / Perfetto file with block annotations here.")
@click.option("--keep-profiles", type=click.Path(file_okay=False, path_type=str),
              help="Keep ORT's profiler files in this folder (default: a temporary one, removed).")
@output_options(["text", "json"], "Output format.", quiet="No progress bar (rounds run) and no line saying where the report went, on stderr.")
def profile_cmd(model, data, feeding, baseline, rounds, decide_at, batch_size, limit, provider,
                opt_level, threads, block_pattern, trace, keep_profiles, out) -> None:
    """Run MODEL on the inputs in --data: latency, per-block time and which blocks really ran.

    Each block's static verdict (graphaudit static) is checked against what ran.
    """
    from graphaudit.analyses.static import audit_static
    from graphaudit.load.data import data_shapes, input_specs
    from graphaudit.load.model import load_for_runtime
    from graphaudit.profile import profile_model
    from graphaudit.profile.baseline import check_same_inputs
    from graphaudit.profile.session import held_for_profile
    from graphaudit.report.jsondoc import command_json
    from graphaudit.report.profile_text import render_text

    if decide_at is not None and baseline is None:
        raise UsageError(f"expected --baseline with --decide-at (the ratio it decides is the model's latency over "
                         f"the baseline's), found --decide-at {decide_at:g} alone")
    out.check((model, data, baseline))
    if trace is not None:
        check_output(trace, "--trace", (model, data, baseline))
    settings = ProfileSettings(**rounds, decide_at=decide_at, batch_size=batch_size, provider=provider,
                               opt_level=opt_level, threads=threads, limit=limit, trace=trace,
                               keep_profiles=keep_profiles, block_pattern=block_pattern, feeding=feeding)
    loaded = load_for_runtime(model)
    # both graphs audited at the shape of one run of the data, as `run` audits them: where neither
    # depends on input values, the baseline's FLOPs are its count, and inputs of one shape all do
    # the same work (a sample's left out then widen nothing: profile.baseline.same_work)
    shapes = data_shapes(data, input_specs(loaded.model, feeding=feeding), feeding)
    static = audit_static(loaded, block_pattern=block_pattern, shapes=shapes)
    loaded = held_for_profile(loaded)  # its graph alone where the sessions read its file: the weights go
    base, base_static = None, None
    if baseline is not None:
        base = load_for_runtime(baseline)
        check_same_inputs(input_specs(loaded.model), input_specs(base.model), baseline)
        base_static = audit_static(base, shapes=shapes)
        base = held_for_profile(base)
    with ProgressBar(quiet=out.quiet) as bar:
        report = profile_model(loaded, data, settings, baseline=base, static=static, baseline_static=base_static,
                               progress=bar)
    out.emit(command_json(report.to_json()) if out.fmt == "json" else render_text(report))
