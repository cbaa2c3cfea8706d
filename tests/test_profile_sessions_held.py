"""The profile's sessions and what the audit holds of ONNX Runtime's memory: one session per model
for its profiled and then its timed rounds, threads that do not spin between sessions timed in
alternation, sessions let go before the evidence runs, captures that keep no view of a session's
arena, no baseline model held through the replay, and no weight held in a proto whose file the
sessions read."""

import gc
import json
import weakref

import numpy as np
import pytest
from click.testing import CliRunner

import graphaudit.profile.profiler as profiler
from graphaudit.cli import cli
from graphaudit.profile import profile_model
from graphaudit.profile.events import parse_profile
from graphaudit.replay.capture import capture
from graphaudit.runtime.handed_weights import is_stub

from support.models import gated_lm, save_heavy_pair, traced, with_a_large_weight
from support.profile_models import save_profile_files


@pytest.fixture
def files(tmp_path):
    return save_profile_files(tmp_path)


def test_the_captures_live_outputs_hold_no_memory_of_the_session():
    trace, coefs, data = traced(gated_lm)
    with capture(trace, coefs, data, batch_size=4) as cache:
        # a view of ONNX Runtime's output would keep the session's whole arena alive
        assert all(v.base is None and v.flags.owndata for v in cache.live.values())


def test_the_profile_lets_its_timing_sessions_go_before_the_evidence_runs(files, monkeypatch):
    opened, alive = [], []
    open_session, evidence_runs = profiler.open_session, profiler._evidence_runs

    def recorded(*args, **kwargs):
        session = open_session(*args, **kwargs)
        opened.append(weakref.ref(session))
        return session

    def evidence(*args, **kwargs):
        gc.collect()
        alive.append(sum(ref() is not None for ref in opened))
        return evidence_runs(*args, **kwargs)

    monkeypatch.setattr(profiler, "open_session", recorded)
    monkeypatch.setattr(profiler, "_evidence_runs", evidence)
    profile_model(files / "dynamic.onnx", files / "data.npz", baseline=files / "dense.onnx", runs=1, warmup=0,
                  profile_runs=1, threads=1)
    assert len(opened) >= 3 and alive and alive[0] == 0


@pytest.mark.parametrize("with_baseline", [False, True])
def test_sessions_timed_in_alternation_do_not_spin(files, with_baseline, monkeypatch):
    """Each session has its own intra-op threads: spinning after a run, they would take the cores
    the other session's next run needs. A model timed alone keeps ONNX Runtime's default."""
    made, session_options = [], profiler.session_options

    def recorded(*args, **kwargs):
        options = session_options(*args, **kwargs)
        if "spinning" not in kwargs:
            made.append("untimed")
        else:  # an entry not set is ONNX Runtime's default, which spins
            try:
                made.append(options.get_session_config_entry("session.intra_op.allow_spinning"))
            except RuntimeError:
                made.append("default")
        return options

    monkeypatch.setattr(profiler, "session_options", recorded)
    profile_model(files / "dynamic.onnx", files / "data.npz", baseline=files / "dense.onnx" if with_baseline else None,
                  runs=1, warmup=0, profile_runs=1, threads=1)
    timed = [entry for entry in made if entry != "untimed"]
    assert timed == (["0", "0"] if with_baseline else ["default"])


def test_each_model_has_one_session_for_its_profiled_and_then_its_timed_rounds(files, monkeypatch):
    """The profiled rounds and the timed ones share a session at the asked level, the profiler
    ended between them: each model's file is opened once for both (at Pythia-160M's shape the
    sessions were a third of the profile), and the timed rounds run unprofiled."""
    opened, open_session = [], profiler.open_session

    def recorded(model, providers, options):
        session = open_session(model, providers, options)
        entry = {"level": options.graph_optimization_level.name, "profiled": options.enable_profiling,
                 "saved": bool(options.optimized_model_filepath), "runs": 0, "in_profile": None}
        run, end = session.run, session.end_profiling

        def counted(*args, **kwargs):
            entry["runs"] += 1
            return run(*args, **kwargs)

        def ended():
            path = end()
            entry["in_profile"] = len(parse_profile(path).runs)
            return path

        session.run, session.end_profiling = counted, ended
        opened.append(entry)
        return session

    monkeypatch.setattr(profiler, "open_session", recorded)
    report = profile_model(files / "dynamic.onnx", files / "data.npz", baseline=files / "dense.onnx", runs=4,
                           warmup=1, threads=1)
    assert [(e["level"], e["profiled"], e["saved"]) for e in opened] == [
        ("ORT_ENABLE_ALL", True, True), ("ORT_ENABLE_ALL", True, True),
        ("ORT_DISABLE_ALL", True, False), ("ORT_DISABLE_ALL", True, False)]
    # 2 inputs: a warm-up run, 2 profiled rounds (3 runs of each node at least), then 4 timed rounds
    assert report.profile_runs == 2 and report.runs == 4
    for entry in opened[:2]:
        assert (entry["runs"], entry["in_profile"]) == (1 + 2 * 2 + 4 * 2, 1 + 2 * 2)
    assert [(e["runs"], e["in_profile"]) for e in opened[2:]] == [(2, 2), (2, 2)]  # the evidence: a run per input


def test_the_calibration_capture_keeps_no_live_outputs():
    """Only the evaluation cache's first batch is compared with the frozen graph's outputs: the
    calibration cache keeps none (a batch of logits at a 50k vocabulary is 412 MB)."""
    trace, coefs, data = traced(gated_lm)
    with capture(trace, coefs, data, batch_size=4) as kept, capture(trace, coefs, data, batch_size=4,
                                                                    keep_live=False) as bare:
        assert kept.live and bare.live == {}
        for c in coefs:
            np.testing.assert_array_equal(kept.arrays[c.tensor], bare.arrays[c.tensor])


def test_the_audit_holds_no_baseline_model_through_the_replay(monkeypatch):
    """A baseline given as a file is read for its FLOP count, let go, and read again by the profile."""
    import importlib

    import graphaudit.load.model as model_module

    audit_module = importlib.import_module("graphaudit.audit")  # the package's `audit` is the function

    from support.zoo import FIXTURES

    loads, during = [], []
    load_for_runtime, replay = model_module.load_for_runtime, audit_module._replay

    def recorded(source, *args, **kwargs):
        loaded = load_for_runtime(source, *args, **kwargs)
        loads.append((str(source), weakref.ref(loaded)))
        return loaded

    def replayed(*args, **kwargs):
        gc.collect()
        during.extend(name for name, ref in loads if "dense" in name and ref() is not None)
        return replay(*args, **kwargs)

    monkeypatch.setattr(model_module, "load_for_runtime", recorded)
    monkeypatch.setattr(audit_module, "_replay", replayed)
    model, dense = FIXTURES / "featuregate", FIXTURES / "dense" / "model.onnx"
    report = audit_module.audit(model / "model.onnx", model / "calib.npz", model / "eval.npz", dense, provider="cpu",
                                runs=1, warmup=0, profile_runs=1, profile_limit=2, resamples=20)
    assert any("dense" in name for name, _ in loads) and during == []
    assert report.profile.baseline is not None  # the profile read it again


@pytest.fixture
def heavy(tmp_path):
    """A model and a baseline, each with a weight past HANDED_OVER inline, and their inputs."""
    return save_heavy_pair(tmp_path, with_a_large_weight)


def _stubbed(loaded) -> list[str]:
    return [t.name for t in loaded.model.graph.initializer if is_stub(t)]


def test_the_profile_holds_the_graph_alone_of_models_whose_files_its_sessions_read(heavy, monkeypatch):
    """The sessions read the files, so the protos the profile holds keep their large weights as
    stubs (`held_for_profile`; 650 MB a model at Pythia-160M's shape), and the profile is the one
    of the whole models."""
    held, runnable_model = [], profiler.runnable_model

    def recorded(loaded):
        held.append(_stubbed(loaded))
        return runnable_model(loaded)

    monkeypatch.setattr(profiler, "runnable_model", recorded)
    options = {"runs": 2, "warmup": 1, "profile_runs": 1, "threads": 1}
    alone = profile_model(heavy / "model.onnx", heavy / "eval.npz", baseline=heavy / "dense.onnx", **options)
    assert held == [["big"], ["big"]]  # the model's, then the baseline's
    monkeypatch.setattr(profiler, "held_for_profile", lambda loaded: loaded)
    held.clear()
    whole = profile_model(heavy / "model.onnx", heavy / "eval.npz", baseline=heavy / "dense.onnx", **options)
    assert held == [[], []]
    docs = [p.to_json() for p in (alone, whole)]
    kept = ("examples", "mapping", "block_method", "flops_executed", "notes")
    same = [{k: d[k] for k in kept} | {"ran": [{k: v for k, v in r.items() if k != "latency_ms"} for r in d["per_input"]]}
            for d in docs]
    assert same[0] == same[1]
    assert [b["name"] for b in docs[0]["blocks"]] == [b["name"] for b in docs[1]["blocks"]]
    assert docs[0]["per_input"] and docs[0]["flops_executed"] and docs[0]["baseline"]["flops_executed"]


def test_the_profile_command_hands_the_profile_the_graph_alone(heavy, monkeypatch):
    """`graphaudit profile` reads the model once for its static audit and the profile, and lets its
    weights go before the profile's sessions read the file."""
    import graphaudit.profile as profile_package

    handed, profile = [], profile_package.profile_model

    def recorded(loaded, *args, **kwargs):
        handed.append(_stubbed(loaded))
        return profile(loaded, *args, **kwargs)

    monkeypatch.setattr(profile_package, "profile_model", recorded)
    result = CliRunner().invoke(cli, ["profile", str(heavy / "model.onnx"), "--data", str(heavy / "eval.npz"),
                                      "--runs", "2", "--warmup", "1", "--profile-runs", "1", "--threads", "1",
                                      "--format", "json", "-q"])
    assert result.exit_code == 0, result.output
    assert handed == [["big"]]
    assert json.loads(result.output)["examples"] == 6
