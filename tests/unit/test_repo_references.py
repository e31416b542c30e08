"""Files a user reads first (README, examples, docs, tools) cite only files the repository has
(issue 25: `examples/mlp.xg` and the README cited a PERF.md that lives outside it)."""

import re
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def tracked(*patterns: str) -> list[Path]:
    out = subprocess.run(["git", "ls-files", *patterns], cwd=REPO, capture_output=True, text=True, check=True).stdout
    return [REPO / line for line in out.splitlines()]


def test_cited_markdown_files_exist() -> None:
    missing = []
    for path in tracked("README.md", "docs/*.md", "examples/*", "tools/*", "xgbuild/*.py"):
        if not path.is_file():
            continue
        for name in set(re.findall(r"\b([A-Z][A-Z_]+\.md)\b", path.read_text(errors="replace"))):
            if not (REPO / name).exists() and not list(REPO.glob(f"**/{name}")):
                missing.append(f"{path.relative_to(REPO)} cites {name}")
    assert not missing, "\n".join(missing)
