"""`graphaudit replay`: Frozen-Controller Auditing of a model on calibration and evaluation data."""

from __future__ import annotations

import math
from pathlib import Path

import click
from tabulate import tabulate

from graphaudit.analyses.output_kinds import parse_output_kinds
from graphaudit.cli import REWRITE_HELP, axes_option, feeding_of, feeding_options, output_kind_option, with_axes
from graphaudit.replay.conditions import CONDITIONS
from graphaudit.errors import UsageError
from graphaudit.progress import ProgressBar
from graphaudit.replay.parity import DEFAULT_TOLERANCE
from graphaudit.replay.pipeline import MAX_RESAMPLES, ReplayReport, replay
from graphaudit.runtime.sessions import MAX_THREADS
from graphaudit.verdict.decide import MATERIAL_NATS
from graphaudit.report.jsondoc import command_json


@click.command("replay")
@click.argument("model", type=click.Path(dir_okay=False, path_type=str))
@click.option("--calib", required=True, type=click.Path(path_type=str),
              help="Calibration inputs (.npz): the static profiles are computed from these only.")
@click.option("--data", type=click.Path(path_type=str),
              help="Evaluation inputs (.npz) to replay; without it the calibration inputs are split into halves.")
@feeding_options
@click.option("--coefficients", "names", multiple=True, metavar="NAME_OR_GLOB",
              help="Coefficient tensors (repeatable or comma-separated; default: declared in the metadata, else detected).")
@axes_option
@click.option("--conditions", "condition_names", multiple=True, metavar="NAME",
              help=f"Conditions to replay (repeatable or comma-separated; default all: {', '.join(CONDITIONS)}).")
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
@click.option("--provider", type=click.Choice(["cpu", "cuda", "auto"]), default="cpu", show_default=True,
              help="ONNX Runtime execution provider for the capture and the replay.")
@click.option("--threads", type=click.IntRange(1, MAX_THREADS),
              help="ONNX Runtime intra-op threads (default: ORT's choice, one per physical core). Fewer than "
                   "the cores leaves one to score each run while the next runs.")
@click.option("--keep-denormals", is_flag=True,
              help="Capture and replay with ONNX Runtime's default floating-point mode. By default their runs "
                   "flush denormal floats (below 1.2e-38) to zero: on x86-64 much faster where masked attention "
                   "scores underflow; it changes only values that small (the zoo's figures came out identical).")
@click.option("--no-rewrite", is_flag=True, help=REWRITE_HELP)
@output_kind_option
@click.option("--format", "fmt", type=click.Choice(["text", "json"]), default="text", show_default=True,
              help="Output format.")
@click.option("--quiet", "-q", is_flag=True, help="No progress bar on stderr.")
def replay_cmd(model, calib, data, set_values, input_axes, names, axes, condition_names, batch_size, seed, cache_dir,
               tolerance, resamples, provider, threads, keep_denormals, no_rewrite, output_kinds, fmt, quiet) -> None:
    """Replay MODEL with its controller frozen: cache the coefficients, feed them back correct,
    from another input, shuffled over tokens, or as static profiles, and report how much worse
    the model gets (NLL, KL, retained gap) and how the coefficients' variance splits."""
    conditions = _split(condition_names) or CONDITIONS
    unknown = [c for c in conditions if c not in CONDITIONS]
    if unknown:
        raise UsageError(f"expected --conditions among {', '.join(CONDITIONS)}, found {', '.join(unknown)}")
    report = replay(model, calib, data, coefficients=with_axes(_split(names), axes), conditions=conditions,
                    batch_size=batch_size, seed=seed, cache_dir=cache_dir, tolerance=tolerance, resamples=resamples,
                    provider=provider, threads=threads, flush_denormals=not keep_denormals,
                    rewrite=not no_rewrite, output_kinds=parse_output_kinds(output_kinds),
                    feeding=feeding_of(set_values, input_axes),
                    progress=ProgressBar(quiet=quiet))
    click.echo(command_json(report.to_json()) if fmt == "json" else render_text(report))


def _split(values: tuple[str, ...]) -> tuple[str, ...]:
    return tuple(v.strip() for value in values for v in value.split(",") if v.strip())


def render_text(r: ReplayReport) -> str:
    """The report as terminal text."""
    if not r.controller:
        return (f"{r.model}: no controller — the model declares no coefficient tensors, none were given "
                "(--coefficients) and none were detected; there is nothing to freeze or replay")
    families = sorted({c.family for c in r.coefficients})
    lines = [f"model: {r.model} — {len(r.coefficients)} coefficient tensor{'s' if len(r.coefficients) != 1 else ''} ({', '.join(families)})"]
    d = r.data
    if d.split:
        lines.append(f"data: no --data given: {d.calibration} split into disjoint halves (seed {r.seed}): "
                     f"{d.calibration_inputs} calibration, {d.evaluation_inputs} evaluation inputs")
    else:
        lines.append(f"data: calibration {d.calibration} ({d.calibration_inputs} inputs), "
                     f"evaluation {d.evaluation} ({d.evaluation_inputs} inputs)")
        if d.shared_inputs:
            lines.append(f"warning: {d.shared_inputs} of the {d.evaluation_inputs} evaluation inputs are also "
                         "calibration inputs: the profiles saw them")
    if r.settings.get("batch_size_note"):
        lines.append(f"batch size {r.settings['batch_size']}: {r.settings['batch_size_note']}")
    lines += [f"{about}: {note}" for about, note in r.setting_notes()]
    p = r.parity
    lines.append(f"parity: {p.describe()} over the first {p.inputs} input{'s' if p.inputs != 1 else ''} — ok "
                 f"(tolerance {p.tolerance:g})")
    if p.every_input is not None:
        e = p.every_input
        lines.append(f"parity of every input: {e.kind} ({e.values} values) over all {e.inputs} inputs, "
                     f"max |Δ| {e.max_abs_diff:.3g} — ok (tolerance {e.tolerance:g})")
    div = r.task.divergence.upper() if r.task.divergence == "kl" else r.task.divergence
    if r.task.read is not None:
        lines.append(f"scored output: {r.task.read.describe()}")
    rows = [(c.name, _num(c.nll.value), _signed(c.delta_nll.value), _ci(c.delta_nll.ci), _sig(c.divergence.value),
             *((_num(c.accuracy.value),) if c.accuracy.value is not None else ()),
             *((_sig(c.mse.value), _ci(c.delta_mse.ci)) if c.mse.value is not None else ()))
            for c in r.conditions]
    headers = ["condition", "NLL", "ΔNLL", f"{_level(r)} CI of ΔNLL", div]
    if any(c.accuracy.value is not None for c in r.conditions):
        headers.append("accuracy")
    if any(c.mse.value is not None for c in r.conditions):
        headers += ["MSE (targets)", f"{_level(r)} CI of ΔMSE"]
    lines += ["", tabulate(rows, headers=headers, disable_numparse=True)]
    if all(c.nll.value is None for c in r.conditions):
        why = r.settings.get("no_nll") or f"the data has no labels or targets to score {r.task.output!r} against"
        lines.append(f"no NLL ({r.task.kind}): {why}, so no ΔNLL or retained gap either; the "
                     f"{'KL' if r.task.divergence == 'kl' else 'mean squared difference'} from the correct output "
                     "needs none")
    if r.retained_gap and any(e.value is not None for _, e in r.retained_gap):
        lines += ["", "retained gap (share of global_mean → correct kept): " + "; ".join(
            f"{name} {_pct(e.value)} {_ci(e.ci, pct=True)}" for name, e in r.retained_gap)]
        gap = r.condition("global_mean").delta_nll if any(c.name == "global_mean" for c in r.conditions) else None
        if gap is not None and gap.value is not None and (gap.value < MATERIAL_NATS or (
                gap.ci is not None and gap.ci[0] is not None and gap.ci[0] <= MATERIAL_NATS)):
            lines.append(f"  (global_mean is not measurably worse than correct, ΔNLL {_signed(gap.value)}: "
                         "there is no gap to share out, and these shares mean nothing)")
    if r.variance:
        rows = [(f, *(f"{_pct(s[k].value)} {_ci(s[k].ci, pct=True)}" for k in
                      ("eta2_layer", "layer_slot_share", "input_share", "token_share"))) for f, s in r.variance]
        lines += ["", tabulate(rows, headers=["family", "η² layer", "(layer, slot)", "input", "token"],
                               disable_numparse=True)]
    lines += ["", f"seed {r.seed}; {r.settings.get('resamples')} bootstrap resamples over inputs; "
                  f"NLL in nats ({r.task.kind}, output {r.task.output!r})"]
    return "\n".join(lines)


def _level(r: ReplayReport) -> str:
    return f"{100 * float(r.settings.get('confidence', 0.95)):g}%"


def _num(x, digits: int = 4) -> str:
    return "—" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.{digits}f}"


def _sig(x) -> str:
    return "—" if x is None or math.isnan(x) else f"{x:.4g}"


def _signed(x, digits: int = 4) -> str:
    return "—" if x is None or math.isnan(x) else f"{x:+.{digits}f}"


def _pct(x) -> str:
    return "—" if x is None or math.isnan(x) else f"{round(100 * x, 2) + 0.0:.2f}%"  # no "-0.00%"


def _ci(ci, pct: bool = False) -> str:
    if ci is None or any(v is None or math.isnan(v) for v in ci):
        return "—"
    return f"[{_pct(ci[0])}, {_pct(ci[1])}]" if pct else f"[{ci[0]:+.4f}, {ci[1]:+.4f}]"
