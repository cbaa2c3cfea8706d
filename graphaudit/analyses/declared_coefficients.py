"""Coefficient tensors: what they are called, which layer they serve, and their axes.

The exporters in `exporters/` declare them in the ONNX metadata under the key
`graphaudit.coefficients`, a JSON list of objects:

    {"tensor": "gate.0", "family": "gate", "layer": 0,
     "axes": ["batch", "token", "feature"]}

`tensor` names a value of the live graph (an intermediate tensor) and, in the frozen graph,
the graph input that replaces it. Axis names: `batch` and `token` are special; every other
axis is a slot axis (`feature`, `way`, `source`, `expert`, ...). `batch*token` is one axis
that holds both, batch-major (row b·T + t), as a MoE router sees the tokens once its input is
flattened (`hidden.view(-1, hidden_size)`); the replay splits it into `batch` and `token`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import onnx

from graphaudit.errors import GraphAuditError
from graphaudit.vocabulary import PER_INPUT

METADATA_KEY = "graphaudit.coefficients"


@dataclass(frozen=True)
class Coefficient:
    """One coefficient tensor of the model, with the layer it serves and its axis names."""

    tensor: str
    family: str
    layer: int
    axes: tuple[str, ...]
    source: str = "metadata"  # metadata | user | detected

    @property
    def slot_axes(self) -> tuple[int, ...]:
        """Positions of the axes that are neither batch nor token."""
        return tuple(i for i, a in enumerate(self.axes) if a not in PER_INPUT)

    def axis(self, name: str) -> int | None:
        """Position of the axis called `name`, or None."""
        return self.axes.index(name) if name in self.axes else None

    def to_json(self) -> dict:
        return {
            "tensor": self.tensor,
            "family": self.family,
            "layer": self.layer,
            "axes": list(self.axes),
            "source": self.source,
        }


def declared_coefficients(model: onnx.ModelProto) -> tuple[Coefficient, ...]:
    """Return the coefficients the model's metadata declares (empty when it declares none)."""
    raw = next((p.value for p in model.metadata_props if p.key == METADATA_KEY), None)
    if raw is None:
        return ()
    if not isinstance(raw, str):  # protobuf gives bytes for a value that is not UTF-8
        raise GraphAuditError(
            f"expected UTF-8 text in the model's {METADATA_KEY!r} metadata, found {len(raw)} bytes that are not UTF-8"
        )
    try:
        entries = json.loads(raw)
    except json.JSONDecodeError as err:
        raise GraphAuditError(
            f"expected JSON in the model's {METADATA_KEY!r} metadata, found text that does not "
            f"parse ({err.msg} at position {err.pos})"
        ) from None
    except RecursionError:
        raise _too_deep() from None
    if not isinstance(entries, list):
        raise GraphAuditError(
            f"expected a JSON list in the model's {METADATA_KEY!r} metadata, found "
            f"{type(entries).__name__}"
        )
    try:
        return tuple(_entry(e, i) for i, e in enumerate(entries))
    except RecursionError:  # quoting a bad entry nested nearly as deep as json.loads allows
        raise _too_deep() from None


def _too_deep() -> GraphAuditError:
    return GraphAuditError(
        f"expected a flat JSON list of objects in the model's {METADATA_KEY!r} metadata, found JSON "
        "nested too deeply to read"
    )


def metadata_entry(coefficients) -> onnx.StringStringEntryProto:
    """Return the metadata entry that declares `coefficients` (for exporters and surgery)."""
    payload = [
        {"tensor": c.tensor, "family": c.family, "layer": c.layer, "axes": list(c.axes)}
        for c in coefficients
    ]
    return onnx.StringStringEntryProto(key=METADATA_KEY, value=json.dumps(payload))


def _entry(entry, index: int) -> Coefficient:
    expected = "an object with 'tensor' (str), 'family' (str), 'layer' (int), 'axes' (list of str)"
    if not isinstance(entry, dict):
        raise GraphAuditError(
            f"expected {expected} as entry {index} of {METADATA_KEY!r}, found {type(entry).__name__}"
        )
    tensor, family, layer, axes = (entry.get(k) for k in ("tensor", "family", "layer", "axes"))
    if not (
        isinstance(tensor, str)
        and isinstance(family, str)
        and isinstance(layer, int)
        and isinstance(axes, list)
        and all(isinstance(a, str) for a in axes)
    ):
        raise GraphAuditError(
            f"expected {expected} as entry {index} of {METADATA_KEY!r}, found {json.dumps(entry)[:200]}"
        )
    return Coefficient(tensor=tensor, family=family, layer=layer, axes=tuple(axes))
