"""`profile_model` and `graphaudit profile` end to end on the tiny dynamic graph.

Timings are never asserted: only what ran, how it was mapped, and what the report holds.
"""

import json
import os

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from graphaudit.cli import main
from graphaudit.errors import GraphAuditError
from graphaudit.graph.build import build_graph
from graphaudit.profile import ProfileReport, profile_model
from graphaudit.profile.baseline import compare
from graphaudit.profile.latency import spread, time_rounds

from support.profile_models import dense_model, dynamic_model, feeds_for, prefix_blocks, transformer_model

FAST = {"runs": 2, "warmup": 1, "profile_runs": 1, "threads": 1}
HAS_CUDA = "CUDAExecutionProvider" in ort.get_available_providers()


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    folder = tmp_path_factory.mktemp("profile")
    onnx.save(dynamic_model(), folder / "dynamic.onnx")
    onnx.save(dense_model(), folder / "dense.onnx")
    onnx.save(transformer_model(), folder / "transformer.onnx")
    np.savez(folder / "data.npz", x=feeds_for(4))
    return folder


@pytest.fixture(scope="module")
def report(files):
    blocks = prefix_blocks(build_graph(dynamic_model()), ("/block0/", "/block1/M", "/moe/", "/loop/"))
    return profile_model(files / "dynamic.onnx", files / "data.npz", baseline=files / "dense.onnx",
                         block_map=blocks, trace=files / "trace.json", **FAST)


def test_report_json_has_the_documented_fields(report):
    doc = report.to_json()
    json.dumps(doc, allow_nan=False)
    assert doc["provider"] == "CPUExecutionProvider"
    assert set(doc["latency_ms"]) >= {"median", "p10", "p90"}
    assert 0 < doc["coverage"] <= 1
    assert doc["inputs"] == 4 and len(doc["per_input"]) == 4
    for block in doc["blocks"]:
        assert set(block) >= {"name", "median_ms", "share", "executed_fraction"}
    assert set(doc["baseline"]) >= {"latency_ms", "ratio", "ratio_spread"}
    assert doc["baseline"]["ratio"] > 0 and doc["profiling_overhead"] > 0
    assert doc["mapping"]["method"] == "optimised-model" and doc["opt_level"] == "ORT_ENABLE_ALL"
    assert doc["node_time_kind"] == "kernel" and doc["profile_layout"] == "current"


def test_blocks_have_their_spread_over_inputs_and_the_baseline_its_own_blocks(report):
    doc = report.to_json()
    for block in doc["blocks"]:  # each input's median over rounds, then percentiles over the inputs
        assert block["p10_ms"] <= block["median_ms"] <= block["p90_ms"], block
    base = doc["baseline"]["blocks"]
    assert base, "the baseline's blocks, profiled as the model's"
    assert {b["name"] for b in base} >= {"(other)"} or len(base) >= 1
    for block in base:
        assert block["p10_ms"] <= block["median_ms"] <= block["p90_ms"], block
    assert 0 < sum(b["share"] for b in base) <= 1.0 + 1e-9  # the baseline's own run time, not the model's


def test_report_says_which_blocks_ran_for_which_inputs(report):
    assert report.block("block1/M")["executed_fraction"] == 0.5
    assert report.block("block0")["executed_fraction"] == 1.0
    assert [("block1/M" in p["blocks_ran"]) for p in report.to_json()["per_input"]] == [False, True, False, True]
    groups = {tuple(g["blocks_ran"]): g["inputs"] for g in report.by_blocks_ran()}
    assert groups == {("block0", "moe", "loop", "(other)"): 2, ("block0", "block1/M", "moe", "loop", "(other)"): 2}
    moe = report.block("moe")
    assert any(v["node"] == "/moe/expert/MatMul" for v in moe["value_dependent_shapes"])


def test_timed_profile_maps_fused_nodes_to_their_block(report):
    fused = [n for n in report.breakdown.nodes if n.name == "/block0/MatMul/MatMulAddFusion"]
    assert fused and fused[0].block == "block0" and fused[0].op_type == "Gemm"
    assert report.breakdown.unmapped_share == 0


def test_trace_file_is_a_chrome_trace_with_blocks(report, files):
    trace = json.loads((files / "trace.json").read_text())
    cats = {e.get("cat") for e in trace["traceEvents"]}
    assert {"run", "block", "node"} <= cats
    assert report.trace == str(files / "trace.json")


def test_disable_all_maps_one_to_one(files):
    r = profile_model(files / "dynamic.onnx", files / "data.npz", opt_level="disable", limit=2, **FAST)
    assert r.mapping_method == "one-to-one" and r.opt_level == "ORT_DISABLE_ALL"
    assert all(n.node == n.name for n in r.breakdown.nodes)
    assert r.baseline is None and r.to_json()["baseline"] is None


def test_profiler_files_stay_out_of_the_models_folder_and_cwd(files, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    before = sorted(os.listdir(files))
    profile_model(files / "dynamic.onnx", files / "data.npz", limit=1, **FAST)
    assert sorted(os.listdir(files)) == before and os.listdir(tmp_path) == []
    kept = tmp_path / "kept"
    profile_model(files / "dynamic.onnx", files / "data.npz", limit=1, keep_profiles=kept, **FAST)
    assert any(p.suffix == ".json" for p in kept.iterdir())


def test_baseline_with_other_inputs_is_refused(files):
    with pytest.raises(GraphAuditError, match=r"expected the baseline .*transformer\.onnx to take the same inputs"):
        profile_model(files / "dynamic.onnx", files / "data.npz", baseline=files / "transformer.onnx", **FAST)


@pytest.mark.skipif(HAS_CUDA, reason="CUDA is available here")
def test_cuda_when_unavailable_is_one_clear_error(files, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["profile", str(files / "dynamic.onnx"), "--data", str(files / "data.npz"), "--provider", "cuda"])
    err = capsys.readouterr().err
    assert exit_info.value.code == 1
    assert err.startswith("graphaudit: error: expected ONNX Runtime with the CUDAExecutionProvider")
    assert err.count("\n") == 1


def test_bad_counts_are_usage_errors(files):
    with pytest.raises(GraphAuditError, match="expected runs to be an integer of at least 1") as info:
        profile_model(files / "dynamic.onnx", files / "data.npz", runs=0)
    assert info.value.exit_code == 2


def test_cli_json_and_text(files, capsys):
    args = ["profile", str(files / "dynamic.onnx"), "--data", str(files / "data.npz"), "--runs", "2",
            "--warmup", "1", "--profile-runs", "1", "--threads", "1", "--limit", "2"]
    with pytest.raises(SystemExit) as exit_info:
        main(args + ["--format", "json", "--baseline", str(files / "dense.onnx"), "--provider", "auto"])
    assert exit_info.value.code == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["inputs"] == 2 and doc["baseline"]["ratio"] > 0
    assert doc["provider"] == ("CUDAExecutionProvider" if HAS_CUDA else "CPUExecutionProvider")
    with pytest.raises(SystemExit) as exit_info:
        main(args + ["--opt-level", "disable"])
    out = capsys.readouterr().out
    assert exit_info.value.code == 0
    assert "latency per input:" in out and "coverage" in out and "kernel times measured on the CPU" in out
    assert "one-to-one" in out and "/moe/NonZero" in out


def test_report_is_frozen(report):
    assert isinstance(report, ProfileReport)
    with pytest.raises(AttributeError):
        report.model = "other"


def test_rounds_alternate_order_and_drop_warmup():
    calls = []
    samples = time_rounds([lambda i: calls.append(("a", i)), lambda i: calls.append(("b", i))], 2, runs=2, warmup=1)
    assert samples.shape == (2, 2, 2)
    # batch by batch, the order flipping each time: round 0 (a b, b a), round 1 (b a, a b), ...
    assert "".join(c[0] for c in calls) == "abba" "baab" "abba"
    assert [c[1] for c in calls[:4]] == [0, 0, 1, 1]
    s = spread([1.0, 2.0, 3.0, 4.0, 100.0])
    assert s.median == 3.0 and s.p10 < s.median < s.p90 and s.n == 5


def test_ratio_is_the_workloads_and_a_preempted_run_does_not_move_it():
    rng = np.random.default_rng(0)
    base = rng.normal(1e6, 1e4, (10, 6))  # (round, input) ns
    model = base * np.array([1.0, 1.0, 1.0, 2.0, 2.0, 2.0])  # half the inputs twice as slow
    model[3, 0] = 50e6  # one call preempted by another process
    result = compare("dense", model, base)
    assert result.ratio == pytest.approx(1.5, rel=0.02)
    assert result.ratio_spread.p10 < result.ratio < result.ratio_spread.p90 < 2.0
    assert result.to_json()["ratio"] == result.ratio and "bootstrap" in result.to_json()["ratio_method"]
    same = compare("dense", base, base)
    assert same.ratio == 1.0 and same.ratio_spread.p10 == same.ratio_spread.p90 == 1.0
    assert compare("dense", model, base).ratio_spread == result.ratio_spread  # seeded
