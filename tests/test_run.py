"""`graphaudit run` and `graphaudit.audit` on the zoo: the verdicts DESIGN.md predicts, claims, formats.

Each model is audited once (module fixture) with small settings, as JSON with
`--claim dynamic-inference`; the tests read that document and the exit status. A model
whose fixture is not built is skipped, saying which.
"""

import json
import re
from pathlib import Path

import pytest

import graphaudit
from graphaudit.cli import main

from support.json_schema import validate

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "fixtures"
FAST = ["--runs", "3", "--warmup", "1", "--profile-runs", "1", "--limit", "8", "--resamples", "100",
        "--provider", "cpu"]


def zoo(name):
    folder = FIXTURES / name
    for f in ("model.onnx", "calib.npz", "eval.npz"):
        if not (folder / f).is_file():
            pytest.skip(f"zoo fixture {name}/{f} is not built (python -m exporters.build --out fixtures)")
    return folder


def run(args, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main([str(a) for a in args])
    out, err = capsys.readouterr()
    return exit_info.value.code, out, err


def model_args(name, baseline=True):
    folder = zoo(name)
    args = ["run", folder / "model.onnx", "--calib", folder / "calib.npz", "--data", folder / "eval.npz", *FAST]
    if baseline:
        args += ["--baseline", zoo("dense") / "model.onnx"]
    return args


@pytest.fixture(scope="module")
def audited(tmp_path_factory):
    """name -> (exit status, JSON document, stderr) of `run --claim dynamic-inference --format json`."""
    cache = {}
    out_dir = tmp_path_factory.mktemp("run")

    def get(name):
        if name not in cache:
            target = out_dir / f"{name}.json"
            args = model_args(name) + ["--format", "json", "-o", target, "--claim", "dynamic-inference", "--quiet"]
            try:
                main([str(a) for a in args])
                code = 0
            except SystemExit as exit_info:
                code = exit_info.code
            cache[name] = (code, json.loads(target.read_text()) if target.is_file() else None)
        return cache[name]

    return get


def answers(doc):
    return {k: v["answer"] for k, v in doc["verdict"].items()}


@pytest.mark.parametrize("name", ["featuregate", "mudd"])
def test_dynamic_parameters_without_dynamic_inference_refute_the_claim(name, audited):
    code, doc = audited(name)
    assert code == 3
    validate(doc)
    got = answers(doc)
    assert got["coefficient_variation"] == "yes"
    assert got["conditional_execution"] == "no"  # every block executed (DESIGN.md, the paper's finding)
    assert got["functional_dependence"] in ("yes", "no")  # measured, whichever way it goes
    assert doc["claims"] == [{"claim": "dynamic-inference", "supported": False,
                              "reason": doc["claims"][0]["reason"]}]
    assert doc["claims"][0]["reason"].startswith("refuted:")
    assert all(b["verdict"] in ("always", "gated") for b in doc["static"]["blocks"])
    blocks = [b for b in doc["profile"]["blocks"] if not b["name"].startswith("(")]
    assert blocks and all(b["executed_fraction"] == 1.0 for b in blocks)
    assert doc["replay"]["parity"]["ok"] and doc["coefficient_means"]


def test_earlyexit_skips_blocks_and_supports_the_claim(audited):
    code, doc = audited("earlyexit")
    assert code == 0, doc and doc["claims"]
    validate(doc)
    assert answers(doc)["conditional_execution"] == "yes"
    assert any(b["verdict"] == "branch" for b in doc["static"]["blocks"])
    assert any((b["executed_fraction"] or 1) < 1 for b in doc["profile"]["blocks"])
    assert doc["claims"][0]["supported"] is True
    # The profile checks each block's static verdict against what ran.
    agreement = {a["block"]: (a["static_verdict"], a["outcome"]) for a in doc["profile"]["static_agreement"]}
    assert agreement["blocks.2"] == ("branch", "confirmed") and agreement["blocks.0"] == ("always", "confirmed")
    # An If decides once per batch: the replay runs one input per batch, and says so.
    assert doc["replay"]["settings"]["batch_size"] == 1
    assert any("one input per batch" in note for note in doc["notes"])


def test_moe_dispatches_tokens_to_a_subset(audited):
    code, doc = audited("moe")
    validate(doc)
    assert any(b["verdict"] == "subset" for b in doc["static"]["blocks"])
    assert answers(doc)["conditional_execution"] == "yes" and code == 0


def test_dense_has_no_replay_and_says_so(audited):
    code, doc = audited("dense")
    validate(doc)
    assert doc["replay"] is None
    assert any("frozen replay did not run" in note for note in doc["notes"])
    assert answers(doc)["coefficient_variation"] == "not measured"
    assert answers(doc)["conditional_execution"] == "no" and code == 3
    assert doc["inputs"].get("is_baseline") is True  # dense against itself is not timed


def test_text_report_on_stdout_and_claim_on_stderr(capsys):
    code, out, err = run(model_args("featuregate") + ["--claim", "dynamic-inference", "--quiet"], capsys)
    assert code == 3
    assert out.startswith("graphaudit run · model ") and "\nVerdict\n" in out
    assert re.search(r"conditional execution\s+no\s+No: every block runs", out)
    assert err.startswith("graphaudit: claim dynamic-inference refuted: ")
    assert "Traceback" not in err


@pytest.mark.parametrize("fmt", ["markdown", "html"])
def test_formats_written_to_a_file(fmt, tmp_path, capsys):
    target = tmp_path / f"report.{fmt}"
    code, out, err = run(model_args("mudd") + ["--format", fmt, "-o", target], capsys)
    assert code == 0 and out == ""
    assert f"wrote the {fmt} report to {target}" in err
    text = target.read_text()
    if fmt == "markdown":
        assert text.startswith("## graphaudit:") and "| functional dependence |" in text
    else:
        assert text.count("<svg") >= 5 and "<script" not in text


def test_compute_savings_needs_a_baseline(capsys):
    code, _out, err = run(model_args("featuregate", baseline=False) + ["--claim", "compute-savings"], capsys)
    assert code == 2 and "expected --baseline with --claim compute-savings" in err


def test_bad_input_is_one_line_and_status_1(tmp_path, capsys):
    bad = tmp_path / "calib.npz"
    bad.write_bytes(b"not an npz")
    folder = zoo("featuregate")
    code, _out, err = run(["run", folder / "model.onnx", "--calib", bad, "--quiet"], capsys)
    assert code == 1 and err.startswith("graphaudit: error: ") and err.count("\n") == 1


def test_python_api_mirrors_the_command():
    folder = zoo("featuregate")
    report = graphaudit.audit(folder / "model.onnx", folder / "calib.npz", folder / "eval.npz",
                              provider="cpu", runs=2, warmup=1, profile_runs=1, profile_limit=4, resamples=50)
    assert isinstance(report, graphaudit.AuditReport)
    assert report.verdict.conditional_execution.answer == "no"
    assert not report.check("dynamic-inference").supported
    assert report.replay.coefficients and report.profile is not None and report.static is not None
    assert report.verdict.compute_savings.answer == "not measured"  # no baseline given
    doc = report.to_json()
    validate(doc)
    assert json.loads(report.render("json")) == doc


def test_an_if_on_a_shape_is_no_dynamic_inference(tmp_path, capsys):
    """Each input runs the same branch of an If whose condition is a shape: fewer nodes ran than the
    block holds, on every input alike. The claim of dynamic inference is refuted (exit 3)."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    width = 16

    def weight(name):
        return numpy_helper.from_array((rng.standard_normal((width, width)) / 4).astype(np.float32), name)

    then = helper.make_graph([helper.make_node("Mul", ["y0", "c1"], ["t_out"], name="/blocks.0/then/Mul")], "then",
                             [], [helper.make_tensor_value_info("t_out", TensorProto.FLOAT, None)])
    other = helper.make_graph([helper.make_node("MatMul", ["y0", "blocks.0.alt.weight"], ["e1"], name="/blocks.0/else/MatMul"),
                               helper.make_node("Relu", ["e1"], ["e_out"], name="/blocks.0/else/Relu")], "else",
                              [], [helper.make_tensor_value_info("e_out", TensorProto.FLOAT, None)])
    nodes = [helper.make_node("MatMul", ["x", "blocks.0.fc.weight"], ["h0"], name="/blocks.0/fc/MatMul"),
             helper.make_node("Relu", ["h0"], ["a0"], name="/blocks.0/Relu"),
             helper.make_node("Add", ["x", "a0"], ["y0"], name="/blocks.0/Add"),
             helper.make_node("Shape", ["x"], ["s"], name="/blocks.0/Shape"),
             helper.make_node("Gather", ["s", "one"], ["t1"], name="/blocks.0/Gather", axis=0),
             helper.make_node("ReduceSum", ["t1"], ["t"], name="/blocks.0/ReduceSum", keepdims=0),
             helper.make_node("Greater", ["t", "zero"], ["cond"], name="/blocks.0/Greater"),
             helper.make_node("If", ["cond"], ["y1"], name="/blocks.0/If", then_branch=then, else_branch=other),
             helper.make_node("MatMul", ["y1", "blocks.1.fc.weight"], ["h1"], name="/blocks.1/fc/MatMul"),
             helper.make_node("Relu", ["h1"], ["a1"], name="/blocks.1/Relu"),
             helper.make_node("Add", ["y1", "a1"], ["y"], name="/blocks.1/Add")]
    inits = [weight("blocks.0.fc.weight"), weight("blocks.0.alt.weight"), weight("blocks.1.fc.weight"),
             numpy_helper.from_array(np.array([1], np.int64), "one"),
             numpy_helper.from_array(np.array(0, np.int64), "zero"),
             numpy_helper.from_array(np.array(1.0, np.float32), "c1")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "seq", width])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", "seq", width])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    onnx.save(model, tmp_path / "model.onnx")
    for name, seed in (("calib", 1), ("eval", 2)):
        np.savez(tmp_path / f"{name}.npz", x=np.random.default_rng(seed).standard_normal((6, 8, width)).astype(np.float32))
    code, out, err = run(["run", tmp_path / "model.onnx", "--calib", tmp_path / "calib.npz", "--data",
                          tmp_path / "eval.npz", "--claim", "dynamic-inference", "--format", "json", *FAST], capsys)
    doc = json.loads(out)
    assert [b["verdict"] for b in doc["static"]["blocks"]] == ["always", "always"]
    fraction = next(b for b in doc["profile"]["blocks"] if b["name"] == "blocks.0")["node_fraction"]
    assert fraction["min"] == fraction["max"] < 1.0  # the else-branch never ran, on any input
    assert doc["verdict"]["conditional_execution"]["answer"] == "no"
    agreement = {a["block"]: a["outcome"] for a in doc["profile"]["static_agreement"]}
    assert agreement["blocks.0"] == "confirmed"
    assert code == 3 and "claim dynamic-inference refuted" in err


def test_bookkeeping_that_changes_shape_is_no_dynamic_inference(tmp_path, capsys):
    """A NonZero counting positive activations changes shape with the values, but the block's
    matrix products run at the same size for every input: no dynamic inference (exit 3)."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    width = 16
    weights = [numpy_helper.from_array((rng.standard_normal((width, width)) / 4).astype(np.float32), f"blocks.{i}.fc.weight")
               for i in range(2)] + [numpy_helper.from_array(np.array(0.0, np.float32), "zero")]
    nodes = [helper.make_node("MatMul", ["x", "blocks.0.fc.weight"], ["h0"], name="/blocks.0/fc/MatMul"),
             helper.make_node("Relu", ["h0"], ["a0"], name="/blocks.0/Relu"),
             helper.make_node("Add", ["x", "a0"], ["y0"], name="/blocks.0/Add"),
             helper.make_node("Greater", ["a0", "zero"], ["pos"], name="/blocks.0/Greater"),
             helper.make_node("NonZero", ["pos"], ["nz"], name="/blocks.0/NonZero"),
             helper.make_node("Shape", ["nz"], ["count"], name="/blocks.0/Shape"),
             helper.make_node("MatMul", ["y0", "blocks.1.fc.weight"], ["h1"], name="/blocks.1/fc/MatMul"),
             helper.make_node("Relu", ["h1"], ["a1"], name="/blocks.1/Relu"),
             helper.make_node("Add", ["y0", "a1"], ["y"], name="/blocks.1/Add")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "seq", width])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", "seq", width]),
                               helper.make_tensor_value_info("count", TensorProto.INT64, [2])], weights)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), tmp_path / "model.onnx")
    for name, seed in (("calib", 1), ("eval", 2)):
        np.savez(tmp_path / f"{name}.npz", x=np.random.default_rng(seed).standard_normal((6, 8, width)).astype(np.float32))
    code, out, err = run(["run", tmp_path / "model.onnx", "--calib", tmp_path / "calib.npz", "--data",
                          tmp_path / "eval.npz", "--claim", "dynamic-inference", "--format", "json", *FAST], capsys)
    doc = json.loads(out)
    varying = next(b for b in doc["profile"]["blocks"] if b["name"] == "blocks.0")["value_dependent_shapes"]
    assert {v["op_type"] for v in varying} >= {"NonZero"} and not any(v["compute"] for v in varying)
    assert doc["verdict"]["conditional_execution"]["answer"] == "no"
    assert code == 3 and "claim dynamic-inference refuted" in err


def test_threads_reach_the_replay_and_the_profile_and_are_recorded(tmp_path, capsys):
    target = tmp_path / "one.json"
    code, _, err = run(model_args("featuregate", baseline=False) + ["--threads", "1", "--format", "json", "-o", target,
                                                                    "--quiet"], capsys)
    assert code == 0, err
    doc = json.loads(target.read_text())
    validate(doc)
    assert doc["inputs"]["threads"] == 1
    assert doc["replay"]["settings"]["threads"] == 1 and doc["profile"]["threads"] == 1
    code, _, err = run(model_args("featuregate", baseline=False) + ["--threads", "0"], capsys)
    assert code == 2 and "--threads" in err and err.count("\n") == 1
    folder = zoo("featuregate")
    with pytest.raises(graphaudit.GraphAuditError, match=r"expected threads in 1\.\.1024, found 0") as refused:
        graphaudit.audit(folder / "model.onnx", folder / "calib.npz", provider="cpu", threads=0)
    assert refused.value.exit_code == 2


def _two_path_router(tmp_path, join: str):
    """A router whose probabilities are the coefficient, while the graph also routes on the logits
    they came from (a second path the freeze leaves live); the rows each path selects are joined
    by an Add. `join` "rows": the selected rows themselves, whose number a reassignment across the
    batch's inputs or tokens keeps; "positions": a Range as long as the sum of the selected
    positions, which almost any reassignment changes. Live, both paths select alike."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    from graphaudit.analyses.declared_coefficients import Coefficient, metadata_entry

    width = 4
    rng = np.random.default_rng(0)
    nodes = [
        helper.make_node("MatMul", ["x", "router"], ["logits"], name="/blocks.0/router/MatMul"),
        helper.make_node("Softmax", ["logits"], ["probs"], name="/blocks.0/router/Softmax", axis=-1),
        helper.make_node("Gather", ["probs", "zero"], ["p0"], name="/blocks.0/Gather", axis=2),
        helper.make_node("Greater", ["p0", "half"], ["by_probs"], name="/blocks.0/Greater"),
        helper.make_node("Gather", ["logits", "zero"], ["l0"], name="/blocks.0/Gather_1", axis=2),
        helper.make_node("Gather", ["logits", "one"], ["l1"], name="/blocks.0/Gather_2", axis=2),
        helper.make_node("Greater", ["l0", "l1"], ["by_logits"], name="/blocks.0/Greater_1"),
        helper.make_node("Reshape", ["x", "rows"], ["flat"], name="/blocks.0/Reshape"),
        helper.make_node("Reshape", ["by_probs", "all"], ["m1"], name="/blocks.0/Reshape_1"),
        helper.make_node("Reshape", ["by_logits", "all"], ["m2"], name="/blocks.0/Reshape_2"),
    ]
    if join == "rows":
        nodes += [helper.make_node("Compress", ["flat", "m1"], ["s1"], name="/blocks.0/Compress", axis=0),
                  helper.make_node("Compress", ["flat", "m2"], ["s2"], name="/blocks.0/Compress_1", axis=0)]
    else:
        for i in "12":
            nodes += [helper.make_node("NonZero", [f"m{i}"], [f"at{i}"], name=f"/blocks.0/NonZero_{i}"),
                      helper.make_node("ReduceSum", [f"at{i}"], [f"sum{i}"], name=f"/blocks.0/ReduceSum_{i}",
                                       keepdims=0),
                      helper.make_node("Range", ["zero", f"sum{i}", "one"], [f"r{i}"], name=f"/blocks.0/Range_{i}"),
                      helper.make_node("Cast", [f"r{i}"], [f"s{i}"], name=f"/blocks.0/Cast_{i}", to=TensorProto.FLOAT)]
    nodes += [
        helper.make_node("Add", ["s1", "s2"], ["both"], name="/blocks.0/Add"),
        helper.make_node("ReduceSum", ["both"], ["total"], name="/blocks.0/ReduceSum", keepdims=0),
        helper.make_node("MatMul", ["x", "w"], ["h"], name="/blocks.0/fc/MatMul"),
        helper.make_node("Add", ["h", "total"], ["y"], name="/blocks.0/Add_1"),
    ]
    inits = [numpy_helper.from_array(rng.standard_normal((width, 2)).astype(np.float32), "router"),
             numpy_helper.from_array(rng.standard_normal((width, width)).astype(np.float32), "w"),
             numpy_helper.from_array(np.array(0, np.int64), "zero"), numpy_helper.from_array(np.array(1, np.int64), "one"),
             numpy_helper.from_array(np.array(0.5, np.float32), "half"),
             numpy_helper.from_array(np.array([-1, width], np.int64), "rows"),
             numpy_helper.from_array(np.array([-1], np.int64), "all")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "seq", width])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", "seq", width])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    model.metadata_props.append(metadata_entry([Coefficient("probs", "router", 0, ("batch", "token", "expert"))]))
    onnx.save(model, tmp_path / "model.onnx")
    for name, seed in (("calib", 1), ("eval", 2)):
        np.savez(tmp_path / f"{name}.npz", x=np.random.default_rng(seed).standard_normal((6, 8, width)).astype(np.float32))
    return ["run", tmp_path / "model.onnx", "--calib", tmp_path / "calib.npz", "--data", tmp_path / "eval.npz",
            "--format", "json", *FAST]


def test_a_frozen_graph_that_cannot_run_reassigned_coefficients_leaves_the_rest_of_the_audit(tmp_path, capsys):
    """With another input's probabilities, or its own shuffled, or a profile, the two selections
    differ and ONNX Runtime refuses the Add that joins them: no condition but `correct` runs. The
    live model runs on every input, so the static audit and the profile still stand; the
    replay's findings are not measured, and say why."""
    code, out, err = run(_two_path_router(tmp_path, "positions"), capsys)
    assert code == 0, err
    doc = json.loads(out)
    assert doc["replay"] is None and doc["static"]["blocks"] and doc["profile"]["blocks"]
    stopped = doc["verdict"]["functional_dependence"]
    assert stopped["answer"] == "not measured"
    assert re.search(r"the frozen replay stopped: expected the frozen graph to run on the coefficients of some "
                     r"condition besides correct, found that it runs on none: \w+ on evaluation inputs \d+\.\.\d+: "
                     r"ONNX Runtime's error in node '/blocks\.0/Add'", stopped["statement"])
    assert doc["verdict"]["coefficient_variation"]["answer"] == "not measured"
    assert any(n.startswith("the frozen replay stopped") for n in doc["notes"])
    assert not any(n.startswith("no coefficient tensors") for n in doc["notes"])


def test_conditions_a_frozen_graph_cannot_run_are_left_out_of_the_audit(tmp_path, capsys):
    """The rows each path selects only need to be as many: reassigning probabilities across the
    batch's inputs or shuffling them over tokens keeps their number, a profile does not. The
    replay reports the conditions that ran and names the others."""
    # `y` (batch, seq, 4) has no Softmax: it would be read as logits; given as values, it has no loss
    code, out, err = run([*_two_path_router(tmp_path, "rows"), "--output-kind", "y=regression"], capsys)
    assert code == 0, err
    doc = json.loads(out)
    validate(doc)
    assert doc["replay"]["task"]["read_as"]["given"] and doc["replay"]["task"]["kind"] == "outputs"
    settings = doc["replay"]["settings"]
    assert list(doc["replay"]["conditions"]) == settings["conditions"] == ["correct", "cross_input", "token_shuffle"]
    assert list(settings["failed_conditions"]) == ["static_layer", "static_position", "global_mean"]
    assert all("ONNX Runtime's error in node '/blocks.0/Add' (Add)" in v for v in settings["failed_conditions"].values())
    dependence = doc["verdict"]["functional_dependence"]  # `y` is no logits and has no targets: no loss
    assert dependence["answer"] == "not measured" and "'y' is not a distribution" in dependence["statement"]
    assert doc["verdict"]["coefficient_variation"]["answer"] == "yes"
    assert any("`static_layer`, `static_position`, `global_mean` did not run" in e["text"]
               for e in doc["verdict"]["functional_dependence"]["evidence"])
    assert any("left out: ONNX Runtime would not run the frozen graph" in n for n in doc["notes"])


def test_a_coefficient_inside_control_flow_stops_the_replay_not_the_audit(tmp_path, capsys):
    # the metadata names a gate computed inside an If's then-branch: it can be neither exposed
    # nor fed, so the replay cannot run; the static audit and the profile still stand
    import numpy as np
    import onnx

    from support.models import gate_in_branch, token_ids

    model = gate_in_branch()
    onnx.save(model, tmp_path / "model.onnx")
    np.savez(tmp_path / "calib.npz", input_ids=token_ids(8))
    code, out, err = run(["run", tmp_path / "model.onnx", "--calib", tmp_path / "calib.npz", "--format", "json", *FAST],
                         capsys)
    assert code == 0, err
    doc = json.loads(out)
    assert doc["replay"] is None and doc["profile"] is not None and doc["static"] is not None
    stopped = doc["verdict"]["functional_dependence"]["statement"]
    assert "the frozen replay stopped: expected coefficient 'gate.b' in the main graph, found it inside the " \
           "then-branch of If `branch`" in stopped


def test_the_report_says_how_long_each_phase_took(audited):
    _, doc = audited("featuregate")
    timing = doc["timing"]
    phases = ("load_s", "static_s", "replay_s", "profile_s")
    assert set(timing) == {*phases, "total_s"} and all(timing[k] >= 0 for k in timing)
    assert sum(timing[k] for k in phases) == pytest.approx(timing["total_s"])
    assert timing["replay_s"] >= sum(doc["replay"]["timing"].values()) > 0  # the replay's own phases lie inside
