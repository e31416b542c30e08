"""Providers of rules_xg: what XG targets hand to each other."""

XgInfo = provider(
    doc = "XG sources: a library's files and everything they import, for the targets that use them.",
    fields = {
        "srcs": "depset of File: the .xg files of this target and of every library it depends on",
        "checked": "depset of File: stamps of the type checks of those files (built with them)",
    },
)

XgEngineInfo = provider(
    doc = "An engine bundle built by `xg_engine`, and how it was built.",
    fields = {
        "engine": "File: the .xge bundle",
        "target": "string: the GPU profile the kernels were built for ('' = the source's TARGET_GPU)",
        "tune": "string: the tuning policy of its kernels (measure, cache, predict or strict)",
        "results": "list of File: the tuning results (one per shard) the engine was linked from",
    },
)

XgToolchainInfo = provider(
    doc = "How rules_xg runs XG: the Python that holds XG's dependencies, and XG's own files.",
    fields = {
        "python": "File: an executable that runs XG's Python (`python3 -m xgbuild.cli.xgc ...`)",
        "compiler": "depset of File: XG's sources, GPU profiles (hw/) and standard library (std/); " +
                    "every XG action takes them as inputs, so editing XG rebuilds what it made",
    },
)

XgSettingInfo = provider(
    doc = "The value of a rules_xg build setting (`//rules_xg:target`, `:tune`, `:tune_shards`).",
    fields = {"value": "the setting's value, checked against its allowed values"},
)
