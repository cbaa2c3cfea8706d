"""Bad options: one line, exit 2 for bad usage (1 where the machine lacks what was asked for).

Coefficient names and patterns that match nothing (the line lists the closest
candidates), block patterns that match nothing or do not parse, a baseline whose inputs
differ from the model's, `--provider cuda` without CUDA, malformed `--shape`, counts
below their minimum, an output path that is one of the inputs, and click's own
objections (unknown option, missing argument) — each through every command that takes it.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from support.cli import FAST_PROFILE, FAST_REPLAY, FAST_RUN, refused
from support.models import float_data, float_gated, gated_lm, token_ids


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    folder = tmp_path_factory.mktemp("options")
    onnx.save(gated_lm(), folder / "gated.onnx")
    onnx.save(float_gated(), folder / "float.onnx")
    np.savez(folder / "calib.npz", input_ids=token_ids(8, seed=1))
    np.savez(folder / "eval.npz", input_ids=token_ids(6, seed=2))
    np.savez(folder / "float.npz", x=float_data(6))
    return folder


def _all(files):
    return [files / n for n in ("gated.onnx", "float.onnx", "calib.npz", "eval.npz", "float.npz")]


@pytest.mark.parametrize("command", [
    ["static", "{m}"],
    ["replay", "{m}", "--calib", "{c}", *FAST_REPLAY],
    ["run", "{m}", "--calib", "{c}", *FAST_RUN],
    ["freeze", "{m}", "-o", "{out}"],
], ids=["static", "replay", "run", "freeze"])
@pytest.mark.parametrize("name", ["gate.9", "gaet.*"], ids=["name", "glob"])
def test_unknown_coefficient_lists_the_closest_candidates(files, tmp_path, capfd, command, name):
    args = [a.format(m=files / "gated.onnx", c=files / "calib.npz", out=tmp_path / "out") for a in command]
    refused(capfd, [*args, "--coefficients", name], _all(files), code=2,
            match=rf"expected --coefficients '{name.replace('.', '[.]').replace('*', '[*]')}' to name a tensor of "
                  r"the model, found none; closest: gate\.[01], gate\.[01]")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("command", [
    ["static", "{m}"],
    ["profile", "{m}", "--data", "{e}", *FAST_PROFILE],
    ["run", "{m}", "--calib", "{c}", *FAST_RUN],
], ids=["static", "profile", "run"])
@pytest.mark.parametrize("pattern, message", [
    (r"transformer\.h\.(\d+)", r"expected --block-pattern 'transformer\\\\\.h\\\\\.\(\\\\d\+\)' to match node names, "
                               r"name scopes or initializer names, found no match among \d+ nodes"),
    (r"block(\d+", r"expected --block-pattern to be a regular expression, found 'block\(\\\\d\+'"),
], ids=["matches-nothing", "not-a-regex"])
def test_block_pattern(files, capfd, command, pattern, message):
    args = [a.format(m=files / "gated.onnx", c=files / "calib.npz", e=files / "eval.npz") for a in command]
    refused(capfd, [*args, "--block-pattern", pattern], _all(files), code=2, match=message)


@pytest.mark.parametrize("command", [
    ["profile", "{m}", "--data", "{e}", "--baseline", "{b}", *FAST_PROFILE],
    ["run", "{m}", "--calib", "{c}", "--baseline", "{b}", *FAST_RUN],
], ids=["profile", "run"])
def test_baseline_whose_inputs_differ(files, capfd, command):
    args = [a.format(m=files / "gated.onnx", c=files / "calib.npz", e=files / "eval.npz", b=files / "float.onnx")
            for a in command]
    refused(capfd, args, _all(files),
            match=r"expected the baseline .*float\.onnx to take the same inputs as the model \(input_ids: int64 "
                  r"\(batch, seq\)\), found inputs \['x'\] instead of \['input_ids'\]")


@pytest.mark.skipif("CUDAExecutionProvider" in ort.get_available_providers(), reason="this machine has CUDA")
@pytest.mark.parametrize("command", [
    ["profile", "{m}", "--data", "{e}", *FAST_PROFILE],
    ["replay", "{m}", "--calib", "{c}", *FAST_REPLAY],
    ["run", "{m}", "--calib", "{c}", *FAST_RUN],
], ids=["profile", "replay", "run"])
def test_cuda_provider_without_cuda(files, capfd, command):
    args = [a.format(m=files / "gated.onnx", c=files / "calib.npz", e=files / "eval.npz") for a in command]
    args = [a for a in args if a not in ("--provider", "cpu")]  # run's fast settings pin cpu
    refused(capfd, [*args, "--provider", "cuda"], _all(files),
            match=r"expected ONNX Runtime with the CUDAExecutionProvider .*found only .*CPUExecutionProvider")


@pytest.mark.parametrize("shape, message", [
    ("input_ids", r"expected --shape NAME=DIMS with positive integer dims .*found 'input_ids'"),
    ("input_ids=1,0", r"found 'input_ids=1,0'"),
    ("input_ids=one,8", r"found 'input_ids=one,8'"),
    ("tokens=1,8", r"expected --shape to name a graph input \(input_ids\), found 'tokens'"),
    ("input_ids=1,8,4", r"expected 2 dimensions for input 'input_ids'"),
], ids=["no-dims", "zero", "not-a-number", "unknown-input", "wrong-rank"])
def test_invalid_shape(files, capfd, shape, message):
    refused(capfd, ["static", files / "gated.onnx", "--shape", shape], _all(files), code=2, match=message)


@pytest.mark.parametrize("args, message", [
    (["replay", "{m}", "--calib", "{c}", "--batch-size", "0"],
     r"expected a valid value for '--batch-size', found 0 is not"),
    (["profile", "{m}", "--data", "{e}", "--batch-size", "0"],
     r"expected batch-size to be an integer of at least 1, found 0"),
    (["profile", "{m}", "--data", "{e}", "--runs", "0"], r"expected runs to be an integer of at least 1, found 0"),
    (["profile", "{m}", "--data", "{e}", "--threads", "-1"], r"expected a valid value for '--threads', found -1 is not"),
    (["profile", "{m}", "--data", "{e}", "--limit", "0"], r"expected limit to be an integer of at least 1, found 0"),
    (["run", "{m}", "--calib", "{c}", "--resamples", "0"], r"expected a valid value for '--resamples', found 0 is not"),
    (["run", "{m}", "--calib", "{c}", "--seed", "-1"], r"expected a valid value for '--seed', found -1 is not"),
    (["replay", "{m}", "--calib", "{c}", "--seed", "-1"], r"expected a valid value for '--seed', found -1 is not"),
    (["replay", "{m}", "--calib", "{c}", "--conditions", "sideways"],
     r"expected --conditions among correct, .*found sideways"),
    (["replay", "{m}", "--calib", "{c}", "--tolerance", "-1"], r"expected a valid value for '--tolerance'"),
    (["static", "{m}", "--format", "yaml"], r"expected a valid value for '--format', found 'yaml' is not one of"),
    (["inspect", "{m}", "--graph-onyl"],
     r"expected an option of graphaudit inspect, found --graph-onyl; closest: --graph-only"),
    (["replay", "{m}"], r"expected the option '--calib', found none"),
    (["run", "{m}", "--calib", "{c}", "--claim", "compute-savings"],
     r"expected --baseline with --claim compute-savings"),
    (["frobnicate", "{m}"],
     r"expected a command among demo, freeze, inspect, profile, replay, report, run, static, found 'frobnicate'"),
], ids=["replay-batch-size-0", "profile-batch-size-0", "runs-0", "threads-negative", "limit-0", "resamples-0", "run-seed-negative",
        "replay-seed-negative", "unknown-condition", "negative-tolerance", "unknown-format", "unknown-option",
        "missing-option", "claim-without-baseline", "unknown-command"])
def test_bad_usage_is_one_line_and_status_2(files, capfd, args, message):
    args = [a.format(m=files / "gated.onnx", c=files / "calib.npz", e=files / "eval.npz") for a in args]
    refused(capfd, args, _all(files), code=2, match=message)


@pytest.mark.parametrize("target", ["gated.onnx", "calib.npz"])
def test_report_and_trace_never_overwrite_an_input(files, capfd, target):
    """`-o` or `--trace` naming an input would overwrite the file audited: refused before anything runs."""
    model, calib = files / "gated.onnx", files / "calib.npz"
    message = rf"to name a file that is not one of the inputs, found .*{target}, an input"
    refused(capfd, ["run", model, "--calib", calib, *FAST_RUN, "-o", files / target], _all(files), code=2,
            match="expected -o " + message)
    refused(capfd, ["profile", model, "--data", calib, *FAST_PROFILE, "--trace", files / target], _all(files),
            code=2, match="expected --trace " + message)


def test_report_into_a_folder_that_does_not_exist(files, tmp_path, capfd):
    refused(capfd, ["run", files / "gated.onnx", "--calib", files / "calib.npz", *FAST_RUN, "-o",
                    tmp_path / "no" / "such" / "report.json"], _all(files),
            match=r"expected -o to name a file in an existing folder, found no folder .*no/such")
