"""XG's build system: compiler, tuner, cache, packager and runtime, in pipeline order.

The public Python API lives in the `xg` package; this package holds the implementation.
"""

__version__ = "0.1.0"
