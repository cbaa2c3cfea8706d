"""The profile's rounds: chosen from a round's time to fit a budget, or as given; and what the
audit holds of ONNX Runtime's memory once a session is done.

No wall-clock time is asserted: the rule is a pure function of the time it is given, and the
wiring runs under a fake clock in which every run takes one second.
"""

import gc
import json
import types
import weakref

import numpy as np
import onnx
import pytest

import graphaudit.profile.latency as latency
import graphaudit.profile.profiler as profiler
from graphaudit.cli import main
from graphaudit.errors import GraphAuditError
from graphaudit.profile import profile_model
from graphaudit.profile.rounds import (
    DEFAULT_BUDGET_S,
    FEWEST_RUNS,
    check_budget,
    choose_rounds,
    round_seconds,
    rounds_cost,
)
from graphaudit.replay.capture import capture

from support.models import gated_lm, traced
from support.profile_models import dense_model, dynamic_model, feeds_for

SECOND = 10**9


def test_a_fast_model_keeps_the_most_rounds():
    rounds = choose_rounds(0.01)
    assert (rounds.runs, rounds.warmup, rounds.profile_runs) == (20, 3, 3)
    assert rounds.chosen and rounds.round_s == 0.01 and rounds.budget_s == DEFAULT_BUDGET_S
    assert rounds.reason.startswith("the most, within the 30 s budget") and "measured time" in rounds.reason


def test_a_slow_model_takes_the_most_rounds_that_fit_the_budget():
    rounds = choose_rounds(2.0, budget_s=30)
    assert (rounds.runs, rounds.warmup, rounds.profile_runs) == (6, 2, 1)
    assert rounds_cost(6, 2, 1, 2.0) <= 30 < rounds_cost(7, 2, 1, 2.0)
    assert rounds.estimate_s == rounds_cost(6, 2, 1, 2.0)
    assert rounds.reason.startswith("fewer than the most") and "a round takes 2 s" in rounds.reason
    # more time each round, never more rounds
    runs = [choose_rounds(t).runs for t in (0.1, 0.5, 1.0, 2.0, 5.0)]
    assert runs == sorted(runs, reverse=True) and runs[0] == 20 and runs[-1] == FEWEST_RUNS


def test_a_model_too_slow_for_the_budget_runs_the_fewest_and_says_so():
    rounds = choose_rounds(10.0)  # a detector at 736 x 736, 12 inputs of 0.8 s
    assert (rounds.runs, rounds.warmup, rounds.profile_runs) == (3, 2, 1)
    assert rounds.reason.startswith("the fewest") and "past the 30 s budget" in rounds.reason


def test_the_baseline_timed_beside_the_model_counts():
    alone, beside = choose_rounds(1.0), choose_rounds(1.0, 1.0)
    assert beside.runs < alone.runs
    assert rounds_cost(beside.runs, beside.warmup, beside.profile_runs, 1.0, 1.0) <= DEFAULT_BUDGET_S


def test_rounds_given_are_kept():
    given = choose_rounds(100.0, runs=20, warmup=3, profile_runs=3)
    assert (given.runs, given.warmup, given.profile_runs) == (20, 3, 3)
    assert not given.chosen and given.reason == "as given" and given.round_s is None
    some = choose_rounds(100.0, runs=7)
    assert (some.runs, some.warmup, some.profile_runs) == (7, 2, 1) and "--runs 7 as given" in some.reason


def test_a_rounds_time_leaves_out_the_first_runs_start_up():
    first = np.array([5 * SECOND, SECOND // 100, SECOND // 100, SECOND // 100])
    assert round_seconds(first) == pytest.approx(0.04)


@pytest.mark.parametrize("budget", [0, -1.0, float("nan"), float("inf"), True])
def test_a_budget_must_be_positive_seconds(budget):
    with pytest.raises(GraphAuditError, match="expected the profile's budget to be a positive number") as info:
        check_budget(budget)
    assert info.value.exit_code == 2


@pytest.fixture
def files(tmp_path):
    onnx.save(dynamic_model(), tmp_path / "dynamic.onnx")
    onnx.save(dense_model(), tmp_path / "dense.onnx")
    np.savez(tmp_path / "data.npz", x=feeds_for(2))
    return tmp_path


@pytest.fixture
def second_per_run(monkeypatch):
    """A clock of the profile's timing in which every run takes one second."""
    ticks = iter(range(0, 10**6 * SECOND, SECOND))  # one second from each reading to the next
    monkeypatch.setattr(latency, "time", types.SimpleNamespace(perf_counter_ns=lambda: next(ticks)))


def test_the_profile_chooses_its_rounds_from_the_first_round(files, second_per_run):
    report = profile_model(files / "dynamic.onnx", files / "data.npz", threads=1)
    expected = choose_rounds(2.0)  # a round: 2 inputs of a second each
    assert (report.runs, report.warmup, report.profile_runs) == (expected.runs, expected.warmup,
                                                                 expected.profile_runs) == (6, 2, 1)
    doc = report.to_json()
    assert doc["runs"] == 6 and doc["rounds"]["chosen"] and doc["rounds"]["round_s"] == 2.0
    assert doc["rounds"]["reason"] == expected.reason
    assert doc["latency_ms"]["median"] == 1000.0


def test_the_baseline_beside_the_model_halves_the_budget_of_each(files, second_per_run):
    report = profile_model(files / "dynamic.onnx", files / "data.npz", baseline=files / "dense.onnx", threads=1)
    assert report.runs == choose_rounds(2.0, 2.0).runs == 3


def test_given_rounds_win_over_the_budget(files, second_per_run):
    report = profile_model(files / "dynamic.onnx", files / "data.npz", runs=2, warmup=1, profile_runs=1,
                           budget=0.001, threads=1)
    assert (report.runs, report.warmup, report.profile_runs) == (2, 1, 1)
    assert report.to_json()["rounds"] == {"runs": 2, "warmup": 1, "profile_runs": 1, "chosen": False,
                                          "reason": "as given", "round_s": None, "budget_s": None,
                                          "estimate_s": None}


def test_cli_states_the_rounds_and_why(files, second_per_run, capsys):
    args = ["profile", str(files / "dynamic.onnx"), "--data", str(files / "data.npz"), "--threads", "1"]
    with pytest.raises(SystemExit) as info:
        main(args + ["--budget", "60"])
    out = capsys.readouterr().out
    assert info.value.code == 0
    assert "; 17 timed rounds after 2 warm-up, 3 profiled" in out
    assert "rounds: fewer than the most (20 timed after 3 warm-up, 3 profiled) to fit the 60 s budget" in out
    with pytest.raises(SystemExit) as info:
        main(args + ["--runs", "2", "--warmup", "0", "--profile-runs", "1", "--format", "json"])
    doc = json.loads(capsys.readouterr().out)
    assert info.value.code == 0 and (doc["runs"], doc["warmup"]) == (2, 0) and doc["rounds"]["reason"] == "as given"
    with pytest.raises(SystemExit) as info:
        main(args + ["--budget", "0"])
    assert info.value.code == 2
    assert "expected the profile's budget to be a positive number of seconds, found 0.0" in capsys.readouterr().err


def test_run_reports_the_profiles_rounds(files, second_per_run, capsys):
    np.savez(files / "calib.npz", x=feeds_for(4))
    with pytest.raises(SystemExit) as info:
        main(["run", str(files / "dynamic.onnx"), "--calib", str(files / "calib.npz"), "--data",
              str(files / "data.npz"), "--provider", "cpu", "--threads", "1", "-q", "--profile-budget", "20",
              "--format", "json"])
    assert info.value.code == 0
    profile = json.loads(capsys.readouterr().out)["profile"]
    assert profile["rounds"]["budget_s"] == 20 and profile["runs"] == choose_rounds(2.0, budget_s=20).runs


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


def test_the_profile_reports_progress_round_by_round():
    """Each timed round and each profiled round is reported as it ends, against the rounds it will run."""
    from graphaudit.profile import profile_model

    from support.zoo import FIXTURES

    seen = []
    model = FIXTURES / "featuregate"
    profile_model(model / "model.onnx", model / "eval.npz", runs=3, warmup=1, profile_runs=2, limit=2,
                  opt_level="disable", progress=lambda stage, done, total: seen.append((stage, done, total)))
    assert [s for s in seen if s[0] == "timed rounds"] == [("timed rounds", 1, None), ("timed rounds", 2, 4),
                                                              ("timed rounds", 3, 4), ("timed rounds", 4, 4)]
    assert [s for s in seen if s[0] == "profiled rounds"] == [("profiled rounds", 1, 3), ("profiled rounds", 2, 3),
                                                                 ("profiled rounds", 3, 3)]
