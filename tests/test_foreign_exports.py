"""A model exported the way other people export it — torch.onnx's TorchScript exporter with or
without dynamic axes, with each block a local function, or at opset 14 (its LayerNorms written
out), the dynamo exporter without dynamic shapes, none with our metadata —
gets the same coefficients (found by detection, with their batch and token axes and layers)
and the same replay as our own export that declares them. Nothing here trains."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("onnxscript")

from exporters.export import export_live, quiet_export  # noqa: E402
from exporters.featuregate import GatedBlock  # noqa: E402
from exporters.zoo import build_model  # noqa: E402
from graphaudit.analyses.static import audit_static  # noqa: E402
from graphaudit.load.model import load_model  # noqa: E402
from graphaudit.replay.pipeline import replay, resolve  # noqa: E402

TINY = dict(d_model=16, n_layers=2, n_heads=2, d_ff=32, context=16)
LENGTH = 12
CONDITIONS = ("correct", "cross_input", "token_shuffle", "static_layer", "static_position")


class _LogitsOnly(torch.nn.Module):
    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, ids):
        return self.model(ids)[0]


@pytest.fixture(scope="module")
def exports(tmp_path_factory):
    folder = tmp_path_factory.mktemp("foreign")
    torch.manual_seed(0)
    model = build_model("featuregate", **TINY).eval()
    export_live(model, folder / "ours.onnx")
    wrapped = _LogitsOnly(model).eval()
    one = torch.randint(0, model.cfg.vocab, (1, LENGTH))
    names = dict(input_names=["input_ids"], output_names=["logits"])
    with quiet_export():
        torch.onnx.export(wrapped, (one,), str(folder / "torchscript_dynamic.onnx"), dynamo=False,
                          dynamic_axes={"input_ids": {0: "batch", 1: "seq"}, "logits": {0: "batch", 1: "seq"}},
                          **names)
        torch.onnx.export(wrapped, (one,), str(folder / "torchscript_fixed.onnx"), dynamo=False, **names)
        # below opset 17 the exporter writes each LayerNorm out (ReduceMean, Sub, Pow, Sqrt, Div, Mul, Add)
        torch.onnx.export(wrapped, (one,), str(folder / "torchscript_opset14.onnx"), dynamo=False, opset_version=14,
                          dynamic_axes={"input_ids": {0: "batch", 1: "seq"}, "logits": {0: "batch", 1: "seq"}},
                          **names)
        torch.onnx.export(wrapped, (one,), dynamo=True, verbose=False, **names).save(str(folder / "dynamo_fixed.onnx"))
        torch.onnx.export(wrapped, (one,), str(folder / "torchscript_functions.onnx"), dynamo=False, opset_version=17,
                          export_modules_as_functions={GatedBlock}, **names)
    rng = np.random.default_rng(0)
    np.savez(folder / "calib.npz", input_ids=rng.integers(0, model.cfg.vocab, (8, LENGTH)))
    np.savez(folder / "eval.npz", input_ids=rng.integers(0, model.cfg.vocab, (6, LENGTH)))
    return folder


FOREIGN = ["torchscript_dynamic", "torchscript_fixed", "dynamo_fixed", "torchscript_functions", "torchscript_opset14"]
DYNAMIC = {"torchscript_dynamic", "torchscript_opset14"}  # exported with dynamic axes; the others fix batch 1


@pytest.mark.parametrize("name", FOREIGN)
def test_detection_finds_every_gate_with_its_axes_and_layer(exports, name):
    loaded = load_model(exports / f"{name}.onnx")
    assert not onnx.load(exports / f"{name}.onnx").metadata_props  # nothing declared
    found = audit_static(loaded).coefficients
    gates = [c for c in found if c.family == "gate"]
    assert [(c.layer, c.axes, c.source) for c in gates] == [(i, ("batch", "token", "slot"), "detected")
                                                            for i in range(TINY["n_layers"])]
    assert [(c.tensor, c.layer, c.axes) for c in resolve(loaded)] == [(c.tensor, c.layer, c.axes) for c in found]


@pytest.mark.parametrize("name", FOREIGN)
def test_replay_equals_the_replay_of_the_declared_export(exports, name):
    ours = replay(exports / "ours.onnx", exports / "calib.npz", exports / "eval.npz", conditions=CONDITIONS,
                  resamples=20)
    theirs = replay(exports / f"{name}.onnx", exports / "calib.npz", exports / "eval.npz", conditions=CONDITIONS,
                    resamples=20)
    assert theirs.parity.ok
    assert [c.name for c in theirs.conditions] == list(CONDITIONS)
    for a, b in zip(ours.conditions, theirs.conditions):
        assert b.nll.value == pytest.approx(a.nll.value, rel=1e-5), a.name
    assert theirs.conditions[2].delta_nll.value > 0  # token_shuffle moves the gates' tokens: not a no-op
    (family, shares), = theirs.variance
    ((_, expected),) = ours.variance
    assert family == "gate"
    for share in ("eta2_layer", "layer_slot_share", "input_share", "token_share"):
        assert shares[share].value == pytest.approx(expected[share].value, rel=1e-4, abs=1e-9), share


def test_flops_at_concrete_shapes_are_counted_in_full_as_in_the_declared_export(exports):
    # the TorchScript exporter computes attention's shapes through ops ONNX's data propagation
    # does not follow (Slice ends from a Div of a Shape): at concrete input shapes they are
    # computed and written in as constants (graphaudit.load.shape_values), so no MatMul is left out
    for name in FOREIGN:
        shapes = {"input_ids": (4 if name in DYNAMIC else 1, LENGTH)}
        ours = audit_static(load_model(exports / "ours.onnx"), shapes=shapes).flops
        theirs = audit_static(load_model(exports / f"{name}.onnx"), shapes=shapes).flops
        assert theirs.count.unknown_shape == (), name
        assert theirs.total == ours.total, name
        if name not in DYNAMIC:  # every input size fixed: counted without being asked
            alone = audit_static(load_model(exports / f"{name}.onnx")).flops
            assert (alone.total, alone.count.unknown_shape) == (ours.total, ()), name


def test_blocks_exported_as_functions_are_counted_in_full(exports):
    """torch's `export_modules_as_functions` writes each block as a call of a local function
    whose body declares no types. Inlined at load, or read through the calls with each body
    typed at its call's arguments, every block counts what the declared export counts, and
    the calls are not listed as operators without a formula."""
    shapes = {"input_ids": (1, LENGTH)}
    ours = audit_static(load_model(exports / "ours.onnx"), shapes=shapes)
    inlined = load_model(exports / "torchscript_functions.onnx")
    assert onnx.load(exports / "torchscript_functions.onnx").functions and inlined.inlined_calls == TINY["n_layers"]
    for theirs in (audit_static(inlined, shapes=shapes),
                   audit_static(load_model(exports / "torchscript_functions.onnx", inline=False), shapes=shapes)):
        _same_flops(theirs, ours)


def _same_flops(theirs, ours):
    assert theirs.flops.count.unknown_shape == ()
    assert theirs.flops.total == ours.flops.total
    assert ours.flops.total > 0
    assert [b.flops for b in theirs.blocks] == [b.flops for b in ours.blocks]  # (theirs under `model.`)
    assert len(theirs.blocks) == TINY["n_layers"]
    assert not [op for op, _ in theirs.flops.count.uncounted if "GatedBlock" in op]


@pytest.mark.parametrize("name, opset", [("moe", 14), ("moe", 17), ("earlyexit", 14)])
def test_other_zoo_models_exported_by_torchscript_get_what_their_graphs_hold(tmp_path, name, opset):
    # the MoE: the same blocks and router as our export (at opset 14 its LayerNorms are written
    # out, and its routed experts' weighted results, added back into the stream, once made the
    # next block's attention read as masked). The early exit: TorchScript traces its Python `if`
    # to the branch the example input took, so the exported graph holds no If and every layer
    # runs for every input; said as such, where our export (an If) is dynamic
    torch.manual_seed(0)
    layers = 3  # the MoE's layer 1 routes; layer 2 reads the stream it gives back
    model = build_model(name, **{**TINY, "n_layers": layers}).eval()
    export_live(model, tmp_path / "ours.onnx")
    one = torch.randint(0, model.cfg.vocab, (1, LENGTH))
    with quiet_export():
        torch.onnx.export(_LogitsOnly(model).eval(), (one,), str(tmp_path / "theirs.onnx"), dynamo=False,
                          opset_version=opset, input_names=["input_ids"], output_names=["logits"],
                          dynamic_axes={"input_ids": {0: "batch", 1: "seq"}, "logits": {0: "batch", 1: "seq"}})
    ours, theirs = (audit_static(load_model(tmp_path / f"{w}.onnx")) for w in ("ours", "theirs"))
    if name == "moe":
        assert [b.verdict for b in theirs.blocks] == [b.verdict for b in ours.blocks] == ["always", "subset", "always"]
        assert [(c.family, c.layer) for c in theirs.coefficients] == [(c.family, c.layer) for c in ours.coefficients]
    else:
        assert not any(n.op_type in ("If", "Loop") for n in onnx.load(tmp_path / "theirs.onnx").graph.node)
        assert ours.dynamic and not theirs.dynamic
        assert {b.verdict for b in theirs.blocks} == {"always"}


def test_mudd_exported_without_dynamic_shapes_gets_its_mixes_with_their_batch_and_token_axes(tmp_path):
    # dynamo's default export fixes every size: a MUDD controller's weights, (way, batch, token,
    # source) by a Transpose of a (batch, token, way, source) projection, have no batch at their
    # first position, and the last layer's single way has the batch's size there. Read from
    # the Transpose, the three are found as in the export with dynamic axes (two were missed,
    # and the third's way axis was taken for its batch)
    torch.manual_seed(0)
    model = build_model("mudd", **{**TINY, "n_layers": 3}).eval()
    one = torch.randint(0, model.cfg.vocab, (1, LENGTH))
    with quiet_export():
        torch.onnx.export(_LogitsOnly(model).eval(), (one,), dynamo=True, verbose=False, input_names=["input_ids"],
                          output_names=["logits"]).save(str(tmp_path / "fixed.onnx"))
        torch.onnx.export(_LogitsOnly(model).eval(), (one,), str(tmp_path / "dynamic.onnx"), dynamo=False,
                          input_names=["input_ids"], output_names=["logits"],
                          dynamic_axes={"input_ids": {0: "batch", 1: "seq"}, "logits": {0: "batch", 1: "seq"}})
    fixed, dynamic = (audit_static(load_model(tmp_path / f"{w}.onnx")) for w in ("fixed", "dynamic"))
    assert [(c.family, c.layer, c.axes) for c in fixed.coefficients] == \
        [(c.family, c.layer, c.axes) for c in dynamic.coefficients] == \
        [("mix", i, ("slot0", "batch", "token", "slot1")) for i in range(3)]
    assert [b.verdict for b in fixed.blocks] == ["gated"] * 3
