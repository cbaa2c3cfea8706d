"""Coefficients the user names: `--coefficients NAME_OR_GLOB[=AXIS,...]` and `--axes`.

Each entry names tensors by name or glob, maybe with the axis names the graph does not tell;
a tensor detection finds too keeps the family and layer detection gives it, any other takes
its family from its name (`gate.3` is a `gate`) and its layer from the blocks.
"""

from __future__ import annotations

import difflib
import fnmatch
import re
from collections import Counter
from collections.abc import Mapping, Sequence

from graphaudit.analyses.axes import InputAxes, axes_of
from graphaudit.analyses.blockmap import BlockMap
from graphaudit.analyses.coefficient_reach import layer_of
from graphaudit.analyses.declared_coefficients import Coefficient
from graphaudit.errors import UsageError
from graphaudit.graph.model import ModelGraph
from graphaudit.vocabulary import BATCH, MERGED, TOKEN

_GLOB = re.compile(r"[*?\[]")


def split_entry(entry: str, names: Sequence[str] | None = None) -> tuple[str, tuple[str, ...] | None]:
    """A user's coefficient entry as (name or glob, axis names or None): `NAME_OR_GLOB` alone,
    or `NAME_OR_GLOB=AXIS,AXIS,...` to give the axes the graph does not tell. An entry that is
    itself one of `names` (a tensor whose name holds `=`) is a name."""
    if "=" not in entry or (names is not None and entry in names):
        return entry, None
    pattern, _, spec = entry.rpartition("=")
    axes = tuple(a.strip() for a in spec.split(","))
    merged = MERGED in axes and BATCH not in axes and TOKEN not in axes
    if not pattern or not all(axes) or len(set(axes)) < len(axes) or (BATCH not in axes and not merged):
        raise UsageError(f"expected axis names for {pattern or entry!r} as {pattern or 'NAME'}=AXIS,AXIS,... with "
                         f"one {BATCH!r} axis and no name twice (e.g. {TOKEN!r} for positions, or one {MERGED!r} "
                         f"axis for both, batch-major), found {spec!r}")
    return pattern, axes


def _matched(mg: ModelGraph, names: Sequence[str]) -> dict[str, tuple[str, ...] | None]:
    """Tensor name -> the axes its entry gave (None: none), for each tensor the user's entries
    name or match; an entry that matches nothing is a UsageError naming the closest."""
    pool = sorted({r.name for r, info in mg.tensors.items() if info.kind != "initializer"})
    matched: dict[str, tuple[str, ...] | None] = {}  # tensor -> the axes its entry gave
    for entry in names:
        name, given = split_entry(entry, pool)
        hits = fnmatch.filter(pool, name) if _GLOB.search(name) else [n for n in pool if n == name]
        if not hits:
            close = difflib.get_close_matches(name, pool, n=5, cutoff=0.5)
            raise UsageError(
                f"expected {'--axes' if given else '--coefficients'} {name!r} to name a tensor of the model, found none"
                + (f"; closest: {', '.join(close)}" if close else f" among {len(pool)} tensor names")
            )
        for hit in hits:
            if matched.get(hit) is None:
                matched[hit] = given
    return matched


def user_coefficients(mg: ModelGraph, names: Sequence[str], blocks: BlockMap | None, axes: InputAxes,
                      found: Mapping[str, Coefficient] | None = None) -> list[Coefficient]:
    """The coefficients the user's entries name, marked `user`: each with the family and layer
    detection gives it where it is in `found`, else its family from its name and its layer
    from the blocks; its axes as the entry gives them, else as the graph tells."""
    if not names:
        return []
    matched = _matched(mg, names)
    coefficients = []
    order: Counter = Counter()
    for name, given in matched.items():
        ref = mg.find_tensor(name)
        shape = mg.tensors[ref].shape if ref in mg.tensors else None
        if given is not None and shape is not None and len(shape) != len(given):
            raise UsageError(f"expected {len(shape)} axis names for the coefficient {name!r} of shape "
                             f"({', '.join(str(d) for d in shape)}), found {len(given)}: {','.join(given)}")
        detected = (found or {}).get(name)
        if detected is not None:
            coefficients.append(Coefficient(name, detected.family, detected.layer, given or detected.axes, source="user"))
            continue
        family = _family_of(name)
        layer = layer_of(mg, ref, name, blocks, order[family])
        order[family] += 1
        coefficients.append(Coefficient(name, family, layer, given or axes_of(mg, ref, axes), source="user"))
    return coefficients


def _family_of(name: str) -> str:
    """`gate` of `gate.3`, `/blocks.3/gate` or `gate.3_quantized` (ONNX Runtime's quantizer's name
    for the integer tensor that stands for `gate.3`)."""
    stem = re.sub(r"[._/:-]*\d+$", "", re.sub(r"_quantized$", "", name.split("/")[-1]))
    return stem or name
