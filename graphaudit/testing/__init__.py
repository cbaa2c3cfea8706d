"""Helpers for tests and benchmarks: synthetic graphs built with onnx.helper."""
