"""Export a zoo model to ONNX: the live graph, and the frozen graph with coefficients as inputs.

Both come from `torch.onnx.export(dynamo=True)` with dynamic `batch` and `seq`:

- live: `input_ids` → `logits`. Each coefficient tensor is exported as an extra output
  named after it (which names the value in the graph), then dropped from the outputs, so
  it stays an intermediate value with a stable name (`gate.0`, `mudd.3`, …).
- frozen: `input_ids` and one input per coefficient → `logits`. The model is called with
  every coefficient given, so the controllers are never traced.

Both carry the `graphaudit.coefficients` metadata, and lose torch's
`pkg.torch.onnx.stack_trace` node metadata (absolute source paths) so that the files do not
depend on the machine that wrote them.
"""

from __future__ import annotations

import contextlib
import logging
import warnings
from collections.abc import Iterator
from pathlib import Path

import onnx
import torch
from torch.export import Dim

from exporters.backbone import LanguageModel
from graphaudit.analyses.declared_coefficients import metadata_entry
from graphaudit.load.protos import graphs

STACK_TRACE_KEY = "pkg.torch.onnx.stack_trace"


def export_live(model: LanguageModel, path: str | Path) -> onnx.ModelProto:
    """Write the live graph of `model` to `path` and return it."""
    names = [c.tensor for c in model.coefficients()]
    ids = _example_ids(model)
    batch, seq = _dims(model)
    onx = _export(
        model,
        (ids,),
        {},
        {"input_ids": {0: batch, 1: seq}},
        ["input_ids"],
        ["logits", *names],
    )
    kept = [o for o in onx.graph.output if o.name == "logits"]
    del onx.graph.output[:]
    onx.graph.output.extend(kept)
    return _finish(model, onx, path)


def export_frozen(model: LanguageModel, path: str | Path) -> onnx.ModelProto:
    """Write the frozen graph of `model` (coefficients as inputs) to `path` and return it."""
    coefficients = model.coefficients()
    if not coefficients:
        raise ValueError(f"{model.name} has no coefficients to freeze")
    ids = _example_ids(model)
    with torch.no_grad():
        _, computed = model(ids)
    batch, seq = _dims(model)
    given = {c.tensor: computed[c.tensor] for c in coefficients}
    shapes = {
        c.tensor: {c.axes.index("batch"): batch, c.axes.index("token"): seq}
        for c in coefficients
    }
    onx = _export(
        model,
        (ids,),
        {"coefficients": given},
        {"input_ids": {0: batch, 1: seq}, "coefficients": shapes},
        ["input_ids", *given],
        ["logits"],
    )
    return _finish(model, onx, path)


def _example_ids(model: LanguageModel) -> torch.Tensor:
    # Batch and length above 1, so that torch.export does not specialise either dimension.
    g = torch.Generator().manual_seed(0)
    return torch.randint(0, model.cfg.vocab, (2, min(8, model.cfg.context)), generator=g)


def _dims(model: LanguageModel) -> tuple[Dim, Dim]:
    return Dim("batch"), Dim("seq", max=model.cfg.context)


@contextlib.contextmanager
def quiet_export() -> Iterator[None]:
    """No gradients, and none of torch.onnx's warnings: the exporter logs one per missing
    optional package (torchvision) on every call."""
    logger = logging.getLogger("torch.onnx")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings(), torch.no_grad():
            warnings.simplefilter("ignore")
            yield
    finally:
        logger.setLevel(level)


def _export(model, args, kwargs, dynamic_shapes, input_names, output_names) -> onnx.ModelProto:
    model.eval()
    with quiet_export():
        program = torch.onnx.export(
            model,
            args,
            kwargs=kwargs,
            dynamo=True,
            dynamic_shapes=dynamic_shapes,
            input_names=input_names,
            output_names=output_names,
            verbose=False,
        )
    return program.model_proto


def _finish(model: LanguageModel, onx: onnx.ModelProto, path: str | Path) -> onnx.ModelProto:
    for graph in graphs(onx.graph):
        for node in graph.node:
            kept = [p for p in node.metadata_props if p.key != STACK_TRACE_KEY]
            del node.metadata_props[:]
            node.metadata_props.extend(kept)
    onx.graph.name = model.name
    del onx.metadata_props[:]
    if model.coefficients():
        onx.metadata_props.append(metadata_entry(model.coefficients()))
    onnx.checker.check_model(onx, full_check=True)
    onnx.save_model(onx, str(path))
    return onx
