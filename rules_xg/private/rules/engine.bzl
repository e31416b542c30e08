"""`xg_engine`: an `.xge` engine bundle from XG sources, its kernels tuned as a fan-out of actions."""

load("//rules_xg/private:actions.bzl", "jobs_action", "link_action", "tune_action")
load("//rules_xg/private:providers.bzl", "XgEngineInfo", "XgInfo", "XgSettingInfo")
load("//rules_xg/private:toolchain.bzl", "TOOLCHAIN_TYPE")

def _main_src(ctx):
    if ctx.file.src:
        return ctx.file.src
    if len(ctx.files.srcs) == 1:
        return ctx.files.srcs[0]
    fail("%s: say which file holds the entry point with `src` (`srcs` has %d files and no `src` is given)" %
         (ctx.label, len(ctx.files.srcs)))

def _dims(ctx):
    for name, size in ctx.attr.dims.items():
        if not size.isdigit() or int(size) < 1:
            fail("%s: dims[%s] = %s is not a positive integer" % (ctx.label, repr(name), repr(size)))
    return ctx.attr.dims

def _consts(ctx):
    for name, value in ctx.attr.consts.items():
        if not name or not (name[0].isalpha() or name[0] == "_") or not name.replace("_", "a").isalnum():
            fail("%s: consts has %s, which is not a constant's name" % (ctx.label, repr(name)))
        if name in ("TARGET_GPU", "NUM_GPU"):
            fail("%s: consts[%s]: set it with `%s` instead" %
                 (ctx.label, repr(name), "target" if name == "TARGET_GPU" else "num_gpu"))
        # The form only: whether the value suits the constant is the compiler's to say (XG0019).
        number = value and value[0] in "0123456789.+-" and not value.lstrip("0123456789.eE+-_")
        if value not in ("true", "false") and not number:
            fail("%s: consts[%s] = %s is not a value: give an integer, a number, true or false" %
                 (ctx.label, repr(name), repr(value)))
    return ctx.attr.consts

def engine_build(ctx):
    """The description of one engine build, from a rule's attributes and the build settings."""
    shards = ctx.attr.shards or ctx.attr._shards[XgSettingInfo].value
    return struct(
        src = _main_src(ctx),
        target = ctx.attr.target or ctx.attr._target[XgSettingInfo].value,
        tune = ctx.attr._tune[XgSettingInfo].value,
        num_gpu = ctx.attr.num_gpu,
        entry = ctx.attr.entry,
        sharding = ctx.file.sharding,
        dims = _dims(ctx),
        consts = _consts(ctx),
        kernels = ctx.attr.kernels,
        shards = shards,
        remote_cache = ctx.attr._remote_cache[XgSettingInfo].value,
        remote_header_file = ctx.attr._remote_header_file[XgSettingInfo].value,
        sign_key = ctx.attr._sign_key[XgSettingInfo].value,
    )

def declare_engine(ctx, out):
    """Declares the jobs, tune and link actions that produce the engine `out`; the XgEngineInfo."""
    build = engine_build(ctx)
    srcs = depset([build.src] + ctx.files.srcs, transitive = [d[XgInfo].srcs for d in ctx.attr.deps])
    inputs = srcs.to_list() + ([build.sharding] if build.sharding else [])
    results = []
    if build.kernels:
        prefix = "%s.tune/" % ctx.label.name
        shards = [ctx.actions.declare_file("%sshard-%d.json" % (prefix, i)) for i in range(build.shards)]
        jobs_action(ctx, build, inputs, shards)
        for i, shard in enumerate(shards):
            result = ctx.actions.declare_file("%sresult-%d.json" % (prefix, i))
            tune_action(ctx, build, shard, result, i)
            results.append(result)
    link_action(ctx, build, inputs, results, out)
    return XgEngineInfo(engine = out, target = build.target, tune = build.tune, results = results)

def _xg_engine_impl(ctx):
    out = ctx.actions.declare_file(ctx.label.name + ".xge")
    info = declare_engine(ctx, out)
    return [
        info,
        DefaultInfo(files = depset([out])),
        OutputGroupInfo(tuning = depset(info.results)),
    ]

ENGINE_ATTRS = {
    "src": attr.label(
        allow_single_file = [".xg"],
        doc = "The .xg file holding the entry point. May be left out when `srcs` has one file.",
    ),
    "srcs": attr.label_list(
        allow_files = [".xg"],
        doc = "More .xg files of this engine (modules `src` imports that are not in a library).",
    ),
    "deps": attr.label_list(
        providers = [XgInfo],
        doc = "`xg_library` targets the sources import.",
    ),
    "entry": attr.string(
        default = "main",
        doc = "The entry function. `main` takes the engine's inputs as externals; another function's " +
              "parameters become the engine's inputs.",
    ),
    "sharding": attr.label(
        allow_single_file = [".toml"],
        doc = "A sharding plan (TOML, docs/sharding.md): regions, functions and inputs mapped to data, " +
              "tensor or replicated. Its `num_gpu` applies unless `num_gpu` is set. Switching strategy " +
              "is a change of this file, not of the sources.",
    ),
    "num_gpu": attr.int(
        default = 0,
        doc = "GPUs to plan for; 0 keeps the source's `NUM_GPU` (1 if it has none).",
    ),
    "target": attr.string(
        default = "",
        doc = "A GPU profile from hw/ for this engine alone; empty: the `//rules_xg:target` setting " +
              "(the configs set it), and if that is empty too, the source's `TARGET_GPU`.",
    ),
    "consts": attr.string_dict(
        doc = "File-level constants of `src` to override, e.g. {\"L\": \"2\", \"D\": \"64\"} for a small " +
              "configuration of a model whose sizes are constants (`xgc --const NAME=VALUE`). Constants " +
              "computed from them follow; the engine records the overrides.",
    ),
    "dims": attr.string_dict(
        doc = "Sizes of symbolic dims to tune the kernels at, e.g. {\"T\": \"8192\"} (1024 otherwise). " +
              "The engine runs at any size; these are the sizes it is fastest at.",
    ),
    "kernels": attr.bool(
        default = True,
        doc = "Build GPU kernels for the target. False: a CPU-only engine (no tuning actions).",
    ),
    "shards": attr.int(
        default = 0,
        doc = "Tuning actions for this engine; 0: the `//rules_xg:tune_shards` setting.",
    ),
    "_target": attr.label(default = "//rules_xg:target", doc = "The target GPU build setting."),
    "_tune": attr.label(default = "//rules_xg:tune", doc = "The tuning policy build setting."),
    "_shards": attr.label(default = "//rules_xg:tune_shards", doc = "The tuning fan-out build setting."),
    "_remote_cache": attr.label(
        default = "//rules_xg:remote_cache",
        doc = "XG's remote tier (a Bazel HTTP cache URL) for the tuning actions.",
    ),
    "_remote_header_file": attr.label(
        default = "//rules_xg:remote_header_file",
        doc = "A file on the executing host holding the remote tier's 'Name: value' header.",
    ),
    "_sign_key": attr.label(
        default = "//rules_xg:sign_key",
        doc = "A file on the executing host holding the Ed25519 key the link action signs with.",
    ),
}

xg_engine = rule(
    implementation = _xg_engine_impl,
    attrs = ENGINE_ATTRS,
    toolchains = [TOOLCHAIN_TYPE],
    provides = [XgEngineInfo],
    doc = "Builds `<name>.xge`. The kernels' tuning fans out into `shards` cached actions (output " +
          "group `tuning` holds their results); linking is a pure function of sources and winners, " +
          "so equal inputs give byte-identical engines.",
)
