"""`--provider auto`: CUDA where a CUDA session really runs, else the CPU with one note.

This machine's ONNX Runtime may be the CPU build: the tests make it offer CUDA
(`get_available_providers` patched), so that the probe really creates a session on CUDA
and ONNX Runtime really falls back to the CPU, as `onnxruntime-gpu` does without the CUDA
libraries.
"""

from __future__ import annotations

import onnxruntime as ort
import pytest

from graphaudit.errors import GraphAuditError
from graphaudit.runtime import sessions

from support.zoo import FIXTURES

CUDA, CPU = "CUDAExecutionProvider", "CPUExecutionProvider"


@pytest.fixture
def offered_cuda(monkeypatch):
    """ONNX Runtime lists CUDA; whether it runs is for the probe to find out."""
    if CUDA in ort.get_available_providers():
        pytest.skip("this machine's ONNX Runtime has CUDA: the fall-back cannot be shown here")
    real = ort.get_available_providers
    monkeypatch.setattr(ort, "get_available_providers", lambda: [CUDA, *real()])
    sessions.cuda_problem.cache_clear()
    sessions._noted.clear()
    yield
    sessions.cuda_problem.cache_clear()
    sessions._noted.clear()


def test_auto_without_cuda_offered_is_the_cpu_without_a_probe(monkeypatch):
    monkeypatch.setattr(sessions, "cuda_problem", lambda: pytest.fail("probed although CUDA is not offered"))
    if CUDA not in ort.get_available_providers():
        assert sessions.resolve_providers("auto") == [CPU]


def test_auto_with_cuda_offered_but_unusable_runs_on_the_cpu_with_one_note(offered_cuda, capfd):
    import logging

    class Kept(logging.Handler):  # on the logger itself: the CLI's own handler stops it propagating
        def __init__(self):
            super().__init__()
            self.records = []

        def emit(self, record):
            self.records.append(record)

    logger, kept = logging.getLogger("graphaudit"), Kept()
    logger.addHandler(kept)
    level, logger.level = logger.level, logging.INFO
    try:
        assert sessions.resolve_providers("auto") == [CPU]
        assert sessions.resolve_providers("auto") == [CPU]  # probed once, noted once
    finally:
        logger.removeHandler(kept)
        logger.level = level
    # ONNX Runtime's own warning of the provider it lacks is silenced (the CLI's handler, left on the
    # logger by an earlier test, may have echoed the note itself)
    err = capfd.readouterr().err
    assert [line for line in err.splitlines() if not line.startswith("graphaudit: note:")] == [], err
    notes = [r.getMessage() for r in kept.records]
    assert len(notes) == 1 and notes[0].startswith("CUDA is not usable here (") and "running on the CPU" in notes[0]
    assert "fell back" in notes[0]


def test_cuda_asked_for_where_it_cannot_run_is_an_error_naming_why(offered_cuda):
    with pytest.raises(GraphAuditError, match=r"expected ONNX Runtime to run on CUDA, found ONNX Runtime fell back"):
        sessions.resolve_providers("cuda")


def test_the_probe_is_made_once_per_process(offered_cuda, monkeypatch):
    made = []
    real = ort.InferenceSession
    monkeypatch.setattr(ort, "InferenceSession", lambda *a, **k: made.append(1) or real(*a, **k))
    for _ in range(3):
        sessions.resolve_providers("auto")
    assert len(made) == 1


def test_a_command_on_auto_says_it_runs_on_the_cpu_in_one_line_and_succeeds(offered_cuda, capsys):
    from graphaudit.cli import main

    model = FIXTURES / "featuregate"
    with pytest.raises(SystemExit) as done:
        main(["replay", str(model / "model.onnx"), "--calib", str(model / "calib.npz"), "--provider", "auto",
              "--resamples", "5", "-q", "--format", "json"])
    err = capsys.readouterr().err
    assert done.value.code == 0, err
    assert err.splitlines() == [err.splitlines()[0]] and err.startswith("graphaudit: note: CUDA is not usable here")


def test_every_command_that_runs_a_model_defaults_to_auto():
    import importlib

    import click

    from graphaudit.cli import COMMANDS

    defaults = {}
    for name, target in COMMANDS.items():
        module, attr = target.split(":")
        for param in getattr(importlib.import_module(module), attr).params:
            if isinstance(param, click.Option) and "--provider" in param.opts:
                defaults[name] = param.default
    assert set(defaults) == {"demo", "profile", "replay", "run"} and set(defaults.values()) == {"auto"}, defaults
