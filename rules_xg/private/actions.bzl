"""The actions of rules_xg: check, jobs, tune-shard and link, each one XG command.

Each runs `python3 -m <module>` from the XG toolchain in the execution root, with XG's own files
and the sources as declared inputs, so Bazel's key of an action is exactly what its output depends
on. The tuning fan-out: `jobs` splits an engine's tuning jobs into a fixed number of shard files
(by a stable hash of each job), one `tune` action per shard tunes and compiles its jobs, and `link`
builds the engine from the results without tuning or compiling anything.
"""

load(":toolchain.bzl", "xg_toolchain_of")

# Why "no-sandbox": the XG cache (local SQLite store + remote tier) lives outside the execution
# root and is reached from inside the actions; results never depend on it (a hit returns the bytes a
# miss would compute), it only saves work. Python's bytecode cache then also survives between runs.
_LOCAL = {"no-sandbox": "1"}

# A measuring action needs a GPU of the target's model on the host that runs it: never send it to
# a remote executor that cannot promise one (a cluster selects GPU pools with exec_properties).
_MEASURE = {"no-sandbox": "1", "requires-gpu": "1", "no-remote-exec": "1"}

def _run(ctx, *, module, args, inputs, outputs, mnemonic, progress, requirements = _LOCAL):
    tc = xg_toolchain_of(ctx)
    ctx.actions.run(
        executable = tc.python,
        # -B: no .pyc written next to sources read through the execution root's links.
        arguments = ["-B", "-m", module, args],
        inputs = depset(inputs, transitive = [tc.compiler]),
        outputs = outputs,
        mnemonic = mnemonic,
        progress_message = progress,
        execution_requirements = requirements,
        # The --action_env values reach the action this way only (an `env` here would drop them),
        # e.g. XG_CACHE_DIR. --incompatible_strict_action_env keeps everything else (PATH, HOME,
        # an exported XG_REMOTE_CACHE, ...) out of the keys; XG's remote tier comes from the
        # //rules_xg:remote_cache setting instead (tune_action).
        use_default_shell_env = True,
    )

def check_action(ctx, src, deps, out):
    """Type-checks one library file; `out` is a stamp that exists only if the check passed."""
    tc = xg_toolchain_of(ctx)
    ctx.actions.run_shell(
        command = '"$1" -B -m xgbuild.cli.xgc "$2" --check --lib && : > "$3"',
        arguments = [tc.python.path, src.path, out.path],
        inputs = depset([src], transitive = [deps, tc.compiler]),
        tools = [tc.python],
        outputs = [out],
        mnemonic = "XgCheck",
        progress_message = "Checking XG library %s" % src.short_path,
        execution_requirements = _LOCAL,
        use_default_shell_env = True,
    )

def _common_flags(args, build):
    if build.target:
        args.add("--target", build.target)
    if build.num_gpu:
        args.add("--num-gpu", build.num_gpu)
    if build.entry != "main":
        args.add("--entry", build.entry)
    if build.sharding:
        args.add("--sharding", build.sharding)
    for name, size in sorted(build.dims.items()):
        args.add("--dim", "%s=%s" % (name, size))
    for name, value in sorted(build.consts.items()):
        args.add("--const", "%s=%s" % (name, value))

def jobs_action(ctx, build, inputs, shards):
    args = ctx.actions.args()
    args.add("jobs", build.src)
    _common_flags(args, build)
    for shard in shards:
        args.add("--out", shard)
    args.add("--quiet")  # the link action shows the program's warnings; once is enough
    _run(
        ctx,
        module = "xgbuild.cli.xgbuild",
        args = args,
        inputs = inputs,
        outputs = shards,
        mnemonic = "XgJobs",
        progress = "Planning the tuning jobs of %s" % ctx.label,
    )

def tune_action(ctx, build, shard, result, index):
    args = ctx.actions.args()
    args.add("tune-shard", shard)
    args.add("--tune", build.tune)
    args.add("--out", result)
    args.add("--jobs", 1)  # Bazel runs the shards in parallel already
    args.add("--quiet")

    # XG's remote tier, from //rules_xg:remote_cache, on the command line where `bazel aquery`
    # shows it. Only tuning reads the XG cache, so only these actions' keys carry the URL; a token
    # never does (the header comes from a file on the executing host). Bazel's --remote_cache and
    # --config=cache enter no key, so switching them reruns nothing.
    if build.remote_cache:
        args.add("--remote", build.remote_cache)
    if build.remote_header_file:
        args.add("--remote-header-file", build.remote_header_file)
    _run(
        ctx,
        module = "xgbuild.cli.xgbuild",
        args = args,
        inputs = [shard],
        outputs = [result],
        mnemonic = "XgTune",
        progress = "Tuning %s shard %d/%d (--tune=%s)" % (ctx.label, index + 1, build.shards, build.tune),
        requirements = _MEASURE if build.tune == "measure" else _LOCAL,
    )

def link_action(ctx, build, inputs, results, out):
    args = ctx.actions.args()
    args.add(build.src)
    _common_flags(args, build)
    args.add("--out", out)
    if build.kernels:
        for result in results:
            args.add("--kernels-from", result)
    else:
        args.add("--no-kernels")

    # Signing, from //rules_xg:sign_key: the key's path is on the command line (and in the key of
    # this action), the key itself stays on the executing host. The bundle bytes do not depend on
    # it: the signature and provenance go in the engine's trailer, after the seal.
    if build.sign_key:
        args.add("--sign-key", build.sign_key)
    args.add("--quiet")
    _run(
        ctx,
        module = "xgbuild.cli.xgc",
        args = args,
        inputs = inputs + results,
        outputs = [out],
        mnemonic = "XgLink",
        progress = "Linking XG engine %s" % out.short_path,
    )
