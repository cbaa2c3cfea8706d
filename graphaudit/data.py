"""Input data: `.npz` files checked against the model's graph inputs.

`load_data` gives back an InputData whose arrays are keyed by graph-input name, all with
the same leading (batch) axis. Pickled objects are never loaded (`allow_pickle=False`);
missing or unexpected keys, wrong dtypes or ranks, fixed dimensions that disagree,
batches of different sizes, empty arrays and NaN/Inf values each raise a GraphAuditError
that names what was expected and what was found. `labels` and `targets` are accepted
beside the inputs for the metrics.
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

from graphaudit.errors import GraphAuditError

LABEL_KEYS = ("labels", "targets")


@dataclass(frozen=True)
class InputSpec:
    """One graph input the data must provide."""

    name: str
    dtype: np.dtype
    shape: tuple[int | str | None, ...] | None  # None: rank unknown

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
        specs.append(InputSpec(vi.name, dtype, shape))
    return tuple(specs)


def load_data(path: str | os.PathLike, specs: Sequence[InputSpec]) -> InputData:
    """Return the arrays of the .npz at `path`, checked against `specs`."""
    path = Path(path)
    raw = _read_npz(path)
    expected = {s.name for s in specs}
    missing = [s for s in specs if s.name not in raw]
    extra = sorted(k for k in raw if k not in expected and k not in LABEL_KEYS)
    if missing:
        raise GraphAuditError(
            f"expected {path.name} to hold arrays for the model's inputs "
            f"({', '.join(s.describe() for s in specs)}), found keys {sorted(raw)}; "
            f"missing {', '.join(s.name for s in missing)}"
        )
    if extra:
        raise GraphAuditError(
            f"expected {path.name} to hold only the model's inputs ({', '.join(sorted(expected))}) "
            f"and optionally {' / '.join(LABEL_KEYS)}, found unexpected keys {extra}"
        )
    return from_arrays(raw, specs, source=path.name)


def from_arrays(raw: Mapping[str, np.ndarray], specs: Sequence[InputSpec], source: str = "<arrays>") -> InputData:
    """Check in-memory arrays against `specs` and return them as InputData."""
    arrays: dict[str, np.ndarray] = {}
    for spec in specs:
        arrays[spec.name] = _check_array(raw[spec.name], spec, source)
    labels = {k: np.asarray(raw[k]) for k in LABEL_KEYS if k in raw}
    for key, value in labels.items():
        if value.dtype == object:
            raise GraphAuditError(f"expected numeric {key} in {source}, found object dtype")
    counts = {name: a.shape[0] for name, a in {**arrays, **labels}.items()}
    if len(set(counts.values())) > 1:
        raise GraphAuditError(
            f"expected every array in {source} to have the same number of examples on axis 0, "
            f"found {', '.join(f'{k}: {v}' for k, v in counts.items())}"
        )
    count = next(iter(counts.values()), 0)
    return InputData(arrays, labels, count, source)


def _read_npz(path: Path) -> dict[str, np.ndarray]:
    if not path.is_file():
        raise GraphAuditError(f"expected a data file (.npz) at {path}, found {'a directory' if path.is_dir() else 'nothing'}")
    if not zipfile.is_zipfile(path):
        raise GraphAuditError(
            f"expected a NumPy .npz archive (a zip of .npy arrays) at {path}, found a file that is not a zip archive"
        )
    try:
        with np.load(path, allow_pickle=False) as archive:
            return {key: archive[key] for key in archive.files}
    except ValueError as err:
        if "allow_pickle" in str(err) or "Object arrays" in str(err):
            raise GraphAuditError(
                f"expected numeric arrays in {path}, found pickled Python objects; graphaudit never "
                "loads pickles (they can run code)"
            ) from None
        raise GraphAuditError(f"expected readable .npy arrays in {path}, found: {' '.join(str(err).split())}") from None
    except (OSError, zipfile.BadZipFile, EOFError, KeyError) as err:
        raise GraphAuditError(f"expected a readable .npz archive at {path}, found a damaged one ({err})") from None


def _check_array(value: np.ndarray, spec: InputSpec, source: str) -> np.ndarray:
    a = np.asarray(value)
    where = f"{spec.name!r} in {source}"
    if a.dtype != spec.dtype:
        same_kind = np.issubdtype(a.dtype, np.integer) and np.issubdtype(spec.dtype, np.integer)
        if same_kind and np.can_cast(a.dtype, spec.dtype, "safe"):
            a = a.astype(spec.dtype)  # e.g. int32 token ids for an int64 input: lossless
        else:
            raise GraphAuditError(f"expected {where} to have dtype {spec.dtype}, found {a.dtype}")
    if spec.shape is not None:
        if a.ndim != len(spec.shape):
            raise GraphAuditError(
                f"expected {where} to have rank {len(spec.shape)} (shape {spec.describe().split(' ', 2)[2]}), "
                f"found rank {a.ndim} (shape {a.shape})"
            )
        for axis, (want, got) in enumerate(zip(spec.shape, a.shape)):
            if isinstance(want, int) and want > 0 and axis > 0 and want != got:
                raise GraphAuditError(f"expected {where} to have size {want} on axis {axis}, found {got}")
    if a.ndim == 0:
        raise GraphAuditError(f"expected {where} to have a batch axis, found a scalar")
    if a.size == 0:
        raise GraphAuditError(f"expected {where} to hold data, found an empty array of shape {a.shape}")
    if np.issubdtype(a.dtype, np.floating) and not np.isfinite(a).all():
        bad = int((~np.isfinite(a)).sum())
        raise GraphAuditError(f"expected finite values in {where}, found {bad} NaN/Inf values")
    return a
