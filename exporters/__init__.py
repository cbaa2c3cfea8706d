"""The reference model zoo: small PyTorch models, their training and their ONNX export.

A repository tool, never installed (`python -m exporters.build --out fixtures`); it needs
torch and onnxscript (the `exporters` extra). graphaudit itself never imports it.
"""
