"""`xgrun` with torch and Triton made unimportable (a `sys.meta_path` blocker): a deploy host's
view. Runs xgrun's real `main()` with the arguments given; on exit it says on stderr whether
torch or Triton got loaded anyway. A script, not a test: tests/e2e/test_xgrun_native.py runs it."""

import sys


class Block:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("torch", "triton"):
            raise ModuleNotFoundError(f"No module named {name!r} (made unimportable by the test)", name=name)
        return None


sys.meta_path.insert(0, Block())
sys.argv[0] = "xgrun"
try:
    from xgbuild.cli.xgrun import main
    main()
finally:
    loaded = sorted({m.split(".")[0] for m in sys.modules if m.split(".")[0] in ("torch", "triton")})
    sys.stderr.write(f"no-torch: loaded {','.join(loaded) or 'nothing'}\n")
