"""Annotation renders of the builtin pack: what the template bounds (rules.templates) cost on normal renders.

Runs every builtin rule test (obshub/rules/builtin/tests) once, recording each ``Engine._render`` (the rule
and the record as templates see it: one render = all annotations of one alert change), then renders the
recorded ones again ``--rounds`` times and reports the median CPU time per render, with a digest of every
rendered text: two trees render the same if the digests are equal. It uses only what the engine had before
the bounds, so the same file measures a tree without them (``PYTHONPATH=<old tree>``):

    python -m bench.rules_render                        # this tree
    PYTHONPATH=/path/to/old python bench/rules_render.py  # another tree, same recordings
"""

from __future__ import annotations

import argparse
import hashlib
import json
import statistics
import time
from typing import Any

from bench import common
from obshub.rules import engine as eng
from obshub.rules import testing
from obshub.rules.loader import BUILTIN_DIR


def record() -> list[tuple]:
    """The ``_render`` calls of the builtin tests: (rule, record, labels, value, count, other, annotations)."""
    calls: list[tuple] = []
    orig = eng.Engine._render

    def rec(self: Any, rule: Any, act: dict, labels: dict, value: float, count: int, other: Any) -> dict:
        out = orig(self, rule, act, labels, value, count, other)
        calls.append((rule, act, labels, value, count, other, out))
        return out

    eng.Engine._render = rec  # type: ignore[method-assign]
    try:
        for f in sorted((BUILTIN_DIR / "tests").glob("*_test.yaml")):
            testing.run_test_file(f)
    finally:
        eng.Engine._render = orig  # type: ignore[method-assign]
    return calls


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--rounds", type=common.positive_int, default=30, help="passes over the recorded renders (default 30)"
    )
    args = ap.parse_args(argv)
    calls = record()
    engine = object.__new__(eng.Engine)  # _render reads and counts template_errors only
    engine.template_errors = 0
    texts = [c[6] for c in calls]
    digest = hashlib.sha256(json.dumps(texts, sort_keys=True, default=str).encode()).hexdigest()[:16]
    per_render_us = []
    for _ in range(args.rounds):
        t0 = time.thread_time()
        for rule, act, labels, value, count, other, _out in calls:
            engine._render(rule, act, labels, value, count, other)
        per_render_us.append((time.thread_time() - t0) / len(calls) * 1e6)
    annotations = sum(len(t) for t in texts)
    print(
        f"renders {len(calls)} ({annotations} annotations), digest {digest}, template errors "
        f"{engine.template_errors // args.rounds}; CPU per render: median {statistics.median(per_render_us):.1f} us, "
        f"min {min(per_render_us):.1f} us, max {max(per_render_us):.1f} us over {args.rounds} rounds"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
