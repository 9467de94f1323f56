"""Kept step summaries replayed as the worker and the rule engine treat them: each closed step's culprit
recomputed (``culprit``, ``culprit_rank``, ``charge_starved``, ``charge_persistent``) and every summary
through the builtin pack in close order (the tests of culprits on kept runs share it)."""

from __future__ import annotations

import collections
import copy
import functools
from pathlib import Path

from obshub.rules import fields
from obshub.rules.engine import Engine
from obshub.rules.loader import load_ruleset
from obshub.streams import analysis

REPO = Path(__file__).resolve().parents[2]
CLOSED = ("complete", "window", "restart")  # how a closed step (not an interim record) was closed


@functools.cache
def builtin_pack():
    """The builtin rule pack, loaded once per test process."""
    return load_ruleset([REPO / "obshub" / "rules" / "builtin"])


def replay_steps(steps: list[dict]) -> tuple[dict[int, dict], list[dict]]:
    """``steps`` (kept step summaries, any order) in close order: ``({step: closed summary with its
    recomputed culprit}, firing changes of the builtin pack)``; the engine is ticked to each close and 60 s
    past the last."""
    recent_s: collections.deque = collections.deque(maxlen=analysis.SELF_STEPS)
    recent_c: collections.deque = collections.deque(maxlen=analysis.PERSIST_STEPS)
    got: list[dict] = []
    eng = Engine(builtin_pack(), got.append)
    closed = {}
    ordered = sorted(steps, key=lambda s: s["closed_at_ns"])
    for s in ordered:
        s = copy.deepcopy(s)
        if s.get("closed_by") in CLOSED:
            s["culprit"] = analysis.culprit_rank(analysis.culprit(s), s)
            recent_s.append(analysis.charge_starved(s, recent_s))
            s["culprit"], key = analysis.charge_persistent(s, recent_c)
            recent_c.append(key)
            closed[s["step"]] = s
        eng.process("steps", fields.step_record(s))
        eng.tick(s["closed_at_ns"])
    eng.tick(ordered[-1]["closed_at_ns"] + 60_000_000_000)
    return closed, [c for c in got if c["status"] == "firing"]
