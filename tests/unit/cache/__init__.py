"""Tests of the content-addressed artifact cache (`xgbuild.cache`, `xgbuild cache …`, tools/cache-server).

A package, so its conftest and helpers import as `cache.conftest` / `cache.cache_helpers` and never
shadow another folder's `conftest` module.
"""
