"""ONNX Runtime: sessions and providers, failures in one line (`sessions`), and denormal numbers
flushed to zero while graphaudit's own runs compute (`denormals`)."""
