"""`xg_library`: XG modules that other XG targets import (`import mylib`)."""

load("//rules_xg/private:actions.bzl", "check_action")
load("//rules_xg/private:providers.bzl", "XgInfo")
load("//rules_xg/private:toolchain.bzl", "TOOLCHAIN_TYPE")

def _xg_library_impl(ctx):
    deps_srcs = depset(transitive = [d[XgInfo].srcs for d in ctx.attr.deps])
    stamps = []
    for src in ctx.files.srcs:
        stamp = ctx.actions.declare_file("%s.checks/%s.ok" % (ctx.label.name, src.basename))
        check_action(ctx, src, deps_srcs, stamp)
        stamps.append(stamp)
    return [
        XgInfo(
            srcs = depset(ctx.files.srcs, transitive = [deps_srcs]),
            checked = depset(stamps, transitive = [d[XgInfo].checked for d in ctx.attr.deps]),
        ),
        DefaultInfo(files = depset(stamps)),
    ]

xg_library = rule(
    implementation = _xg_library_impl,
    attrs = {
        "srcs": attr.label_list(
            allow_files = [".xg"],
            mandatory = True,
            doc = "The .xg modules. Each is type-checked as a library (no `main` needed) when built.",
        ),
        "deps": attr.label_list(
            providers = [XgInfo],
            doc = "Other `xg_library` targets these modules import.",
        ),
    },
    toolchains = [TOOLCHAIN_TYPE],
    doc = "XG modules for `import`. Building the target type-checks every file; a type error fails " +
          "the build with XG's diagnostic.",
)
