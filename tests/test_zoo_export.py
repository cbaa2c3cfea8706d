"""The exporters keep working: a fresh, untrained, tiny copy of every zoo architecture
exports (live and frozen), passes the ONNX checker, and runs in ONNX Runtime with PyTorch's
outputs. Nothing here trains."""

from __future__ import annotations

import hashlib

import numpy as np
import onnx
import onnxruntime as ort
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("onnxscript")

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


def _session(path) -> ort.InferenceSession:
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])


@pytest.mark.parametrize("name", list(MODELS))
def test_fresh_export_runs_in_onnxruntime(name, tmp_path):
    torch.manual_seed(0)
    model = build_model(name, **TINY).eval()
    ids = np.random.default_rng(0).integers(0, 256, size=(3, 11), dtype=np.int64)
    with torch.no_grad():
        logits, computed = model(torch.from_numpy(ids))

    live = export_live(model, tmp_path / "model.onnx")
    onnx.checker.check_model(live, full_check=True)
    assert [i.name for i in live.graph.input] == ["input_ids"]
    assert [o.name for o in live.graph.output] == ["logits"]
    assert declared_coefficients(live) == model.coefficients()
    (out,) = _session(tmp_path / "model.onnx").run(None, {"input_ids": ids})
    np.testing.assert_allclose(out, logits.numpy(), atol=ATOL)

    if not model.coefficients():
        return
    frozen = export_frozen(model, tmp_path / "model.frozen.onnx")
    onnx.checker.check_model(frozen, full_check=True)
    names = [c.tensor for c in model.coefficients()]
    assert [i.name for i in frozen.graph.input] == ["input_ids", *names]
    assert declared_coefficients(frozen) == model.coefficients()
    feed = {"input_ids": ids, **{n: computed[n].numpy() for n in names}}
    (out,) = _session(tmp_path / "model.frozen.onnx").run(None, feed)
    np.testing.assert_allclose(out, logits.numpy(), atol=ATOL)


def test_export_is_deterministic(tmp_path):
    torch.manual_seed(0)
    model = build_model("dense", **TINY)
    export_live(model, tmp_path / "a.onnx")
    export_live(model, tmp_path / "b.onnx")
    a, b = ((tmp_path / f).read_bytes() for f in ("a.onnx", "b.onnx"))
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
    with pytest.raises(KeyError, match="gate.9"):
        model(ids, coefficients={"gate.9": computed["gate.0"]})
