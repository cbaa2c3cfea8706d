"""Free dimensions as ONNX Runtime reads them: every spelling of "any size" is free and independent.

Exporters spell a dimension of any size in several ways: a negative `dim_value` (Paddle2ONNX
writes -1), a `dim_param` of "?" or "" (one symbol shared by every such axis, were it read as a
name), or a dimension with neither set. ONNX Runtime runs each as a size of its own, whatever
the others are. `name_free_dims` gives each free dimension of a graph input a symbol of its
own (FREE_PREFIX, the input and the axis), so that shape inference carries it to the tensors
computed from it as it carries `batch` (the batch and token axes of coefficients are read from
those symbols: graphaudit.analyses.axes), and clears the free spellings elsewhere (outputs,
value_info, bodies' inputs), where inference then writes what it finds.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import TypeGuard

import onnx

from graphaudit.load.protos import graphs

# dim_param spellings that name no dimension: free, each on its own (a repeated "?" is no equality)
FREE_PARAMS = frozenset({"", "?", "-1"})
# the symbols graphaudit gives free input dimensions; graphaudit.load.data reads them back as free (None)
FREE_PREFIX = "free__"


def is_free(dim: onnx.TensorShapeProto.Dimension) -> bool:
    """Whether `dim` is written as a free size without a name: a negative value, "?", "" or nothing."""
    which = dim.WhichOneof("value")
    if which == "dim_value":
        return dim.dim_value < 0
    return which is None or dim.dim_param in FREE_PARAMS


def is_free_symbol(dim: int | str | None) -> bool:
    """Whether a dimension as graphaudit reads it (`graph.build.shape_of`) is one `name_free_dims`
    named, or a free spelling itself."""
    return dim is None or (isinstance(dim, int) and dim < 0) or (
        isinstance(dim, str) and (dim in FREE_PARAMS or dim.startswith(FREE_PREFIX)))


def is_fixed_shape(shape: tuple[int | str | None, ...] | None) -> TypeGuard[tuple[int, ...]]:
    """Whether a shape as graphaudit reads it is known and every dimension a number."""
    return shape is not None and all(isinstance(d, int) for d in shape)


def name_free_dims(model: onnx.ModelProto, every: Sequence[onnx.GraphProto] | None = None) -> int:
    """How many dimensions were changed: each free one of `model`'s graph inputs given a symbol of
    its own, free spellings elsewhere cleared (the model is changed in place: the caller owns it).
    `every`: the model's graphs, as `protos.graphs` lists them, where the caller has them."""
    every = every or list(graphs(model.graph))
    taken = {d.dim_param for g in every for v in (*g.input, *g.output, *g.value_info)
             if v.type.HasField("tensor_type") for d in v.type.tensor_type.shape.dim if d.dim_param}
    weights = {t.name for t in model.graph.initializer}
    changed = 0
    for value in model.graph.input:
        if value.name in weights or not value.type.HasField("tensor_type"):
            continue
        for axis, dim in enumerate(value.type.tensor_type.shape.dim):
            if is_free(dim):
                symbol = f"{FREE_PREFIX}{re.sub(r'[^0-9A-Za-z_]', '_', value.name)}_{axis}"
                while symbol in taken:  # an identifier still: shapes are evaluated as expressions of symbols
                    symbol += "_"
                taken.add(symbol)
                dim.dim_param = symbol
                changed += 1
    for graph in every:
        values = (*graph.output, *graph.value_info, *(graph.input if graph is not model.graph else ()))
        for value in values:
            if value.type.HasField("tensor_type"):
                for dim in value.type.tensor_type.shape.dim:
                    if dim.WhichOneof("value") is not None and is_free(dim):
                        dim.Clear()
                        changed += 1
    return changed
