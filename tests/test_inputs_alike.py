"""Where every input does the same work in the model and in the baseline (nothing in either graph
depends on input values, and every input has the same shapes), the inputs a profile's sample
leaves out could change the workload ratio by the measurement's noise alone, which the rounds'
bootstrap already holds: the interval compute savings is decided on is not widened for them
(`run`, and `graphaudit profile`, which audits both graphs at the data's shape as `run` does).
Read as a difference between inputs, the noise of a busy machine had widened a 160M FeatureGate's
interval by ±11% and kept its profile timing to its budget.

The profile's wiring runs under a fake clock (each run a second, give or take a seeded 30%); no
wall-clock time is asserted."""

import json
import shutil
import types

import numpy as np
import pytest
from click.testing import CliRunner

import graphaudit.profile.latency as latency
from graphaudit.analyses.static import audit_static
from graphaudit.cli import cli
from graphaudit.load.model import load_model
from graphaudit.profile import profile_model
from graphaudit.profile.baseline import ALIKE_METHOD, COUNTED, compare, ratio_interval, same_work
from graphaudit.profile.rounds import ALIKE_SAMPLE, FEWEST_SAMPLE, plan_sample
from graphaudit.report.profile_text import render_text
from graphaudit.verdict.decide import decide

from support.profile_models import feeds_for, save_profile_files

SECOND = 10**9


@pytest.fixture
def files(tmp_path):
    """The profile tests' files, a copy of the dense model as a model with fixed work, and 12 inputs."""
    folder = save_profile_files(tmp_path)
    shutil.copy(folder / "dense.onnx", folder / "fixed.onnx")
    np.savez(folder / "many.npz", x=feeds_for(12))
    return folder


def _static(path):
    return audit_static(load_model(path))


def _clock(monkeypatch, step):
    ticks = iter(np.cumsum([step() for _ in range(10**6)]).astype(np.int64))
    monkeypatch.setattr(latency, "time", types.SimpleNamespace(perf_counter_ns=lambda: next(ticks)))


@pytest.fixture
def noisy_seconds(monkeypatch):
    """A clock in which each run takes a second, give or take a seeded 30%."""
    rng = np.random.default_rng(0)
    _clock(monkeypatch, lambda: int(SECOND * (1 + 0.3 * rng.uniform(-1, 1))))


@pytest.fixture
def second_per_run(monkeypatch):
    """A clock in which every run takes one second."""
    _clock(monkeypatch, lambda: SECOND)


def test_inputs_do_the_same_work_where_neither_graph_depends_on_values_and_every_input_has_one_shape(files):
    fixed, dynamic = _static(files / "fixed.onnx"), _static(files / "dynamic.onnx")
    assert fixed.fixed_work and not dynamic.fixed_work  # an If the model decides: its work varies
    one = (("x", (1, 8, 4)),)
    assert same_work([fixed, fixed], [one] * 5) and same_work([fixed], [one] * 5)  # with a baseline, or alone
    assert not same_work([fixed, fixed], [one, one, (("x", (1, 6, 4)),)])  # another length is other work
    assert not same_work([dynamic, fixed], [one] * 5) and not same_work([fixed, dynamic], [one] * 5)
    assert not same_work([None, fixed], [one]) and not same_work([fixed, None], [one])  # nothing says so
    assert not same_work([], [one])


def test_alike_inputs_left_out_do_not_widen_the_interval_and_the_answer_says_why():
    rng = np.random.default_rng(0)
    base = rng.normal(1e6, 1e4, (5, 4))
    load = rng.lognormal(0, 0.2, (5, 1))  # a busy machine: rounds far apart, and each run off by 10%
    model, base = base * 1.04 * load * rng.lognormal(0, 0.1, base.shape), base * load
    widened = compare("dense", model, base, inputs=32).ratio_interval
    alike = compare("dense", model, base, inputs=32, alike=True).ratio_interval
    rounds_only = ratio_interval(model, base)
    assert widened.sampling > 0.03 and alike.sampling == 0.0 and alike.alike
    assert (alike.low, alike.high) == (rounds_only.low, rounds_only.high)
    assert (alike.sample, alike.inputs) == (4, 32) and alike.sampled
    assert widened.low < alike.low < 1.04 < alike.high < widened.high
    doc = compare("dense", model, base, inputs=32, alike=True).to_json()["ratio_interval"]
    assert doc["inputs_alike"] is True and doc["method"] == ALIKE_METHOD and doc["sampling_halfwidth"] == 0.0
    assert "inputs_alike" not in compare("dense", model, base, inputs=32).to_json()["ratio_interval"]
    assert "inputs_alike" not in compare("dense", model, base, alike=True).to_json()["ratio_interval"]  # none left out
    profile = {"model": "model.onnx", "provider": "CPUExecutionProvider", "batch_size": 1,
               "latency_ms": {"median": 1.0, "n": 20}, "baseline": compare("dense", model, base, inputs=32,
                                                                          alike=True).to_json(),
               "rounds": {"sample": 4, "inputs": 32}}
    evidence = " ".join(e.text for e in decide(None, None, profile).compute_savings.evidence)
    assert "on 4 of the 32 inputs" in evidence
    assert "every input does the same work in each graph timed (nothing in it depends" in evidence and "the 28 left out could change only " \
           "the noise the rounds hold: not widened" in evidence and "widened by ±" not in evidence


@pytest.mark.parametrize("sample", [FEWEST_SAMPLE, ALIKE_SAMPLE])
def test_the_rounds_interval_alone_holds_a_workload_of_alike_inputs_about_19_times_in_20(sample):
    """400 seeded workloads of 32 inputs doing the same work (one ratio to the baseline for all,
    their latencies as alike as a shape makes them), timed on `sample` of them for 5 rounds under a
    load both runs of a pair share and 1% of noise per run: the rounds' interval, not widened,
    holds the workload's ratio in about 95% of them, on the 2 inputs a chosen sample of alike
    inputs holds as on 4 (wider, by about the square root of 2)."""
    held, halfwidths = 0, []
    for seed in range(400):
        rng = np.random.default_rng(seed)
        ratio = rng.uniform(0.8, 1.2)
        load = rng.lognormal(0, 0.2, (5, 1))
        baseline = 1e6 * load * rng.lognormal(0, 0.01, (5, sample))
        model = 1e6 * ratio * load * rng.lognormal(0, 0.01, (5, sample))
        interval = compare("dense", model, baseline, inputs=32, alike=True).ratio_interval
        held += interval.low <= ratio <= interval.high
        halfwidths.append((interval.high - interval.low) / 2 / ratio)
    assert held >= 370, held
    assert 0.005 < float(np.mean(halfwidths)) < 0.015  # 0.8% on 4 inputs, 1.2% on 2


def test_a_sampled_profile_of_alike_inputs_decides_on_the_rounds_alone(files, noisy_seconds):
    fixed, dense = _static(files / "fixed.onnx"), _static(files / "dense.onnx")
    report = profile_model(files / "fixed.onnx", files / "many.npz", baseline=files / "dense.onnx", threads=1,
                           static=fixed, baseline_static=dense)
    doc = report.to_json()
    interval = doc["baseline"]["ratio_interval"]
    assert (doc["rounds"]["sample"], doc["rounds"]["inputs"]) == (interval["sample"], interval["inputs"]) == (2, 12)
    assert interval["inputs_alike"] is True and interval["sampling_halfwidth"] == 0.0
    text = render_text(report)
    assert "interval over rounds 0." in text and "and the inputs left out" not in text


def test_a_sampled_profile_of_inputs_that_may_differ_still_counts_those_left_out(files, noisy_seconds):
    dynamic, dense = _static(files / "dynamic.onnx"), _static(files / "dense.onnx")
    doc = profile_model(files / "dynamic.onnx", files / "many.npz", baseline=files / "dense.onnx", threads=1,
                        static=dynamic, baseline_static=dense).to_json()
    interval = doc["baseline"]["ratio_interval"]
    assert interval["sample"] == 4 and "inputs_alike" not in interval and interval["sampling_halfwidth"] > 0
    # without the baseline's report nothing says its work is fixed: counted as before
    doc = profile_model(files / "fixed.onnx", files / "many.npz", baseline=files / "dense.onnx", threads=1,
                        static=_static(files / "fixed.onnx")).to_json()
    assert "inputs_alike" not in doc["baseline"]["ratio_interval"]
    assert doc["baseline"]["ratio_interval"]["sampling_halfwidth"] > 0


def test_graphaudit_profile_audits_both_graphs_at_the_datas_shape_as_run_does(files):
    """`graphaudit profile` audits model and baseline at the shape of one run of the data, so that
    where neither depends on input values the baseline's FLOPs are its count and a sample's inputs
    left out widen nothing; where the model does depend on them, they still do."""
    args = ["profile", "--data", str(files / "many.npz"), "--baseline", str(files / "dense.onnx"), "--sample", "4",
            "--runs", "5", "--threads", "1", "--format", "json", "-q"]
    fixed = CliRunner().invoke(cli, [*args[:1], str(files / "fixed.onnx"), *args[1:]])
    assert fixed.exit_code == 0, fixed.output
    baseline = json.loads(fixed.output)["baseline"]
    assert baseline["ratio_interval"]["inputs_alike"] is True and baseline["ratio_interval"]["sampling_halfwidth"] == 0
    assert baseline["flops_source"] == COUNTED
    dynamic = CliRunner().invoke(cli, [*args[:1], str(files / "dynamic.onnx"), *args[1:]])
    assert dynamic.exit_code == 0, dynamic.output
    interval = json.loads(dynamic.output)["baseline"]["ratio_interval"]
    assert "inputs_alike" not in interval and interval["sample"] == 4 and interval["inputs"] == 12


def test_a_sample_of_alike_inputs_holds_the_fewest_where_more_would_fit():
    chosen, why = plan_sample(32, 0.5, 0.5, budget_s=120)
    assert chosen > FEWEST_SAMPLE  # inputs that may differ: as many as fit half the budget
    chosen, why = plan_sample(32, 0.5, 0.5, budget_s=120, alike=True)
    assert chosen == ALIKE_SAMPLE == 2 and why.startswith("2 of 32 inputs, one drawn at random from each of 2 "
                                                          "equal stretches of them: the fewest, as every input "
                                                          "does the same work")
    assert plan_sample(1, 0.5, 0.5, budget_s=0.5, alike=True)[0] == 1  # never more than there are
    assert plan_sample(32, 0.001, 0.001, alike=True) == (32, "every input")  # all fit: no sample at all
    assert plan_sample(32, 0.5, 0.5, budget_s=120, sample=9, alike=True) == (9, "as given")


def test_a_profile_of_alike_inputs_samples_the_fewest_and_one_that_may_differ_as_many_as_fit(files, second_per_run):
    fixed, dynamic, dense = _static(files / "fixed.onnx"), _static(files / "dynamic.onnx"), _static(files / "dense.onnx")
    common = {"baseline": files / "dense.onnx", "threads": 1, "budget": 400, "baseline_static": dense}
    alike = profile_model(files / "fixed.onnx", files / "many.npz", static=fixed, **common).to_json()["rounds"]
    differ = profile_model(files / "dynamic.onnx", files / "many.npz", static=dynamic, **common).to_json()["rounds"]
    assert (alike["sample"], differ["sample"]) == (ALIKE_SAMPLE, 9)  # 9 of 12 fit half of the 400 s budget
    assert "the fewest, as every input does the same work" in alike["reason"]
