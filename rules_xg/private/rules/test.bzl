"""`xg_test`: builds an engine and runs it with `xgrun` on the CPU with checks on."""

load("//rules_xg/private:providers.bzl", "XgEngineInfo")
load("//rules_xg/private:toolchain.bzl", "TOOLCHAIN_TYPE", "xg_toolchain_of")
load(":engine.bzl", "ENGINE_ATTRS", "declare_engine")

_SCRIPT = """#!/bin/sh
# Made by rules_xg's xg_test: run the engine on the CPU with checks on (NaN/Inf in any output fails).
set -eu
exec {python} -m xgbuild.cli.xgrun {engine} --device cpu --check {args}
"""

def _shell_quote(s):
    return "'" + s.replace("'", "'\\''") + "'"

def _xg_test_impl(ctx):
    tc = xg_toolchain_of(ctx)
    if ctx.attr.engine:
        engine = ctx.attr.engine[XgEngineInfo].engine
    else:
        if not ctx.file.src and not ctx.files.srcs:
            fail("%s: give either `engine` (an xg_engine) or `src` to build one from" % ctx.label)
        engine = ctx.actions.declare_file(ctx.label.name + ".xge")
        declare_engine(ctx, engine)
    args = ["--seed", str(ctx.attr.seed)] + ctx.attr.run_args
    script = ctx.actions.declare_file(ctx.label.name + ".sh")
    ctx.actions.write(script, _SCRIPT.format(
        python = _shell_quote(tc.python.short_path),
        engine = _shell_quote(engine.short_path),
        args = " ".join([_shell_quote(a) for a in args]),
    ), is_executable = True)
    runfiles = ctx.runfiles(files = [engine, tc.python], transitive_files = tc.compiler)
    return [DefaultInfo(executable = script, runfiles = runfiles, files = depset([engine]))]

_TEST_ATTRS = dict(ENGINE_ATTRS)
_TEST_ATTRS.update({
    "engine": attr.label(
        providers = [XgEngineInfo],
        doc = "An `xg_engine` to run; without it, the engine is built from `src`/`srcs` here.",
    ),
    "seed": attr.int(default = 1, doc = "Seed of the random inputs `xgrun` makes for the engine."),
    "run_args": attr.string_list(doc = "More `xgrun` arguments, e.g. [\"--dim\", \"T=64\"]."),
})

xg_test = rule(
    implementation = _xg_test_impl,
    attrs = _TEST_ATTRS,
    toolchains = [TOOLCHAIN_TYPE],
    test = True,
    doc = "Builds an engine (or takes `engine`) and runs it with `xgrun --device cpu --check` on " +
          "seeded random inputs; the test fails if the run does (errors, NaN or Inf).",
)
