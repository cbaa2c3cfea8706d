"""The graph model: a loaded ONNX model as a networkx graph (`model`), built by `build` (subgraphs
and local functions included, with `function_types` for a body's types at one call), and the order
in which analyses visit its nodes (`visit_order`)."""
