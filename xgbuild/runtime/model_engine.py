"""Engines of imported models, called like the model: `engine(x)` takes and returns torch tensors.

The build (xgbuild/build/engines.py) makes them from an `ImportedProgram` (PyTorch or ONNX), with
the weights inside. `ModelEngine` wraps the `Engine`: positional inputs are checked against the
captured signature (count, dtype, shape, device), with errors naming the input, expected vs got.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from ..errors import InputError, XGError
from ..settings import RunSettings
from .engine import Engine


def _sig_text(spec: dict) -> str:
    return f"{spec['name']}: {spec['dtype']}{list(spec['shape'])}"


class ModelEngine:
    """An engine called with positional torch tensors, as the model was."""

    def __init__(self, engine: Engine, check: bool = True, out_spec: Any = None) -> None:
        self.engine = engine
        self.check = check
        # The model's output structure (lists, dicts, dataclasses) when built in this process; an
        # engine loaded from a file returns a tensor or a flat tuple of them.
        self.out_spec = out_spec

    @classmethod
    def load(cls, path: Path | str, settings: RunSettings | None = None) -> "ModelEngine":
        return cls(Engine.load(path, settings))

    def save(self, path: Path | str) -> str:
        """Write the `.xge` (weights inside); `xgrun` runs it. Returns the bundle digest."""
        return self.engine.save(path)

    @property
    def manifest(self) -> dict:
        return self.engine.manifest

    @property
    def digest(self) -> str:
        return self.engine.digest

    @property
    def signature(self) -> list[dict]:
        return self.engine.signature

    def __call__(self, *inputs: Any) -> Any:
        sig = self.signature
        if len(inputs) != len(sig):
            takes = ", ".join(_sig_text(s) for s in sig)
            raise InputError(f"the engine takes {len(sig)} input{'s' if len(sig) != 1 else ''} ({takes}), "
                             f"got {len(inputs)}")
        devices = set()
        for spec, x in zip(sig, inputs):
            if not isinstance(x, torch.Tensor):
                raise InputError(f"input `{spec['name']}` is a {type(x).__name__}; the engine expects a tensor "
                                 f"({spec['dtype']}{list(spec['shape'])})")
            devices.add(x.device.type)
        if len(devices) > 1:
            raise InputError(f"inputs are on several devices ({', '.join(sorted(devices))}); put them on one")
        device = devices.pop() if devices else "cpu"
        if device not in ("cpu", "cuda"):
            raise XGError(f"inputs on {device} are not supported (cpu or cuda)")
        result = self.engine.run({s["name"]: x for s, x in zip(sig, inputs)}, device=device, check=self.check,
                                 wait=False)
        out = self.engine.graph.output
        if "t" in out:
            leaves = [result.tensors["out"]]
        else:
            leaves = [result.tensors[f"out_{i}"] for i in range(len(out["tuple"]))]
        if self.out_spec is not None and not self.out_spec.is_leaf():
            from torch.utils._pytree import tree_unflatten
            return tree_unflatten(leaves, self.out_spec)
        return leaves[0] if "t" in out else tuple(leaves)

    def __repr__(self) -> str:
        return (f"ModelEngine({', '.join(_sig_text(s) for s in self.signature)}; target "
                f"{self.manifest['target']}, digest {self.digest[:12]})")


MAX_SIGNATURES = 8      # input signatures a LazyModelEngine compiles for before it asks for dynamic shapes


class LazyModelEngine:
    """`xg.compile(model)` without example inputs (the seed's form): the model is captured and built
    at its first call, with that call's tensors as the example inputs, and again for each new input
    signature (dtypes and shapes; at most MAX_SIGNATURES). The XG cache keeps every tuned kernel, so
    a signature seen by an earlier process builds without tuning. `save`, `manifest`, `digest` and
    `signature` are those of the engine the latest call used."""

    def __init__(self, build: Any) -> None:
        self._build = build                 # example inputs -> ModelEngine
        self._engines: dict[tuple, ModelEngine] = {}
        self._last: ModelEngine | None = None

    def __call__(self, *inputs: Any) -> Any:
        if not inputs:
            raise InputError("the engine takes the model's tensor inputs; got none")
        for i, x in enumerate(inputs):
            if not isinstance(x, torch.Tensor):
                raise InputError(f"input {i} is a {type(x).__name__}; the engine takes tensors")
        key = tuple((x.dtype, tuple(x.shape), str(x.device)) for x in inputs)
        engine = self._engines.get(key)
        if engine is None:
            if len(self._engines) >= MAX_SIGNATURES:
                raise XGError(f"the model was compiled for {MAX_SIGNATURES} input signatures already; pass "
                              "example_inputs and dynamic_shapes (torch.export.Dim) to xg.compile to build "
                              "one engine for a range of sizes")
            engine = self._engines[key] = self._build(tuple(x.detach() for x in inputs))
        self._last = engine
        return engine(*inputs)

    def _built(self) -> ModelEngine:
        if self._last is None:
            raise XGError("the engine is built at its first call (xg.compile got no example_inputs): call it "
                          "once, or pass example_inputs=(x,) to xg.compile")
        return self._last

    def save(self, path: Path | str) -> str:
        return self._built().save(path)

    @property
    def manifest(self) -> dict:
        return self._built().manifest

    @property
    def digest(self) -> str:
        return self._built().digest

    @property
    def signature(self) -> list[dict]:
        return self._built().signature

    def __repr__(self) -> str:
        return f"LazyModelEngine({len(self._engines)} signature(s) built)"
