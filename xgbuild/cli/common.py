"""Shared CLI plumbing: exit codes, the top-level error guard, diagnostics output.

Exit codes of every XG command:
  0  success (warnings allowed)
  1  the program, engine or data is wrong (diagnostics say how)
  2  usage error, unreadable file, or an internal error in XG
"""

from __future__ import annotations

import json
import sys
import tempfile
import traceback
from typing import Callable, NoReturn

import typer

EXIT_OK, EXIT_PROGRAM, EXIT_USAGE = 0, 1, 2


class CliError(Exception):
    """A user-facing failure: printed as `error: message` with the given exit code."""

    def __init__(self, message: str, code: int = EXIT_PROGRAM) -> None:
        super().__init__(message)
        self.code = code


def fail(message: str, code: int = EXIT_PROGRAM) -> NoReturn:
    raise CliError(message, code)


def make_app(help: str) -> typer.Typer:
    return typer.Typer(help=help, add_completion=False, no_args_is_help=True,
                       pretty_exceptions_enable=False, context_settings={"help_option_names": ["-h", "--help"]})


def write_diagnostics(text: str) -> None:
    """Rendered diagnostics to stderr: coloured on a terminal, plain in a pipe, a file, or under
    NO_COLOR (rich's console decides both, so no environment read happens here)."""
    from rich.console import Console
    console = Console(file=sys.stderr)
    if console.is_terminal and console.color_system is not None and not console.no_color:
        from ..compiler.frontend.diagnostics import colorize
        text = colorize(text)
    sys.stderr.write(text + "\n")


def emit_json(obj: object) -> None:
    sys.stdout.write(json.dumps(obj, indent=2, sort_keys=True) + "\n")


def run(app: typer.Typer | Callable[[], object], prog_name: str) -> NoReturn:
    """Run a typer app; turn every failure into a message and an exit code, never a traceback."""
    try:
        app(prog_name=prog_name, standalone_mode=True)  # type: ignore[call-arg]
    except CliError as exc:
        # Library errors may already carry their "error:" (rendered diagnostics do); say it once.
        text = str(exc).removeprefix("error: ")
        write_diagnostics(text if text.startswith("error[") else f"error: {text}")
        sys.exit(exc.code)
    except SystemExit:
        raise
    except KeyboardInterrupt:
        sys.stderr.write("error: interrupted\n")
        sys.exit(130)
    except BrokenPipeError:
        sys.exit(EXIT_OK)
    except ModuleNotFoundError as exc:
        if (exc.name or "").split(".")[0] not in BUILD_MODULES:
            _internal_error(prog_name)
        sys.stderr.write(f"error: {prog_name} needs `{exc.name.split('.')[0]}`, one of XG's build tools, which this "
                         "install lacks: pip install 'xg[build]' (a deploy host runs engines without them: "
                         "xgrun --runtime native)\n")
        sys.exit(EXIT_PROGRAM)
    except Exception:
        _internal_error(prog_name)
    sys.exit(EXIT_OK)


# Modules of the `build` extra (pyproject.toml): the compiler's, the tuner's, the torch runtime's.
BUILD_MODULES = frozenset({"torch", "triton", "sympy", "safetensors", "sqlite_utils", "onnx"})


def _internal_error(prog_name: str) -> NoReturn:
    with tempfile.NamedTemporaryFile("w", prefix=f"{prog_name}-ice-", suffix=".txt", delete=False) as f:
        f.write(traceback.format_exc())
    sys.stderr.write(f"error: internal error in {prog_name} (a bug in XG); traceback written to {f.name}\n")
    sys.exit(EXIT_USAGE)


def settings_or_exit():
    """The settings from the environment, read once by a command and handed down; a bad value
    (XG_REMOTE_TIMEOUT=abc) is a usage error naming the variable."""
    from ..settings import Settings, SettingsError
    try:
        return Settings.from_env()
    except SettingsError as exc:
        fail(str(exc), EXIT_USAGE)


def target_or_exit(target: str | None, hw_dir) -> None:
    """A `--target` no profile has is a usage error (exit 2) of the command line, not of the
    source: the diagnostic lists the known targets and underlines nothing."""
    from ..compiler.frontend.checker import target_option_error
    err = target_option_error(target, hw_dir)
    if err is not None:
        write_diagnostics(str(err))
        raise typer.Exit(EXIT_USAGE)


def parse_dims(specs: list[str]) -> dict[str, int]:
    """`--dim NAME=SIZE` options as a dict; a malformed one is a usage error."""
    out = {}
    for spec in specs:
        name, sep, value = spec.partition("=")
        # ASCII only: str.isdigit() and int() take `৪` (a Bengali four) as a digit.
        if not sep or not (name.isascii() and name.isidentifier()) or not (value.isascii() and value.isdigit()) \
                or len(value) > 18 or int(value) < 1:
            fail(f"--dim takes NAME=SIZE with a positive size, got {spec!r}", EXIT_USAGE)
        out[name] = int(value)
    return out


def parse_consts(specs: list[str]) -> tuple:
    """`--const NAME=VALUE` options as `CheckOptions.consts`; a malformed one, or a constant
    given twice, is a usage error."""
    from ..compiler.frontend.constants import OverrideError, normalize, parse_override
    out: dict = {}
    try:
        for spec in specs:
            name, value = parse_override(spec)
            if name in out:
                fail(f"--const {name} is given twice", EXIT_USAGE)
            out[name] = value
        return normalize(out)
    except OverrideError as exc:
        fail(str(exc), EXIT_USAGE)


def progress_or_exit(progress: str, quiet: bool = False, json_out: bool = False) -> bool | str:
    """`--progress auto|bar|json|none` as what the tuner takes: True draws the bar (auto: when
    stderr is a terminal, and neither --quiet nor --json), "json" writes one JSON event per line on
    stderr (jobs taken, candidates measured, jobs done: for CI logs), False nothing."""
    if progress not in ("auto", "bar", "json", "none"):
        fail(f"--progress takes auto, bar, json or none, got {progress!r}", EXIT_USAGE)
    if progress == "json":
        return "json"
    if progress == "bar":
        return True
    return progress == "auto" and not quiet and not json_out and sys.stderr.isatty()


def policy_or_exit(tune: str, last: str = "{}, {}"):
    """`--tune`'s value as a `Policy`; another is a usage error listing the policies (the last one
    joined by `last`: xgc says "..., predict or strict", xgbuild "..., predict, strict")."""
    from ..tuner.policy import Policy
    try:
        return Policy(tune)
    except ValueError:
        *first, final = list(Policy)
        fail(f"--tune takes {last.format(', '.join(first), final)}, got {tune!r}", EXIT_USAGE)


def exit_code_for(diagnostics) -> int:
    """The exit code of a check or compile that produced `diagnostics`."""
    codes = {d.code for d in diagnostics if d.severity.value == "error"}
    if not codes:
        return EXIT_OK
    # An unreadable file or a bug in XG is not a mistake in the program.
    return EXIT_USAGE if codes & {"XG0007", "XG0900"} else EXIT_PROGRAM


def compile_or_exit(file, options, *, warnings: bool = True, sharding=None):
    """Compile a source file for a command that builds from it; diagnostics go to stderr and a
    failure exits with `exit_code_for` (1 for a wrong program, 2 for an unreadable file).
    `sharding`: a plan file's path (as xgc --sharding); its NUM_GPU applies unless options set one."""
    from ..build.compile import compile_program
    from ..errors import CompileError
    try:
        compiled = compile_program(file, options, sharding)
    except CompileError as exc:
        write_diagnostics(str(exc))
        raise typer.Exit(exit_code_for(exc.diagnostics) or EXIT_PROGRAM)
    if warnings and compiled.check.diagnostics:
        write_diagnostics(compiled.check.render())
    return compiled
