"""Throws thousands of mutated programs at the checker: every outcome must be a set of diagnostics
(never an exception, never an internal error), and every run must end quickly."""

import random
import time
from pathlib import Path

from xgbuild.compiler.frontend import check_source
from xgbuild.compiler.frontend.lexer import KEYWORDS

REPO = Path(__file__).resolve().parents[3]
CORPUS = sorted((REPO / "examples").glob("*.xg")) + sorted((Path(__file__).parent / "cases").glob("*.xg"))
PIECES = sorted(KEYWORDS) + ["(", ")", "[", "]", "{", "}", ",", ":", "=", "==", "->", "=>", "@", "/", "+",
                             "\n", "    ", "0", "1.5", "-", "Tensor[", "Result[", "Ok(", "Err(", "x", "A",
                             "shard(", "dim=", "cast(", "float32", "int64", "#", "\"", "main", "DivByZero",
                             # hostile pieces (issue 26): confusable digits, literals at and past their
                             # type's range, lone CRs, long chains
                             "\u09ea", "\uff14", "\u0664", "1e400", "-1e400", "9223372036854775807",
                             "9223372036854775808", "-9223372036854775808", str(10 ** 40), "\r", "\r\n",
                             " + 9223372036854775807", " * 1e300", "[0:1]" * 40, " + x" * 200,
                             ".unwrap_or(0)" * 20]
MUTATIONS = 3000


def mutate(rng: random.Random, text: str) -> str:
    for _ in range(rng.randint(1, 4)):
        pos = rng.randrange(len(text) + 1)
        kind = rng.randrange(5)
        if kind == 0:      # delete a span
            text = text[:pos] + text[pos + rng.randint(1, 12):]
        elif kind == 1:    # insert a token
            text = text[:pos] + rng.choice(PIECES) + text[pos:]
        elif kind == 2:    # duplicate a span
            end = min(len(text), pos + rng.randint(1, 40))
            text = text[:end] + text[pos:end] + text[end:]
        elif kind == 3:    # swap two lines
            lines = text.split("\n")
            if len(lines) > 2:
                i, j = rng.randrange(len(lines)), rng.randrange(len(lines))
                lines[i], lines[j] = lines[j], lines[i]
            text = "\n".join(lines)
        else:              # replace a character with a random one (any code point)
            if text:
                pos = min(pos, len(text) - 1)
                text = text[:pos] + chr(rng.randrange(0, 0x3000)) + text[pos + 1:]
    return text


def test_mutated_programs_never_crash() -> None:
    seed = time.time_ns()
    rng = random.Random(seed)
    sources = [p.read_text() for p in CORPUS]
    slowest = 0.0
    for i in range(MUTATIONS):
        text = mutate(rng, rng.choice(sources))
        start = time.perf_counter()
        result = check_source(text, f"fuzz{i}.xg")
        slowest = max(slowest, time.perf_counter() - start)
        internal = [d for d in result.diagnostics if d.code == "XG0900"]
        assert not internal, f"seed {seed}, case {i}: {internal[0].message}\n---\n{text}"
        for d in result.diagnostics:
            assert d.line >= 1 and d.col >= 1, (seed, i, d)
        result.render()
        result.to_json()
    assert slowest < 5.0, f"seed {seed}: one check took {slowest:.2f}s"
