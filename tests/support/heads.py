"""Classifier heads on `se_cnn`'s class logits, and their replay on random images: the output
kinds' tests (what an output holds, read from the graph, and each scored on its true scale)."""

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper

from graphaudit.replay.pipeline import replay

from support.models import se_cnn

CLASSES = 3


def headed(head, output: str, shape, inits=()) -> onnx.ModelProto:
    """`se_cnn` whose class logits `z` (batch, 3) and feature map `x.2` (batch, 4, 5, 5) feed `head`,
    which makes the one graph output `output`."""
    model = se_cnn(classes=CLASSES)
    graph = model.graph
    for node in graph.node:
        for i, name in enumerate(node.output):
            if name == "logits":
                node.output[i] = "z"
    graph.node.extend(head)
    graph.initializer.extend(inits)
    del graph.output[:]
    graph.output.append(helper.make_tensor_value_info(output, TensorProto.FLOAT, shape))
    onnx.checker.check_model(model, full_check=True)
    return model


def logits_head(name="scores"):
    """The class logits themselves, behind an Identity, as output `name`."""
    return headed([helper.make_node("Identity", ["z"], [name], name="/head/Identity")], name, ["batch", 3])


def head_data(tmp_path, model, labels=None, targets=None, count=(24, 20)):
    """Save `model` and calibration / evaluation inputs; `labels` / `targets`: fn(rng, n) -> array."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    onnx.save(model, tmp_path / "model.onnx")
    for seed, (name, n) in enumerate(zip(("calib", "eval"), count)):
        arrays = {"pixels": np.random.default_rng(seed).standard_normal((n, 4, 5, 5)).astype(np.float32)}
        for key, make in (("labels", labels), ("targets", targets)):
            if make is not None:
                arrays[key] = make(np.random.default_rng(seed + 10), n)
        np.savez(tmp_path / f"{name}.npz", **arrays)
    return tmp_path / "model.onnx", tmp_path / "calib.npz", tmp_path / "eval.npz"


def replay_head(tmp_path, model, **kwargs):
    """The replay of `model` on `head_data`'s inputs (`labels`, `targets` as there; the rest to `replay`)."""
    files = head_data(tmp_path, model, kwargs.pop("labels", None), kwargs.pop("targets", None))
    return replay(*files, resamples=50, **kwargs)


def live_outputs(tmp_path) -> np.ndarray:
    """The saved model's first output on the saved evaluation inputs, by ONNX Runtime, in float64."""
    session = ort.InferenceSession(str(tmp_path / "model.onnx"), providers=["CPUExecutionProvider"])
    return session.run(None, {"pixels": np.load(tmp_path / "eval.npz")["pixels"]})[0].astype(np.float64)


def classes(rng, n):
    """`n` class labels drawn from `rng`."""
    return rng.integers(0, CLASSES, n)

