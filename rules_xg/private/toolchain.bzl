"""The XG toolchain: which Python runs XG, and XG's own files (inputs of every XG action)."""

load(":providers.bzl", "XgToolchainInfo")

# A Label, not a string: resolved in this repository wherever the rules are loaded from.
TOOLCHAIN_TYPE = str(Label("//rules_xg:toolchain_type"))

def _xg_toolchain_impl(ctx):
    return [platform_common.ToolchainInfo(xg = XgToolchainInfo(
        python = ctx.executable.python,
        compiler = depset(ctx.files.compiler),
    ))]

xg_toolchain = rule(
    implementation = _xg_toolchain_impl,
    attrs = {
        "python": attr.label(
            mandatory = True,
            executable = True,
            cfg = "exec",
            allow_single_file = True,
            doc = "An executable running the Python that holds XG's dependencies (`@xg_python//:python3`).",
        ),
        "compiler": attr.label(
            mandatory = True,
            doc = "XG's sources, hw/ profiles and std/ library (`//:xg_compiler`).",
        ),
    },
    doc = "Declares an XG toolchain; register it with `toolchain(toolchain_type = \"@xg//rules_xg:toolchain_type\")`.",
)

def xg_toolchain_of(ctx):
    return ctx.toolchains[TOOLCHAIN_TYPE].xg
