"""graphaudit: does input-dependent parameterization buy input-dependent computation?

The library keeps three properties of an ONNX model apart: coefficient variation,
functional dependence of the frozen model, and actual execution. Importing it never
imports torch.
"""

from graphaudit._version import __version__
from graphaudit.errors import GraphAuditError

__all__ = ["__version__", "GraphAuditError"]
