"""The builtin pack on the stream application's own analysis: synthetic runs with a known straggler and
guilty layer (streams.synthetic) are summarised by the offline reference of the stream app
(streams.offline), and the events plus summaries go through the rule engine in time order. The pack
must name the right host and layer, and nothing else among the straggler alerts; a clean run fires
nothing. This pins the interface between the stream app's summaries and the rules."""

from __future__ import annotations

from pathlib import Path

import pytest

from obshub.rules import fields
from obshub.rules.engine import Engine
from obshub.rules.loader import load_ruleset

REPO = Path(__file__).resolve().parents[2]
synthetic = pytest.importorskip("obshub.streams.synthetic")
offline = pytest.importorskip("obshub.streams.offline")


def run_pack(scn) -> list[dict]:
    batches = [b for _, b in synthetic.generate(scn)]
    summaries = offline.summarize_batches(batches)
    by_step: dict[int, list[dict]] = {}
    for b in batches:
        for ev in b.events:
            by_step.setdefault(ev.step, []).append(fields.event_record(b, ev))
    changes: list[dict] = []
    engine = Engine(load_ruleset([REPO / "obshub" / "rules" / "builtin"]), changes.append)
    for (_job, step), summary in sorted(summaries.items(), key=lambda kv: kv[0][1]):
        evs = sorted(by_step.get(step, []), key=lambda r: r["time_ns"])
        for rec in evs:
            engine.process("events", rec)
        closed = (evs[-1]["time_ns"] if evs else engine.now_ns) + 1_000_000
        engine.process("steps", fields.step_record({**summary, "closed_at_ns": closed}))
        engine.tick(closed)
    return [c for c in changes if c["status"] == "firing"]


@pytest.mark.slow
@pytest.mark.parametrize(
    "layer,rule",
    [
        ("sched", "sched_contention_on_straggler"),
        ("memory", "memory_stall_on_straggler"),
        ("network", "tcp_retransmits_on_straggler"),
        ("nic", "rdma_slow_completion_on_straggler"),
    ],
)
def test_pack_names_host_and_layer(layer, rule):
    # a persistent fault: node2 is the guilty straggler from step 20 on. The per-layer straggler rules
    # run a CUSUM over the per-step evidence (docs/RULES.md "Sequential straggler rules")
    scn = synthetic.Scenario(
        job="llm", hosts=4, steps=60, straggler=2, guilty_steps=tuple(range(20, 60)), guilty_layer=layer
    )
    firing = run_pack(scn)
    hits = [a for a in firing if a["rule"] == rule]
    assert hits, f"{rule} did not fire; fired: {[(a['rule'], a['labels']) for a in firing]}"
    a = hits[0]
    assert a["labels"]["host"] == "node2" and a["labels"]["layer"] == layer and a["labels"]["job"] == "llm"
    assert int(a["annotations"]["step"]) in scn.guilty_steps and a["annotations"]["evidence"]
    wrong = [
        (x["rule"], x["labels"])
        for x in firing
        if x["labels"].get("host") != "node2" or x["labels"].get("layer") not in (layer, "pytorch")
    ]
    assert not wrong, wrong


def test_clean_run_fires_nothing():
    assert run_pack(synthetic.Scenario(job="llm", hosts=4, steps=36)) == []


@pytest.mark.parametrize("layer", ["sched", "memory"])
@pytest.mark.parametrize(
    "extra_ms,fires_after",
    [(7.0, 3), (10.0, 2), (40.0, 1)],  # the spread of lateness here is a fraction of a ms (0.3 ms jitter)
)
def test_evidence_accumulates_weak_steps_and_fires_alone_on_a_strong_one(layer, extra_ms, fires_after):
    """The sequential rules add up each step's evidence (docs/ANALYSIS.md "Sequential straggler rules"):
    a weak excess fires after three guilty steps in a row, a moderate one after two, a strong one on
    its first step; fewer guilty steps than that fire nothing. The sched rule counts at most
    ``sched_step_max`` spreads a step (load noise lands on the run queue): a strong sched excess needs
    two steps."""
    if layer == "sched":
        fires_after = max(2, fires_after)

    def fired(n: int) -> list[tuple[str, str, str]]:
        scn = synthetic.Scenario(
            job="llm",
            hosts=4,
            steps=36,
            straggler=2,
            guilty_steps=tuple(range(24, 24 + n)),
            guilty_layer=layer,
            extra_ms=extra_ms,
        )
        firing = [a for a in run_pack(scn) if a["labels"].get("category") == "straggler"]
        return [(a["labels"]["host"], a["labels"]["layer"], a["annotations"]["step"]) for a in firing]

    if fires_after > 1:
        assert fired(fires_after - 1) == []
    assert fired(fires_after) == [("node2", layer, str(24 + fires_after - 1))]


def test_stopped_host_is_named():
    scn = synthetic.Scenario(job="llm", hosts=4, steps=36, stop_host=3, stop_after=20)
    firing = run_pack(scn)
    assert [(a["rule"], a["labels"]["host"]) for a in firing] == [("host_stopped_reporting", "node3")], firing
