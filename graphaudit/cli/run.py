"""`graphaudit run`: the three-property audit of a model, its verdict, and claims for CI."""

from __future__ import annotations

import click

from graphaudit.cli import REWRITE_HELP, output_kind_option
from graphaudit.cli.options import coefficient_options, feeding_options, output_options, ray_options, rounds_options
from graphaudit.limits import MAX_THREADS
from graphaudit.profile.settings import SAVINGS_RATIO_MAX, ProfileSettings
from graphaudit.progress import ProgressBar
from graphaudit.replay.settings import MAX_RESAMPLES, ReplaySettings
from graphaudit.report import FORMATS
from graphaudit.verdict.decide import CLAIM_FINDINGS, claims_status

EPILOG = """\b
Exit status: 0 when the audit ran (and every --claim is supported), 1 for a problem with
the model or data, 2 for bad usage, 3 when the audit refutes a --claim or did not measure
what it needs, 4 when none is refuted but one is inconclusive (compute-savings: the
latency ratio's interval over the timed rounds straddles the threshold; a smaller
--profile-precision or more --runs may decide it).
"""


@click.command("run", epilog=EPILOG)
@click.argument("model", type=click.Path(dir_okay=False, path_type=str))
@click.option("--calib", required=True, type=click.Path(dir_okay=False, path_type=str),
              help="Calibration inputs (.npz keyed by graph-input name); the static profiles come from them.")
@click.option("--data", type=click.Path(dir_okay=False, path_type=str),
              help="Evaluation inputs, disjoint from --calib, replayed and profiled "
                   "(default: the calibration inputs, split in halves for the replay).")
@feeding_options
@click.option("--baseline", type=click.Path(dir_okay=False, path_type=str),
              help="A dense model taking the same inputs; latency is compared against it.")
@coefficient_options(help="Coefficient tensor name or glob (repeatable; default: those the model's metadata declares).")
@click.option("--block-pattern", help="Regular expression naming the blocks (default: found from the graph).")
@click.option("--provider", type=click.Choice(["cpu", "cuda", "auto"]), default="auto", show_default=True,
              help="ONNX Runtime execution provider.")
@output_options(FORMATS, "Report format.")
@click.option("--claim", "claims", multiple=True, type=click.Choice(list(CLAIM_FINDINGS)),
              help="Exit with status 3 unless the audit supports this claim, 4 where it is inconclusive (repeatable).")
@click.option("--seed", type=click.IntRange(min=0), default=0, show_default=True,
              help="Seed of the replay's permutations and bootstrap.")
@rounds_options("profile-")
@click.option("--profile-until", "until", type=click.Choice(["answer", "precision"]), default="answer",
              show_default=True,
              help=f"With --baseline, when the timed rounds may stop short of --profile-precision: 'answer' once the "
                   f"compute-savings answer is decided (the ratio's interval wholly on one side of "
                   f"{SAVINGS_RATIO_MAX:.2f}×, read wider at each check so that together they miss at most half "
                   "as often as the verdict's 95% interval); 'precision' only at the precision or the budget, for "
                   "a ratio known to it.")
@click.option("--limit", type=int, help="Profile only the first N inputs.")
@click.option("--resamples", type=click.IntRange(1, MAX_RESAMPLES), default=1000, show_default=True,
              help="Bootstrap resamples for the intervals.")
@click.option("--threads", type=click.IntRange(1, MAX_THREADS),
              help="ONNX Runtime intra-op threads for the replay and the profile (default: ORT's choice, one "
                   "per physical core).")
@click.option("--keep-denormals", is_flag=True,
              help="Capture and replay with ONNX Runtime's default floating-point mode, as the profile always "
                   "runs. By default their runs flush denormal floats (below 1.2e-38) to zero: on x86-64 much "
                   "faster where masked attention scores underflow; it changes only values that small (the "
                   "zoo's figures came out identical).")
@click.option("--no-rewrite", is_flag=True, help=REWRITE_HELP)
@ray_options
@output_kind_option
@click.pass_context
def run_cmd(ctx, model, calib, data, feeding, baseline, coefficients, block_pattern, provider, out, claims, seed, rounds,
            until, limit, resamples, threads, keep_denormals, no_rewrite, distributed,
            output_kinds) -> None:
    """Audit MODEL: do its coefficients vary, does the frozen model depend on them, does it skip work?

    Runs the static audit of the graph, the frozen-controller replay (only when the model
    has coefficient tensors) and the runtime profile, then answers each question in plain
    words with the evidence it rests on.
    """
    from graphaudit.analyses.output_kinds import parse_output_kinds
    from graphaudit.audit import AuditSettings, audit

    out.check((model, calib, data, baseline))  # before the audit, which can take long
    settings = AuditSettings(
        replay=ReplaySettings(coefficients=coefficients.entries, seed=seed, resamples=resamples, provider=provider,
                              threads=threads, flush_denormals=not keep_denormals, rewrite=not no_rewrite,
                              output_kinds=parse_output_kinds(output_kinds), feeding=feeding, **distributed),
        profile=ProfileSettings(**rounds, provider=provider, threads=threads, limit=limit, block_pattern=block_pattern,
                                feeding=feeding, decide_at=SAVINGS_RATIO_MAX if until == "answer" else None),
        claims=claims)
    with ProgressBar(quiet=out.quiet) as bar:
        report = audit(model, calib, data, baseline, settings, progress=bar)
    out.emit(report.render(out.fmt), nl=False)
    for check in report.claims:
        if not check.supported:
            click.echo(f"graphaudit: claim {check.claim} {check.reason}", err=True)
    status = claims_status(report.claims)
    if status:
        ctx.exit(status)
