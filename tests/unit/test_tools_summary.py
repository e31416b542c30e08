"""`tools/test` and `tools/run-examples` end with one line counting everything they ran (issue 25:
the last line of `tools/test` counted the Bazel tests alone, the pytest summary 80 lines up, and
`tools/run-examples` ended without a summary)."""

import re
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_tools_test_ends_with_one_summary_line(tmp_path) -> None:
    (tmp_path / "test_some.py").write_text(
        "import pytest\n\ndef test_a():\n    assert False\n\ndef test_b():\n    pass\n\n"
        "@pytest.mark.skip\ndef test_c():\n    pass\n")
    import os
    for slow, note in (("1", ""), ("0", " (slow tests left out: XG_TEST_SLOW=1 runs them)")):
        proc = subprocess.run([str(REPO / "tools" / "test"), str(tmp_path / "test_some.py"), "--rootdir",
                               str(tmp_path)], cwd=REPO, capture_output=True, text=True, timeout=300, check=False,
                              env={**os.environ, "XG_TEST_SLOW": slow})
        last = proc.stdout.strip().splitlines()[-1]
        assert proc.returncode == 1, proc.stdout + proc.stderr
        assert re.fullmatch(r"tools/test: FAILED \(pytest: 1 passed, 1 failed, 1 skipped" + re.escape(note)
                            + r"; import contracts: \d+ kept, 0 broken\) in \d+m\d\ds", last), last


def test_run_examples_promises_a_summary_line() -> None:
    # Running every example takes minutes; the script's last output is its summary printf.
    text = (REPO / "tools" / "run-examples").read_text()
    assert "printf 'run-examples: %s (%d steps ok, %d failed%s) in %dm%02ds\\n'" in text
    assert text.rstrip().endswith('exit "$failed"')
