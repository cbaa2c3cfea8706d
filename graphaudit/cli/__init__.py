"""The `graphaudit` command: a thin click group over the library.

Each subcommand lives in its own module, parses its options, calls one public library
function and renders the result. Errors raised as GraphAuditError become one line on
stderr and the error's exit status; click's objections to the command line become one
line and status 2; nothing else is caught.
"""

from __future__ import annotations

import importlib
import logging
import os
import sys

import click

from graphaudit._version import __version__
from graphaudit.errors import GraphAuditError, UsageError

# name -> "module:attribute"; modules are imported only when their command runs or when
# help lists them, so `graphaudit --version` stays fast.
COMMANDS = {
    "demo": "graphaudit.cli.demo:demo",
    "inspect": "graphaudit.cli.inspect:inspect_cmd",
    "static": "graphaudit.cli.static:static_cmd",
    "profile": "graphaudit.cli.profile:profile_cmd",
    "run": "graphaudit.cli.run:run_cmd",
    "replay": "graphaudit.cli.replay:replay_cmd",
    "freeze": "graphaudit.cli.freeze:freeze_cmd",
    "report": "graphaudit.cli.report:report_cmd",
}

# The format an output file's suffix names, where --format does not say.
SUFFIX_FORMATS = {".json": "json", ".md": "markdown", ".markdown": "markdown", ".html": "html", ".htm": "html",
                  ".txt": "text"}


def output_format(fmt: str | None, output: str | None, default: str = "text") -> str:
    """The report format: --format when given, else the one -o's suffix names, else `default`."""
    if fmt is not None:
        return fmt
    if output is not None and output != "-":
        return SUFFIX_FORMATS.get(os.path.splitext(str(output))[1].lower(), default)
    return default

REWRITE_HELP = ("Replay the frozen graph's operators as exported. By default, on the CPU, a masked fill (Where "
                "of an infinite constant before a Softmax) runs as an Add of the mask's bias, a two-operand "
                "Einsum as Transpose and MatMul, a linear layer's MatMul and bias Add as one Gemm, and a "
                "multi-head attention spelled out in primitive operators as ONNX's Attention (opset 23): the same "
                "computation, which ONNX Runtime runs faster (the parity check compares it with the live model).")


class _LazyGroup(click.Group):
    def list_commands(self, ctx):
        return sorted(COMMANDS)

    def get_command(self, ctx, name):
        target = COMMANDS.get(name)
        if target is None:
            return None
        module, attr = target.split(":")
        return getattr(importlib.import_module(module), attr)


@click.group(cls=_LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, "--version", prog_name="graphaudit")
def cli():
    """Audit a 'dynamic' neural network exported to ONNX.

    graphaudit keeps three properties apart: whether the controller's coefficients vary
    with the input, whether the frozen model depends on which coefficients it is given,
    and whether any block is ever skipped or shrunk when the model runs.
    """


def main(argv: list[str] | None = None) -> None:
    """Run the CLI, turning GraphAuditError into one line and its exit status. The command runs
    inside graphaudit.files.scratch.session: its temporary files, and ONNX Runtime's, go into one folder
    that is removed however the command ends (SIGTERM and SIGHUP unwind like Ctrl-C)."""
    from graphaudit.files import scratch

    _notes_to_stderr()
    try:
        with scratch.session():
            status = _run(argv)
    except KeyboardInterrupt as err:  # a signal while the temporary folder was being made or removed
        status = _stopped(scratch.exit_status(err))
    if status >= 128:  # stopped by a signal: the temporary folder is gone, nothing is left to finalise
        # A KeyboardInterrupt that passed through an extension's own call into Python (ONNX
        # Runtime's bindings) leaves CPython set to re-raise SIGINT at exit, whatever was caught:
        # the status would read "killed by SIGINT" instead of 128 + the signal.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(status)
    sys.exit(status)


class _NotesToStderr(logging.Handler):
    """The library's notes (the logger "graphaudit") as `graphaudit: note: ...` lines on stderr."""

    def emit(self, record: logging.LogRecord) -> None:
        click.echo(f"graphaudit: note: {record.getMessage()}", err=True)  # sys.stderr as it is now


def _notes_to_stderr() -> None:
    """What the library notes on the way (e.g. CUDA offered but not usable, so the CPU runs)
    reaches stderr as one line each; once per process, however often the CLI runs in it."""
    logger = logging.getLogger("graphaudit")
    if not any(isinstance(h, _NotesToStderr) for h in logger.handlers):
        logger.addHandler(_NotesToStderr())
        logger.setLevel(logging.INFO)
        logger.propagate = False


def _run(argv: list[str] | None) -> int:
    """The exit status of the command line `argv`, its errors shown as one line."""
    from graphaudit.files.scratch import exit_status

    try:
        # Commands return None, or call ctx.exit(code) (e.g. 3 when a claim is refuted).
        status = cli.main(args=argv, prog_name="graphaudit", standalone_mode=False)
    except GraphAuditError as err:
        click.echo(f"graphaudit: error: {err}", err=True)
        return err.exit_code
    except click.exceptions.NoArgsIsHelpError as err:
        err.show()  # `graphaudit` alone: the help text, not an error line
        return err.exit_code
    except click.UsageError as err:
        click.echo(f"graphaudit: error: {usage_line(err)}", err=True)
        return err.exit_code
    except click.exceptions.Abort as err:  # click's wrapping of a KeyboardInterrupt (scratch.Terminated too)
        return _stopped(exit_status(err.__cause__))
    except KeyboardInterrupt as err:  # one raised outside click's own handling
        return _stopped(exit_status(err))
    except click.ClickException as err:
        err.show()
        return err.exit_code
    except click.exceptions.Exit as err:
        return err.exit_code
    except BrokenPipeError:
        return 1
    except ModuleNotFoundError as err:
        if err.name != "onnxruntime":
            raise
        click.echo(f"graphaudit: error: {NO_RUNTIME}", err=True)
        return 1
    except Exception as err:
        interrupt = _interrupt_behind(err)
        if interrupt is None:
            raise
        return _stopped(exit_status(interrupt))  # e.g. an import a signal cut short (ImportError)
    return status if isinstance(status, int) else 0


NO_RUNTIME = ("expected ONNX Runtime, found none installed: install graphaudit with one of its extras, "
              "pip install 'graphaudit[cpu]', or 'graphaudit[gpu]' for its CUDA build")


def _interrupt_behind(err: BaseException) -> KeyboardInterrupt | None:
    """The KeyboardInterrupt (a signal) that `err` was raised in handling, if any: an extension
    module's import that a signal cut short fails as "ImportError: initialization failed"."""
    seen = set()
    current: BaseException | None = err
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, KeyboardInterrupt):
            return current
        current = current.__cause__ or current.__context__
    return None


def _stopped(status: int) -> int:
    import signal

    name = "Ctrl-C" if status == 128 + signal.SIGINT else signal.Signals(status - 128).name
    click.echo(f"graphaudit: aborted ({name}); temporary files removed", err=True)
    return status


def usage_line(err: click.UsageError) -> str:
    """click's objection to a command line, as one "expected ..., found ..." line."""
    where = err.ctx.command_path if err.ctx is not None else "graphaudit"
    see = f" (see {where} --help)"
    message = " ".join(err.format_message().split()).rstrip(".")
    if isinstance(err, click.NoSuchOption):
        close = f"; closest: {', '.join(err.possibilities)}" if err.possibilities else ""
        return f"expected an option of {where}, found {err.option_name}{close}{see}"
    if isinstance(err, click.exceptions.NoSuchCommand):
        return f"expected a command among {', '.join(sorted(COMMANDS))}, found {err.command_name!r}{see}"
    param = getattr(err, "param", None)
    name = param.get_error_hint(err.ctx) if param is not None and err.ctx is not None else None
    if isinstance(err, click.MissingParameter) and name and param is not None:  # a name comes from a param
        kind = err.param_type or param.param_type_name
        return f"expected the {kind} {name}, found none{see}"
    if isinstance(err, click.BadParameter) and name:
        return f"expected a valid value for {name}, found {' '.join(str(err.message).split()).rstrip('.')}{see}"
    return f"expected a valid command line for {where}, found: {message}{see}"


# `static`, `replay`, `run` and `freeze`: axes of coefficients the graph does not tell
axes_option = click.option(
    "--axes", "axes", multiple=True, metavar="NAME_OR_GLOB=AXES",
    help="Axis names of coefficient tensors whose shapes do not tell them (an export without dynamic shapes), "
         "e.g. 'mudd.*=way,batch,token,source': one batch axis, token for positions, any name for the others; "
         "'batch*token' for one axis holding both, batch-major, as a MoE router's flattened tokens "
         "(repeatable; it names those tensors as coefficients too).")

output_kind_option = click.option(
    "--output-kind", "output_kinds", multiple=True, metavar="NAME=KIND",
    help="What graph output NAME holds, over what the graph says: logits, probs (probabilities: one "
         "distribution over the last axis, or a probability per value where a Sigmoid makes them), logprobs "
         "or regression (values); repeatable. The report says what each scored output was read as, and why.")



def with_axes(names, axes) -> tuple[str, ...]:
    """The coefficient entries of --coefficients and --axes together (see --axes)."""
    for entry in axes:
        if "=" not in entry:
            raise UsageError(f"expected --axes NAME_OR_GLOB=AXIS,AXIS,..., found {entry!r}")
    return (*names, *axes)


# `static --data`, `replay`, `profile` and `run`: how inputs the data does not hold one row per example are fed
# (their options: graphaudit.cli.options.feeding_options)
def feeding_of(set_values, input_axes):
    """The Feeding that --set and --input-axes give (None when neither is given)."""
    from graphaudit.load.feeding import Feeding, parse_axes, parse_set

    values, axes = parse_set(set_values), parse_axes(input_axes)
    return Feeding(values, axes) if values or axes else None


# `static` and `inspect` read a model's graph only (graphaudit.load.model.load_for_audit)
graph_only_option = click.option(
    "--graph-only", is_flag=True,
    help="Do not look at external weight files at all (by default their sizes are checked; their bytes are "
         "never read).")


def check_output(path: str | os.PathLike, option: str, inputs) -> None:
    """Refuse to write `path` when it is one of the command's input files, cannot be written
    (a directory, a block device, a name too long) or has no folder to go in.

    "One of the inputs" means the same file by any name (a hard or symbolic link too); write
    the output with graphaudit.files.write.replace_file, which never writes through a link.
    """
    from graphaudit.files.write import check_target  # here, not at the top: `graphaudit --version` stays fast

    check_target(path, option, inputs)
