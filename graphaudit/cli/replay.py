"""`graphaudit replay`: Frozen-Controller Auditing of a model on calibration and evaluation data."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import click

from graphaudit.cli import REWRITE_HELP, output_kind_option
from graphaudit.cli.options import coefficient_options, feeding_options, output_options, ray_options
from graphaudit.limits import MAX_THREADS
from graphaudit.progress import ProgressBar
from graphaudit.replay.conditions import check_names
from graphaudit.replay.conditions import names as condition_names
from graphaudit.replay.settings import DEFAULT_TOLERANCE, MAX_RESAMPLES, ReplaySettings


@click.command("replay")
@click.argument("model", type=click.Path(dir_okay=False, path_type=str))
@click.option("--calib", required=True, type=click.Path(path_type=str),
              help="Calibration inputs (.npz): the static profiles are computed from these only.")
@click.option("--data", type=click.Path(path_type=str),
              help="Evaluation inputs (.npz) to replay; without it the calibration inputs are split into halves.")
@feeding_options
@coefficient_options("Coefficient tensors (repeatable or comma-separated; default: declared in the metadata, else "
                     "detected).", "NAME_OR_GLOB", split=lambda names: _split(names))
@click.option("--conditions", "conditions_given", multiple=True, metavar="NAME",
              help=f"Conditions to replay (repeatable or comma-separated; default all: {', '.join(condition_names())}).")
@click.option("--batch-size", type=click.IntRange(min=1),
              help="Inputs per ONNX Runtime run (capture and replay use the same batches); default 16, or 1 "
                   "when the graph has value-dependent control flow (it decides once per batch), or fewer "
                   "when one batch of the scored output would pass 256 MiB; a model whose inputs fix their "
                   "first dimension runs that many at a time.")
@click.option("--seed", type=click.IntRange(min=0), default=0, show_default=True,
              help="Seed of the permutations, the data split and the bootstrap.")
@click.option("--cache-dir", type=click.Path(file_okay=False, path_type=Path),
              help="Keep the captured coefficients here (memory-mapped) and reuse them on the next run, once "
                   "checked (a damaged cache is captured again, with a note).")
@click.option("--tolerance", type=click.FloatRange(min=0),
              help=f"Largest absolute output difference the parity check accepts (twice that on the "
                   f"log-probabilities of every input's targets). Default {DEFAULT_TOLERANCE:g}; for a model "
                   "computing in float16, 2^-7 of its largest live output magnitude.")
@click.option("--resamples", type=click.IntRange(1, MAX_RESAMPLES), default=1000, show_default=True,
              help="Bootstrap resamples over inputs for the confidence intervals.")
@click.option("--provider", type=click.Choice(["cpu", "cuda", "auto"]), default="auto", show_default=True,
              help="ONNX Runtime execution provider for the capture and the replay.")
@click.option("--threads", type=click.IntRange(1, MAX_THREADS),
              help="ONNX Runtime intra-op threads (default: ORT's choice, one per physical core). Fewer than "
                   "the cores leaves one to score each run while the next runs.")
@click.option("--keep-denormals", is_flag=True,
              help="Capture and replay with ONNX Runtime's default floating-point mode. By default their runs "
                   "flush denormal floats (below 1.2e-38) to zero: on x86-64 much faster where masked attention "
                   "scores underflow; it changes only values that small (the zoo's figures came out identical).")
@click.option("--no-rewrite", is_flag=True, help=REWRITE_HELP)
@ray_options
@output_kind_option
@output_options(["text", "json"], "Output format.")
def replay_cmd(model, calib, data, feeding, coefficients, conditions_given, batch_size, seed, cache_dir, tolerance,
               resamples, provider, threads, keep_denormals, no_rewrite, distributed, output_kinds, out) -> None:
    """Replay MODEL with its controller frozen: cache the coefficients, feed them back correct,
    from another input, shuffled over tokens, or as static profiles, and report how much worse
    the model gets (NLL, KL, retained gap) and how the coefficients' variance splits."""
    from graphaudit.analyses.output_kinds import parse_output_kinds
    from graphaudit.replay.pipeline import replay
    from graphaudit.report.jsondoc import command_json
    from graphaudit.report.replay_text import render_text

    conditions = _split(conditions_given) or condition_names()
    check_names(conditions, "--conditions")
    out.check((model, calib, data))
    settings = ReplaySettings(coefficients=coefficients.entries, conditions=conditions, batch_size=batch_size,
                              seed=seed, cache_dir=cache_dir, tolerance=tolerance, resamples=resamples,
                              provider=provider, threads=threads, flush_denormals=not keep_denormals,
                              rewrite=not no_rewrite, output_kinds=parse_output_kinds(output_kinds), feeding=feeding,
                              **distributed)
    report = replay(model, calib, data, settings, progress=ProgressBar(quiet=out.quiet))
    out.emit(command_json(report.to_json()) if out.fmt == "json" else render_text(report))


def _split(values: Sequence[str]) -> tuple[str, ...]:
    return tuple(v.strip() for value in values for v in value.split(",") if v.strip())
