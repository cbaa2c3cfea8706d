"""How each graph input is fed: rows of examples along its own axis, or one value for every batch.

Most inputs hold one row per example on axis 0. Two other kinds are fed as ONNX Runtime
takes them:

- an input given one value for every batch as it is, not sliced by rows nor counted as
  examples: a scalar (a sample rate `sr` of shape []), or any input named in
  `Feeding.values` (`--set NAME=VALUE`, typed from the input's element type) or held as a
  0-d array in the data (broadcast to the input's fixed shape: a `use_cache_branch` flag of
  shape [1]);
- an input whose examples lie on another axis (a recurrent state `state[2, batch, 128]`):
  the axis `Feeding.axes` names (`--input-axes state=_,batch,_`), else the one the graph
  tells (`example_axis`).

`Feeding` is what the caller says; `example_axis` reads the rest from the graph inputs.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from graphaudit.errors import UsageError
from graphaudit.load.free_dims import is_free_symbol
from graphaudit.vocabulary import BATCH  # the name of the example axis in an --input-axes layout


@dataclass(frozen=True)
class Feeding:
    """What the caller says about feeding the graph inputs: `values`, one value per input given
    to every batch as it is (a number, a string of one as typed on the command line, or an
    array); `axes`, the example axis of inputs whose examples are not on axis 0 (an axis number,
    or a layout such as "_,batch,_" / ("_", "batch", "_") naming it `batch`)."""

    values: Mapping[str, object] = field(default_factory=dict)
    axes: Mapping[str, int | str | Sequence[str]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        both = sorted(set(self.values) & set(self.axes))
        if both:
            raise UsageError(f"expected an input either set to one value (--set) or batched on an axis "
                             f"(--input-axes), found both for {', '.join(both)}")

    def __bool__(self) -> bool:
        return bool(self.values or self.axes)

    def to_json(self) -> dict:
        return {"values": {k: np.asarray(v).tolist() for k, v in self.values.items()},
                "axes": {k: v if isinstance(v, int) else ",".join(layout(v)) for k, v in self.axes.items()}}


def parse_set(entries: Sequence[str]) -> dict[str, str]:
    """--set NAME=VALUE entries as {name: value text} (typed later, from the input's element type)."""
    values: dict[str, str] = {}
    for entry in entries:
        name, sep, text = entry.partition("=")
        name, text = name.strip(), text.strip()
        if not sep or not name or not text:
            raise UsageError(f"expected --set NAME=VALUE (e.g. sr=16000), found {entry!r}")
        if name in values:
            raise UsageError(f"expected --set to give {name!r} one value, found {values[name]!r} and {text!r}")
        values[name] = text
    return values


def parse_axes(entries: Sequence[str]) -> dict[str, tuple[str, ...]]:
    """--input-axes NAME=AXES entries (e.g. state=_,batch,_) as {name: layout}."""
    axes: dict[str, tuple[str, ...]] = {}
    for entry in entries:
        name, sep, text = entry.partition("=")
        name = name.strip()
        if not sep or not name:
            raise UsageError(f"expected --input-axes NAME=AXES with exactly one 'batch' (e.g. state=_,batch,_), "
                             f"found {entry!r}")
        if name in axes:
            raise UsageError(f"expected --input-axes to name {name!r} once, found it twice")
        axes[name] = layout(text, f"--input-axes {entry!r}")
    return axes


def layout(value: str | Sequence[str], where: str = "an input's axes") -> tuple[str, ...]:
    """An axis layout ("_,batch,_") as its names, checked to hold exactly one `batch`."""
    names = tuple(n.strip() for n in (value.split(",") if isinstance(value, str) else value))
    if any(not n for n in names) or names.count(BATCH) != 1:
        raise UsageError(f"expected {where} to be a comma list of axes with exactly one '{BATCH}' and '_' for "
                         f"each other axis (e.g. _,{BATCH},_), found {names.count(BATCH)} '{BATCH}' in "
                         f"{','.join(names) or 'nothing'}")
    return names


def given_axis(name: str, given: int | str | Sequence[str], shape: tuple | None) -> int:
    """The example axis `given` names for the input `name` of `shape` (None: rank unknown), checked."""
    if shape is not None and not shape:
        raise UsageError(f"expected --input-axes to name an input with axes, found {name!r}, a scalar (shape []): "
                         f"it is fed whole to every batch (give it with --set {name}=VALUE or as a 0-d array)")
    if isinstance(given, (int, np.integer)) and not isinstance(given, bool):
        rank = len(shape) if shape is not None else None
        if rank is not None and not -rank <= int(given) < rank:
            raise UsageError(f"expected the example axis of {name!r} within its {rank} axes, found {int(given)}")
        return int(given) % rank if rank is not None else int(given)
    # only a bool (an int to mypy) is left that is not a layout; iterating it raises TypeError, as before
    names = layout(given, f"--input-axes {name}")  # type: ignore[arg-type]
    if shape is not None and len(names) != len(shape):
        shown = ", ".join("?" if is_free_symbol(d) else str(d) for d in shape)
        raise UsageError(f"expected --input-axes {name} to name {len(shape)} axes (the input's shape is "
                         f"({shown})), found {len(names)} ({','.join(names)})")
    return names.index(BATCH)


def example_axes(shapes: Mapping[str, tuple | None], feeding: Feeding | None = None) -> dict[str, int | None]:
    """Each input's example axis (None: fed whole to every batch), from `feeding`, else read
    from the graph inputs' `shapes` (`example_axis`). Names `feeding` gives that the model
    lacks are a usage error."""
    feeding = feeding or Feeding()
    unknown = sorted((set(feeding.values) | set(feeding.axes)) - set(shapes))
    if unknown:
        option = "--set" if unknown[0] in feeding.values else "--input-axes"
        raise UsageError(f"expected {option} to name a graph input ({', '.join(shapes) or 'none'}), found "
                         f"{unknown[0]!r}")
    free_batch = any(shape and not isinstance(shape[0], int) for name, shape in shapes.items()
                     if name not in feeding.values and name not in feeding.axes)
    batch = {s[0] for s in shapes.values() if s and isinstance(s[0], str) and not is_free_symbol(s[0])}
    later = {d for s in shapes.values() if s for d in s[1:] if isinstance(d, str) and not is_free_symbol(d)}
    found: dict[str, int | None] = {}
    for name, shape in shapes.items():
        if name in feeding.values:
            found[name] = None
        elif name in feeding.axes:
            found[name] = given_axis(name, feeding.axes[name], shape)
        else:
            found[name] = example_axis(shape, batch, later - batch, free_batch)
    return found


def example_axis(shape: tuple | None, batch: set, others: set, free_batch: bool) -> int | None:
    """The example axis of an input of `shape`, as the graph tells it; None where it takes one
    value for every batch. `batch`: the symbols on the inputs' first axes; `others`: the symbols
    on their later axes (tokens, lengths); `free_batch`: whether some input takes any number of
    examples on its first axis.

    A scalar is fed whole. An input whose first axis is free holds its examples there. One whose
    first axis is fixed holds them where it carries a symbol the other inputs hold on their first
    axis (state[2, batch, 128] beside input[batch, 512]); failing that, beside inputs of a free
    batch, on its only free axis when its first axis is fixed to more than 1 and that axis is no
    other input's token or length (state[2, ?, 128]). Otherwise axis 0, as every input's first
    axis holds its examples (a fixed size there fixes the batch: `data.fixed_batch`; a flag of
    shape [1] fed one value per example, or whole as a 0-d array: `data.from_arrays`).
    """
    if shape is None:
        return 0
    if not shape:
        return None
    if not isinstance(shape[0], int) or shape[0] < 0:
        return 0
    carrying = [a for a, d in enumerate(shape) if isinstance(d, str) and d in batch]
    if len(carrying) == 1:
        return carrying[0]
    free = [a for a, d in enumerate(shape) if not (isinstance(d, int) and d >= 0)]
    if free_batch and shape[0] > 1 and len(free) == 1 and shape[free[0]] not in others:
        return free[0]
    return 0


def typed_value(name: str, value: object, dtype: np.dtype) -> np.ndarray:
    """`value` (a --set string, a number or an array) as an array of the input's `dtype`; a text
    that is not one number of that type, or a number past its range, is a usage error."""
    if isinstance(value, (bool, int, float, np.generic)):
        value = str(value.item() if isinstance(value, np.generic) else value)
    if not isinstance(value, str):
        return np.asarray(value)
    text = value.strip()
    try:
        if dtype == np.bool_:
            lowered = text.lower()
            if lowered not in ("0", "1", "true", "false"):
                raise ValueError(text)
            return np.array(lowered in ("1", "true"))
        if np.issubdtype(dtype, np.integer):
            number, info = int(text, 0), np.iinfo(dtype)
            if not info.min <= number <= info.max:
                raise UsageError(f"expected --set {name}= an integer that {dtype} holds ({info.min}..{info.max}), "
                                 f"found {text}")
            return np.array(number, dtype=dtype)
        if np.issubdtype(dtype, np.floating):
            real = float(text)
            if not np.isfinite(real):
                raise ValueError(text)
            return np.array(real, dtype=dtype)
    except ValueError:
        kind = ("a boolean (0, 1, true or false)" if dtype == np.bool_ else
                "an integer" if np.issubdtype(dtype, np.integer) else "a finite number")
        raise UsageError(f"expected --set {name}= {kind}, as the input's type {dtype} holds, found {text!r}") from None
    raise UsageError(f"expected --set to name a numeric or boolean input, found {name!r} of type {dtype}")
