"""Input data: `.npz` files checked against the model's graph inputs.

`load_data` gives back an InputData whose arrays are keyed by graph-input name, all with
the same leading (batch) axis. Pickled objects are never loaded (`allow_pickle=False`);
missing or unexpected keys, wrong dtypes or ranks, fixed dimensions that disagree,
batches of different sizes, empty arrays, NaN/Inf values and indices past the table an
input indexes (token ids past the embedding) each raise a GraphAuditError that names what
was expected and what was found. `labels` (integers) and `targets` (finite numbers) are
accepted beside the inputs for the metrics. `data_shapes` reads only the array headers.
"""

from __future__ import annotations

import os
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator, Mapping, Sequence

import numpy as np
import onnx
from onnx import helper

from graphaudit.errors import GraphAuditError, UsageError

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

    def describe(self) -> str:
        dims = "?" if self.shape is None else "(" + ", ".join("?" if d is None else str(d) for d in self.shape) + ")"
        return f"{self.name}: {self.dtype} {dims}"


@dataclass(frozen=True)
class InputData:
    """Arrays for the model's inputs (and optional labels), one row per example."""

    arrays: Mapping[str, np.ndarray] = field(repr=False)
    labels: Mapping[str, np.ndarray] = field(repr=False)
    count: int
    source: str

    def batches(self, batch_size: int) -> Iterator[tuple[slice, dict[str, np.ndarray]]]:
        """Yield (rows, feeds) for consecutive batches of at most `batch_size` examples."""
        if batch_size < 1:
            raise GraphAuditError(f"expected a batch size of at least 1, found {batch_size}", exit_code=2)
        for start in range(0, self.count, batch_size):
            rows = slice(start, min(start + batch_size, self.count))
            yield rows, {k: v[rows] for k, v in self.arrays.items()}

    def subset(self, rows: Sequence[int] | slice, source: str | None = None) -> "InputData":
        """The examples at `rows`, as a new InputData."""
        pick = (lambda a: a[rows]) if isinstance(rows, slice) else (lambda a: a[np.asarray(rows, dtype=np.int64)])
        arrays = {k: pick(v) for k, v in self.arrays.items()}
        labels = {k: pick(v) for k, v in self.labels.items()}
        count = next(iter(arrays.values())).shape[0] if arrays else 0
        return InputData(arrays, labels, count, source or self.source)


def input_specs(model: onnx.ModelProto, exclude: Sequence[str] = ()) -> tuple[InputSpec, ...]:
    """The graph inputs of `model` that data must feed (initializers and `exclude` left out)."""
    inits = {t.name for t in model.graph.initializer}
    tables = _indexed_tables(model)
    specs = []
    for vi in model.graph.input:
        if vi.name in inits or vi.name in exclude:
            continue
        tt = vi.type.tensor_type
        dtype = np.dtype(helper.tensor_dtype_to_np_dtype(tt.elem_type)) if tt.elem_type else np.dtype("float32")
        shape = None
        if tt.HasField("shape"):
            shape = tuple(
                d.dim_value if d.HasField("dim_value") else (d.dim_param or None) for d in tt.shape.dim
            )
        limit, table = tables.get(vi.name, (None, None))
        specs.append(InputSpec(vi.name, dtype, shape, limit, table))
    return tuple(specs)


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


def load_data(path: str | os.PathLike, specs: Sequence[InputSpec]) -> InputData:
    """Return the arrays of the .npz at `path`, checked against `specs`."""
    path = Path(path)
    raw = _read_npz(path)
    _check_keys(raw, specs, path.name)
    return from_arrays(raw, specs, source=path.name)


def data_shapes(path: str | os.PathLike, specs: Sequence[InputSpec]) -> dict[str, tuple[int, ...]]:
    """The shape of one example (batch 1) of each input in the .npz at `path`, read from the
    array headers alone (no values are read), checked against `specs` as `load_data` checks."""
    path = Path(path)
    _require_zip(path)
    headers: dict[str, tuple[np.dtype, tuple[int, ...]]] = {}
    try:
        with zipfile.ZipFile(path) as archive:
            for member in archive.namelist():
                if member.endswith(".npy"):
                    headers[member[:-4]] = _header(archive, member)
    except (OSError, zipfile.BadZipFile, EOFError, ValueError) as err:
        raise GraphAuditError(f"expected a readable .npz archive at {path}, found a damaged one ({err})") from None
    _check_keys(headers, specs, path.name)
    for spec in specs:
        _check_header(*headers[spec.name], spec, f"{spec.name!r} in {path.name}")
    _check_counts({name: shape[0] for name, (_, shape) in headers.items() if shape}, path.name)
    batch = fixed_batch(specs) or 1
    return {spec.name: (batch, *headers[spec.name][1][1:]) for spec in specs}


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
    """How many inputs the model takes per run when its graph inputs fix their first (batch)
    dimension, as an export without a dynamic batch does; None when none fixes it. Every input's
    axis 0 holds the examples, so one input with a fixed size fixes the batch of all; inputs
    fixing different sizes have no batch the data could be cut into, and give None (the data
    checks and ONNX Runtime then say what does not fit)."""
    sizes = {s.shape[0] for s in specs if s.shape and isinstance(s.shape[0], int) and s.shape[0] > 0}
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


def from_arrays(raw: Mapping[str, np.ndarray], specs: Sequence[InputSpec], source: str = "<arrays>") -> InputData:
    """Check in-memory arrays against `specs` and return them as InputData."""
    arrays: dict[str, np.ndarray] = {}
    for spec in specs:
        arrays[spec.name] = _check_array(raw[spec.name], spec, source)
    labels = {k: _check_labels(k, np.asarray(raw[k]), source) for k in LABEL_KEYS if k in raw}
    counts = {name: a.shape[0] for name, a in {**arrays, **labels}.items()}
    _check_counts(counts, source)
    count = next(iter(counts.values()), 0)
    return InputData(arrays, labels, count, source)


def _check_keys(keys: Mapping[str, object], specs: Sequence[InputSpec], source: str) -> None:
    expected = {s.name for s in specs}
    missing = [s for s in specs if s.name not in keys]
    extra = sorted(k for k in keys if k not in expected and k not in LABEL_KEYS)
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


def _check_counts(counts: Mapping[str, int], source: str) -> None:
    if len(set(counts.values())) > 1:
        raise GraphAuditError(
            f"expected every array in {source} to have the same number of examples on axis 0, "
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


def _header(archive: zipfile.ZipFile, member: str) -> tuple[np.dtype, tuple[int, ...]]:
    """The dtype and shape an .npy member of `archive` declares, read from its header alone."""
    with archive.open(member) as f:
        version = np.lib.format.read_magic(f)
        read = (np.lib.format.read_array_header_1_0 if version == (1, 0)
                else np.lib.format.read_array_header_2_0)
        shape, _, dtype = read(f)
    return np.dtype(dtype), tuple(shape)


def _read_npz(path: Path) -> dict[str, np.ndarray]:
    _require_zip(path)
    arrays: dict[str, np.ndarray] = {}
    try:
        with np.load(path, allow_pickle=False) as archive:
            for key in archive.files:
                try:
                    arrays[key] = archive[key]
                    if isinstance(arrays[key], bytes):  # numpy hands back a member that is not .npy as its bytes
                        raise GraphAuditError(
                            f"expected every member of {path} to be a NumPy .npy array, found {key!r} holding "
                            f"{len(arrays[key])} bytes without the .npy header"
                        )
                except MemoryError:  # a header may declare any shape: numpy allocates it before reading
                    raise GraphAuditError(
                        f"expected arrays that fit in memory in {path}, found {_declared(archive.zip, key)} "
                        f"for key {key!r}"
                    ) from None
        return arrays
    except ValueError as err:
        if "max_header_size" in str(err):  # numpy's guard against headers built to exhaust memory
            raise GraphAuditError(
                f"expected .npy headers of at most 10 kB in {path} (numpy's limit for files it does not trust), "
                "found a larger one"
            ) from None
        if "allow_pickle" in str(err) or "Object arrays" in str(err):
            raise GraphAuditError(
                f"expected numeric arrays in {path}, found pickled Python objects; graphaudit never "
                "loads pickles (they can run code)"
            ) from None
        raise GraphAuditError(f"expected readable .npy arrays in {path}, found: {' '.join(str(err).split())}") from None
    except (OSError, zipfile.BadZipFile, EOFError, KeyError) as err:
        raise GraphAuditError(f"expected a readable .npz archive at {path}, found a damaged one ({err})") from None


def _declared(archive: zipfile.ZipFile, key: str) -> str:
    """What the header of `key` in `archive` declares, in words: its shape, dtype and bytes."""
    try:
        dtype, shape = _header(archive, key + ".npy" if key + ".npy" in archive.namelist() else key)
    except (OSError, zipfile.BadZipFile, EOFError, KeyError, ValueError):
        return "an array too large to allocate"
    size = int(np.prod(shape, dtype=object)) * dtype.itemsize
    return f"a declared shape {shape} of {dtype} ({size} bytes)"


def _require_zip(path: Path) -> None:
    if not path.is_file():
        raise GraphAuditError(f"expected a data file (.npz) at {path}, found {'a directory' if path.is_dir() else 'nothing'}")
    if not zipfile.is_zipfile(path):
        raise GraphAuditError(
            f"expected a NumPy .npz archive (a zip of .npy arrays) at {path}, found a file that is not a zip archive"
        )


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
    if dtype == object:
        raise GraphAuditError(f"expected numeric values for {where}, found pickled Python objects; graphaudit "
                              "never loads pickles (they can run code)")
    widen = False
    if dtype != spec.dtype:
        same_kind = np.issubdtype(dtype, np.integer) and np.issubdtype(spec.dtype, np.integer)
        if not (same_kind and np.can_cast(dtype, spec.dtype, "safe")):
            raise GraphAuditError(f"expected {where} to have dtype {spec.dtype}, found {dtype}")
        widen = True
    if spec.shape == ():  # nothing the data could hold fits: the model's input has no example axis
        raise GraphAuditError(
            f"expected the model's input {spec.name!r} to have an axis for the examples, found a scalar input "
            f"(shape []): graphaudit feeds every input one row per example (axis 0); export that input "
            f"with shape [1] (one example per run) or with a batch axis")
    if spec.shape is not None:
        if len(shape) != len(spec.shape):
            raise GraphAuditError(
                f"expected {where} to have rank {len(spec.shape)} (shape {spec.describe().split(' ', 2)[2]}), "
                f"found rank {len(shape)} (shape {tuple(shape)})"
            )
        for axis, (want, got) in enumerate(zip(spec.shape, shape)):
            if isinstance(want, int) and want > 0 and axis > 0 and want != got:
                raise GraphAuditError(f"expected {where} to have size {want} on axis {axis}, found {got}")
    if len(shape) == 0:
        raise GraphAuditError(f"expected {where} to have a batch axis, found a scalar")
    # an empty axis past the batch and token ones that the model leaves open (a decoder's past keys
    # of length 0, on its first step) is data; an empty batch or token sequence, or an empty axis
    # of a fixed or unknown size, is not
    open_axes = {a for a, want in enumerate(spec.shape or ()) if a >= 2 and isinstance(want, str)}
    if 0 in shape and (shape[0] == 0 or any(size == 0 and a not in open_axes for a, size in enumerate(shape))):
        raise GraphAuditError(f"expected {where} to hold data, found an empty array of shape {tuple(shape)}")
    return widen
