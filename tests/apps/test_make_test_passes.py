"""`make test`'s passes (Makefile; docs/ARCHITECTURE.md "Two passes"): every test of `pytest tests` runs in
exactly one of its pytest commands, whatever markers it carries; only tests marked `kafka` alone (no `bpf`,
`torch`, `e2e` or `alone`) run in the heavy pass's two processes, and the rest of the heavy pass runs in one
process after them, alone on the machine."""

from __future__ import annotations

import itertools
import re
from pathlib import Path

from _pytest.mark.expression import Expression

REPO = Path(__file__).resolve().parents[2]
MARKERS = ("kafka", "bpf", "torch", "e2e", "alone", "slow")


def _commands(target: str) -> list[tuple[str, bool]]:
    """``(marker expression, runs in several processes)`` of each pytest command of a Makefile target."""
    make = (REPO / "Makefile").read_text()
    body = make.split(f"\n{target}:", 1)[1].split("\n\n", 1)[0]
    return [(m.group(2), " -n 2 " in m.group(1)) for m in re.finditer(r'pytest ([^\n]*?)-m "([^"]+)"', body)]


def _selected(expr: str, marks: set[str]) -> bool:
    return Expression.compile(expr).evaluate(lambda name, **_kw: name in marks)


def test_every_marker_combination_runs_in_exactly_one_command():
    unit, heavy_parallel, heavy_serial = _commands("test")
    assert unit[1] and heavy_parallel[1] and not heavy_serial[1]
    for n in range(len(MARKERS) + 1):
        for marks in map(set, itertools.combinations(MARKERS, n)):
            hits = [e for e, _par in (unit, heavy_parallel, heavy_serial) if _selected(e, marks)]
            assert len(hits) == 1, (marks, hits)
            if hits[0] == heavy_parallel[0]:  # beside another heavy process: a broker and nothing else
                assert "kafka" in marks and not marks & {"bpf", "torch", "e2e", "alone"}, marks
            if marks & {"bpf", "torch", "e2e", "alone"}:
                assert hits[0] == heavy_serial[0], marks
    (fast, _par), *rest = _commands("test-fast")
    assert not rest
    for n in range(len(MARKERS) + 1):  # test-fast: pass 1 without the slow tests
        for marks in map(set, itertools.combinations(MARKERS, n)):
            assert _selected(fast, marks) == (_selected(unit[0], marks) and "slow" not in marks), marks


def test_every_marker_is_registered():
    text = (REPO / "pyproject.toml").read_text()
    for m in MARKERS:
        assert f'"{m}: ' in text, m
