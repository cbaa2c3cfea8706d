"""The exporters keep working: a fresh, untrained, tiny copy of every zoo architecture
exports (live and frozen), passes the ONNX checker, and runs in ONNX Runtime with PyTorch's
outputs. Nothing here trains.

Each export is torch.export's tracing of the model (seconds, whatever the shapes), so every
model is exported once per module, and the tests that export are marked `slow`: the whole
suite runs them, `pytest -m "not slow"` leaves them out."""

from __future__ import annotations

import dataclasses
import functools
import hashlib
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("onnxscript")

from exporters.backbone import LanguageModel  # noqa: E402
from exporters.export import export_frozen, export_live  # noqa: E402
from exporters.zoo import MODELS, build_model  # noqa: E402
from graphaudit.analyses.declared_coefficients import declared_coefficients  # noqa: E402

TINY = dict(d_model=16, n_layers=2, n_heads=2, d_ff=32, context=16)
ATOL = 1e-5  # float32, a tiny model: PyTorch and ORT differ by ~1e-7


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """Tiny ops: a second thread only waits, and on a loaded machine that is 10x slower."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(autouse=True, scope="module")
def one_registry():
    """Nothing; torch.onnx builds its table of ONNX functions for the ATen operators anew on
    every export (about 2 s), from torchlib alone when no custom table is given, as here:
    built once, the exported graphs are the same bytes. Where torch keeps it elsewhere, each
    export builds its own."""
    try:
        from torch.onnx._internal.exporter._registration import ONNXRegistry
    except ImportError:
        yield
        return
    built = ONNXRegistry.__dict__.get("from_torchlib")
    if not isinstance(built, classmethod):
        yield
        return
    cached = functools.lru_cache(maxsize=None)(built.__func__)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(ONNXRegistry, "from_torchlib", classmethod(cached))
        yield


@dataclasses.dataclass(frozen=True)
class Export:
    """A fresh zoo model, its outputs on `ids`, and where its live and frozen graphs were written."""

    model: LanguageModel
    ids: np.ndarray
    logits: np.ndarray
    computed: dict
    live: onnx.ModelProto
    live_path: Path
    frozen: onnx.ModelProto | None
    frozen_path: Path | None


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """A function of a zoo model's name giving its Export, each exported once in this module."""
    @functools.cache
    def export(name: str) -> Export:
        folder = tmp_path_factory.mktemp(name)
        torch.manual_seed(0)
        model = build_model(name, **TINY).eval()
        ids = np.random.default_rng(0).integers(0, 256, size=(3, 11), dtype=np.int64)
        with torch.no_grad():
            logits, computed = model(torch.from_numpy(ids))
        live = export_live(model, folder / "model.onnx")
        frozen = export_frozen(model, folder / "model.frozen.onnx") if model.coefficients() else None
        return Export(model, ids, logits.numpy(), computed, live, folder / "model.onnx",
                      frozen, folder / "model.frozen.onnx" if frozen is not None else None)

    return export


def _session(path) -> ort.InferenceSession:
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])


@pytest.mark.slow
@pytest.mark.parametrize("name", list(MODELS))
def test_fresh_export_runs_in_onnxruntime(name, exported):
    e = exported(name)
    model, ids, logits, computed = e.model, e.ids, e.logits, e.computed

    live = e.live
    onnx.checker.check_model(live, full_check=True)
    assert [i.name for i in live.graph.input] == ["input_ids"]
    assert [o.name for o in live.graph.output] == ["logits"]
    assert declared_coefficients(live) == model.coefficients()
    (out,) = _session(e.live_path).run(None, {"input_ids": ids})
    np.testing.assert_allclose(out, logits, atol=ATOL)

    if not model.coefficients():
        return
    frozen = e.frozen
    onnx.checker.check_model(frozen, full_check=True)
    names = [c.tensor for c in model.coefficients()]
    assert [i.name for i in frozen.graph.input] == ["input_ids", *names]
    assert declared_coefficients(frozen) == model.coefficients()
    feed = {"input_ids": ids, **{n: computed[n].numpy() for n in names}}
    (out,) = _session(e.frozen_path).run(None, feed)
    np.testing.assert_allclose(out, logits, atol=ATOL)


@pytest.mark.slow
def test_export_is_deterministic(exported, tmp_path):
    # the second export of the model `exported` wrote, in the same process, as the first was
    e = exported("dense")
    export_live(e.model, tmp_path / "b.onnx")
    a, b = (p.read_bytes() for p in (e.live_path, tmp_path / "b.onnx"))
    assert hashlib.sha256(a).hexdigest() == hashlib.sha256(b).hexdigest()


def test_overrides_replace_the_controller():
    torch.manual_seed(0)
    model = build_model("featuregate", **TINY).eval()
    ids = torch.randint(0, 256, (2, 5))
    with torch.no_grad():
        logits, computed = model(ids)
        same, none_left = model(ids, coefficients=computed)
        closed, _ = model(ids, coefficients={"gate.0": torch.zeros_like(computed["gate.0"])})
    assert none_left == {}
    torch.testing.assert_close(same, logits)
    assert not torch.allclose(closed, logits)
    with pytest.raises(KeyError, match=r"gate\.9"):
        model(ids, coefficients={"gate.9": computed["gate.0"]})
