"""Engines of imported models, called like the model: `engine(x, mask=m)` takes and returns torch
tensors.

The build (xgbuild/build/engines.py) makes them from an `ImportedProgram` (PyTorch or ONNX), with
the weights inside. `ModelEngine` wraps the `Engine`: a call's positional and keyword arguments
are bound to the engine's inputs by name (positionals in the model's parameter order when built in
this process, in the engine's input order when loaded from a file), then checked against the
captured signature (dtype, shape, device), with errors naming the input, expected vs got.
Arguments the capture fixed that are not tensors (`use_cache=False`, `return_dict=None`,
`forward`'s defaults) are accepted only when equal to the captured value: the engine computes
that one case, and any other is refused rather than silently ignored.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from ..errors import InputError, XGError, user_stacklevel
from ..settings import RunSettings
from .engine import Engine


def _shape_text(shape: Any) -> str:
    return f"[{', '.join(str(d) for d in shape)}]"        # symbolic dims by name, unquoted


def _sig_text(spec: dict) -> str:
    return f"{spec['name']}: {spec['dtype']}{_shape_text(spec['shape'])}"


class ModelEngine:
    """An engine called with torch tensors, positionally or by keyword, as the model was."""

    def __init__(self, engine: Engine, check: bool = True, out_spec: Any = None,
                 params: tuple[str, ...] | None = None, fixed: dict[str, Any] | None = None) -> None:
        self.engine = engine
        self.check = check
        # The model's output structure (lists, dicts, dataclasses) when built in this process; an
        # engine loaded from a file returns a tensor or a flat tuple of them.
        self.out_spec = out_spec
        # How the model was called (in this process only): the names positional arguments fill,
        # and the non-tensor arguments fixed at capture. A loaded engine takes its inputs, in order.
        self.params = tuple(params) if params else tuple(s["name"] for s in engine.signature)
        self.fixed = dict(fixed or {})

    @classmethod
    def load(cls, path: Path | str, settings: RunSettings | None = None, *, trusted_keys: Any = None,
             expect_digest: str | None = None, allow_fallback: bool = False) -> "ModelEngine":
        """`Engine.load`'s checks (`trusted_keys`, `expect_digest`, `allow_fallback`), then an engine
        called like the model."""
        return cls(Engine.load(path, settings, trusted_keys=trusted_keys, expect_digest=expect_digest,
                               allow_fallback=allow_fallback))

    def save(self, path: Path | str) -> str:
        """Write the `.xge` (weights inside); `xgrun` runs it. Returns the bundle digest."""
        return self.engine.save(path)

    def synchronize(self) -> None:
        """Wait for every queued GPU call and raise the first failed check among them. A call
        returns its tensors as a PyTorch module does, before the GPU has run it; its check
        (NaN/Inf, token ids in range) is read as soon as the GPU is done, and a failure is raised
        by the next call, or here."""
        self.engine.synchronize()

    @property
    def manifest(self) -> dict:
        return self.engine.manifest

    @property
    def digest(self) -> str:
        return self.engine.digest

    @property
    def signature(self) -> list[dict]:
        return self.engine.signature

    def bind(self, args: tuple, kwargs: dict) -> dict[str, torch.Tensor]:
        """The call's tensors by input name; each misfit an InputError naming the argument."""
        sig = self.signature
        names = [s["name"] for s in sig]

        def takes() -> str:            # built only for an error: the happy path formats nothing
            return f"the engine takes {len(sig)} input{'s' if len(sig) != 1 else ''} ({', '.join(map(_sig_text, sig))})"
        if len(args) > len(self.params):
            raise InputError(f"{takes()}, got {len(args)} positional arguments")
        bound: dict[str, Any] = {}
        where: dict[str, str] = {}
        for i, (name, value) in enumerate(zip(self.params, args)):
            bound[name], where[name] = value, f"positional argument {i + 1}"
        for name, value in kwargs.items():
            if name in bound:
                raise InputError(f"input `{name}` is given twice: as {where[name]} and by keyword")
            if name not in names and name not in self.fixed:
                raise InputError(f"unknown keyword argument `{name}`; {takes()}")
            bound[name], where[name] = value, "a keyword argument"
        for name, value in bound.items():
            if name in self.fixed:
                _check_fixed(name, value, self.fixed[name], where[name], names)
        missing = [n for n in names if n not in bound]
        if missing:
            given = sum(1 for n in names if n in bound)
            raise InputError(f"missing input{'s' if len(missing) > 1 else ''} "
                             f"{', '.join(f'`{m}`' for m in missing)}: {takes()}, got {given}")
        devices = set()
        for spec in sig:
            x = bound[spec["name"]]
            if x is None:
                raise InputError(f"input `{spec['name']}` is None; the engine was built with a tensor there "
                                 f"({spec['dtype']}{_shape_text(spec['shape'])})")
            if not isinstance(x, torch.Tensor):
                raise InputError(f"input `{spec['name']}` is a {type(x).__name__}; the engine expects a tensor "
                                 f"({spec['dtype']}{_shape_text(spec['shape'])})")
            devices.add(x.device.type)
        if len(devices) > 1:
            on = ", ".join(f"`{s['name']}` on {bound[s['name']].device}" for s in sig)
            raise InputError(f"inputs are on several devices ({on}); put them on one")
        return {n: bound[n] for n in names}

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        inputs = self.bind(args, kwargs)
        device = next(iter(inputs.values())).device.type if inputs else "cpu"
        if device not in ("cpu", "cuda"):
            raise XGError(f"inputs on {device} are not supported (cpu or cuda)")
        result = self.engine.run(inputs, device=device, check=self.check, wait=False)
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


def _same(a: Any, b: Any) -> bool:
    """Equal values of the same type (True is not 1 here: the model may tell them apart)."""
    try:
        return type(a) is type(b) and bool(a == b)
    except Exception:  # noqa: BLE001 (a value whose == raises or is not a bool is not the same)
        return False


def _check_fixed(name: str, value: Any, captured: Any, where: str, inputs: list[str]) -> None:
    """An argument the capture fixed: the same value, or an InputError saying what was captured."""
    if _same(value, captured):
        return
    hint = ""
    if isinstance(value, torch.Tensor) and where.startswith("positional"):
        hint = (f"; {where} fills the model's parameter `{name}`: pass tensors by keyword "
                f"(engine({', '.join(f'{n}=...' for n in inputs)}))")
    raise InputError(f"`{name}` was {captured!r} when the model was compiled and the engine computes that case "
                     f"only; got {_show(value)}{hint}")


def _show(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        return f"a tensor ({str(value.dtype).removeprefix('torch.')}{list(value.shape)})"
    return repr(value) if isinstance(value, (type(None), bool, int, float, str)) else f"a {type(value).__name__}"


MAX_SIGNATURES = 8      # input signatures a LazyModelEngine compiles for before it asks for dynamic shapes


def _key_part(what: str, value: Any) -> tuple:
    """What of one argument selects the engine: a tensor's dtype, shape and device; a constant's
    type and value (the engine is built for that value)."""
    if isinstance(value, torch.Tensor):
        return ("tensor", value.dtype, tuple(value.shape), str(value.device))
    if isinstance(value, (type(None), bool, int, float, str)):
        return (type(value).__name__, value)
    raise InputError(f"input {what} is a {type(value).__name__}; the engine takes tensors, and constants "
                     "(None, bool, int, float, str)")


def _dynamic_dims(keys: list[tuple], example: tuple, params: tuple[str, ...]) -> dict | None:
    """torch.export's `dynamic_shapes` (by parameter name) making dynamic each dim whose size
    differs among the signatures `keys` (as `_key_part` makes them), or None when they differ in
    anything else (rank, dtype, device, keyword names, constants)."""
    pos, kws = example
    parts = [(params[i], p) for i, p in enumerate(pos)] + list(kws)
    if len(pos) > len(params) or any(len(k[0]) != len(pos) or [n for n, _ in k[1]] != [n for n, _ in kws]
                                     for k in keys):
        return None
    shapes: dict[str, Any] = {}
    for j, (name, part) in enumerate(parts):
        seen = [(k[0] + tuple(p for _, p in k[1]))[j] for k in keys]
        if part[0] != "tensor":
            if any(p != part for p in seen):
                return None
            continue
        if any(p[0] != "tensor" or p[1] != part[1] or p[3] != part[3] or len(p[2]) != len(part[2]) for p in seen):
            return None
        dims = {d: torch.export.Dim(f"{name}_{d}") for d in range(len(part[2])) if len({p[2][d] for p in seen}) > 1}
        shapes[name] = dims or None
    return shapes


class LazyModelEngine:
    """`xg.compile(model)` without example inputs (the seed's form): the model is captured and built
    at its first call, with that call's arguments as the example inputs (positional and keyword),
    and again for each new input signature (keyword names, dtypes and shapes, constants' values;
    at most MAX_SIGNATURES). The XG cache keeps every tuned kernel, so
    a signature seen by an earlier process builds without tuning. `save`, `manifest`, `digest` and
    `signature` are those of the engine the latest call used."""

    def __init__(self, build: Any) -> None:
        self._build = build                 # (args, kwargs) of a call -> ModelEngine
        self._engines: dict[tuple, ModelEngine] = {}
        self._calls: dict[tuple, tuple[tuple, dict]] = {}      # signature -> the (detached) call that built it
        self._last: ModelEngine | None = None

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if not args and not kwargs:
            raise InputError("the engine takes the model's tensor inputs; got none")
        for i, x in enumerate(args):
            if x is not None and not isinstance(x, torch.Tensor):
                raise InputError(f"input {i} is a {type(x).__name__}; the engine takes tensors positionally "
                                 "(None skips a parameter; pass other constants by keyword)")
        key = (tuple(_key_part(str(i), x) for i, x in enumerate(args)),
               tuple((k, _key_part(f"`{k}`", v)) for k, v in sorted(kwargs.items())))
        engine = self._engines.get(key)
        if engine is None:
            if len(self._engines) >= MAX_SIGNATURES:
                raise XGError(f"the model was compiled for {MAX_SIGNATURES} input signatures already; pass "
                              "example_inputs and dynamic_shapes (torch.export.Dim) to xg.compile to build "
                              "one engine for a range of sizes")
            detached = tuple(x.detach() if isinstance(x, torch.Tensor) else x for x in args)
            kw = {k: v.detach() if isinstance(v, torch.Tensor) else v for k, v in kwargs.items()}
            engine = self._engines[key] = self._build(detached, kw)
            self._calls[key] = (detached, kw)
        self._last = engine
        return engine(*args, **kwargs)

    def synchronize(self) -> None:
        """`ModelEngine.synchronize` for every signature's engine."""
        for engine in self._engines.values():
            engine.synchronize()

    def _built(self) -> ModelEngine:
        if self._last is None:
            raise XGError("the engine is built at its first call (xg.compile got no example_inputs): call it "
                          "once, or pass example_inputs=(x,) to xg.compile")
        return self._last

    def save(self, path: Path | str) -> str:
        """Write one `.xge` for every input signature called so far: with several that differ only
        in sizes, the model is captured again with those dims dynamic (torch.export.Dim), so the
        file runs them all; where that cannot be (other ranks, dtypes, constants, or torch.export
        refuses the dims), the latest call's engine, with a warning naming what it leaves out."""
        last = self._built()
        if len(self._engines) == 1:
            return last.save(path)
        # The largest call as the example: torch.export specialises a dynamic dim seen at size 1.
        key = max(self._engines, key=lambda k: sum(sum(p[2]) for p in k[0] + tuple(q for _, q in k[1])
                                                   if p[0] == "tensor"))
        shapes = _dynamic_dims(list(self._engines), key, last.params)
        reason = "their tensors differ in rank, dtype, device or keyword names, or their constants differ"
        if shapes is not None:
            args, kwargs = self._calls[key]
            try:
                return self._build(args, kwargs, shapes).save(path)
            except XGError as exc:
                reason = f"capturing them with dynamic dims failed: {str(exc).splitlines()[0]}"
        import warnings
        warnings.warn(f"engine.save keeps the latest of {len(self._engines)} input signatures only "
                      f"({', '.join(_sig_text(s) for s in last.signature)}): {reason}; pass example_inputs and "
                      "dynamic_shapes to xg.compile for one engine of every size", stacklevel=user_stacklevel())
        return last.save(path)

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
