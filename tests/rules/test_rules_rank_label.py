"""The `rank` label of the builtin pack's alerts (docs/RULES.md "Builtin pack and runbooks"): the global rank
where the record names one, and no `rank` label at all where it does not (a null group-by value), as
step_stall and memory_stall_episode do. rank_hang, straggler_slow_compute and the RDMA rule gave an empty
`rank=""` label instead, so one alert's label set depended on whether the rank happened to be known."""

from __future__ import annotations

import functools
from pathlib import Path

import pytest

from obshub.rules import fields
from obshub.rules.engine import Engine
from obshub.rules.loader import load_ruleset

REPO = Path(__file__).resolve().parents[2]
T0_NS = 1_767_225_600_000_000_000


@functools.cache
def builtin_pack():
    """The builtin pack, loaded and type-checked once for every test here (an engine keeps its own state)."""
    return load_ruleset([REPO / "obshub" / "rules" / "builtin"])


def firing(records: list[dict], rule: str) -> dict:
    """The one firing change of ``rule`` after the step summaries ``records``, 1 s apart."""
    changes: list[dict] = []
    engine = Engine(builtin_pack(), changes.append)
    for i, rec in enumerate(records):
        t = T0_NS + i * 1_000_000_000
        engine.process("steps", fields.step_record({**rec, "closed_at_ns": t}))
        engine.tick(t + 500_000_000)
    (fired,) = [c for c in changes if c["status"] == "firing" and c["rule"] == rule]
    return fired


@pytest.mark.parametrize("rank, label", [(2, "2"), (None, None)])
def test_a_hung_rank_alert_has_a_rank_label_only_when_the_rank_is_known(rank, label):
    hung = {"host": "node-00", "last_step": 85, "last_phase": "after forward", "silent_ns": 400_000_000}
    hung["state"] = "stopped"
    if rank is not None:
        hung["rank"] = rank
    rec = {
        "job": "solo",
        "step": 85,
        "closed_by": "hang",
        "hosts": ["node-00"],
        "world_size": 4,
        "hang": {"pg": "0", "coll_seq": 260, "op": "all_reduce", "waiting": ["node-00"], "waiting_ranks": 3,
                 "waited_ns": 700_000_000, "after_ns": 500_000_000, "hosts": [hung]},
    }  # fmt: skip
    labels = firing([rec, {**rec}], "rank_hang")["labels"]
    assert labels["host"] == "node-00" and labels.get("rank") == label, labels
    assert ("rank" in labels) == (label is not None), labels


@pytest.mark.parametrize("rank, label", [(13, "13"), (None, None)])
def test_a_slow_compute_alert_has_a_rank_label_only_when_the_rank_is_known(rank, label):
    straggler = {"host": "node2", "score": 0.6, "excess_ns": 60_000_000, "reason": "last at 4/4 collectives"}
    blame = {"host": "node2", "layer": "pytorch", "excess_ns": 60_000_000, "straggler_ns": 210_000_000,
             "peer_median_ns": 150_000_000, "count": 10, "max_ns": 9_000_000}  # fmt: skip
    if rank is not None:
        straggler["rank"] = blame["rank"] = rank
    records = [
        {"job": "llm", "step": 20 + i, "baseline": {"n": 30, "median_ns": 200_000_000}, "straggler": straggler,
         "blame": [blame]}
        for i in range(12)
    ]  # fmt: skip
    labels = firing(records, "straggler_slow_compute")["labels"]
    assert labels["host"] == "node2" and labels.get("rank") == label, labels
    assert ("rank" in labels) == (label is not None), labels
