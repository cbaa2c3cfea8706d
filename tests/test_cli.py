"""The command line: help on every command, --version, error lines and exit codes."""

import subprocess
import sys

import pytest
from click.testing import CliRunner

import graphaudit
from graphaudit.cli import COMMANDS, cli

from support.cli import run_main


def test_version():
    result = CliRunner().invoke(cli, ["--version"])
    assert result.exit_code == 0
    assert result.output.strip() == f"graphaudit, version {graphaudit.__version__}"


def test_help_lists_every_command():
    result = CliRunner().invoke(cli, ["--help"])
    assert result.exit_code == 0
    for name in COMMANDS:
        assert name in result.output


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_every_command_has_help_text(name):
    result = CliRunner().invoke(cli, [name, "--help"])
    assert result.exit_code == 0, result.output
    command = cli.get_command(None, name)
    assert command.help and len(command.help.strip()) > 20
    for param in command.params:
        if param.param_type_name == "option" and not param.hidden:
            assert param.help, f"{name} {param.opts} has no help text"


def test_user_error_is_one_line_and_status_1(tmp_path, capsys):
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"not a model")
    code, _out, err = run_main(["inspect", str(bad)], capsys)
    assert code == 1
    assert err.startswith("graphaudit: error: expected an ONNX model")
    assert err.count("\n") == 1 and "Traceback" not in err


def test_bad_usage_is_status_2(capsys):
    code, _out, err = run_main(["inspect"], capsys)
    assert code == 2 and err == "graphaudit: error: expected the argument 'MODEL', found none (see graphaudit inspect --help)\n"
    code, _out, err = run_main(["no-such-command"], capsys)
    assert code == 2


def test_python_dash_m_and_import_without_torch():
    out = subprocess.run([sys.executable, "-m", "graphaudit", "--version"], capture_output=True, text=True)
    assert out.returncode == 0 and graphaudit.__version__ in out.stdout
    code = "import graphaudit, graphaudit.cli, sys; assert 'torch' not in sys.modules, 'torch imported'"
    check = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert check.returncode == 0, check.stderr
