"""Option groups shared by the commands, each declared once and handed to the command as one object.

`option_group(into, build, *options)` adds click options to a command and gives its callback
one argument, `into`, built by `build` from their values (as sqlite-utils' `@output_options`
declares a group once; here the group is also parsed once). The groups:

- `feeding_options`: --set and --input-axes, as a graphaudit.load.feeding.Feeding (or None);
- `coefficient_options`: --coefficients and --axes, as a CoefficientSettings;
- `output_options`: --format, -o and -q, as an OutputSettings;
- `ray_options`: --ray and --workers, as the ReplaySettings fields they set (a dict).

Importing this module stays light (click only): `graphaudit --version` stays fast.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click

from graphaudit.cli import SUFFIX_FORMATS, axes_option, check_output, feeding_of, output_format, with_axes
from graphaudit.errors import UsageError


def option_group(into: str, build: Callable[..., Any], *options: Callable) -> Callable:
    """A decorator adding `options` to a command, whose callback then takes `into`: `build` called
    with the options' values as keywords, named after their parameters."""
    def decorate(command: Callable) -> Callable:
        names: list[str] = []

        @functools.wraps(command)
        def callback(*args, **kwargs):
            values = {name: kwargs.pop(name) for name in names}
            return command(*args, **kwargs, **{into: build(**values)})

        # click keeps a function's options in an attribute on it, which no type declares
        decorated: Any = callback
        decorated.__click_params__ = list(getattr(command, "__click_params__", ()))
        before = len(decorated.__click_params__)
        for option in reversed(options):
            decorated = option(decorated)
        names.extend(param.name for param in decorated.__click_params__[before:])
        return decorated

    return decorate


# `static --data`, `replay`, `profile` and `run`: how inputs the data does not hold one row per example are fed
feeding_options = option_group(
    "feeding", feeding_of,
    click.option(
        "--set", "set_values", multiple=True, metavar="NAME=VALUE",
        help="One value given to every batch as it is, typed from the graph input's element type, e.g. "
             "sr=16000 or use_cache_branch=0 (repeatable). Scalar inputs can also be a 0-d array in the .npz."),
    click.option(
        "--input-axes", "input_axes", multiple=True, metavar="NAME=AXES",
        help="The example axis of an input whose examples are not on its first axis, e.g. state=_,batch,_ for a "
             "recurrent state (2, batch, 128): one name per axis, exactly one 'batch' (repeatable). The .npz then "
             "holds that input with its examples on that axis. Without it, the graph tells where it can (the "
             "symbol of the other inputs' batch, or the only free axis)."))


@dataclass(frozen=True)
class CoefficientSettings:
    """The coefficient tensors named with --coefficients and --axes (see --axes)."""

    names: tuple[str, ...] = ()
    axes: tuple[str, ...] = ()

    @property
    def entries(self) -> tuple[str, ...]:
        """The entries the library takes as `coefficients`: the names, then the axes."""
        return (*self.names, *self.axes)


def coefficient_options(help: str, metavar: str | None = None,
                        split: Callable[[Sequence[str]], tuple[str, ...]] = tuple) -> Callable:
    """--coefficients (with the command's own `help`, `metavar`, and `split` of its values) and --axes,
    as the command's `coefficients`, a CoefficientSettings; a bad --axes entry is a UsageError."""
    def build(coefficient_names, axes):
        names = split(coefficient_names)
        return CoefficientSettings(tuple(names), with_axes((), axes))

    return option_group(
        "coefficients", build,
        click.option("--coefficients", "coefficient_names", multiple=True, metavar=metavar, help=help),
        axes_option)


@dataclass(frozen=True)
class OutputSettings:
    """Where and how a command writes its report: --format (or -o's suffix), -o (None: standard
    output, as `-o -`), -q and -v."""

    fmt: str = "text"
    output: Path | None = None
    quiet: bool = False
    verbose: bool = False

    def check(self, inputs) -> None:
        """Refuse, before any work, an -o that is one of `inputs` or cannot be written."""
        if self.output is not None:
            check_output(self.output, "-o", inputs)

    def emit(self, text: str, nl: bool = True) -> None:
        """Write `text` to -o (a fresh file moved into place, never through a link; one line on
        stderr says where, unless -q), else to standard output."""
        if self.output is None:
            click.echo(text, nl=nl)
            return
        from graphaudit.files.write import replace_file  # here: `--help` stays light

        body = text + ("\n" if nl else "")
        replace_file(self.output, lambda fresh: fresh.write_text(body, encoding="utf-8"), "the report")
        if not self.quiet:
            click.echo(f"graphaudit: wrote the {self.fmt} report to {self.output}", err=True)


def output_options(formats: Iterable[str], help: str, *, quiet: str = "No progress bar on stderr.") -> Callable:
    """--format (among `formats`, with the command's `help`), -o, -q (with the command's `quiet` help)
    and -v, as the command's `out`, an OutputSettings. Without --format, -o's suffix names the
    format (.json, .md, .html, .txt), else it is text; a suffix naming a format the command lacks
    is bad usage."""
    choices = list(formats)

    def build(fmt, output, quiet, verbose):
        if quiet and verbose:
            raise UsageError("expected at most one of -q and -v, found both")
        target = None if output is None or output == "-" else Path(output)
        if fmt is None and target is not None:
            named = SUFFIX_FORMATS.get(target.suffix.lower())
            if named is not None and named not in choices:
                raise UsageError(f"expected -o's suffix to name a format among {', '.join(choices)}, found "
                                 f"{target.suffix} ({named}); give --format, or another suffix")
        if verbose:
            from graphaudit.runtime.sessions import show_runtime_logs  # ONNX Runtime, only when asked

            show_runtime_logs()
            logging.getLogger("graphaudit").setLevel(logging.DEBUG)
        return OutputSettings(output_format(fmt, output), target, quiet, verbose)

    return option_group(
        "out", build,
        click.option("--format", "fmt", type=click.Choice(choices), default=None,
                     help=f"{help} [default: the one -o's suffix names (.json, .md, .html), else text]"),
        click.option("-o", "--output", type=click.Path(dir_okay=False, allow_dash=True, path_type=str),
                     help="Write the report to this file instead of standard output ('-': standard output)."),
        click.option("--quiet", "-q", is_flag=True, help=quiet),
        click.option("--verbose", "-v", is_flag=True,
                     help="ONNX Runtime's own log lines (warnings and errors) on stderr; they are silenced by "
                          "default, since each failure it reports also comes back as one line of graphaudit's."))


def rounds_options(prefix: str = "") -> Callable:
    """How much the profile runs: --runs, --warmup, --profile-runs and, each named with `prefix`
    (`run` says --profile-budget where `profile` says --budget), --budget, --precision and
    --sample, as the command's `rounds`: a dict of the ProfileSettings fields they set."""
    from graphaudit.profile import settings as s

    def build(runs, warmup, profile_runs, budget, precision, sample):
        return {"runs": runs, "warmup": warmup, "profile_runs": profile_runs, "budget": budget,
                "precision": precision, "sample": sample}

    return option_group(
        "rounds", build,
        click.option("--runs", type=int, help=(
            f"Timed rounds, each running every sampled input once on the model and the baseline (default: until "
            f"the latency's 95% interval is within --{prefix}precision"
            + (", or the compute-savings answer is decided (--profile-until)" if prefix == "profile-" else "")
            + f", at least {s.FEWEST_TIMED_ROUNDS}, at most {s.MOST_CHOSEN_RUNS}, within --{prefix}budget).")),
        click.option("--warmup", type=int, help=(
            f"Runs of each input shape discarded first in each session (default: {s.DEFAULT_WARMUP}).")),
        click.option("--profile-runs", type=int, help=(
            "Rounds run with ONNX Runtime's profiler on, for the per-node and per-block times (default: as "
            f"few as give each node {s.FEWEST_RUNS} profiled runs: one where {s.FEWEST_RUNS} inputs or more are "
            "sampled).")),
        click.option(f"--{prefix}budget", "budget", type=float, default=s.DEFAULT_BUDGET_S, show_default=True,
                     help="Seconds the profile's runs may take, at the times measured on the way; the fewest "
                          f"rounds ({s.FEWEST_TIMED_ROUNDS} timed, 1 profiled) run whatever they take."),
        click.option(f"--{prefix}precision", "precision", type=float, default=s.DEFAULT_PRECISION, show_default=True,
                     help="Timed rounds stop once the 95% interval of the latency ratio to the baseline (without "
                          "one, of the latency) over the rounds is within this fraction of it (0.02: ±2%); what "
                          "the inputs left out of a sample could change widens the interval the verdict reads, "
                          "unless every input does the same work in both graphs."),
        click.option(f"--{prefix}sample", "sample", type=int, help=(
            "Inputs (batches) profiled, one drawn at random (seeded) from each of as many equal stretches of the "
            "data (default: every input where the fewest "
            f"rounds of them all fit half the budget, else as many as do, at least {s.FEWEST_SAMPLE}, and "
            f"{s.ALIKE_SAMPLE} where every input does the same work: nothing in the graphs depends on input values "
            "and the inputs share one shape); the compute-savings verdict counts what the inputs left out could "
            "change, where they could.")))


def _ray_settings(ray: str | None, workers: int | None) -> dict[str, Any]:
    if workers is not None and ray is None:
        raise UsageError(f"expected --workers with --ray, found --workers {workers} alone")
    return {"ray": ray, "workers": workers}


# `replay` and `run`: the replay's shards on Ray workers
ray_options = option_group(
    "distributed", _ray_settings,
    click.option("--ray", "ray", is_flag=False, flag_value="", default=None, metavar="[ADDRESS]",
                 help="Capture and replay on Ray workers, each on a shard of whole batches of the inputs, their "
                      "statistics added up: with no ADDRESS an embedded local Ray, one worker per core; with one "
                      "(e.g. ray://head:10001, or auto), that cluster. Needs graphaudit[ray]. The profile still "
                      "runs in this process, after the workers are done."),
    click.option("--workers", type=click.IntRange(min=1),
                 help="Ray workers (shards) with --ray (default: one per CPU core of the cluster, at most one per "
                      "evaluation batch)."))
