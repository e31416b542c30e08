"""Model importers: PyTorch (`torch.export`) and ONNX graphs into XG's Graph IR.

Both produce an `ImportedProgram` (imported.py) that goes through the same passes, kernel
linking, cache and `.xge` packaging as `.xg` programs. The layer-level building blocks both share
are in composites.py; the op tables are aten_ops.py and onnx_ops.py. See docs/importers.md.
"""

from .imported import ImportedProgram, Unsupported, UnsupportedOps

__all__ = ["ImportedProgram", "Unsupported", "UnsupportedOps"]
