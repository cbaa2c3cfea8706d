"""The profile on the trained zoo (fixtures/): what ran, for whom, at what size.

Each test is skipped while its fixture is missing. One profiled pass at ORT_DISABLE_ALL on
a few inputs: no timing is asserted.
"""

from pathlib import Path

import pytest

from graphaudit.analyses.blocks import find_blocks
from graphaudit.analyses.flops import count_flops
from graphaudit.analyses.static import audit_static
from graphaudit.graph.build import build_graph
from graphaudit.load.model import load_model
from graphaudit.profile import profile_model

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
QUICK = {"runs": 1, "warmup": 0, "profile_runs": 1, "opt_level": "disable", "threads": 1}


def fixture(name):
    model = FIXTURES / name / "model.onnx"
    if not model.is_file():
        pytest.skip(f"fixture {name} not built yet")
    return model, FIXTURES / name / "eval.npz"


def blocks_of(report):
    return [b for b in report.to_json()["blocks"] if b["name"].startswith("blocks.")]


@pytest.mark.parametrize("name", ["featuregate", "mudd"])
def test_gated_models_run_every_block_in_full_on_every_input(name):
    model, data = fixture(name)
    loaded = load_model(model)
    report = profile_model(loaded, data, limit=4, static=audit_static(loaded), **QUICK)
    blocks = blocks_of(report)
    assert len(blocks) >= 2
    for block in blocks:
        assert block["executed_fraction"] == 1.0 and block["node_fraction"]["min"] == 1.0
        assert block["value_dependent_shapes"] == []
        assert block["runtime_outcome"] == "confirmed"
    # executed FLOPs, from the shapes run, equal the static count at the same input shape
    mg = build_graph(loaded.model)
    seq = report.execution.inputs[0].feed_shapes[0][1]
    static = count_flops(mg, {"input_ids": seq})
    per_block = {b.name: sum(static.per_node.get(n, 0) for n in b.node_ids) for b in find_blocks(mg).blocks}
    for block in blocks:
        assert block["executed_flops"]["min"] == block["executed_flops"]["max"] == per_block[block["name"]]


def test_moe_experts_run_on_input_dependent_token_counts():
    model, data = fixture("moe")
    report = profile_model(model, data, limit=6, **QUICK)
    varying = [v for b in report.execution.blocks for v in b.value_dependent if v.op_type == "MatMul"]
    assert varying, "no expert MatMul ran at value-dependent sizes"
    rows = {int(s.split("]")[0].strip("[").split(",")[0]) for v in varying for s in v.shapes}
    assert len(rows) > 2  # several different token counts across experts and inputs


def test_earlyexit_late_blocks_run_for_some_inputs_only():
    model, data = fixture("earlyexit")
    report = profile_model(model, data, **{**QUICK, "runs": 1})
    blocks = blocks_of(report)
    late = [b for b in blocks if b["node_fraction"]["min"] < 1.0 or b["executed_fraction"] < 1.0]
    assert late, f"every block ran in full on every input: {[b['name'] for b in blocks]}"
    assert all(b["node_fraction"]["max"] == 1.0 for b in late)  # ...and in full on other inputs
    assert len(report.by_blocks_ran()) == 2
