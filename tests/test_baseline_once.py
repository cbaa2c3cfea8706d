"""The audit reads a baseline's file once: its static FLOP count and the profile share the load,
the profile holding its graph alone (its sessions read the file), so that the baseline's
weights are not held through the replay and its proto is not parsed and checked twice."""

import importlib

import numpy as np
import onnx
import pytest

from graphaudit.audit import audit
from graphaudit.load import model as load_module
from graphaudit.load.model import load_for_runtime
from graphaudit.profile import profile_model
from graphaudit.profile import profiler as profiler_module
from graphaudit.profile.baseline import COUNTED
from graphaudit.runtime.handed_weights import HANDED_OVER, STUB_LOCATION

from support.models import gated_lm, token_ids, with_a_large_weight

audit_module = importlib.import_module("graphaudit.audit")  # the package's `audit` is the function


@pytest.fixture()
def files(tmp_path):
    onnx.save(gated_lm(), tmp_path / "model.onnx")
    onnx.save(with_a_large_weight(gated_lm(), seed=7), tmp_path / "dense.onnx")
    np.savez(tmp_path / "calib.npz", input_ids=token_ids(8, seed=1))
    np.savez(tmp_path / "eval.npz", input_ids=token_ids(8, seed=2))
    return tmp_path


def _stubs(loaded) -> list[str]:
    return [t.name for t in loaded.model.graph.initializer
            if any(e.key == "location" and e.value == STUB_LOCATION for e in t.external_data)]


def test_the_baseline_is_loaded_once_and_the_profile_holds_its_graph_alone(files, monkeypatch):
    loads, handed = [], []
    load_model, profile = load_module.load_model, audit_module._profile

    def counted(source, **kwargs):
        loads.append(str(source))
        return load_model(source, **kwargs)

    def seen(loaded, data, baseline, *args, **kwargs):
        handed.append(baseline)
        return profile(loaded, data, baseline, *args, **kwargs)

    monkeypatch.setattr(load_module, "load_model", counted)
    monkeypatch.setattr(audit_module, "_profile", seen)
    report = audit(files / "model.onnx", files / "calib.npz", files / "eval.npz", baseline=files / "dense.onnx",
                   provider="cpu", runs=3, warmup=1, threads=1)
    assert loads.count(str(files / "dense.onnx")) == 1
    assert _stubs(handed[0]) == ["big"]  # its weight left in its file, for ORT to read
    assert report.inputs["baseline"] == str(files / "dense.onnx")
    profiled = report.profile.to_json()["baseline"]
    assert profiled["ratio_interval"]["rounds"] == 3


def test_a_profile_of_the_baselines_graph_alone_is_the_profile_of_the_baseline(files):
    """What the profile reads of a baseline (its blocks, executed FLOPs, the weights ORT would write
    beside its optimised model) is the same from its graph alone as from the whole model."""
    whole = load_for_runtime(files / "dense.onnx")
    alone = audit_module._held_for_profile(files / "dense.onnx", whole)
    assert _stubs(alone) == ["big"] and _stubs(whole) == []
    assert profiler_module._weight_bytes(alone) == profiler_module._weight_bytes(whole) > HANDED_OVER
    docs = [profile_model(files / "model.onnx", files / "eval.npz", baseline=b, runs=2, warmup=1, profile_runs=1,
                          threads=1).to_json()["baseline"] for b in (whole, alone)]
    timed = ("ms", "ratio", "pct", "interval")
    same = [{k: v for k, v in doc.items() if k != "blocks" and not any(t in k for t in timed)} for doc in docs]
    assert same[0] == same[1] and set(same[0]) >= {"model", "flops_executed"} and same[0]["flops_executed"]
    assert [b["name"] for b in docs[0]["blocks"]] == [b["name"] for b in docs[1]["blocks"]]


def test_the_baselines_static_audit_is_made_once_and_stands_for_its_executed_flops(files, monkeypatch):
    """The audit hands the profile the baseline's static audit it made for its FLOP count: nothing
    in that graph depends on input values, so its count is what each input executes, and the
    baseline has no evidence session of its own (at Pythia-160M's shape it took 2 s)."""
    audited, evidence = [], []
    static, evidence_runs = audit_module._static, profiler_module._evidence_runs

    def counted(loaded, *args):
        audited.append(loaded.path)
        return static(loaded, *args)

    def recorded(runnable, providers, feeds, threads, prefix):
        evidence.append(prefix.name)
        return evidence_runs(runnable, providers, feeds, threads, prefix)

    monkeypatch.setattr(audit_module, "_static", counted)
    monkeypatch.setattr(profiler_module, "_evidence_runs", recorded)
    report = audit(files / "model.onnx", files / "calib.npz", files / "eval.npz", baseline=files / "dense.onnx",
                   provider="cpu", runs=2, warmup=1, threads=1)
    assert audited.count(files / "dense.onnx") == 1
    assert evidence == ["evidence"]  # the model's alone
    assert report.profile.baseline.flops_source == COUNTED
    assert report.profile.baseline.flops_executed == report.baseline_flops > 0
