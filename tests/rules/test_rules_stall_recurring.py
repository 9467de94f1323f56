"""step_stall_recurring (obshub/rules/builtin/15_stall.yaml, docs/RULES.md "step_stall_recurring") as the
sinks see it: the change records the engine hands them, from the builtin pack, for a sporadic fault that
keeps recurring after the alert fired (walk25: a one-node job of 3 ranks, rank 2 stalled 12 times)."""

from __future__ import annotations

import functools
import re
from pathlib import Path

from obshub.rules import fields
from obshub.rules.engine import Engine
from obshub.rules.loader import load_ruleset

REPO = Path(__file__).resolve().parents[2]
T0_NS = 1_767_225_600_000_000_000
S = 1_000_000_000


@functools.cache
def builtin_pack():
    return load_ruleset([REPO / "obshub" / "rules" / "builtin"])


def stall(step: int, rank: int | None = 2) -> dict:
    culprit = {"host": "node-00", "layer": "sched", "evidence": 7.0, "source": "evidence", "why": "sched evidence 7"}
    if rank is not None:
        culprit["rank"] = rank
    return {
        "job": "solo",
        "step": step,
        "step_time_max_ns": 900_000_000,
        "stall_ratio": 9.0,
        "baseline": {"median_ns": 100_000_000, "p99_ns": 120_000_000, "n": 50, "spread_ns": 4_000_000},
        "culprit": culprit,
    }


def recurring_changes(stalls: list[tuple[int, dict]]) -> list[dict]:
    """The change records of step_stall_recurring after the step summaries ``stalls`` (time in s, record)."""
    changes: list[dict] = []
    engine = Engine(builtin_pack(), changes.append)
    for at_s, rec in stalls:
        t = T0_NS + at_s * S
        engine.process("steps", fields.step_record({**rec, "closed_at_ns": t}))
        engine.tick(t + S // 2)
    return [c for c in changes if c["rule"] == "step_stall_recurring"]


def times(change: dict) -> int:
    return int(re.search(r"stalled solo (\d+) times in 10 min", change["annotations"]["summary"]).group(1))


def test_a_recurring_stall_that_goes_on_is_notified_again_with_its_current_count():
    """12 stalls 18 s apart: the page fired at the 3rd saying "3 times" and was never sent again while 9 more
    followed, so every sink kept "3 times ... last: step 220". A further stall of a firing alert now sends
    it again with the count as it is (`renotify`), at least a minute after the previous notification (the
    route's group_interval then batches it; PagerDuty's dedup key is the alert's: one incident)."""
    got = recurring_changes([(18 * i, stall(40 + 180 * i)) for i in range(12)])
    fired = [c for c in got if c["status"] == "firing"]
    assert [times(c) for c in fired] == [3, 7, 11], [c["annotations"]["summary"] for c in fired]
    assert [c.get("renotified", 0) for c in fired] == [0, 1, 2]
    assert len({c["fingerprint"] for c in fired}) == 1 and all(c["labels"] == fired[0]["labels"] for c in fired)
    sent = [c["updated_at_ns"] for c in fired]
    assert all(b - a >= 60 * S for a, b in zip(sent, sent[1:])), sent
