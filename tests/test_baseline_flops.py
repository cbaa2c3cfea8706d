"""The baseline's executed FLOPs: its static count where nothing in its graph depends on input
values and every run is fed the shapes it was counted at (its evidence session then not
opened), measured from one profiled run per input otherwise; the report says which."""

import importlib

import onnx
import pytest
from onnx import parser

from graphaudit.analyses.static import audit_static
from graphaudit.load.model import load_for_runtime
from graphaudit.profile import profile_model
from graphaudit.profile import profiler as profiler_module
from graphaudit.profile.baseline import COUNTED, FLOPS_SOURCES, MEASURED, counted_flops
from graphaudit.report.jsondoc import SCHEMA_VERSION, schema
from graphaudit.report.profile_text import render_text

from support.json_schema import undescribed, validate
from support.zoo import FIXTURES

audit_module = importlib.import_module("graphaudit.audit")  # the package's `audit` is the function

DATA = FIXTURES / "dense" / "eval.npz"  # (32, 64) token ids, the same in every zoo folder
MODEL = FIXTURES / "featuregate" / "model.onnx"
FAST = {"runs": 2, "warmup": 1, "profile_runs": 1, "limit": 2, "threads": 1}

# A caller's switch: `use_head` runs a MatMul or passes `x` on. No weight or computation decides
# it, so the graph is not dynamic and nothing is skippable, yet what runs depends on a value fed.
SWITCHED = """
<ir_version: 8, opset_import: ["" : 17]>
switched (float[1,4] x, bool use_head) => (float[1,4] y)
<float[4,4] w = {1.,0.,0.,0., 0.,1.,0.,0., 0.,0.,1.,0., 0.,0.,0.,1.}>
{
  y = If(use_head) <
    then_branch = head () => (float[1,4] projected) { projected = MatMul(x, w) },
    else_branch = skip () => (float[1,4] passed) { passed = Identity(x) }
  >
}
"""


def _zoo(*names: str) -> None:
    missing = [n for n in names if not (FIXTURES / n / "model.onnx").is_file()]
    if missing:
        pytest.skip(f"zoo fixtures {missing} are not built (python -m exporters.build --out fixtures)")


def _static_of(name: str):
    """The StaticReport the audit makes of zoo model `name` as a baseline, at the shapes of DATA's runs."""
    base = load_for_runtime(FIXTURES / name / "model.onnx")
    return audit_module._static(base, None, (), audit_module._shapes(base, DATA))


@pytest.fixture()
def evidence(monkeypatch) -> list[str]:
    """The evidence sessions the profile opens, by their folder's name: `evidence` the model's,
    `baseline` the baseline's."""
    opened: list[str] = []
    evidence_runs = profiler_module._evidence_runs

    def counted(runnable, providers, feeds, threads, prefix):
        opened.append(prefix.name)
        return evidence_runs(runnable, providers, feeds, threads, prefix)

    monkeypatch.setattr(profiler_module, "_evidence_runs", counted)
    return opened


def test_a_dense_baselines_count_is_what_its_runs_measure_and_it_is_not_run_again(evidence):
    _zoo("dense", "featuregate")
    static = _static_of("dense")
    base = FIXTURES / "dense" / "model.onnx"
    measured = profile_model(MODEL, DATA, baseline=base, **FAST)
    assert evidence == ["evidence", "baseline"]
    evidence.clear()
    counted = profile_model(MODEL, DATA, baseline=base, baseline_static=static, **FAST)
    assert evidence == ["evidence"]  # the model's alone
    assert (measured.baseline.flops_source, counted.baseline.flops_source) == (MEASURED, COUNTED)
    assert counted.baseline.flops_executed == measured.baseline.flops_executed == static.flops.total
    doc = {"version": SCHEMA_VERSION, **counted.to_json()}
    validate(doc, "profile")
    assert undescribed(doc, "profile") == []
    assert doc["baseline"]["flops_source"] == COUNTED
    assert f"({COUNTED})" in render_text(counted) and f"({MEASURED})" in render_text(measured)


def test_the_schema_names_each_source():
    baseline = schema()["$defs"]["profile_fields"]["properties"]["baseline"]["anyOf"][1]["properties"]
    assert baseline["flops_source"]["enum"] == [*FLOPS_SOURCES, None]


def test_a_baseline_whose_compute_depends_on_its_inputs_is_measured(evidence):
    """MoE routes each row to k of its experts: nothing is skippable at the count's bound, but
    which rows each expert runs is the data's, so its count is a bound, not what ran."""
    _zoo("moe", "featuregate")
    static = _static_of("moe")
    assert static.flops.skippable == 0 and static.data_dependent_compute
    report = profile_model(MODEL, DATA, baseline=FIXTURES / "moe" / "model.onnx", baseline_static=static, **FAST)
    assert evidence == ["evidence", "baseline"] and report.baseline.flops_source == MEASURED


@pytest.mark.parametrize("name", ["moe", "earlyexit"])
def test_a_zoo_model_that_decides_its_compute_is_not_counted(name):
    _zoo(name)
    static = _static_of(name)
    assert counted_flops(static, [tuple(static.flops.shapes)]) is None


def test_a_callers_switch_is_not_counted():
    """The caller's flag decides what runs, though neither the model decides nor is anything
    skippable: only a measure says which branch each input took."""
    model = parser.parse_model(SWITCHED)
    onnx.checker.check_model(model, full_check=True)
    static = audit_static(model, shapes={"x": (1, 4), "use_head": ()})
    assert not static.dynamic and static.flops.skippable == 0 and static.flops.total == 32
    assert not static.fixed_work
    assert counted_flops(static, [(("use_head", ()), ("x", (1, 4)))]) is None


def test_runs_of_other_shapes_than_the_counts_are_measured(evidence):
    """The count is of one input; a batch of two executes twice it, which only a measure gives
    here, and another sequence length is another count."""
    _zoo("dense", "featuregate")
    static = _static_of("dense")
    total = static.flops.total
    assert counted_flops(static, [(("input_ids", (1, 64)),)] * 2) == total
    assert counted_flops(static, [(("input_ids", (2, 64)),)]) is None
    assert counted_flops(static, [(("input_ids", (1, 64)),), (("input_ids", (1, 32)),)]) is None
    assert counted_flops(static, []) is None
    report = profile_model(MODEL, DATA, baseline=FIXTURES / "dense" / "model.onnx", baseline_static=static,
                           **{**FAST, "limit": 4, "batch_size": 2})
    assert evidence == ["evidence", "baseline"] and report.baseline.flops_source == MEASURED
    assert report.baseline.flops_executed == 2 * total
