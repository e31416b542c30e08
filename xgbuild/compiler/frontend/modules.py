"""Imports: `import std.nn` and `import mylib` bring a module's functions and constants in.

Each module is checked on its own first (as a library); only a clean module is merged, so its
functions never need diagnostics rendered against another file. Node ids are offset per module
so one program's side tables never collide. Cycles and missing files are diagnostics at the
`import` line; a cycle's note names its files in order (`a.xg -> b.xg -> a.xg`), and an error
inside a module reaches the importing file with the notes of the errors under it.

A module is read like a main file (`source.read_source`): only a regular file, at most
MAX_SOURCE_BYTES, so a FIFO or a link to /dev/zero is refused before anything is read.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from ...settings import shipped_dir
from . import ast as A
from .codes import BAD_IMPORT
from .diagnostics import Diagnostics
from .lexer import tokenize
from .parser import parse
from .source import SourceFile, Span, UnreadableSource, decode_source, read_source

STD_DIR = shipped_dir("std")    # `import std.nn`: the standard library XG ships
_ID_STRIDE = 10_000_000
MAX_IMPORT_DEPTH = 32     # modules importing modules, from the main file down
MAX_MODULES = 256         # distinct modules in one program


@dataclass(frozen=True)
class Origin:
    """Where an imported declaration came from."""
    source: SourceFile
    module: str
    import_span: Span


@dataclass
class ModuleLoader:
    options: object
    base_dir: Path
    # The frontend's entry point, check_source_with_loader(text, name, options, loader): passed in
    # by frontend/__init__.py, which imports this module (importing it back would be a cycle).
    check: Callable
    loading: list[tuple[str, Path]] = field(default_factory=list)    # (module, file) being checked, outermost first
    loaded: dict[str, list[A.Node]] = field(default_factory=dict)
    next_offset: int = 1

    def resolve(self, path: list[str]) -> Path:
        if path[0] == "std" and len(path) > 1:
            return STD_DIR.joinpath(*path[1:]).with_suffix(".xg")
        return self.base_dir.joinpath(*path).with_suffix(".xg")

    def load_all(self, module: A.Module, diags: Diagnostics) -> list[A.Node]:
        out: list[A.Node] = []
        seen: set[str] = set()
        for decl in module.decls:
            if isinstance(decl, A.Import):
                for d in self.load(decl, diags):
                    key = f"{type(d).__name__}:{d.name}:{d.origin.module}"
                    if key not in seen:
                        seen.add(key)
                        out.append(d)
        return out

    def load(self, imp: A.Import, diags: Diagnostics) -> list[A.Node]:
        name = imp.name
        if name in self.loaded:
            return self.loaded[name]
        names = [n for n, _ in self.loading]
        if name in names:
            ring = self.loading[names.index(name):]
            cycle = " -> ".join([p.name for _, p in ring] + [ring[0][1].name])
            through = " -> ".join(f"`{n}`" for n, _ in ring[1:] + ring[:1])
            diags.error(BAD_IMPORT, imp.span, detail=f"import cycle: {cycle}",
                        notes=(f"`{name}` imports itself through {through}",),
                        help="move what both modules need into a third module that imports neither")
            return []
        # Each module is checked with everything it imports, so a chain of N modules costs N**2:
        # bound the chain and the program's modules (std.nn and a few of one's own are typical).
        if len(self.loading) >= MAX_IMPORT_DEPTH:
            diags.error(BAD_IMPORT, imp.span, detail=f"imports nested deeper than {MAX_IMPORT_DEPTH} modules",
                        notes=(" -> ".join(n for n, _ in self.loading[:3]) + " -> ... -> " + name,),
                        help="import the modules you need from the file that needs them, not through a chain")
            return []
        if len(self.loaded) >= MAX_MODULES:
            diags.error(BAD_IMPORT, imp.span, detail=f"the program imports more than {MAX_MODULES} modules",
                        help="merge small modules")
            return []
        path = self.resolve(imp.path)
        try:
            text = decode_source(read_source(path))
        except (UnreadableSource, UnicodeDecodeError) as exc:
            reason = ("not valid UTF-8" if isinstance(exc, UnicodeDecodeError)
                      else "no such module" if not path.exists() and not path.is_symlink() else str(exc))
            diags.error(BAD_IMPORT, imp.span, detail=f"cannot import `{name}`: {reason} ({path})",
                        help="`std.*` modules live in XG's std/ directory; others beside the importing file")
            return []
        from .checker import CheckOptions
        self.loading.append((name, path))
        sub = ModuleLoader(self.options, path.parent, self.check, self.loading, self.loaded, self.next_offset)
        result = self.check(text, str(path), CheckOptions(lib=True, hw_dir=self.options.hw_dir), sub)
        self.next_offset = sub.next_offset
        self.loading.pop()
        if not result.ok:
            notes: list[str] = []
            for d in result.diagnostics:
                if d.severity.value != "error":
                    continue
                # "module `m` has errors" from a module further down: its notes are the errors
                # themselves (the cycle, the missing file), which are what to show here.
                if not (d.code == BAD_IMPORT.code and d.notes and d.message.endswith(" has errors")):
                    notes.append(f"{d.file}:{d.line}:{d.col}: {d.message}")
                notes.extend(d.notes)
            notes = tuple(notes[:10])
            diags.error(BAD_IMPORT, imp.span, detail=f"module `{name}` has errors", notes=notes)
            self.loaded[name] = []
            return []
        # Parse again with ids of its own: the checked copy's ids belong to its own check.
        source = SourceFile(str(path), text)
        quiet = Diagnostics(source)
        offset = self.next_offset * _ID_STRIDE
        self.next_offset += 1
        parsed = parse(tokenize(text, quiet), quiet, first_id=offset)
        origin = Origin(source, name, imp.span)
        decls: list[A.Node] = []
        for decl in parsed.decls:
            if isinstance(decl, A.FuncDef):
                if decl.name == "main":
                    diags.error(BAD_IMPORT, imp.span, detail=f"module `{name}` defines `main`; modules hold functions "
                                "and constants")
                    continue
                decl.origin = origin
                decls.append(decl)
            elif isinstance(decl, A.ConstDecl) and decl.name not in ("TARGET_GPU", "NUM_GPU", "COMPUTE"):
                decl.origin = origin
                decls.append(decl)
            elif isinstance(decl, A.Import):
                decls.extend(self.load(decl, quiet))
            else:
                diags.error(BAD_IMPORT, imp.span, detail=f"module `{name}` declares `{decl.name}`; modules hold "
                            "functions and constants only")
        self.loaded[name] = decls
        return decls
