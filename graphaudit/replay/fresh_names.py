"""Fresh value and node names for the rewrites of the frozen graph (graphaudit.replay.rewrite)."""

from __future__ import annotations

import onnx

from graphaudit.load.protos import value_dims


class FreshNames:
    """Fresh value and node names that clash with none in the model, and the element types of
    the model's values and of the new ones (`typed`)."""

    def __init__(self, model: onnx.ModelProto) -> None:
        graph = model.graph
        self.taken = {v for n in graph.node for v in (*n.input, *n.output, n.name)}
        self.taken |= {v.name for v in (*graph.input, *graph.output, *graph.initializer, *graph.value_info)}
        self.types = {t.name: t.data_type for t in graph.initializer}
        self.types.update((v.name, v.type.tensor_type.elem_type) for v in (*graph.input, *graph.output, *graph.value_info)
                          if v.type.HasField("tensor_type") and v.type.tensor_type.elem_type)
        self.typed: list[tuple[str, int]] = []
        self.shapes: dict[str, tuple] = {}  # new values' dimensions, where known
        self.dims = value_dims(graph)

    def value(self, base: str, like: str) -> str:
        """A fresh value name, of the element type of value `like` where that is known."""
        name = self.fresh(base)
        if like in self.types:
            self.types[name] = self.types[like]
            self.typed.append((name, self.types[like]))
        return name

    def fresh(self, base: str) -> str:
        """`base`, or `base_k` for the first k that is not taken; taken from now on."""
        name, k = base, 0
        while name in self.taken:
            k += 1
            name = f"{base}_{k}"
        self.taken.add(name)
        return name
