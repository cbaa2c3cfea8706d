"""Where the repository and its zoo fixtures are, and copies made from the zoo's models.

The trained zoo models are built by `python -m exporters.build --out fixtures`; tests that
need one skip without it.
"""

from __future__ import annotations

import shutil
import warnings
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "fixtures"
# The trained zoo models with coefficients that are built in fixtures/.
ZOO = [n for n in ("featuregate", "mudd", "moe", "earlyexit") if (FIXTURES / n / "model.onnx").is_file()]


def zoo_subset(folder: Path, name: str = "featuregate", rows: int = 4, tokens: int = 16) -> dict:
    """A copy of a zoo model and the first `rows` x `tokens` of its calibration and evaluation data."""
    source = FIXTURES / name
    if not all((source / f).is_file() for f in ("model.onnx", "calib.npz", "eval.npz")):
        pytest.skip(f"zoo fixture {name} is not built (python -m exporters.build --out fixtures)")
    folder.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(source / "model.onnx", folder / "model.onnx")
    paths = {"model": folder / "model.onnx"}
    for split in ("calib", "eval"):
        with np.load(source / f"{split}.npz", allow_pickle=False) as archive:
            ids = archive["input_ids"][:rows, :tokens]
        paths[split] = folder / f"{split}.npz"
        np.savez(paths[split], input_ids=ids)
    return paths


def quantized_featuregate(target: Path, form: str) -> None:
    """The FeatureGate fixture quantized statically by ONNX Runtime's quantizer, in `form`
    ("QDQ" or "QOperator"), calibrated on 4 inputs, saved at `target`."""
    quantization = pytest.importorskip("onnxruntime.quantization")
    ids = np.load(FIXTURES / "featuregate" / "calib.npz")["input_ids"]

    class Reader(quantization.CalibrationDataReader):
        def __init__(self):
            self.feeds = iter([{"input_ids": ids[i:i + 1]} for i in range(4)])

        def get_next(self):
            return next(self.feeds, None)

    # from a copy beside `target`: the quantizer writes `<model>-inferred.onnx` next to its input, which two
    # tests quantizing the fixture at once would write and delete under each other
    source = Path(target).with_name(Path(target).stem + "-float.onnx")
    shutil.copyfile(FIXTURES / "featuregate" / "model.onnx", source)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        quantization.quantize_static(str(source), str(target), Reader(),
                                     quant_format=getattr(quantization.QuantFormat, form))
    source.unlink()
