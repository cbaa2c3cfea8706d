"""ONNX Runtime: sessions and providers, failures in one line (`sessions`), large inline weights
handed over as arrays (`handed_weights`), and denormal numbers flushed to zero while
graphaudit's own runs compute (`denormals`)."""
