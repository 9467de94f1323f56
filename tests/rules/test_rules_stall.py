"""The single-step stall rules (obshub/rules/builtin/15_stall.yaml) on step summaries built by the stream
app's own analysis (streams.synthetic -> streams.offline, the same join and analysis as the worker),
through the whole builtin pack: sporadic stalls of every layer, on hosts and job sizes of several shapes,
are each named at once with the right host and layer, the same host+layer escalates at the third, and
clean jobs with natural jitter (or merely slow steps) fire nothing. The culprit itself (analysis.culprit)
is checked on the same summaries."""

from __future__ import annotations

from pathlib import Path

import pytest

from obshub.rules import fields
from obshub.rules.engine import Engine
from obshub.rules.loader import load_ruleset
from obshub.streams import analysis, offline, synthetic

REPO = Path(__file__).resolve().parents[2]
STALL_RULES = {"step_stall", "step_stall_recurring", "step_stall_unexplained"}
CULPRIT_LAYER = {"pytorch": "process"}  # what a slower rank with no lower layer to blame is named


def run_pack(scn) -> tuple[list[dict], dict]:
    """Every firing change of the builtin pack over the scenario's events and summaries, in time order,
    and the summaries ``{step: summary}``."""
    batches = [b for _, b in synthetic.generate(scn)]
    summaries = offline.summarize_batches(batches)
    by_step: dict[int, list[dict]] = {}
    for b in batches:
        for ev in b.events:
            by_step.setdefault(ev.step, []).append(fields.event_record(b, ev))
    changes: list[dict] = []
    engine = Engine(
        load_ruleset([REPO / "obshub" / "rules" / "builtin", REPO / "obshub" / "rules" / "packs" / "stall.yaml"]),
        changes.append,
    )
    out = {}
    for (_job, step), summary in sorted(summaries.items(), key=lambda kv: kv[0][1]):
        evs = sorted(by_step.get(step, []), key=lambda r: r["time_ns"])
        for rec in evs:
            engine.process("events", rec)
        closed = (evs[-1]["time_ns"] if evs else engine.now_ns) + 1_000_000
        engine.process("steps", fields.step_record({**summary, "closed_at_ns": closed}))
        engine.tick(closed)
        out[step] = summary
    engine.tick(engine.now_ns + 60_000_000_000)
    return [c for c in changes if c["status"] == "firing"], out


SHAPES = [
    # (layer the fault acts in, hosts, straggler index, seed, stall ms): the layer's events come with the
    # stall (synthetic.GUILTY_KINDS): network = both ends of every connection of the host retransmit (a
    # blackout or loss burst); sched = run-queue waits (a CPU burst); memory = direct reclaim; pytorch =
    # nothing below the framework: a rank stopped (SIGSTOP) or frozen; cuda, nic = their probes' events
    ("network", 4, 1, 3, 800.0),
    ("network", 6, 5, 11, 400.0),
    ("sched", 4, 2, 5, 800.0),
    ("sched", 3, 0, 8, 300.0),
    ("memory", 5, 3, 13, 600.0),
    ("pytorch", 4, 3, 17, 800.0),
    ("pytorch", 8, 6, 19, 500.0),
    ("cuda", 4, 0, 23, 700.0),
    ("nic", 3, 2, 29, 900.0),
]


@pytest.mark.parametrize("layer,hosts,straggler,seed,stall_ms", SHAPES)
def test_every_sporadic_stall_is_named_at_once_and_the_third_escalates(layer, hosts, straggler, seed, stall_ms):
    stalls = (30, 75, 130)  # sporadic: one stalled step, then clean training again
    scn = synthetic.Scenario(
        job="llm",
        hosts=hosts,
        steps=170,
        straggler=straggler,
        guilty_steps=stalls,
        guilty_layer=layer,
        extra_ms=stall_ms,
        jitter_ms=1.5,
        seed=seed,
    )
    firing, summaries = run_pack(scn)
    host, want = scn.host_name(straggler), CULPRIT_LAYER.get(layer, layer)
    for s in stalls:
        c = summaries[s]["culprit"]
        assert c is not None and (c["host"], c["layer"]) == (host, want), (s, c)
    named = [a for a in firing if a["rule"] == "step_stall"]
    assert sorted(int(a["annotations"]["step"]) for a in named) == list(stalls), [
        (a["annotations"]["step"], a["labels"]) for a in named
    ]
    for a in named:
        assert a["labels"]["host"] == host and a["labels"]["layer"] == want and a["labels"]["category"] == "stall"
        assert a["severity"] == "warning"
        assert f"stalled step {a['annotations']['step']} of llm ({want})" in a["annotations"]["summary"]
        assert " ms, x" in a["annotations"]["summary"] and "evidence" in a["annotations"]["evidence"]
    rec = [a for a in firing if a["rule"] == "step_stall_recurring"]
    assert len(rec) == 1 and rec[0]["annotations"]["step"] == str(stalls[2]), rec
    assert rec[0]["severity"] == "critical" and "3 times in 10 min" in rec[0]["annotations"]["summary"]
    assert (rec[0]["labels"]["host"], rec[0]["labels"]["layer"]) == (host, want)
    # nothing of the pack names another host or another layer (the sequential rules may add their own
    # alert on the same host and layer, or the straggler rules the framework's own layer)
    wrong = [
        (a["rule"], a["labels"])
        for a in firing
        if a["labels"].get("host") != host or a["labels"].get("layer") not in (want, layer)
    ]
    assert not wrong, wrong
    # stall alerts are never on a non-stalled step
    assert {int(a["annotations"]["step"]) for a in firing if a["rule"] in STALL_RULES} <= set(stalls)


@pytest.mark.parametrize(
    "hosts,jitter_ms,seed,slow_ms",
    [
        (4, 3.0, 2, 0.0),  # natural jitter: up to 3 ms on every segment of every host
        (6, 8.0, 4, 0.0),  # heavy jitter: 8 ms on a 20 ms forward
        (4, 2.0, 6, 60.0),  # occasional slow steps (x2 the median) are no stall
        (3, 2.0, 9, 150.0),  # x3, but only 150 ms longer: below the 250 ms floor
    ],
)
def test_clean_jobs_with_jitter_or_merely_slow_steps_fire_no_stall(hosts, jitter_ms, seed, slow_ms):
    slow = tuple(range(25, 200, 17)) if slow_ms else ()
    scn = synthetic.Scenario(
        job="llm",
        hosts=hosts,
        steps=200,
        straggler=1,
        guilty_steps=slow,
        guilty_layer="sched",
        extra_ms=slow_ms,
        jitter_ms=jitter_ms,
        seed=seed,
    )
    firing, summaries = run_pack(scn)
    assert not [a for a in firing if a["rule"] in STALL_RULES], [(a["rule"], a["labels"]) for a in firing]
    if not slow:
        assert firing == [], [(a["rule"], a["labels"]) for a in firing]
    assert max(s["stall_ratio"] for s in summaries.values() if s["baseline"]["n"] >= 10) < 3.5


def test_culprit_prefers_evidence_then_the_straggler_and_names_nobody_without_either():
    ev = {"spread_ns": 4_000_000, "hosts": {"a": {"network": 4.0, "pytorch": 0.0}, "b": {"pytorch": 7.0}}}
    strag = {"host": "b", "reason": "last at 3/3 collectives"}
    c = analysis.culprit({"evidence": ev, "straggler": strag, "blame": []})
    assert c["host"] == "b" and c["layer"] == "process" and c["evidence"] == 7.0 and c["source"] == "evidence"
    assert "straggler: last at 3/3" in c["why"]
    # a tie at the clip: a named layer wins over lateness no layer explains
    ev["hosts"]["a"]["network"] = 7.0
    c = analysis.culprit({"evidence": ev, "straggler": strag, "blame": []})
    assert (c["host"], c["layer"]) == ("a", "network")
    # no evidence (the steps right after a hang): the straggler and its first blamed layer
    blame = [{"host": "b", "layer": "memory", "excess_ns": 90_000_000}]
    c = analysis.culprit({"evidence": {"spread_ns": 1, "hosts": {}}, "straggler": strag, "blame": blame})
    assert (c["host"], c["layer"], c["source"], c["evidence"]) == ("b", "memory", "blame", 0.0)
    assert "+90.0 ms" in c["why"]
    c = analysis.culprit({"evidence": {"spread_ns": 1, "hosts": {}}, "straggler": strag, "blame": []})
    assert (c["host"], c["layer"]) == ("b", "process") and "no layer blamed" in c["why"]
    assert analysis.culprit({"evidence": {"spread_ns": 1, "hosts": {}}, "straggler": None, "blame": []}) is None


@pytest.mark.parametrize("layer", ["network", "sched", "memory", "pytorch"])
def test_a_persistent_fault_that_stalls_steps_adds_no_wrong_alert(layer):
    # a persistent fault large enough to stall steps (x6 from step 20 on): the stall rules name the same
    # host and layer as the fault (until the baseline's median moves up), nothing else
    scn = synthetic.Scenario(
        job="llm", hosts=4, steps=90, straggler=1, guilty_steps=tuple(range(20, 90)), guilty_layer=layer, extra_ms=400.0
    )
    firing, _ = run_pack(scn)
    want = CULPRIT_LAYER.get(layer, layer)
    stall = [a for a in firing if a["rule"] in STALL_RULES]
    assert stall and stall[0]["annotations"]["step"] == "20", [(a["rule"], a["annotations"]["step"]) for a in stall]
    wrong = [
        (a["rule"], a["labels"])
        for a in firing
        if a["labels"].get("host") != "node1" or a["labels"].get("layer") not in (want, layer)
    ]
    assert not wrong, wrong
