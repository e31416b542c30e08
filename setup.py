"""Ships XG's data with its code: the GPU profiles (`hw/`), the standard library (`std/`) and the
Bazel rules (`rules_xg/`) live at the checkout's root, where Bazel and editors expect them; a wheel
carries them as package data under `xgbuild/_data/`, where `xgbuild.settings.shipped_dir` finds
them through importlib.resources. Everything else about the package is in pyproject.toml."""

import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent
SHIPPED_DIRS = ("hw", "std", "rules_xg")     # the same names as xgbuild.settings.SHIPPED_DIRS


class build_py_with_data(build_py):
    """build_py, then a fresh copy of each shipped directory into the built package."""

    def run(self) -> None:
        super().run()
        if self.editable_mode:      # an editable install reads them from the checkout itself
            return
        for name in SHIPPED_DIRS:
            dest = Path(self.build_lib) / "xgbuild" / "_data" / name
            # Fresh each time: an in-tree build reuses build/lib, which may hold files since deleted.
            shutil.rmtree(dest, ignore_errors=True)
            shutil.copytree(ROOT / name, dest, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))


setup(cmdclass={"build_py": build_py_with_data})
