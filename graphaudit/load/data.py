"""Input data: `.npz` files checked against the model's graph inputs.

`load_data` gives back an InputData whose arrays are keyed by graph-input name, each with the
same number of examples on its example axis (axis 0, or the input's own: graphaudit.load.feeding),
and the values fed whole to every batch (scalars, `--set`). Pickled objects are never loaded (`allow_pickle=False`);
missing or unexpected keys, wrong dtypes or ranks, fixed dimensions that disagree,
batches of different sizes, empty arrays, NaN/Inf values and indices past the table an
input indexes (token ids past the embedding) each raise a GraphAuditError that names what
was expected and what was found. `labels` (integers) and `targets` (finite numbers) are
accepted beside the inputs for the metrics. `data_shapes` reads only the array headers.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx
from onnx import helper

from graphaudit.errors import GraphAuditError, UsageError
from graphaudit.load.feeding import Feeding, example_axes, typed_value
from graphaudit.load.free_dims import is_fixed_shape, is_free_symbol
from graphaudit.load.npz import npz_headers, read_npz

LABEL_KEYS = ("labels", "targets")


@dataclass(frozen=True)
class InputSpec:
    """One graph input the data must provide."""

    name: str
    dtype: np.dtype
    shape: tuple[int | str | None, ...] | None  # None: rank unknown
    # rows of the table this input indexes directly (an embedding's Gather), and the table's name
    index_limit: int | None = None
    index_table: str | None = None
    axis: int | None = 0  # where its examples lie; None: one value fed whole to every batch

    def describe(self) -> str:
        dims = "?" if self.shape is None else "(" + ", ".join("?" if d is None else str(d) for d in self.shape) + ")"
        return f"{self.name}: {'string' if self.dtype == object else self.dtype} {dims}"


@dataclass(frozen=True)
class InputData:
    """Arrays for the model's inputs (and optional labels), one row per example."""

    arrays: Mapping[str, np.ndarray] = field(repr=False)  # examples on axis 0, or on `axes[name]`
    labels: Mapping[str, np.ndarray] = field(repr=False)
    count: int
    source: str
    fixed: Mapping[str, np.ndarray] = field(default_factory=dict, repr=False)  # fed whole to every batch
    axes: Mapping[str, int] = field(default_factory=dict)  # the example axis of arrays not batched on axis 0

    @property
    def feeding(self) -> Feeding:
        """How these inputs are fed, as a Feeding (for checking them against another model)."""
        return Feeding(dict(self.fixed), dict(self.axes))

    def feeds(self, rows: Sequence[int] | np.ndarray | slice) -> dict[str, np.ndarray]:
        """The inputs of the examples at `rows`, each taken along its example axis, with the
        values fed whole."""
        index = rows if isinstance(rows, slice) else np.asarray(rows, dtype=np.int64)
        taken = {k: v[(slice(None),) * self.axes[k] + (index,)] if self.axes.get(k) else v[index]
                 for k, v in self.arrays.items()}
        return {**taken, **self.fixed}

    def batches(self, batch_size: int, span: slice | None = None) -> Iterator[tuple[slice, dict[str, np.ndarray]]]:
        """Yield (rows, feeds) for consecutive batches of at most `batch_size` examples, of the
        examples at `span` only when given (rows numbered in the whole data)."""
        if batch_size < 1:
            raise GraphAuditError(f"expected a batch size of at least 1, found {batch_size}", exit_code=2)
        first, stop = (0, self.count) if span is None else (span.start, min(span.stop, self.count))
        for start in range(first, stop, batch_size):
            rows = slice(start, min(start + batch_size, stop))
            yield rows, self.feeds(rows)

    def subset(self, rows: Sequence[int] | np.ndarray | slice, source: str | None = None) -> InputData:
        """The examples at `rows`, as a new InputData."""
        index = rows if isinstance(rows, slice) else np.asarray(rows, dtype=np.int64)
        arrays = {k: v for k, v in self.feeds(rows).items() if k in self.arrays}
        labels = {k: v[index] for k, v in self.labels.items()}
        count = len(range(self.count)[index]) if isinstance(index, slice) else len(index)
        return InputData(arrays, labels, count, source or self.source, self.fixed, self.axes)

    def examples_first(self, name: str) -> np.ndarray:
        """The array of input `name` with its examples on axis 0 (a view)."""
        return np.moveaxis(self.arrays[name], self.axes.get(name, 0), 0)

    def run_shapes(self, batch: int) -> dict[str, tuple[int, ...]]:
        """The shape of each input in one run of `batch` examples."""
        shapes = {}
        for name, array in self.arrays.items():
            shape = list(array.shape)
            shape[self.axes.get(name, 0)] = batch
            shapes[name] = tuple(shape)
        return {**shapes, **{name: tuple(v.shape) for name, v in self.fixed.items()}}


def input_specs(model: onnx.ModelProto, exclude: Sequence[str] = (),
                feeding: Feeding | None = None) -> tuple[InputSpec, ...]:
    """The graph inputs of `model` that data must feed (initializers and `exclude` left out),
    each with its example axis (`feeding.example_axes`: from `feeding`, else the graph).
    Free dimensions (-1, "?", "", none written, or named so at load) are None: any size."""
    inits = {t.name for t in model.graph.initializer}
    tables = _indexed_tables(model)
    found = []
    for vi in model.graph.input:
        if vi.name in inits or vi.name in exclude:
            continue
        tt = vi.type.tensor_type
        dtype = np.dtype(helper.tensor_dtype_to_np_dtype(tt.elem_type)) if tt.elem_type else np.dtype("float32")
        shape = None
        if tt.HasField("shape"):
            shape = tuple(None if is_free_symbol(d) else d for d in (
                d.dim_value if d.HasField("dim_value") else d.dim_param if d.HasField("dim_param") else None
                for d in tt.shape.dim))
        found.append((vi.name, dtype, shape, *tables.get(vi.name, (None, None))))
    axes = example_axes({name: shape for name, _, shape, _, _ in found}, feeding)
    return tuple(InputSpec(name, dtype, shape, limit, table, axes[name]) for name, dtype, shape, limit, table in found)


def _indexed_tables(model: onnx.ModelProto) -> dict[str, tuple[int, str]]:
    """Graph inputs used directly as Gather indices into an initializer: input -> (rows, table)."""
    dims = {t.name: tuple(t.dims) for t in model.graph.initializer}
    found: dict[str, tuple[int, str]] = {}
    for node in model.graph.node:
        if node.op_type != "Gather" or node.domain not in ("", "ai.onnx") or len(node.input) < 2:
            continue
        table, indices = node.input[0], node.input[1]
        axis = next((a.i for a in node.attribute if a.name == "axis"), 0)
        shape = dims.get(table)
        if shape is None or not -len(shape) <= axis < len(shape):
            continue
        rows = int(shape[axis])
        if indices not in found or rows < found[indices][0]:
            found[indices] = (rows, table)
    return found


def load_data(path: str | os.PathLike, specs: Sequence[InputSpec], feeding: Feeding | None = None) -> InputData:
    """Return the arrays of the .npz at `path`, checked against `specs` (`feeding.values`: the
    values of inputs fed whole that the file need not hold). Every header is checked (`data_shapes`)
    before any array is decompressed, so a file refused for its keys or shapes is never read whole."""
    path = Path(path)
    data_shapes(path, specs, feeding)  # keys, dtypes and shapes from the headers, before a value is read
    return from_arrays(read_npz(path), specs, source=path.name, feeding=feeding)


def data_shapes(path: str | os.PathLike, specs: Sequence[InputSpec],
                feeding: Feeding | None = None) -> dict[str, tuple[int, ...]]:
    """The shape of each input in one run of one example (batch 1, or the model's fixed batch)
    in the .npz at `path`, read from the array headers alone (no values are read), checked
    against `specs` as `load_data` checks."""
    path = Path(path)
    headers = npz_headers(path)
    values = dict((feeding or Feeding()).values)
    _check_keys(headers, specs, path.name, feeding)
    shapes: dict[str, tuple[int, ...]] = {}
    counts: dict[str, int] = {}
    batch = fixed_batch(specs) or 1
    for spec in specs:
        where = f"{spec.name!r} in {path.name}"
        if spec.axis is None or (spec.name in headers and _one_value(headers[spec.name][1], spec)):
            # its shape as fed: a --set value's, or the file's (a 0-d array broadcast)
            given = typed_value(spec.name, values[spec.name], spec.dtype) if spec.name in values else None
            shapes[spec.name] = _whole_shape(given.shape if given is not None else headers[spec.name][1], spec, where)
            continue
        _check_header(*headers[spec.name], spec, where)
        shape = list(headers[spec.name][1])
        counts[spec.name], shape[spec.axis] = shape[spec.axis], batch
        shapes[spec.name] = tuple(shape)
    counts.update({k: shape[0] for k, (_, shape) in headers.items() if k in LABEL_KEYS and shape})
    _check_counts(counts, path.name, {s.name: s.axis for s in specs if s.axis and s.name in counts})
    return shapes


MASK_INPUT = "attention_mask"  # 1 where an input has a token, 0 where it is padded


def padding(data: InputData) -> np.ndarray | None:
    """Where each input has a token — (inputs, positions) bools from its `attention_mask` — when
    that mask pads any input; None without such a mask or padding. The replay leaves padded
    positions out of every score, shuffle and profile."""
    mask = data.arrays.get(MASK_INPUT)
    if mask is None or mask.ndim != 2:
        return None
    if mask.dtype != bool:
        other = (mask != 0) & (mask != 1)
        if other.any():
            raise GraphAuditError(f"expected {MASK_INPUT} in {data.source} to hold 1 for a token and 0 for "
                                  f"padding, found {mask[other][0]!r} ({int(other.sum())} values neither)")
    return tokens_of(mask)


def tokens_of(mask: np.ndarray) -> np.ndarray | None:
    """Where an attention mask marks a token (True) rather than padding; None when it pads nothing."""
    tokens = mask != 0
    return None if tokens.all() else tokens


def fixed_batch(specs: Sequence[InputSpec]) -> int | None:
    """How many inputs the model takes per run when its graph inputs fix their example (batch)
    dimension, as an export without a dynamic batch does; None when none fixes it. Every input's
    example axis (axis 0, or its own) holds the examples, so one input with a fixed size there
    fixes the batch of all; inputs fixing different sizes have no batch the data could be cut
    into, and give None (the data checks and ONNX Runtime then say what does not fit). Inputs
    fed whole to every batch have no say."""
    sizes = {d for s in specs if s.shape and s.axis is not None and isinstance(d := s.shape[s.axis], int) and d > 0}
    return sizes.pop() if len(sizes) == 1 else None


def check_batch_size(specs: Sequence[InputSpec], requested: int | None) -> int | None:
    """`requested`, or the model's fixed batch when it has one; a different size is a usage error."""
    fixed = fixed_batch(specs)
    if fixed is not None and requested is not None and requested != fixed:
        raise UsageError(f"expected --batch-size {fixed} (the model's inputs fix their first dimension to "
                         f"{fixed}), found {requested}")
    return fixed if fixed is not None else requested


def whole_batches(data: InputData, batch: int | None) -> tuple[InputData, str | None]:
    """`data` cut to whole batches of a model's fixed `batch` (None: as it is), and a note when
    inputs were left out."""
    if batch is None or data.count % batch == 0:
        return data, None
    whole = data.count - data.count % batch
    if whole == 0:
        raise GraphAuditError(f"expected at least {batch} inputs in {data.source} (the model's inputs fix "
                              f"their first dimension to {batch}), found {data.count}")
    note = (f"the last {data.count - whole} of the {data.count} inputs in {data.source} were left out: the model "
            f"runs exactly {batch} at a time")
    return data.subset(slice(0, whole)), note


def from_arrays(raw: Mapping[str, np.ndarray], specs: Sequence[InputSpec], source: str = "<arrays>",
                feeding: Feeding | None = None) -> InputData:
    """Check in-memory arrays (and `feeding.values`) against `specs` and return them as InputData."""
    values = dict((feeding or Feeding()).values)
    arrays: dict[str, np.ndarray] = {}
    fixed: dict[str, np.ndarray] = {}
    for spec in specs:
        if spec.axis is None or (spec.name in raw and _one_value(np.shape(raw[spec.name]), spec)):
            given = spec.name in values
            value = typed_value(spec.name, values[spec.name], spec.dtype) if given else raw[spec.name]
            fixed[spec.name] = _check_whole(value, spec, f"--set {spec.name}" if given else f"{spec.name!r} in {source}")
        else:
            arrays[spec.name] = _check_array(raw[spec.name], spec, source)
    labels = {k: _check_labels(k, np.asarray(raw[k]), source) for k in LABEL_KEYS if k in raw}
    axes = {s.name: s.axis for s in specs if s.axis and s.name in arrays}
    counts = {name: a.shape[axes.get(name, 0)] for name, a in {**arrays, **labels}.items()}
    _check_counts(counts, source, axes)
    count = next(iter(counts.values()), 1)  # inputs all fed whole, no labels: one run of them
    return InputData(arrays, labels, count, source, fixed, axes)


def _check_keys(keys: Mapping[str, object], specs: Sequence[InputSpec], source: str,
                feeding: Feeding | None = None) -> None:
    values = (feeding or Feeding()).values
    expected = {s.name for s in specs}
    twice = sorted(k for k in keys if k in values)
    if twice:
        raise UsageError(f"expected each input given once, found {twice[0]!r} both in {source} and in --set")
    missing = [s for s in specs if s.name not in keys and s.name not in values]
    extra = sorted(k for k in keys if k not in expected and k not in LABEL_KEYS)
    whole = [s for s in missing if s.axis is None]
    if whole:
        raise GraphAuditError(
            f"expected a value for the model's input {whole[0].describe()}, fed whole to every batch, found none "
            f"in {source}: give it as --set {whole[0].name}=VALUE or as a 0-d array {whole[0].name!r} in the .npz")
    if missing:
        raise GraphAuditError(
            f"expected {source} to hold arrays for the model's inputs "
            f"({', '.join(s.describe() for s in specs)}), found keys {sorted(keys)}; "
            f"missing {', '.join(s.name for s in missing)}"
        )
    if extra:
        raise GraphAuditError(
            f"expected {source} to hold only the model's inputs ({', '.join(sorted(expected))}) "
            f"and optionally {' / '.join(LABEL_KEYS)}, found unexpected keys {extra}"
        )


def _check_counts(counts: Mapping[str, int], source: str, axes: Mapping[str, int] | None = None) -> None:
    if len(set(counts.values())) > 1:
        where = "axis 0" if not axes else "their example axis (" + ", ".join(
            f"{k}: {axes.get(k, 0)}" for k in counts) + ")"
        raise GraphAuditError(
            f"expected every array in {source} to have the same number of examples on {where}, "
            f"found {', '.join(f'{k}: {v}' for k, v in counts.items())}"
        )


def _check_labels(key: str, a: np.ndarray, source: str) -> np.ndarray:
    """`labels` are integer class or token ids (-100: left out); `targets` are finite numbers."""
    integer = np.issubdtype(a.dtype, np.integer)
    if a.dtype == bool or not (integer or (key == "targets" and np.issubdtype(a.dtype, np.floating))):
        kind = "integer" if key == "labels" else "numeric"
        raise GraphAuditError(f"expected {kind} {key} in {source}, found dtype {a.dtype}")
    if a.ndim == 0:
        raise GraphAuditError(f"expected {key} in {source} to have a batch axis, found a scalar")
    if not integer and not np.isfinite(a).all():
        raise GraphAuditError(f"expected finite {key} in {source}, found {int((~np.isfinite(a)).sum())} NaN/Inf values")
    return a


def _check_array(value: np.ndarray, spec: InputSpec, source: str) -> np.ndarray:
    a = np.asarray(value)
    where = f"{spec.name!r} in {source}"
    if _check_header(a.dtype, a.shape, spec, where):
        a = a.astype(spec.dtype)  # e.g. int32 token ids for an int64 input: lossless
    if np.issubdtype(a.dtype, np.floating) and not np.isfinite(a).all():
        bad = int((~np.isfinite(a)).sum())
        raise GraphAuditError(f"expected finite values in {where}, found {bad} NaN/Inf values")
    if spec.index_limit is not None and np.issubdtype(a.dtype, np.integer):
        low, high = int(a.min()), int(a.max())
        if low < 0 or high >= spec.index_limit:
            raise GraphAuditError(
                f"expected {where} to hold indices 0..{spec.index_limit - 1} (rows of {spec.index_table!r}, "
                f"which it indexes), found values from {low} to {high}"
            )
    return a


def _check_header(dtype: np.dtype, shape: tuple[int, ...], spec: InputSpec, where: str) -> bool:
    """Check an array's dtype and shape against `spec`; True when it is to be widened to spec.dtype."""
    widen = _check_dtype(dtype, spec, where)
    batch = spec.axis or 0
    if spec.shape is not None:
        if len(shape) != len(spec.shape):
            across = f", examples on axis {batch}" if batch else ""
            raise GraphAuditError(
                f"expected {where} to have rank {len(spec.shape)} (shape {spec.describe().split(' ', 2)[2]}{across}), "
                f"found rank {len(shape)} (shape {tuple(shape)})"
            )
        for axis, (want, got) in enumerate(zip(spec.shape, shape)):
            if isinstance(want, int) and want > 0 and axis != batch and want != got:
                raise GraphAuditError(f"expected {where} to have size {want} on axis {axis}, found {got}")
    if len(shape) == 0:
        raise GraphAuditError(f"expected {where} to have a batch axis, found a scalar")
    # an empty axis past the batch and token ones that the model leaves open (a decoder's past keys
    # of length 0, on its first step) is data; an empty batch or token sequence, or an empty axis
    # of a fixed or unknown size, is not
    open_axes = {a for a, want in enumerate(spec.shape or ()) if a >= 2 and a != batch and isinstance(want, str)}
    if 0 in shape and (shape[batch] == 0 or any(size == 0 and a not in open_axes for a, size in enumerate(shape))):
        raise GraphAuditError(f"expected {where} to hold data, found an empty array of shape {tuple(shape)}")
    return widen


def _check_dtype(dtype: np.dtype, spec: InputSpec, where: str) -> bool:
    """Check an array's dtype against `spec`; True when it is to be widened to spec.dtype."""
    if spec.dtype == object:  # an ONNX string input: text as NumPy unicode, which ONNX Runtime takes as it is
        if dtype.kind != "U":
            raise GraphAuditError(f"expected text for {where} (the model's input is a string tensor) as a NumPy "
                                  f"unicode array (np.array(['...']), dtype <U), found {_dtype_words(dtype)}")
        return False
    if dtype == np.dtype(object):
        raise GraphAuditError(f"expected numeric values for {where}, found pickled Python objects; graphaudit "
                              "never loads pickles (they can run code)")
    if dtype != spec.dtype:
        same_kind = np.issubdtype(dtype, np.integer) and np.issubdtype(spec.dtype, np.integer)
        if not (same_kind and np.can_cast(dtype, spec.dtype, "safe")):
            raise GraphAuditError(f"expected {where} to have dtype {spec.dtype}, found {dtype}")
        return True
    return False


def _dtype_words(dtype: np.dtype) -> str:
    return "pickled Python objects, which graphaudit never loads (they can run code)" if dtype == np.dtype(object) \
        else f"dtype {dtype}"


def _one_value(shape: tuple[int, ...], spec: InputSpec) -> bool:
    """Whether an array of `shape` for an input with an example axis is one value for every batch:
    a 0-d array for an input of fixed sizes (a flag of shape [1]), broadcast to them."""
    return not shape and spec.shape is not None and all(isinstance(d, int) for d in spec.shape)


def _whole_shape(shape: tuple[int, ...], spec: InputSpec, where: str) -> tuple[int, ...]:
    """The shape an input fed whole to every batch is fed at, given a value of `shape`: its own,
    or the input's fixed shape for one value (a 0-d array) broadcast to it."""
    if spec.shape is None or len(shape) == len(spec.shape):
        for axis, (want, got) in enumerate(zip(spec.shape or (), shape)):
            if isinstance(want, int) and want != got:
                raise GraphAuditError(f"expected {where} to have size {want} on axis {axis} (one value for every "
                                      f"batch, of the input's shape), found {got}")
        return tuple(shape)
    if not shape and is_fixed_shape(spec.shape):
        return tuple(spec.shape)
    shown = spec.describe().split(" ", 2)[2]
    if not spec.shape:
        raise GraphAuditError(f"expected {where} to be one value for every batch, a 0-d array (the model's input "
                              f"is a scalar, shape []), found shape {tuple(shape)}")
    raise GraphAuditError(f"expected {where} to be one value for every batch, of the input's shape {shown} or a "
                          f"0-d array{'' if all(isinstance(d, int) for d in spec.shape) else ' (for fixed sizes only)'}"
                          f", found shape {tuple(shape)}")


def _check_whole(value: object, spec: InputSpec, where: str) -> np.ndarray:
    """A value fed whole to every batch, checked against `spec` and broadcast to its fixed shape."""
    a = np.asarray(value)
    if _check_dtype(a.dtype, spec, where):
        a = a.astype(spec.dtype)
    if np.issubdtype(a.dtype, np.floating) and not np.isfinite(a).all():
        raise GraphAuditError(f"expected finite values in {where}, found {int((~np.isfinite(a)).sum())} NaN/Inf values")
    shape = _whole_shape(a.shape, spec, where)
    return np.ascontiguousarray(np.broadcast_to(a, shape)) if shape != a.shape else a
