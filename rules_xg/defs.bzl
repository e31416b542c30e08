"""rules_xg: Bazel rules for XG. This file only re-exports; the rules live in private/.

    load("//rules_xg:defs.bzl", "xg_engine", "xg_library", "xg_test")

The target GPU, tuning policy and tuning fan-out are build settings (`//rules_xg:target`,
`:tune`, `:tune_shards`), set by the configs of `.bazelrc` (`--config=gb200`, ...).
"""

load("//rules_xg/private:providers.bzl", _XgEngineInfo = "XgEngineInfo", _XgInfo = "XgInfo")
load("//rules_xg/private/rules:engine.bzl", _xg_engine = "xg_engine")
load("//rules_xg/private/rules:library.bzl", _xg_library = "xg_library")
load("//rules_xg/private/rules:test.bzl", _xg_test = "xg_test")

xg_library = _xg_library
xg_engine = _xg_engine
xg_test = _xg_test
XgInfo = _XgInfo
XgEngineInfo = _XgEngineInfo
