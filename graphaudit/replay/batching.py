"""How many inputs the replay hands ONNX Runtime per run, and the inputs cut to whole batches.

`default_batch_size` chooses the size when none is given: the model's own batch when its
inputs fix their first dimension, 1 for value-dependent control flow (an If or Loop decides
once per batch), else DEFAULT_BATCH_SIZE, fewer when one batch of the scored output would
pass OUTPUT_BUDGET. `batches_for` applies it, or a size given, to the replay's inputs and says
why, in words, whenever the size is not the default or inputs were left out.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np
import onnx

from graphaudit.analyses.flops import ShapeResolver
from graphaudit.analyses.static import audit_static
from graphaudit.graph.build import shape_of
from graphaudit.load.data import InputData, fixed_batch, input_specs, whole_batches
from graphaudit.load.feeding import Feeding
from graphaudit.load.model import LoadedModel
from graphaudit.metrics.tasks import scored_name

DEFAULT_BATCH_SIZE = 16
# Most bytes of the scored output one batch may hold when no batch size is given: the replay
# keeps a few arrays of that size at once (ONNX Runtime's outputs, log-probabilities, the reference)
OUTPUT_BUDGET = 256 * 2**20
# Why a graph with value-dependent control flow is replayed one input per batch
ONE_PER_BATCH = ("the graph has value-dependent control flow, which decides once per batch: the replay ran one "
                 "input per batch, so each input's decision is its own")


def batches_for(loaded: LoadedModel, batch_size: int | None, calibration: InputData, evaluation: InputData,
                model_decides: bool | None = None) -> tuple[int, InputData, InputData, str | None]:
    """(batch size, calibration and evaluation inputs cut to whole batches, why) for the replay:
    `batch_size` as given (checked against the model by `data.check_batch_size` already), else
    `default_batch_size`; the inputs cut only where the model fixes its batch. `model_decides`:
    the static audit's (`StaticReport.model_decides`), which the caller has run; None: run here
    when needed, without coefficient names."""
    feeding = evaluation.feeding
    fixed = fixed_batch(input_specs(loaded.model, feeding=feeding))
    notes: list[str | None] = []
    if batch_size is None:
        batch_size, why = default_batch_size(loaded, model_decides, evaluation.run_shapes(evaluation.count), feeding)
        notes.append(why)
    elif batch_size == fixed != DEFAULT_BATCH_SIZE:
        notes.append(fixed_note(batch_size))
    calibration, cut = whole_batches(calibration, fixed)
    evaluation, cut_too = whole_batches(evaluation, fixed)
    return batch_size, calibration, evaluation, "; ".join(n for n in (*notes, cut, cut_too) if n) or None


def default_batch_size(loaded: LoadedModel, conditional_execution: bool | None = None,
                       input_shapes: Mapping[str, Sequence[int]] | None = None,
                       feeding: Feeding | None = None) -> tuple[int, str | None]:
    """The replay's batch size when none is given, and why when it is not DEFAULT_BATCH_SIZE.

    The model's own batch when its inputs fix their first dimension (`data.fixed_batch`). 1 when
    the graph has control flow the model decides by values (`conditional_execution`, read from
    the static audit's `model_decides` when not given; a caller's switch decides alike for the batch): an If or Loop decides once per batch. Otherwise as many inputs
    as keep one batch of the scored output within OUTPUT_BUDGET, its size per input read from
    the output's declared shape with symbolic dimensions taken from `input_shapes` (data
    shapes), up to DEFAULT_BATCH_SIZE. `feeding`: how the inputs are fed (graphaudit.load.feeding).
    """
    fixed = fixed_batch(input_specs(loaded.model, feeding=feeding))
    if fixed is not None:
        return fixed, None if fixed == DEFAULT_BATCH_SIZE else fixed_note(fixed)
    if conditional_execution is None:
        conditional_execution = audit_static(loaded).model_decides
    if conditional_execution:
        return 1, ONE_PER_BATCH
    sized = _output_per_input(loaded.model, input_shapes or {})
    if sized is None or sized[1] * DEFAULT_BATCH_SIZE <= OUTPUT_BUDGET:
        return DEFAULT_BATCH_SIZE, None
    name, nbytes = sized
    size = max(1, OUTPUT_BUDGET // nbytes)
    return size, (f"the output {name!r} takes {nbytes / 2**20:.1f} MiB per input: {size} input{'s' if size > 1 else ''} "
                  f"per batch keep{'' if size > 1 else 's'} one batch of it near {OUTPUT_BUDGET // 2**20} MiB at most "
                  "(--batch-size sets it)")


def fixed_note(batch: int) -> str:
    """Why the batch is `batch`: the model's inputs fix it."""
    inputs = "input" if batch == 1 else "inputs"
    return f"the model's inputs fix their first dimension to {batch}: it runs exactly {batch} {inputs} at a time"


def _output_per_input(model, input_shapes: Mapping[str, Sequence[int]]) -> tuple[str, int] | None:
    """(name, bytes per input) of the output the replay scores, from its declared shape; None if unknown."""
    outputs = {o.name: o for o in model.graph.output}
    name = scored_name(list(outputs))
    if name is None:
        return None
    out = outputs[name]
    elem_type, dims = shape_of(out.type)
    if not elem_type or dims is None or len(dims) < 2:
        return None
    declared = {vi.name: shape_of(vi.type)[1] for vi in model.graph.input}  # the symbols free dims were given too
    sizes = {d: int(size) for name, shape in declared.items() if shape  # symbolic dimension -> its size in the data
             for d, size in zip(shape, input_shapes.get(name, ())) if isinstance(d, str)}
    per_input = ShapeResolver(sizes)(dims[1:])  # the batch axis first
    if per_input is None:
        return None
    return out.name, int(np.dtype(onnx.helper.tensor_dtype_to_np_dtype(elem_type)).itemsize) * math.prod(per_input)
