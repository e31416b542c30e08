"""Graph IR: SSA tensor ops with dtypes and (possibly symbolic) shapes, and its tools."""

from .graph import Graph, Node, Op
from .verify import IRError, verify

__all__ = ["Graph", "IRError", "Node", "Op", "verify"]
