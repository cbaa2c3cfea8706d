"""graphaudit: does input-dependent parameterization buy input-dependent computation?

The library keeps three properties of an ONNX model apart: coefficient variation,
functional dependence of the frozen model, and actual execution. Importing it never
imports torch.
"""

from graphaudit._version import __version__

# `graphaudit.audit` must be the function even after `import graphaudit.audit`: a lazily
# resolved attribute would be replaced by the submodule of the same name the first time
# anything imported it. So it is imported here, from a module that loads nothing heavy
# (no numpy, onnx, runtime or torch) until an audit runs.
from graphaudit.audit import AuditReport, AuditSettings, audit
from graphaudit.errors import GraphAuditError

__all__ = ["AuditReport", "AuditSettings", "GraphAuditError", "__version__", "audit"]
