"""The reference zoo's verdicts: the positive and negative controls of the static audit.

Dense runs every block; FeatureGate and MUDD gate every block but skip nothing; MoE runs
its routed layers on value-chosen tokens; EarlyExit can skip the blocks after its exit.
Each model is checked live (`model.onnx`) and frozen (`model.frozen.onnx`).
"""

from pathlib import Path

import pytest

from graphaudit.analyses.static import audit_static
from graphaudit.load.model import load_model

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
FILES = ("model.onnx", "model.frozen.onnx")


def report_of(name: str, file: str):
    path = FIXTURES / name / file
    if not path.is_file():
        pytest.skip(f"{path.relative_to(FIXTURES.parent)} is not there (regenerate with `python -m exporters.build`)")
    return audit_static(load_model(path), shapes={"input_ids": (1, 64)})


def layers(report, family: str) -> set[int]:
    return {c.layer for c in report.coefficients if c.family == family}


@pytest.mark.parametrize("file", FILES)
def test_dense_runs_every_block(file):
    if file != "model.onnx":
        pytest.skip("Dense has no coefficients, hence no frozen graph")
    report = report_of("dense", file)
    assert [b.verdict for b in report.blocks] == ["always"] * 4
    assert not report.conditional_execution and not report.dynamic
    assert report.flops.skippable == 0


@pytest.mark.parametrize("name", ["featuregate", "mudd"])
@pytest.mark.parametrize("file", FILES)
def test_gated_models_skip_nothing(name, file):
    report = report_of(name, file)
    assert len(report.blocks) == 4
    assert {b.verdict for b in report.blocks} <= {"gated", "always"}
    assert "gated" in {b.verdict for b in report.blocks}
    assert not report.conditional_execution and not report.data_dependent_compute
    assert report.contradiction("static") is None
    assert {c.source for c in report.coefficients} == {"metadata"}


@pytest.mark.parametrize("file", FILES)
def test_moe_routed_layers_run_on_a_subset(file):
    report = report_of("moe", file)
    routed = layers(report, "router")
    assert routed  # declared in the metadata
    for block in report.blocks:
        assert block.verdict == ("subset" if block.index in routed else "always"), block.name
    ev = report.blocks[min(routed)].evidence[0]
    assert ev.kind == "selection" and ev.size == "data-dependent" and "NonZero" in ev.detail
    assert report.data_dependent_compute and not report.conditional_execution
    # the experts' products have a data-dependent size: each routed block's FLOPs are a lower bound
    assert [b.uncounted > 0 for b in report.blocks] == [b.index in routed for b in report.blocks]
    assert sum(b.uncounted for b in report.blocks) == len(report.flops.count.unknown_shape)
    assert [b["flops_uncounted_nodes"] for b in report.to_json()["blocks"]] == [b.uncounted for b in report.blocks]
    from graphaudit.report.static_text import render_text

    table = render_text(report).splitlines()
    # live, each token goes to exactly k = 2 of the 4 experts (every index of the TopK is an
    # expert's): a routed block's least is its most, one count, neither a lower nor an upper
    # bound; so is the total. Frozen, counted at the input ids' shape only, the fed router
    # probabilities have no concrete shape: the experts' rows are not bounded, their count stays
    # a lower bound
    for b in report.blocks:
        line = next(line for line in table if f" {b.name} " in line)
        if file == "model.onnx":
            assert "≥ " not in line and "≤ " not in line, line
            assert b.flops_every_row > b.flops and b.skippable_flops == 0 if b.index in routed else \
                b.flops_every_row is None
        else:
            assert ("≥ " in line) == (b.index in routed), line
    if file == "model.onnx":
        assert next(line for line in table if line.startswith("FLOPs: ")).startswith("FLOPs: 27.33 M in total")


@pytest.mark.parametrize("file", FILES)
def test_earlyexit_late_blocks_are_a_branch(file):
    report = report_of("earlyexit", file)
    (exit_layer,) = layers(report, "exit")
    for block in report.blocks:
        assert block.verdict == ("branch" if block.index > exit_layer else "always"), block.name
    assert report.conditional_execution
    (control,) = report.controls
    assert control.op == "If" and control.dependence == "value"
    assert 0 < report.flops.skippable_share < 1


@pytest.mark.parametrize("name", ["earlyexit", "featuregate", "moe", "mudd"])
def test_detection_finds_what_the_metadata_declares(name, tmp_path):
    # the zoo's models with their metadata removed: detection alone names the same tensors, of
    # the same family and layer, with batch and token where the metadata has them (it calls the
    # other axes `slot`). EarlyExit's: the most probable class's probability per token, which
    # decides the If after block 1 through ReduceMean, ReduceMin and Greater. MUDD's, of axes
    # (way, batch, token, source): its controllers' projections plus their static bias, squashed
    # by nothing, found by what they weight (family `mix`).
    import onnx

    model = onnx.load(FIXTURES / name / "model.onnx")
    declared = report_of(name, "model.onnx").coefficients
    del model.metadata_props[:]
    onnx.save(model, tmp_path / "model.onnx")
    detected = audit_static(load_model(tmp_path / "model.onnx"), shapes={"input_ids": (1, 64)})

    def plain(axes):
        others = [a for a in axes if a not in ("batch", "token")]  # slot, or slot0, slot1, ... where several
        return tuple(a if a in ("batch", "token") else f"slot{others.index(a)}" if len(others) > 1 else "slot"
                     for a in axes)

    assert [(c.tensor, c.family, c.layer, c.axes) for c in detected.coefficients] == [
        (c.tensor, {"mudd": "mix"}.get(c.family, c.family), c.layer, plain(c.axes)) for c in declared]
    assert {c.source for c in detected.coefficients} == {"detected"}
