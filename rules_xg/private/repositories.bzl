"""`xg_python_configure`: the repository rule that finds the Python holding XG's dependencies.

It makes `@xg_python` with a checkout-independent launcher (`@xg_python//:python3`) and a Python
toolchain for Bazel's own py rules. The interpreter is the project's virtualenv (`.venv`, made by
`tools/setup.sh`), or the one named by `XG_PYTHON` (any interpreter that imports torch, triton,
zstandard, sqlite_utils and typer). Nothing is downloaded.

Why a launcher and a link instead of `py_runtime(interpreter_path = ...)`: an absolute path would
enter the key of every action that runs Python, so a second checkout in another directory (or
another machine) could never hit the remote cache. The launcher's bytes are the same everywhere;
it finds the environment through the `env` link that sits beside it in this repository.
"""

_REQUIRED = ["torch", "triton", "zstandard", "sqlite_utils", "typer", "rich", "safetensors"]

_LAUNCHER = """#!/bin/sh
# XG's Python (made by rules_xg's xg_python_configure). The `env` link beside this file points at
# the Python environment that holds XG's dependencies; the link, not this file, knows where it is.
here=$(dirname "$(readlink -f "$0")")
exec "$here/env/{exe}" "$@"
"""

_BUILD = """# Made by rules_xg's xg_python_configure: XG's Python for actions and for Bazel's py rules.
load("@bazel_tools//tools/python:toolchain.bzl", "py_runtime_pair")

package(default_visibility = ["//visibility:public"])

exports_files(["python3"])

py_runtime(
    name = "py3_runtime",
    interpreter = ":python3",
    python_version = "PY3",
)

py_runtime_pair(
    name = "runtime_pair",
    py3_runtime = ":py3_runtime",
)

toolchain(
    name = "python_toolchain",
    toolchain = ":runtime_pair",
    toolchain_type = "@bazel_tools//tools/python:toolchain_type",
)
"""

_PROBE = """
import importlib.util, os, sys
# find_spec, not import: importing torch takes seconds, and this runs at every server start.
missing = [name for name in sys.argv[1:] if importlib.util.find_spec(name) is None]
print(sys.prefix)
print(os.path.relpath(sys.executable, sys.prefix))
print("%d.%d" % sys.version_info[:2])
print(",".join(missing))
"""

def _xg_python_configure_impl(rctx):
    workspace = rctx.path(Label("//:WORKSPACE")).dirname
    named = rctx.os.environ.get("XG_PYTHON", "")
    python = rctx.path(named) if named else workspace.get_child(".venv").get_child("bin").get_child("python3")
    where = "XG_PYTHON=%s" % named if named else str(python)
    if not python.exists:
        fail("XG's Python environment is missing (looked for %s): run tools/setup.sh first, " % where +
             "or set XG_PYTHON to an interpreter that has XG's dependencies")
    probe = rctx.execute([python, "-c", _PROBE] + _REQUIRED, timeout = 120)
    if probe.return_code != 0:
        fail("XG's Python (%s) does not run: %s" % (where, probe.stderr.strip()))
    prefix, exe, version, missing = (probe.stdout.strip().split("\n") + ["", "", "", ""])[:4]
    if missing:
        fail("XG's Python (%s) lacks %s: run tools/setup.sh" % (where, missing.replace(",", ", ")))
    if exe.startswith(".."):
        fail("XG's Python (%s) runs outside its own prefix %s; point XG_PYTHON at an environment's interpreter" %
             (where, prefix))
    rctx.symlink(prefix, "env")
    rctx.file("python3", _LAUNCHER.format(exe = exe), executable = True)
    rctx.file("BUILD", _BUILD)
    rctx.file("VERSION", version + "\n")

xg_python_configure = repository_rule(
    implementation = _xg_python_configure_impl,
    environ = ["XG_PYTHON"],
    local = True,
    doc = "Finds the Python that holds XG's dependencies and makes `@<name>//:python3` (a " +
          "checkout-independent launcher) and `@<name>//:python_toolchain` (for py rules).",
)
