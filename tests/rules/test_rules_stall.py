"""The single-step stall rules (obshub/rules/builtin/15_stall.yaml) on step summaries built by the stream
app's own analysis (streams.synthetic -> streams.offline, the same join and analysis as the worker),
through the whole builtin pack: sporadic stalls of every layer, on hosts and job sizes of several shapes,
are each named at once with the right host and layer, the same host+layer escalates at the third, and
clean jobs with natural jitter (or merely slow steps) fire nothing. The culprit itself (analysis.culprit)
is checked on the same summaries."""

from __future__ import annotations

import copy
import functools
import gzip
import json
from pathlib import Path

import pytest

from obshub.rules import fields
from obshub.rules.engine import Engine
from obshub.rules.loader import load_ruleset
from obshub.streams import analysis, offline, synthetic

REPO = Path(__file__).resolve().parents[2]
STALL_RULES = {"step_stall", "step_stall_recurring", "step_stall_unexplained"}
CULPRIT_LAYER = {"pytorch": "process"}  # what a slower rank with no lower layer to blame is named


@functools.cache
def builtin_pack():
    """The builtin pack, loaded and type-checked once for every test here (an engine keeps its own state)."""
    return load_ruleset([REPO / "obshub" / "rules" / "builtin"])  # the stall rules are on by default


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
        builtin_pack(),
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
    ("pytorch", 5, 2, 31, 300.0),  # a 300 ms freeze of a rank
    ("network", 5, 0, 37, 2000.0),  # a 2 s loss burst or blackout of host 0
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
        # the culprit's rank as a label: the straggler's global rank, none for a host's link
        c = summaries[int(a["annotations"]["step"])]["culprit"]
        assert a["labels"].get("rank") == (None if c.get("rank") is None else str(c["rank"])), (a["labels"], c)
        assert want == "network" or "rank" in a["labels"], (a["labels"], c)
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
    "hosts,jitter_ms,seed,slow_ms,layer",
    [
        (4, 3.0, 2, 0.0, "sched"),  # natural jitter: up to 3 ms on every segment of every host
        (6, 8.0, 4, 0.0, "sched"),  # heavy jitter: 8 ms on a 20 ms forward
        (4, 2.0, 6, 60.0, "sched"),  # occasional slow steps (x2 the median) are no stall
        # x3, but only 150 ms longer, and nothing below the framework names it: below the 250 ms floor
        (3, 2.0, 9, 150.0, "pytorch"),
        # one host's run-queue waits (starved) at x2.2, 90 ms longer: below stall_starved_floor_ns (100 ms);
        # this case was 150 ms at x3 while that floor was 200 ms (docs/ANALYSIS.md "Floors of the single-step
        # rules": 200 ms CPU bursts that cost 132-198 ms are stalls)
        (3, 2.0, 9, 90.0, "sched"),
    ],
)
def test_clean_jobs_with_jitter_or_merely_slow_steps_fire_no_stall(hosts, jitter_ms, seed, slow_ms, layer):
    slow = tuple(range(25, 200, 17)) if slow_ms else ()
    scn = synthetic.Scenario(
        job="llm",
        hosts=hosts,
        steps=200,
        straggler=1,
        guilty_steps=slow,
        guilty_layer=layer,
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
    ev = {"spread_ns": 4_000_000, "hosts": {"a": {"sched": 3.0, "pytorch": 0.0}, "b": {"pytorch": 7.0}}}
    strag = {"host": "b", "reason": "last at 3/3 collectives"}
    c = analysis.culprit({"evidence": ev, "straggler": strag, "blame": []})
    assert c["host"] == "b" and c["layer"] == "process" and c["evidence"] == 7.0 and c["source"] == "evidence"
    assert "straggler: last at 3/3" in c["why"]
    # a tie at the clip on one host: a named layer wins over lateness no layer explains
    ev["hosts"]["b"]["sched"] = 7.0
    c = analysis.culprit({"evidence": ev, "straggler": strag, "blame": []})
    assert (c["host"], c["layer"]) == ("b", "sched")
    # another host about as late (more than half the best value): no single host stands out
    ev["hosts"]["a"]["sched"] = 4.0
    assert analysis.culprit({"evidence": ev, "straggler": strag, "blame": []}) is None
    ev["hosts"]["a"]["sched"] = 3.0
    # a starved rank: a lower layer of its own with evidence names it rather than the rest of its lateness
    c = analysis.culprit({"evidence": {"spread_ns": 64_000_000, "hosts": {"b": {"pytorch": 7.0, "sched": 2.46}}}})
    assert (c["host"], c["layer"], c["evidence"]) == ("b", "sched", 2.46)
    # a blackout's neighbour with a little network evidence of its own does not hide the blacked-out host
    c = analysis.culprit(
        {"evidence": {"spread_ns": 24_000_000, "hosts": {"a": {"network": 2.0}, "b": {"network": 4.0}}}}
    )
    assert (c["host"], c["layer"]) == ("b", "network")
    # network evidence in the step: another host's lateness is its victims' waiting (a rank that waited for
    # a retransmission arrives late at the next collective), however large: the link is named
    ev["hosts"] = {"a": {"network": 2.5}, "b": {"pytorch": 7.0}}
    c = analysis.culprit({"evidence": ev, "straggler": strag, "blame": []})
    assert (c["host"], c["layer"], c["evidence"]) == ("a", "network", 2.5)
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


# --- generated step summaries in the shapes the live demo's summaries took (kept from `make demo`,
# persistent 8% loss on node-01, docs/BENCHMARKS.md): the culprit is charged as the worker charges it
# (analysis.culprit, then the job's persistent fault, as Fold.close does) and the builtin pack runs on them

MEDIAN_NS = 140_000_000
HOSTS4 = ["node-00", "node-01", "node-02", "node-03"]


def summary(step, tmax_ms, *, ev=None, strag=None, layers=None, closed_by="complete", n=50, spread_ms=20, stopped=None):
    """A step summary of a 4-host job with baseline median ``MEDIAN_NS``: ``ev`` ``{host: {layer: z}}``,
    ``strag`` ``(host, excess ms)``, ``layers`` ``{host: {layer: time ms}}``, ``stopped`` ``{host: (ms,
    rank)}`` (a rank the kernel saw stopped)."""
    tmax = int(tmax_ms * 1e6)
    return {
        "stopped": {h: {"ns": int(ms * 1e6), "rank": r} for h, (ms, r) in (stopped or {}).items()},
        "job": "llm",
        "step": step,
        "closed_by": closed_by,
        "hosts": HOSTS4,
        "expected_hosts": HOSTS4,
        "step_time_ns": dict.fromkeys(HOSTS4, tmax),
        "step_time_max_ns": tmax,
        "straggler": {"host": strag[0], "excess_ns": int(strag[1] * 1e6), "reason": "last at 1/3 collectives"}
        if strag
        else None,
        "blame": [],
        "evidence": {"spread_ns": spread_ms * 1_000_000, "hosts": ev or {}},
        "layers": {
            h: {k: {"time_ns": int(v * 1e6), "count": 1, "max_ns": 0} for k, v in r.items()}
            for h, r in (layers or {}).items()
        },
        "baseline": {"median_ns": MEDIAN_NS, "p99_ns": 180_000_000, "n": n, "spread_ns": spread_ms * 1_000_000},
        "stall_ratio": round(tmax / MEDIAN_NS, 3),
        "stall": tmax > 180_000_000,
    }


def charge(summaries):
    """The summaries with their culprit as the worker sends it (Fold.close's order)."""
    recent: list = []
    sched: list = []
    held = None
    memory = None
    for s in summaries:
        if s["closed_by"] in ("hang", "running"):
            continue
        s["culprit"] = analysis.culprit(s)
        sched.append(analysis.charge_starved(s, sched))
        s["culprit"], key = analysis.charge_persistent(s, recent)
        recent.append(key)
        held = analysis.hold_ambiguous(s, held)
        memory = analysis.memory_episode(s, memory)
    return summaries


def fire(summaries, t0_s=0.0, every_s=0.5):
    """Every firing change of the builtin pack over ``summaries``, one every ``every_s`` s."""
    changes: list[dict] = []
    engine = Engine(builtin_pack(), changes.append)
    for i, s in enumerate(summaries):
        t = int((t0_s + i * every_s) * 1e9) + 1_780_000_000_000_000_000
        engine.process("steps", fields.step_record({**s, "closed_at_ns": t}))
        engine.tick(t)
    engine.tick(engine.now_ns + 60_000_000_000)
    return [c for c in changes if c["status"] == "firing"]


def stall_alerts(steps: list[dict]) -> list[tuple[str, str, str]]:
    """(rule, host, layer) of every step_stall* alert the builtin pack fires on ``steps``."""
    return [
        (a["rule"], a["labels"]["host"], a["labels"]["layer"])
        for a in fire(steps)
        if a["rule"].startswith("step_stall")
    ]


def clean_steps(first, count, rng):
    return [
        summary(
            s,
            rng.uniform(120, 170),
            strag=(rng.choice(HOSTS4), rng.uniform(3, 12)),
            ev={rng.choice(HOSTS4): {"sched": 0.4}},
        )
        for s in range(first, first + count)
    ]


@pytest.mark.parametrize("lossy,seed", [("node-01", 1), ("node-03", 2), ("node-00", 3), ("node-02", 4)])
def test_a_persistent_network_fault_names_only_its_own_host_and_layer(lossy, seed):
    # every step slowed by retransmission timeouts (300-2,400 ms against a 140 ms median); per step one of
    # the shapes the live summaries had: the lossy host's network evidence alone, or with a victim that
    # waited for a retransmission and arrived late by one (a larger, `pytorch`, value: step 88 of the kept
    # run); no network evidence of its own while a victim or the lossy host itself is the late one (steps
    # 89, 92); neither straggler nor evidence (all waited alike)
    import random

    rng = random.Random(seed)
    victims = [h for h in HOSTS4 if h != lossy]
    steps = clean_steps(0, 30, rng)
    for s in range(30, 110):
        tmax = rng.choice((300, 350, 530, 600, 840, 1030, 2380))
        v = rng.choice(victims)
        shape = "own" if s < 32 else rng.choice(("own", "own", "own+victim", "victim", "self", "none"))
        ev, strag = {}, None
        if shape.startswith("own"):
            ev[lossy] = {"network": rng.choice((2.0, 4.0, 7.0))}
        if shape in ("own+victim", "victim"):
            ev[v] = {"pytorch": rng.uniform(4.0, 7.0)}
            strag = (v, rng.choice((106, 207, 252)))
        if shape == "self":
            ev[lossy] = {"pytorch": 7.0}
            strag = (lossy, 207)
        steps.append(summary(s, tmax, ev=ev, strag=strag))
    firing = fire(charge(steps))
    named = [a for a in firing if a["rule"] == "step_stall"]
    assert named and all((a["labels"]["host"], a["labels"]["layer"]) == (lossy, "network") for a in named), [
        (a["annotations"]["step"], a["labels"]) for a in named
    ]
    assert not [a for a in firing if a["rule"] == "step_stall_unexplained"]
    assert all(a["labels"].get("host") == lossy for a in firing), [(a["rule"], a["labels"]) for a in firing]
    assert next(a for a in firing if a["rule"] == "step_stall_recurring")["labels"]["layer"] == "network"
    charged = [s["culprit"] for s in steps[32:]]
    assert {(c["host"], c["layer"]) for c in charged} == {(lossy, "network")}
    assert {c["source"] for c in charged} == {"evidence", "persistent"}


def test_a_persistent_fault_ends_and_a_later_sporadic_stall_of_another_host_is_its_own():
    # node-01's link lossy for 20 steps, then 60 clean steps; a SIGSTOP-like stall of node-03 (late by the
    # whole stall, no layer below the framework) and a stall nobody explains are not charged to node-01
    import random

    rng = random.Random(5)
    steps = clean_steps(0, 20, rng)
    steps += [summary(s, 600, ev={"node-01": {"network": 7.0}}) for s in range(20, 40)]
    steps += clean_steps(40, 60, rng)
    steps.append(summary(100, 950, ev={"node-03": {"pytorch": 7.0}}, strag=("node-03", 800)))
    steps += clean_steps(101, 30, rng)
    steps.append(summary(131, 990))  # every rank slow alike, no straggler, no evidence, no layer
    charge(steps)
    assert steps[-32]["culprit"]["host"] == "node-03" and steps[-32]["culprit"]["layer"] == "process"
    assert steps[-1]["culprit"] is None
    firing = fire(steps)
    late = [
        (a["rule"], a["labels"].get("host"), a["labels"].get("layer"))
        for a in firing
        if int(a["annotations"].get("step", 0)) >= 100
    ]
    assert late == [("step_stall", "node-03", "process"), ("step_stall_unexplained", None, None)], late


def test_a_bystander_is_no_culprit_and_a_burst_with_no_straggler_is_named_by_its_layer_time():
    # a stall of 850 ms over the median: a straggler late by 10 ms explains none of it
    s = summary(60, 990, strag=("node-00", 10))
    assert analysis.culprit(s) is None
    # ... while the host whose run-queue time rose by most of it is named (a CPU burst that hit a rank
    # while it waited inside a collective: nobody arrives late)
    s = summary(
        60,
        990,
        strag=("node-00", 10),
        layers={
            "node-00": {"sched": 12},
            "node-01": {"sched": 10},
            "node-02": {"sched": 640},
            "node-03": {"sched": 11},
        },
    )
    c = analysis.culprit(s)
    assert (c["host"], c["layer"], c["source"]) == ("node-02", "sched", "layers") and "+629.0 ms" in c["why"]
    # a straggler late by a good part of the stall stays the culprit (its blamed layer or its process)
    s = summary(60, 990, strag=("node-03", 700))
    assert (analysis.culprit(s)["host"], analysis.culprit(s)["layer"]) == ("node-03", "process")
    # the live shapes of a loaded 2-core demo host (docs/BENCHMARKS.md): a rank late by 110 ms in a step
    # that lost 790 ms (5.4 spreads of lateness, nothing below the framework) explains too little of it
    s = summary(739, 945, ev={"node-02": {"pytorch": 5.43}}, strag=("node-02", 109))
    assert analysis.culprit(s) is None
    # two hosts starved at once (7.0 and 6.3 spreads of run-queue time): no single host stands out
    s = summary(460, 872, ev={"node-00": {"sched": 7.0}, "node-01": {"sched": 6.29}}, strag=("node-00", 227))
    assert analysis.culprit(s) is None
    # a stall nobody explains pages only from x5 and 500 ms (a loaded machine's clean step reached x3.2)
    fired = fire([*clean_steps(0, 20, __import__("random").Random(1)), summary(20, 611), summary(21, 140)])
    assert not [a for a in fired if a["rule"].startswith("step_stall")], fired
    fired = fire([*clean_steps(0, 20, __import__("random").Random(1)), summary(20, 720), summary(21, 140)])
    assert [a["rule"] for a in fired if a["rule"].startswith("step_stall")] == ["step_stall_unexplained"]
    # not a stall (no baseline): the straggler, however small
    assert analysis.culprit(summary(5, 990, strag=("node-00", 10), n=0))["host"] == "node-00"


def test_interim_records_of_a_stalled_step_never_count_twice_and_recurrence_counts_closed_steps():
    # three stalls of node-02 / sched, each seen first as hang and running interim records, then closed
    rows = []
    for step in (40, 80, 120):
        for by in ("hang", "running", "hang"):
            rows.append(summary(step, 900, ev={"node-02": {"sched": 7.0}}, strag=("node-02", 700), closed_by=by))
        rows.append(summary(step, 900, ev={"node-02": {"sched": 7.0}}, strag=("node-02", 700)))
        rows += [summary(step + i, 140) for i in range(1, 12)]
    charge(rows)
    for r in rows:
        if r["closed_by"] != "complete":
            r["culprit"] = {"host": "node-02", "layer": "sched", "evidence": 7.0, "source": "evidence", "why": "x"}
    firing = fire(rows)
    stall = [(a["rule"], a["annotations"]["step"]) for a in firing if a["rule"].startswith("step_stall")]
    assert stall == [
        ("step_stall", "40"),
        ("step_stall", "80"),
        ("step_stall", "120"),
        ("step_stall_recurring", "120"),
    ], stall
    rec = next(a for a in firing if a["rule"] == "step_stall_recurring")
    assert "3 times in 10 min" in rec["annotations"]["summary"] and rec["severity"] == "critical"


# -- the live shapes of a blackout's retransmits (issue #30: docs/BENCHMARKS.md section 8) -------------------

MS = 1_000_000
RING = {f"node-0{i}": f"10.77.0.{11 + i}" for i in range(4)}  # gloo's ring 0-1-2-3-0 in the demo


def ring_accs(sent: dict[str, dict[str, int]], step_ms: float, sched_ms: dict[str, float] | None = None) -> dict:
    """Host accumulators of one step of the 4-host demo ring: every host ``step_ms`` long, arriving alike at
    its three all-reduces (a blackout or a burst inside a collective makes nobody late), 20 RTT samples
    on each of its two ring connections, ``sent`` ``{host: {peer: retransmits it sent there}}`` in the
    direction ``accumulate`` counts them, ``sched_ms`` the hosts' run-queue time."""
    from obshub.streams import accumulate

    peers = {"node-00": ("node-01", "node-03"), "node-01": ("node-00", "node-02")}
    peers |= {"node-02": ("node-01", "node-03"), "node-03": ("node-02", "node-00")}
    accs = {}
    for i, (h, addr) in enumerate(RING.items()):
        a = accumulate.new_acc(h, i)
        a["step_ns"], a["unc_ns"] = int(step_ms * MS), 1_000
        for k in range(3):
            t = int((k + 1) * step_ms / 4 * MS)
            a["colls"][f"0#{k}"] = ["all_reduce", t, t + MS, MS]
        a["layers"] = {"sched": [int((sched_ms or {}).get(h, 5.0) * MS), 1, int((sched_ms or {}).get(h, 5.0) * MS)]}
        pairs = {}
        for p in peers[h]:
            rx = sent.get(h, {}).get(p, 0)
            lo, hi = sorted((addr, RING[p]))
            pairs[f"{lo}|{hi}"] = [20, rx, 20 * MS, rx if addr == lo else 0, 0 if addr == lo else rx]
        a["net"] = {"addrs": {addr: 1}, "pairs": pairs}
        accs[h] = a
    return accs


def ring_summary(step: int, accs: dict, window: dict | None = None) -> dict:
    """The worker's summary of ``accs`` after 20 clean steps of 130 ms (``analysis.summarize``)."""
    hist = [[s, 130 * MS, 5 * MS] for s in range(step - 20, step)]
    return analysis.summarize(
        "llm",
        step,
        accs,
        expected_hosts=sorted(accs),
        history=hist,
        quality={},
        closed_by="complete",
        closed_at_ns=1,
        window=window,
    )


BLACKOUTS = [
    # (what was sent during node-02's blackout, {host: {peer: retransmits}}): the recorded first blackout
    # of the node-02 campaign: only node-01 was sending to node-02 when it began (4 retransmits, its
    # back-off), node-02 itself one toward node-03, node-00 one spurious toward node-01; its fewest per
    # busy connection is 1, and the step alone named nobody (step_stall_unexplained x12.3)
    {"node-01": {"node-02": 4}, "node-02": {"node-03": 1}, "node-00": {"node-01": 1}},
    # both neighbours sending into the drops (the usual 800 ms blackout: 4 and 4)
    {"node-01": {"node-02": 4}, "node-03": {"node-02": 4}},
    # the blackout of node-01's run that caught only one neighbour sending, twice (here node-01 -> node-02)
    {"node-01": {"node-02": 2}},
    # a 2 s blackout: longer back-off on one side, noise elsewhere
    {"node-03": {"node-02": 6}, "node-01": {"node-02": 1}, "node-00": {"node-03": 1}},
    # a loss burst (40 %): several retransmits each way, node-02's own among them
    {"node-01": {"node-02": 3}, "node-03": {"node-02": 2}, "node-02": {"node-01": 2, "node-03": 1}},
]


@pytest.mark.parametrize("sent", BLACKOUTS)
def test_a_blackouts_retransmits_toward_its_host_name_the_stalled_step(sent):
    """A stalled step whose retransmits went toward one host names that host's link, however few of its
    connections carried them; the same retransmits in a step that is not slowed add nothing (the
    sequential rules keep their per-step gates), and the pack fires one step_stall on node-02 / network."""
    stalled = ring_summary(30, ring_accs(sent, 1620), window={})
    c = stalled["culprit"]
    assert c is not None and (c["host"], c["layer"], c["source"]) == ("node-02", "network", "evidence"), c
    assert stalled["evidence"]["hosts"]["node-02"]["network"] >= 2.0
    assert set(stalled["evidence"]["hosts"]) == {"node-02"}
    # x1.2, not slowed: only the per-step network evidence (the directed view names the second shape)
    accs = ring_accs(sent, 160)
    usual = ring_summary(30, accs, window={})
    per_step = {h: v.z for h, v in analysis.net_evidence(accs, analysis.Thresholds()).items()}
    assert {h: e["network"] for h, e in usual["evidence"]["hosts"].items() if e["network"]} == per_step
    if sent is BLACKOUTS[0]:  # the recorded miss: nothing per step, and nothing in a step not slowed
        assert per_step == {}
    rows = [summary(i, 130 + (i % 3) * 4) for i in range(20)] + [dict(stalled, baseline=summary(0, 1)["baseline"])]
    rows += [summary(i, 132) for i in range(21, 30)]
    rows = charge(rows)
    firing = fire(rows)
    stall = [(a["rule"], a["labels"]["host"], a["labels"]["layer"]) for a in firing if a["rule"] in STALL_RULES]
    assert stall == [("step_stall", "node-02", "network")], stall


def test_retransmits_toward_a_host_count_only_as_a_back_off_that_stands_out():
    th = analysis.Thresholds()
    # a rank stopped or starved for 800 ms: one spurious timeout on each neighbour's connection to it
    assert (
        analysis.net_toward_evidence(ring_accs({"node-01": {"node-02": 1}, "node-03": {"node-02": 1}}, 900), th) == {}
    )
    # two on one connection (a back-off: the recorded blackout of node-01 that caught only node-00 sending)
    got = analysis.net_toward_evidence(ring_accs({"node-01": {"node-02": 2}}, 900), th)
    assert got == {"node-02": analysis.NetEvidence(2.0, 2, 0, 0, 0, "toward")}
    # one retransmit toward it and one toward another host: nothing
    assert (
        analysis.net_toward_evidence(ring_accs({"node-01": {"node-02": 1}, "node-03": {"node-00": 1}}, 900), th) == {}
    )
    # as many toward a neighbour as toward it (less than count_factor times the second): nobody stands out
    both = {"node-01": {"node-02": 4}, "node-03": {"node-00": 3}}
    assert analysis.net_toward_evidence(ring_accs(both, 900), th) == {}
    # 14 toward node-02, 6 toward node-03 (the recorded 8 % loss step): node-02, (14 - 6) / sqrt(7)
    loss = {"node-01": {"node-02": 2}, "node-03": {"node-02": 12}, "node-00": {"node-03": 6}}
    got = analysis.net_toward_evidence(ring_accs(loss, 900), th)
    assert got == {"node-02": analysis.NetEvidence(3.0, 14, 6, 0, 0, "toward")}  # 3.024, clipped to net_toward_clip
    assert analysis.net_toward_evidence(ring_accs(loss, 900), analysis.Thresholds(net_toward_clip=7.0)) == {
        "node-02": analysis.NetEvidence(3.024, 14, 6, 0, 0, "toward")
    }


def test_a_starved_host_whose_sockets_look_lossy_is_named_by_its_run_queue_time():
    """A CPU burst that hits a rank while it waits inside a collective: nobody arrives late, its peers'
    segments wait for its ACKs and are retransmitted toward it (network evidence), but its own run-queue
    time explains the stall: sched, not network. A blackout's host, whose run-queue time is its peers',
    stays network."""
    starved = summary(
        783,
        970,
        ev={"node-02": {"network": 2.0}},
        layers={h: {"sched": 700 if h == "node-02" else 30} for h in HOSTS4},
    )
    c = analysis.culprit(starved)
    assert (c["host"], c["layer"], c["source"]) == ("node-02", "sched", "layers"), c
    assert "looked lossy too (network evidence 2)" in c["why"]
    blackout = summary(241, 1620, ev={"node-02": {"network": 2.121}}, layers={h: {"sched": 40} for h in HOSTS4})
    assert (analysis.culprit(blackout)["host"], analysis.culprit(blackout)["layer"]) == ("node-02", "network")
    # the run-queue time of another host does not take a blackout's host away
    other = summary(
        241,
        1620,
        ev={"node-02": {"network": 2.121}},
        layers={h: {"sched": 900 if h == "node-00" else 40} for h in HOSTS4},
    )
    assert (analysis.culprit(other)["host"], analysis.culprit(other)["layer"]) == ("node-02", "network")


@pytest.mark.parametrize(
    "own_net,peer_net,sched,want",
    [
        (2.0, 2.0, (124, 135, 63, 691), ("node-03", "sched")),  # the live step: a tie node-02 won by its name
        (2.0, 3.2, (124, 135, 63, 691), ("node-02", "network")),  # a peer's loss of its own (3 spreads)
        (0.0, 2.0, (124, 135, 63, 691), ("node-02", "network")),  # no lossy socket on the starved host
        # 2.9x its busiest peer: not starved; the tie of node-02 and node-03 names nobody (demo20: it was
        # node-02 / network by its name, which fired nothing either)
        (2.0, 2.0, (124, 235, 63, 691), None),
    ],
)
def test_a_starved_host_tied_with_a_peer_in_network_evidence_is_named_by_its_run_queue(own_net, peer_net, sched, want):
    # 300 ms CPU bursts of node-03 every 3 s (live, 2026-12-06, /tmp/burst12/split300-n3, step 221): the
    # burst hit node-03 while every rank waited in a collective, x2.94 of a 133 ms median; node-02 and
    # node-03 each had network evidence 2.0 (retransmits toward the starved host and its late ACKs) and the
    # host name gave node-02 / network, which fired nothing (under stall_specific_net_evidence): missed.
    # node-03's run-queue time, 5x its busiest peer's, explains the stall.
    rng = __import__("random").Random(221)
    at_median = at_median_of(133.0)
    ev = {"node-00": {"pytorch": 0.603}, "node-02": {"network": peer_net}, "node-03": {"network": own_net}}
    s = at_median(
        summary(
            20,
            392,
            ev=ev,
            strag=("node-03", 34),
            layers={h: {"sched": ms} for h, ms in zip(HOSTS4, sched)},
            spread_ms=13,
        )
    )
    s["net_directed"] = True
    steps = charge([*(at_median(x) for x in clean_steps(0, 20, rng)), s, at_median(summary(21, 133))])
    c = steps[20]["culprit"]
    assert (c and (c["host"], c["layer"])) == want, c
    fired = stall_alerts(steps)
    # a directed network culprit fires from 3 spreads (stall_specific_net_evidence), under it nothing does
    assert fired == ([("step_stall", *want)] if want and (want[1] == "sched" or peer_net >= 3) else []), fired


@pytest.mark.parametrize(
    "median_ms,tmax_ms,directed,sched,fires",
    [
        # 200 ms blackouts of node-00 every 3 s (live, 2026-12-06, /tmp/burst12/split200-n0-base): 2.1 spreads
        # of directed network evidence, under stall_specific_net_evidence, and under stall_k or its floor
        (112.0, 320.6, True, (49, 51, 66, 28), True),  # step 1423: x2.86, 209 ms lost
        (118.7, 331.4, True, (70, 93, 84, 76), True),  # step 1552: x2.79, 213 ms, every run queue up alike
        # at load 2-3 (a 158 ms median) a 200 ms blackout of node-03 lost 219 ms at x2.38 (rqveto14 step 254)
        (158.3, 377.3, True, (40, 40, 40, 40), True),
        (140.0, 308.0, True, (40, 40, 40, 40), True),  # at stall_weak_net_k: x2.20
        (140.0, 306.6, True, (40, 40, 40, 40), False),  # x2.19
        (62.0, 161.0, True, (20, 20, 20, 20), False),  # x2.60, but 99 ms lost: under stall_specific_floor_ns
        (112.0, 320.6, False, (49, 51, 66, 28), False),  # no directed charge: the same evidence is no blackout
        (112.0, 320.6, True, (49, 51, 66, 300), False),  # node-03's run queue 4.5x the busiest other's: vetoed
    ],
)
def test_a_directed_network_culprit_under_3_spreads_fires_from_x2_2_unless_a_run_queue_vetoes_it(
    median_ms, tmax_ms, directed, sched, fires
):
    rng = __import__("random").Random(int(tmax_ms))
    at_median = at_median_of(median_ms)
    clean = [at_median(summary(i, median_ms * rng.uniform(0.9, 1.15))) for i in range(20)]
    layers = {h: {"sched": ms} for h, ms in zip(HOSTS4, sched)}
    s = at_median(summary(20, tmax_ms, ev={"node-00": {"network": 2.121}}, layers=layers, spread_ms=10))
    s["net_directed"] = directed
    steps = charge([*clean, s, at_median(summary(21, median_ms))])
    c = steps[20]["culprit"]
    assert (c["host"], c["layer"], c["source"], c["runq_veto"]) == ("node-00", "network", "evidence", sched[3] == 300)
    assert stall_alerts(steps) == ([("step_stall", "node-00", "network")] if fires else []), c


@pytest.mark.parametrize(
    "view,directed,fires",
    [
        ("toward", False, True),  # the live step: node-00 sent 2 retransmits toward node-03, nobody else any
        ("toward", True, True),
        ("drops", False, True),  # the host's own dropped segments (netdrop16 step 404: no toward back-off)
        ("rx", False, False),  # undirected loss of its own connections: no blackout's charge
        ("rtt", False, False),  # an RTT outlier
        (None, False, False),  # an older worker's summary: no view
    ],
)
def test_the_peers_back_off_toward_a_host_names_a_blackout_below_x2_5_when_the_step_is_not_directed(
    view, directed, fires
):
    # a 200 ms blackout of node-03 every 3 s at load 2-3 (live, 2026-12-06, /tmp/rqveto14/runs/new-n3, step
    # 329): x2.27 of a 172 ms median, 219 ms lost, node-03 at 2.0 spreads from node-00's two retransmits
    # toward it on one connection (the toward view); the directed view wants every busy connection: missed
    rng = __import__("random").Random(329)
    at_median = at_median_of(172.4)
    clean = [at_median(summary(i, 172.4 * rng.uniform(0.9, 1.15))) for i in range(20)]
    layers = {h: {"sched": ms} for h, ms in zip(HOSTS4, (158, 188, 165, 172))}
    s = at_median(summary(20, 391.4, ev={"node-03": {"network": 2.0}}, layers=layers, spread_ms=20))
    s["net_directed"] = directed
    if view is not None:
        s["evidence"]["net_view"] = {"node-03": view}
    steps = charge([*clean, s, at_median(summary(21, 172.4))])
    c = steps[20]["culprit"]
    assert (c["host"], c["layer"], c.get("net_view"), c["runq_veto"]) == ("node-03", "network", view, False), c
    assert stall_alerts(steps) == ([("step_stall", "node-03", "network")] if fires else []), c


@pytest.mark.parametrize(
    "sched,want",
    [
        # rqveto14 step 254 (live, a 200 ms blackout of node-03, x2.38, 219 ms lost): node-03's run queue
        # +61.6 ms over its peers' median, 28 % of the loss, 1.3x the busiest peer's: its link
        ((78.7, 89.3, 118.7, 150.8), ("node-03", "network", "evidence")),
        ((78.7, 89.3, 118.7, 198.0), ("node-03", "network", "evidence")),  # +108.7 ms: 49.6 % of the loss
        ((78.7, 89.3, 118.7, 199.5), ("node-03", "sched", "layers")),  # +110.2 ms: 50.3 %
        ((30, 30, 30, 330), ("node-03", "sched", "layers")),  # a burst: 137 %, starved
    ],
)
def test_a_network_best_gives_way_to_its_own_hosts_run_queue_only_when_it_explains_half_the_loss(sched, want):
    s = at_median_of(158.3)(
        summary(
            20,
            377.3,
            ev={"node-02": {"sched": 0.226}, "node-03": {"network": 2.0}},
            layers={h: {"sched": ms} for h, ms in zip(HOSTS4, sched)},
            spread_ms=36.5,
        )
    )
    s["net_directed"] = True
    c = analysis.culprit(s)
    assert (c["host"], c["layer"], c["source"]) == want, c


@pytest.mark.parametrize(
    "sched,vetoed",
    [
        ((124, 135, 63, 691), True),  # the live step: node-03's run queue 5.1x the busiest other's, +567 ms
        ((124, 235, 63, 691), True),  # 2.9x
        ((124, 135, 63, 210), True),  # 1.56x, +86 ms over its peers' median (33 % of the 259 ms lost)
        ((124, 135, 63, 190), False),  # 1.41x: load, not a burst of one host
        ((20, 20, 20, 60), False),  # 3x, but +40 ms over its peers' median explains 15 % of the loss
    ],
)
def test_a_peers_weak_network_culprit_beside_a_burst_is_vetoed_by_the_burst_hosts_run_queue(sched, vetoed):
    # burst12 step 221 (x2.94 of a 133 ms median) without node-03's own lossy sockets: the tie rule cannot
    # name node-03, so the culprit stays node-02 / network at 2.0 spreads (its retransmits toward the
    # starved host); the burst host's run queue keeps stall_weak_net from firing on it
    rng = __import__("random").Random(221)
    at_median = at_median_of(133.0)
    ev = {"node-00": {"pytorch": 0.603}, "node-02": {"network": 2.0}}
    layers = {h: {"sched": ms} for h, ms in zip(HOSTS4, sched)}
    s = at_median(summary(20, 392, ev=ev, strag=("node-03", 34), layers=layers, spread_ms=13))
    s["net_directed"] = True
    steps = charge([*(at_median(x) for x in clean_steps(0, 20, rng)), s, at_median(summary(21, 133))])
    c = steps[20]["culprit"]
    assert (c["host"], c["layer"], c["runq_veto"]) == ("node-02", "network", vetoed), c
    assert ("node-03's run queue vetoes it" in c["why"]) == vetoed, c["why"]
    assert stall_alerts(steps) == ([] if vetoed else [("step_stall", "node-02", "network")])


@pytest.mark.parametrize(
    "sched,vetoed",
    [
        ((463, 462, 1450, 1443), True),  # the live step: node-02 and node-03 starved alike, 3.1x the others
        ((463, 462, 560, 600), False),  # no gap of 1.5x between any two hosts: load, no starved group
        ((1450, 462, 1443, 463), False),  # two starved hosts, the culprit not among them
        ((1300, 462, 1450, 1443), False),  # 3 of 4 hosts high: the machine, not two hosts (at most half)
    ],
)
def test_a_network_culprit_starved_alike_with_another_host_is_vetoed_by_their_run_queues(sched, vetoed):
    # frame21-lightning-cpuproc step 316 (Lightning, 4 x 2 ranks on 2 cores, a process hog on node-02):
    # x2.55 of a 246 ms median, node-02 and node-03 1,450 and 1,443 ms of run-queue time against 462-463;
    # node-03 / network at 2.8 spreads of toward (its peers' retransmits toward a host that answered late)
    # fired a wrong step_stall through stall_weak_net: the single-host veto saw node-02 only 1.0x node-03
    rng = __import__("random").Random(316)
    at_median = at_median_of(246.0)
    layers = {h: {"sched": ms} for h, ms in zip(HOSTS4, sched)}
    s = at_median(summary(20, 628.0, ev={"node-03": {"network": 2.828}}, layers=layers, spread_ms=29))
    s["net_directed"] = True
    s["evidence"]["net_view"] = {"node-03": "toward"}
    steps = charge([*(at_median(x) for x in clean_steps(0, 20, rng)), s, at_median(summary(21, 246.0))])
    c = steps[20]["culprit"]
    assert (c["host"], c["layer"], c.get("runq_veto")) == ("node-03", "network", vetoed), c
    assert ("the run queues of node-02 and node-03 veto it" in c["why"]) == vetoed, c["why"]
    assert stall_alerts(steps) == ([] if vetoed else [("step_stall", "node-03", "network")])


@pytest.mark.parametrize(
    "directed,view,want",
    [
        (False, "rx", ("node-02", "sched")),  # the live step: node-01's own lossy sockets, undirected
        (False, "rtt", ("node-02", "sched")),
        (False, None, ("node-02", "sched")),  # an older worker's summary: no view
        (True, "rx", ("node-01", "network")),  # directed toward node-01: a blackout's shape stays its link's
        (False, "toward", ("node-01", "network")),  # its peers' back-off toward it: a blackout's view
        (False, "drops", ("node-01", "network")),  # its own dropped segments: a blackout's view
    ],
)
def test_a_starved_hosts_run_queue_vetoing_anothers_undirected_network_evidence_names_the_starved_host(
    directed, view, want
):
    # rank17's base node-02 run (2 ranks per host, 2026-12-06, step 279): an 800 ms burst on node-02 rank 4
    # across a step boundary, x5.8 of a 180 ms median, nobody late; node-01 at 2 spreads of rx evidence,
    # node-02's run queue 2717 ms, 4.8x the busiest other host's and 280 % of the loss: was node-01 /
    # network (runq_veto) and a wrong step_stall by stall_k
    rng = __import__("random").Random(279)
    at_median = at_median_of(179.8)
    layers = {h: {"sched": ms} for h, ms in zip(HOSTS4, (567.5, 317.2, 2717.2, 152.7))}
    s = at_median(summary(20, 1037.4, ev={"node-01": {"network": 2.0}}, layers=layers, spread_ms=31))
    s["net_directed"] = directed
    if view is not None:
        s["evidence"]["net_view"] = {"node-01": view}
    steps = charge([*(at_median(x) for x in clean_steps(0, 20, rng)), s, at_median(summary(21, 179.8))])
    c = steps[20]["culprit"]
    assert (c["host"], c["layer"]) == want, c
    if want[1] == "sched":
        assert c["starved"] and "node-01's connections looked lossy (network evidence 2)" in c["why"], c
        assert stall_alerts(steps) == [("step_stall", "node-02", "sched")]
    else:
        assert c["runq_veto"] and "node-02's run queue vetoes it" in c["why"], c


def test_a_stopped_ranks_peers_retransmitting_toward_it_are_no_blackout():
    """A rank stopped (SIGSTOP) for 800 ms arrives late at its collective and its two neighbours each sent
    it two retransmits (the recorded node-02 process stall, 2026-12-05): that is its process, not its
    link. The same retransmits toward a host that waited with the others are a blackout's."""
    th = analysis.Thresholds()
    sent = {"node-01": {"node-02": 2}, "node-03": {"node-02": 2}}
    waited = ring_accs(sent, 900)
    assert analysis.net_toward_evidence(waited, th) == {"node-02": analysis.NetEvidence(3.0, 4, 0, 0, 0, "toward")}
    stopped = ring_accs(sent, 900)
    stopped["node-02"]["colls"]["0#0"][1] += 740 * MS  # it reached the first all-reduce 740 ms after the others
    assert analysis.net_toward_evidence(stopped, th) == {}
    # (two toward it on each of its connections also meet the per-step directed view, net_count_min 2:
    # a stopped rank that hangs is charged by its hang record, docs/ANALYSIS.md "Culprit of a step")


def test_a_rank_stopped_inside_a_collective_is_the_process_culprit_ahead_of_its_peers_network_view():
    # a SIGSTOP of node-01's rank 5 while it waited inside a collective: nobody is late, its peers'
    # retransmits toward it give node-01 network evidence; the kernel saw its threads stopped 780 ms
    s = summary(400, 990, ev={"node-01": {"network": 4.0}}, stopped={"node-01": (780, 5)})
    c = analysis.culprit(s)
    assert (c["host"], c["layer"], c["source"], c["rank"]) == ("node-01", "process", "stopped", 5), c
    assert "rank 5 stopped" in c["why"] and "780.0 ms" in c["why"]
    assert analysis.culprit_rank(c, s)["rank"] == 5
    # the same step without the stop is its link's (the peers' view), as before
    assert analysis.culprit(summary(400, 990, ev={"node-01": {"network": 4.0}}))["layer"] == "network"
    # ahead of another host's lateness too (a stopped rank's peers arrive late after it resumes)
    s = summary(401, 990, ev={"node-02": {"pytorch": 9.0}}, strag=("node-02", 600), stopped={"node-01": (760, None)})
    c = analysis.culprit(s)
    assert (c["host"], c["source"], c["rank"]) == ("node-01", "stopped", None) and "a rank stopped" in c["why"]
    # a stop that explains little of the stall (40 ms of 850 lost) is no culprit; the usual order decides
    s = summary(402, 990, ev={"node-03": {"network": 5.0}}, stopped={"node-01": (40, 1)})
    assert (analysis.culprit(s)["host"], analysis.culprit(s)["source"]) == ("node-03", "evidence")
    # two hosts stopped about as long (a job stopped whole): no single rank's fault from the stops
    s = summary(403, 990, stopped={"node-01": (800, 1), "node-02": (700, 2)})
    assert analysis.culprit(s) is None
    # without a baseline a stop of at least STOPPED_MIN_NS names its rank; a shorter one does not
    assert analysis.culprit(summary(5, 990, n=0, stopped={"node-02": (60, 2)}))["source"] == "stopped"
    assert analysis.culprit(summary(5, 990, n=0, stopped={"node-02": (20, 2)})) is None


def test_a_persistent_fault_does_not_swallow_a_stopped_rank():
    recent = [("node-00", "network")] * 4  # node-00's lossy link charged for the last steps
    s = summary(500, 990, ev={}, stopped={"node-03": (700, 3)})
    s["culprit"] = analysis.culprit(s)
    c, key = analysis.charge_persistent(s, recent)
    assert (c["host"], c["source"], key) == ("node-03", "stopped", None)


@pytest.mark.parametrize("stop_ms,median_ms", [(300, 250), (200, 140), (2000, 250)])
def test_a_short_stop_fires_from_the_specific_ratio_and_clean_steps_of_the_same_size_fire_nothing(stop_ms, median_ms):
    # a stopped rank's step at x2-x2.2 of a loaded median (below stall_k 3) fires step_stall with the rank;
    # the same step time with no stop (clean jitter of a loaded machine) fires nothing
    rng = __import__("random").Random(stop_ms)
    scale = median_ms / (MEDIAN_NS / 1e6)

    def scaled(x):
        x["step_time_max_ns"] = int(x["step_time_max_ns"] * scale)
        x["step_time_ns"] = dict.fromkeys(HOSTS4, x["step_time_max_ns"])
        x["baseline"] = dict(x["baseline"], median_ns=int(median_ms * 1e6))
        x["stall_ratio"] = round(x["step_time_max_ns"] / (median_ms * 1e6), 3)
        return x

    tmax = (median_ms + stop_ms) / scale
    base = [scaled(x) for x in clean_steps(0, 20, rng)]
    stopped = charge([*base, scaled(summary(20, tmax, stopped={"node-02": (stop_ms, 6)})), scaled(summary(21, 140))])
    fired = [a for a in fire(stopped) if a["rule"].startswith("step_stall")]
    assert [(a["rule"], a["labels"]["host"], a["labels"]["layer"], a["labels"]["rank"]) for a in fired] == [
        ("step_stall", "node-02", "process", "6")
    ], fired
    base = [scaled(x) for x in clean_steps(0, 20, __import__("random").Random(stop_ms))]
    clean = charge([*base, scaled(summary(20, tmax, strag=("node-02", 40))), scaled(summary(21, 140))])
    fired = [a for a in fire(clean) if a["rule"].startswith("step_stall")]
    if stop_ms / median_ms < 2.0:  # below x3 and no stop: nothing (x3 and more is the general rule's)
        assert not fired, fired


def kept_stops() -> dict:
    """The kept run of 4 SIGSTOPs of 300 ms of node-01's local rank 2 (global 6) in a 4-host x 4-rank job on 2
    cores (tests/rules/data/stop19_stops.json.gz: its closed step summaries as the worker sent them, without
    their ``ranks``/``collectives``, and the stalls' start times)."""
    return json.loads(gzip.decompress((Path(__file__).parent / "data" / "stop19_stops.json.gz").read_bytes()))


def fire_at_close(summaries):
    """Every firing change of the builtin pack over ``summaries``, each at its own ``closed_at_ns``."""
    changes: list[dict] = []
    engine = Engine(builtin_pack(), changes.append)
    for s in summaries:
        engine.process("steps", fields.step_record(s))
        engine.tick(s["closed_at_ns"])
    engine.tick(engine.now_ns + 60_000_000_000)
    return [c for c in changes if c["status"] == "firing"]


def test_a_short_stop_of_one_rank_among_16_is_named_when_it_cost_the_job_and_not_when_it_cost_nothing():
    # 16 ranks on 2 cores at load 8-26: the median step is 600-700 ms, so a 300 ms stop of rank 6 costs at
    # most x1.36 (under stall_specific_k 1.5): steps 52 (208 ms lost, x1.33, the hang record of the
    # all_reduce it held up names it) and 71 (213 ms, x1.36, its stop) fire step_stall with rank 6; steps 31
    # and 89 (x0.94, x1.02: its CPU went to its 15 peers) carry the same culprit but cost the job nothing
    doc = kept_stops()
    steps = sorted(doc["steps"], key=lambda s: s["closed_at_ns"])
    stops = {s["step"]: s for s in steps if s["stopped"]}
    assert sorted(stops) == [31, 52, 71, 89]
    for no, s in stops.items():  # the culprit the worker sent is still what culprit() names from the summary
        c = s["culprit"]
        assert (c["host"], c["layer"], c["rank"]) == ("node-01", "process", 6), (no, c)
        if c["source"] != "hang":
            assert analysis.culprit(s) == c, (no, c)
    firing = fire_at_close([s for s in steps if s["closed_by"] == "complete"])
    got = [(a["rule"], a["labels"].get("host"), a["labels"].get("layer"), a["labels"].get("rank")) for a in firing]
    stall = [(a["rule"], a["annotations"]["step"], a["labels"]["rank"]) for a in firing if a["rule"] == "step_stall"]
    assert stall == [("step_stall", "52", "6"), ("step_stall", "71", "6")], got
    assert all(g[1:3] == ("node-01", "process") for g in got), got  # nothing else, on no other host
    # the stall each alert names started at most 2 s before its step closed
    for a in firing:
        step = stops[int(a["annotations"]["step"])]
        assert any(0 < step["closed_at_ns"] - t < 2_000_000_000 for t in doc["stall_starts_ns"]), a


@pytest.mark.parametrize(
    "source,stop_ms,stop_rank,tmax_ms,fires",
    [
        ("stopped", 271, 6, 809, True),  # step 71: 213 ms over a 596 ms median, x1.36
        ("hang", 298, 6, 839, True),  # step 52: the hang record of the collective it held up names it
        ("stopped", 280, 6, 640, False),  # step 89: x1.02, 16 ms lost: the stop cost the job nothing
        ("stopped", 271, 6, 690, False),  # 94 ms lost (under stall_specific_floor_ns)
        ("stopped", 271, 6, 710, False),  # 114 ms lost but x1.19 (under stall_stopped_k 1.2)
        ("stopped", 90, 6, 809, False),  # a stop under stall_stopped_min_ns (100 ms)
        ("hang", 298, 5, 839, False),  # the hang names another rank than the stopped one
        ("evidence", 271, 6, 809, False),  # lateness of the host without the stop as culprit: general rules
    ],
)
def test_stall_stopped_needs_the_stopped_rank_as_culprit_and_a_measurable_cost(
    source, stop_ms, stop_rank, tmax_ms, fires
):
    median_ms = 596
    base = [
        dict(
            s,
            step_time_max_ns=int(s["step_time_max_ns"] * median_ms / 140),
            baseline=dict(s["baseline"], median_ns=median_ms * 1_000_000),
        )
        for s in clean_steps(0, 20, __import__("random").Random(7))
    ]
    for s in base:
        s["stall_ratio"] = round(s["step_time_max_ns"] / (median_ms * 1e6), 3)
        s["culprit"] = None
    s = summary(20, tmax_ms, stopped={"node-01": (stop_ms, stop_rank)})
    s["baseline"] = dict(s["baseline"], median_ns=median_ms * 1_000_000)
    s["stall_ratio"] = round(tmax_ms / median_ms, 3)
    why = "the step hung on it (stopped)" if source == "hang" else "rank 6 stopped"
    s["culprit"] = {"host": "node-01", "layer": "process", "rank": 6, "evidence": 0.0, "source": source, "why": why}
    fired = [
        (a["rule"], a["labels"]["host"], a["labels"]["rank"])
        for a in fire([*base, s])
        if a["rule"].startswith("step_stall")
    ]
    assert fired == ([("step_stall", "node-01", "6")] if fires else []), fired


def test_a_burst_on_one_rank_of_a_host_names_that_rank_by_its_run_queue_time():
    # a CPU burst pinned to node-02's local rank 1 (global 5) while the ranks waited inside a collective:
    # nobody late; node-02's run-queue time is up by most of the stall, and rank 5's row holds it
    s = summary(
        60,
        990,
        layers={
            "node-00": {"sched": 12},
            "node-01": {"sched": 10},
            "node-02": {"sched": 640},
            "node-03": {"sched": 11},
        },
    )
    s["evidence"]["ranks"] = {"node-02": 4}  # the host's named rank (another one): not the burst's
    cell = lambda ms: {"sched": {"time_ns": int(ms * 1e6), "count": 3, "max_ns": int(ms * 1e6)}}  # noqa: E731
    s["ranks"] = {"node-02": {"4": {"layers": cell(9)}, "5": {"layers": cell(631)}}}
    c = analysis.culprit_rank(analysis.culprit(s), s)
    assert (c["host"], c["layer"], c["source"], c["rank"]) == ("node-02", "sched", "layers", 5), c
    s["ranks"] = {"node-02": {"4": {"layers": cell(600)}, "5": {"layers": cell(40)}}}
    assert analysis.culprit_rank(analysis.culprit(s), s)["rank"] == 4


@pytest.mark.parametrize(
    "ev,directed,stopped,want",
    [
        ({"node-03": {"network": 3.0}}, True, None, ("node-03", "network")),  # a 300 ms blackout at x1.9
        ({"node-03": {"network": 3.0}}, False, None, None),  # the same without the directed view's charge
        ({"node-01": {"network": 2.0}}, True, None, None),  # two stray retransmits toward a host: too weak
        ({"node-03": {"sched": 5.6}}, False, None, None),  # run-queue evidence keeps stall_k (loaded hosts)
        ({}, False, {"node-01": (200, 1)}, ("node-01", "process")),  # a stop that overlapped idle time
    ],
)
def test_specific_evidence_names_a_stall_from_x1_5_and_other_culprits_keep_stall_k(ev, directed, stopped, want):
    rng = __import__("random").Random(5)
    s = summary(20, 1.9 * MEDIAN_NS / 1e6, ev=ev, stopped=stopped, strag=("node-03", 120) if ev else None)
    s["net_directed"] = directed
    fired = [a for a in fire(charge([*clean_steps(0, 20, rng), s])) if a["rule"].startswith("step_stall")]
    got = [(a["labels"]["host"], a["labels"]["layer"]) for a in fired]
    assert got == ([want] if want else []), fired


@pytest.mark.parametrize("records,want", [(20, [("node-03", "memory")]), (0, [])])
def test_a_rank_at_its_memory_limit_fires_from_x1_5_and_plain_lateness_keeps_stall_k(records, want):
    # a 300 ms memory stall (node-03 campaign, 2026-12-05): late by 205 ms of a x1.9 step, with the
    # kernel's reclaim retries in its memory row; without them the same lateness is the process's (x3)
    rng = __import__("random").Random(7)
    s = summary(20, 1.9 * MEDIAN_NS / 1e6, ev={"node-03": {"pytorch": 7.0}}, strag=("node-03", 120))
    s["straggler"]["group"] = [{"host": "node-03", "late_ns": 120_000_000}]
    if records:
        s["layers"] = {"node-03": {"memory": {"time_ns": 500_000, "count": records, "max_ns": 90_000}}}
    fired = [a for a in fire(charge([*clean_steps(0, 20, rng), s])) if a["rule"].startswith("step_stall")]
    assert [(a["labels"]["host"], a["labels"]["layer"]) for a in fired] == want, fired


# recorded shapes (docs/BENCHMARKS.md 8): median ms, step ms, spread ms, {host: sched evidence}, {host:
# run-queue ms}, straggler (host, excess ms); the culprit's host is the one with the largest evidence
STARVED_SHAPES = [
    # 300 ms CPU bursts of node-03 at x2.1-x2.5: starved, fired below stall_k
    ((225, 481, 51, {"node-03": 5.18, "node-01": 0.59}, (74, 128, 70, 697), ("node-03", 236)), True, True),
    ((166, 414, 32, {"node-03": 6.01, "node-00": 0.19}, (122, 86, 116, 611), ("node-03", 190)), True, True),
    # a burst at x2.35 whose run-queue time was 2.6x a peer's: not far enough above (stall_k keeps it)
    ((172, 404, 35, {"node-03": 5.58}, (121, 88, 119, 316), ("node-03", 227)), False, False),
    # clean loaded steps: an outside starvation of node-01 at x1.82 (2.9x its busiest peer), a neighbour's
    # burst spilling onto node-00 at x1.52 (starved, but under stall_starved_k), a busy peer (run-queue 1.6x
    # it, evidence 2.25), a peer of 131 ms against 297 at x2.97 (2.3x), an outside starvation of node-00 at
    # x2.3 during a 300 ms burst run on node-03 (2.8x its busiest peer: fired at STARVED_PEER_FACTOR 2.5)
    ((185, 336, 34, {"node-01": 5.15, "node-02": 0.55}, (51, 238, 82, 43), ("node-01", 163)), False, False),
    ((203, 308, 25, {"node-00": 3.0}, (192, 48, 51, 40), ("node-00", 90)), True, False),
    ((135, 274, 20, {"node-01": 5.95, "node-02": 2.25}, (26, 168, 106, 20), ("node-01", 120)), False, False),
    ((144, 427, 40, {"node-02": 6.58, "node-00": 0.72}, (97, 131, 297, 80), ("node-02", 250)), False, False),
    ((168, 395, 27, {"node-00": 7.0}, (272, 97, 19, 20), ("node-00", 249)), False, False),
]


def at_median_of(median_ms):
    """A function that sets a step summary's baseline median to ``median_ms`` and its stall ratio to match."""

    def at_median(x):
        x["baseline"] = dict(x["baseline"], median_ns=int(median_ms * 1e6))
        x["stall_ratio"] = round(x["step_time_max_ns"] / (median_ms * 1e6), 3)
        return x

    return at_median


def sched_step(median_ms, tmax_ms, ev, sched, strag, spread_ms):
    """Step 20 of HOSTS4 lasting ``tmax_ms`` with per-host sched evidence ``ev`` and sched times ``sched`` (ms)."""
    layers = {h: {"sched": ms} for h, ms in zip(HOSTS4, sched)}
    ev = {h: {"sched": z} for h, z in ev.items()}
    return at_median_of(median_ms)(summary(20, tmax_ms, ev=ev, strag=strag, layers=layers, spread_ms=spread_ms))


@pytest.mark.parametrize("shape,starved,fires", STARVED_SHAPES)
def test_a_host_starved_far_beyond_its_peers_fires_below_stall_k_and_loaded_clean_steps_do_not(shape, starved, fires):
    median_ms, tmax_ms, spread_ms, ev, sched, strag = shape
    rng = __import__("random").Random(int(tmax_ms))
    at_median = at_median_of(median_ms)
    s = sched_step(median_ms, tmax_ms, ev, sched, strag, spread_ms)
    steps = charge([*(at_median(x) for x in clean_steps(0, 20, rng)), s, at_median(summary(21, median_ms))])
    c = steps[20]["culprit"]
    host = max(ev, key=ev.get)
    assert (c["host"], c["layer"], c["source"], c["starved"]) == (host, "sched", "evidence", starved), c
    assert ("; starved: run-queue" in c["why"]) == starved, c["why"]
    fired = stall_alerts(steps)
    assert fired == ([("step_stall", host, "sched")] if fires else []), fired


def test_starved_needs_every_part_of_its_criterion():
    # the first recorded burst (x2.14), then each condition broken alone: no longer starved
    def s(ev=None, sched=(74, 128, 70, 697), tmax=481, n=50):
        x = summary(
            416,
            tmax,
            ev=ev or {"node-03": {"sched": 5.18}, "node-01": {"sched": 0.59}},
            strag=("node-03", 236),
            layers={h: {"sched": ms} for h, ms in zip(HOSTS4, sched)},
            spread_ms=51,
            n=n,
        )
        x["baseline"]["median_ns"] = 225_000_000
        return analysis.culprit(x)

    assert s()["starved"] is True
    assert s(ev={"node-03": {"sched": 2.9}})["starved"] is False  # evidence under 3 spreads
    assert s(ev={"node-03": {"sched": 5.18}, "node-01": {"sched": 1.8}})["starved"] is False  # a peer's over a third
    assert s(sched=(74, 233, 70, 697))["starved"] is False  # a peer at 2.99x less: not far above every peer
    assert s(sched=(74, 128, 70, 230))["starved"] is False  # explains 61 % of the 256 ms lost, but 1.8x a peer
    assert s(sched=(74, 128, 70, 390))["starved"] is True  # 3x the busiest peer
    assert s(sched=(20, 40, 30, 160))["starved"] is False  # 4x every peer, but +130 ms: 51 % of the 256 lost
    assert "starved" not in (s(n=0) or {}) or s(n=0)["starved"] is False  # no baseline: never starved
    x = summary(416, 481, ev={"node-03": {"sched": 5.18}}, strag=("node-03", 236), spread_ms=51)
    assert analysis.culprit(x)["starved"] is False  # no layer rows (a wide step's omitted host)


@pytest.mark.parametrize("tmax_ms,fires", [(498, False), (730, True)])
def test_a_run_queue_culprit_that_is_not_starved_needs_stall_sched_k(tmax_ms, fires):
    # make demo's clean run beside a test suite (2026-12-05): node-00 x3.2 with 378 ms of run-queue time
    # against its peers' 150-176 (2.1x: its peers waited too); the same culprit at x4.6 still fires
    rng = __import__("random").Random(327)

    def at_median(x):
        x["baseline"] = dict(x["baseline"], median_ns=157_600_000)
        x["stall_ratio"] = round(x["step_time_max_ns"] / 157_600_000, 3)
        return x

    s = at_median(
        summary(
            20,
            tmax_ms,
            ev={"node-00": {"sched": 3.99}, "node-02": {"sched": 0.23}},
            strag=("node-00", 200),
            layers={h: {"sched": ms} for h, ms in zip(HOSTS4, (378, 165, 176, 150))},
            spread_ms=53,
        )
    )
    steps = charge([*(at_median(x) for x in clean_steps(0, 20, rng)), s, at_median(summary(21, 150))])
    assert (steps[20]["culprit"]["layer"], steps[20]["culprit"]["starved"]) == ("sched", False)
    fired = [(a["rule"], a["labels"]["host"]) for a in fire(steps) if a["rule"].startswith("step_stall")]
    assert fired == ([("step_stall", "node-00")] if fires else []), fired


def test_lateness_of_a_host_whose_link_was_just_named_is_its_links():
    # persistent 8 % loss on node-00 (ttd campaign, 2026-12-05): one step names node-00 / network (2.0),
    # the next loses 1.5 s to a retransmission back-off with node-00 late by 629 ms and no retransmit
    # inside it: charged to node-00 / network, not its process; another host's lateness keeps its own
    rng = __import__("random").Random(1297)
    late = summary(21, 1646, ev={"node-00": {"pytorch": 7.0, "sched": 1.05}}, strag=("node-00", 629))
    other = summary(21, 1646, ev={"node-02": {"pytorch": 7.0}}, strag=("node-02", 629))
    for s, want in ((late, ("node-00", "network", "persistent")), (other, ("node-02", "process", "evidence"))):
        steps = charge([*clean_steps(0, 20, rng), summary(20, 140, ev={"node-00": {"network": 2.0}}), s])
        c = steps[-1]["culprit"]
        assert (c["host"], c["layer"], c["source"]) == want, c


def test_a_cpu_burst_across_a_step_boundary_names_the_starved_host_in_both_steps():
    # stall7, live node-01 800 ms bursts: step 287 named node-01 / sched (its run-queue waits, nobody late),
    # step 288 had node-01 late by 720 ms (its peers waited for it at the first collective) with 18 ms of
    # run-queue time: lateness of the host starved in the step before is its run queue's, not its process's
    rng = __import__("random").Random(7)
    peers = {h: {"sched": 60} for h in HOSTS4 if h != "node-01"}
    starved = summary(20, 890, layers={"node-01": {"sched": 786}, **peers})
    late = summary(
        21, 850, ev={"node-01": {"pytorch": 7.0}}, strag=("node-01", 720), layers={"node-01": {"sched": 18}, **peers}
    )
    steps = charge([*clean_steps(0, 20, rng), starved, late, summary(22, 140)])
    assert (steps[20]["culprit"]["layer"], steps[20]["culprit"]["source"], steps[20]["culprit"]["starved"]) == (
        "sched",
        "layers",
        True,
    )
    assert (steps[21]["culprit"]["host"], steps[21]["culprit"]["layer"]) == ("node-01", "sched")
    assert "starved of CPU" in steps[21]["culprit"]["why"]
    fired = [(a["labels"]["host"], a["labels"]["layer"]) for a in fire(steps) if a["rule"].startswith("step_stall")]
    assert fired and set(fired) == {("node-01", "sched")}, fired
    # the same late step after a clean one stays the process's (nothing starved it)
    steps = charge([*clean_steps(0, 20, __import__("random").Random(7)), summary(20, 140), late])
    assert (steps[21]["culprit"]["host"], steps[21]["culprit"]["layer"]) == ("node-01", "process")


# 300 ms CPU bursts on the 2-core demo host at load 7-8 (live, 2026-12-05, node-02 and node-03 runs kept in
# /tmp/stall8): a burst took CPU from every host, so the burst host's run-queue time stood at 1.75-2.5 times
# its busiest peer's (under STARVED_PEER_FACTOR) while it rose 540-630 ms over its own recent steps and its
# peers' 10-150 ms. The history below is 160-220 ms per host (median about 190), so each value here is
# 190 ms plus the live rise. (step, median ms, step ms, {host: sched evidence}, run-queue ms of
# node-00..03, starved)
SELF_SHAPES = [
    (152, 249, 527, {}, (324, 342, 792, 338), True),  # node-02, nobody late (source layers): x2.1
    (262, 226, 615, {}, (199, 317, 242, 799), True),  # node-03, x2.7: +609 ms, peers +9-127
    # a burst whose peers rose half as much as it (node-02 +542 ms, node-00 +270 ms at x2.2): not 3 times,
    # not starved against its own steps; the burst test (2 times, 271 ms and 97 % of the loss more) names it
    # (starve20; missed before, docs/BENCHMARKS.md 8)
    (305, 229, 507, {}, (460, 201, 732, 366), "burst"),
    # clean steps at load 8: the whole machine's run queues rose (node-02 +770 ms, its peers +347-516 ms at
    # x2.8; node-00 +372 ms, its peers +190-270 ms at x1.96)
    (205, 205, 572, {"node-02": 4.0}, (555, 706, 960, 537), False),
    (273, 212, 415, {"node-00": 3.2}, (595, 420, 380, 460), False),
    # a host that rose about 110 ms more than its busiest peer in a x1.5 step (live step 263: +271 ms,
    # peers +56-155 ms): under 60 % of a median step, jitter
    (263, 212, 317, {"node-02": 3.1}, (355, 246, 461, 300), False),
]


def _self_history(rng, steps):
    """Clean steps of the live run's shape: every host 160-220 ms of run-queue time, medians 210-250 ms."""
    out = []
    for i in range(steps):
        x = summary(i, rng.uniform(200, 250), strag=(rng.choice(HOSTS4), rng.uniform(3, 12)))
        x["layers"] = {
            h: {"sched": {"time_ns": int(rng.uniform(160, 220) * 1e6), "count": 7, "max_ns": 0}} for h in HOSTS4
        }
        out.append(x)
    return out


@pytest.mark.parametrize("step,median_ms,tmax_ms,ev,sched,burst", SELF_SHAPES)  # burst: True, False, "burst"
def test_a_burst_that_loaded_every_host_is_starved_against_its_own_recent_steps(
    step, median_ms, tmax_ms, ev, sched, burst
):
    rng = __import__("random").Random(step)
    at_median = at_median_of(median_ms)
    strag = (max(ev, key=ev.get), 0.5 * (tmax_ms - median_ms)) if ev else None
    s = sched_step(median_ms, tmax_ms, ev, sched, strag, 40)
    host = HOSTS4[max(range(4), key=lambda i: sched[i])]
    # alone (no recent steps of its own) the burst is far above no peer: not starved, below stall_k
    alone = charge([copy.deepcopy(s)])[0]["culprit"]
    assert (alone["host"], alone["layer"], alone["starved"]) == (host, "sched", False), alone
    steps = charge([*(at_median(x) for x in _self_history(rng, 20)), s, at_median(summary(21, median_ms))])
    c = steps[20]["culprit"]
    assert (c["host"], c["layer"], c["starved"]) == (host, "sched", bool(burst)), c["why"]
    assert ("against its own recent steps" in c["why"]) == (burst is True), c["why"]
    assert bool(c.get("burst")) == (burst == "burst") or burst is True, c["why"]
    fired = stall_alerts(steps)
    assert fired == ([("step_stall", host, "sched")] if burst else []), fired


def test_lateness_of_the_host_whose_link_its_running_record_named_is_its_links():
    # persistent 8 % loss of node-03 (ttd campaign, 2026-12-05, kept in /tmp/stall8/p3): the episode's first
    # slowed step (x7.8) closed with node-03 late by 877 ms and no retransmit of its own left in it, named
    # node-03 / process and fired step_stall node-03 / process; its running record 0.13 s earlier named
    # node-03 / network (3.0). The worker (fold.py) charges such a close to the running record's culprit.
    named = {"host": "node-03", "layer": "network", "evidence": 3.0, "source": "evidence", "why": "network evidence 3"}
    rng = __import__("random").Random(1912)

    def close(host, layer="pytorch", tmax=1028):
        s = summary(20, tmax, ev={host: {layer: 7.0}}, strag=(host, 877))
        s["culprit"] = analysis.culprit(s)
        return s

    late = close("node-03")
    assert (late["culprit"]["host"], late["culprit"]["layer"]) == ("node-03", "process")
    assert analysis.running_applies(late, named)
    late["culprit"] = analysis.charge_running(named, late["culprit"])
    assert (late["culprit"]["layer"], late["culprit"]["source"]) == ("network", "running")
    assert "its own: node-03 / process" in late["culprit"]["why"]
    fired = [
        (a["rule"], a["labels"]["host"], a["labels"]["layer"]) for a in fire([*charge(clean_steps(0, 20, rng)), late])
    ]
    assert [f for f in fired if f[0].startswith("step_stall")] == [("step_stall", "node-03", "network")], fired
    # another host's lateness, the host's own run queue, and a step that lost little keep their own culprit
    assert not analysis.running_applies(close("node-01"), named)
    assert not analysis.running_applies(close("node-03", "sched"), named)
    assert not analysis.running_applies(close("node-03", tmax=170), named)  # x1.2: not slowed


# node-00 net-slow, persistent campaign (ttd, 2026-12-05, kept in /tmp/stall8/p0, steps 1360-1362): the slowed
# steps' culprit was node-00 / network (its running record, then its own evidence), while node-03, the
# straggler, arrived late with 137-180 ms more run-queue time than its peers: 3.3, 7.0 and 1.9 spreads of
# sched evidence, CUSUM 5.3, sched_contention_on_straggler node-03 fired (a wrong alert). The same shape
# in /tmp/stall8/p3r1 (node-03 net-slow, steps 331-333): node-02 had 4.6 and 4.2.
VICTIM_STEPS = [  # (tmax ms, spread ms, evidence, culprit as the worker charged it)
    (
        3156,
        20.5,
        {"node-00": {"sched": 1.446}, "node-01": {"pytorch": 0.97}, "node-03": {"pytorch": 7.0, "sched": 3.293}},
        "running",
    ),
    (
        3522,
        20.8,
        {"node-00": {"network": 7.0}, "node-01": {"pytorch": 0.312}, "node-03": {"pytorch": 7.0, "sched": 7.0}},
        "evidence",
    ),
    (
        2819,
        25.1,
        {"node-00": {"network": 7.0}, "node-02": {"pytorch": 0.095}, "node-03": {"pytorch": 7.0, "sched": 1.908}},
        "evidence",
    ),
]


def _victim_steps(culprit_host: str | None, rng) -> list[dict]:
    """Clean steps, then ``VICTIM_STEPS`` with node-03 the straggler and the culprit ``culprit_host`` /
    network (None: no culprit), then clean steps again."""
    out = charge(clean_steps(0, 20, rng))
    for i, (tmax, spread, ev, source) in enumerate(VICTIM_STEPS):
        s = summary(20 + i, tmax, ev=ev, strag=("node-03", 180), spread_ms=spread)
        s["culprit"] = (
            {"host": culprit_host, "layer": "network", "evidence": 7.0, "source": source, "why": "network evidence 7"}
            if culprit_host
            else None
        )
        out.append(s)
    return out + charge(clean_steps(23, 10, rng))


def test_a_slow_links_victim_accumulates_no_sched_cusum_and_a_host_charged_its_own_steps_does():
    rng = __import__("random").Random(1361)
    sched = lambda steps: [  # noqa: E731
        a["labels"]["host"] for a in fire(steps, every_s=3.0) if a["rule"] == "sched_contention_on_straggler"
    ]
    # the step is charged to node-00's link: node-03's run-queue time in it is no evidence against node-03
    assert sched(_victim_steps("node-00", rng)) == []
    # the same evidence in steps charged to node-03 itself (its own link slow and its CPU contended), or
    # to nobody, still sums: real contention is not lost
    assert sched(_victim_steps("node-03", rng)) == ["node-03"]
    assert sched(_victim_steps(None, rng)) == ["node-03"]


# 300 ms CPU bursts at load 3-5 (live, 2026-12-06, kept in /tmp/stall9/c300): two bursts fell inside a
# collective (nobody late: culprit source "layers") and stalled the step x2.46 and x3.24 with the burst
# host's run-queue time 4.2x and 5.2x its busiest peer's, yet were not starved: a `layers` culprit counted as
# 3 spreads, and a peer had 1.24 and 1.17 spreads (17-25 ms at a spread of 14-20 ms) of run-queue lateness.
@pytest.mark.parametrize(
    "median_ms,tmax_ms,spread_ms,peer,sched,starved",
    [
        (150, 368, 20, {"node-01": 1.24}, (70, 115, 81, 478), True),  # step 352 (burst host as node-03 here)
        (131, 424, 14, {"node-01": 1.17}, (40, 73, 56, 380), True),  # step 457
        # the same peer lateness when the job's spread is 110 ms (load 7-8): the excess is 2.9 spreads,
        # counted as 3, and 1.17 spreads of a peer's are over a third of it (the peer may share the cause)
        (131, 424, 110, {"node-01": 1.17}, (40, 73, 56, 380), False),
        # the other parts still hold: 2.9x the busiest peer is no starvation
        (131, 424, 14, {"node-01": 1.17}, (40, 131, 56, 380), False),
    ],
)
def test_a_burst_inside_a_collective_is_starved_by_its_run_queue_excess_in_spreads(
    median_ms, tmax_ms, spread_ms, peer, sched, starved
):
    rng = __import__("random").Random(tmax_ms)
    at_median = at_median_of(median_ms)

    s = at_median(
        summary(
            20,
            tmax_ms,
            ev={h: {"sched": z} for h, z in peer.items()},
            layers={h: {"sched": ms} for h, ms in zip(HOSTS4, sched)},
            spread_ms=spread_ms,
        )
    )
    steps = charge([*(at_median(x) for x in clean_steps(0, 20, rng)), s, at_median(summary(21, median_ms))])
    c = steps[20]["culprit"]
    assert (c["host"], c["layer"], c["source"], c["starved"]) == ("node-03", "sched", "layers", starved), c
    fired = stall_alerts(steps)
    assert fired == ([("step_stall", "node-03", "sched")] if starved else []), fired


@pytest.mark.parametrize(
    "median_ms,tmax_ms,excess_ms,fires",
    [(169.5, 357, 214, True), (100, 195, 104, True), (100, 195, 96, False)],
)
def test_a_starved_host_whose_peers_waited_longer_than_the_step_lost_fires_from_that_wait(
    median_ms, tmax_ms, excess_ms, fires
):
    # 300 ms burst of node-02 at load 2-6 (live, 2026-12-06, kept in /tmp/stall9/c300new, step 400): x2.11 of
    # a 170 ms median, 188 ms lost (then under stall_starved_floor_ns, 200 ms) while its peers waited 214 ms
    # for it; starved (7 spreads, 8.8x the busiest peer's run-queue time). The wait is what it cost the job.
    # The floor is 100 ms now: the same shape at a 100 ms median, 95 ms lost, fires from a wait of 104 ms
    # and not from 96.
    rng = __import__("random").Random(400)
    at_median = at_median_of(median_ms)

    s = at_median(
        summary(
            20,
            tmax_ms,
            ev={"node-02": {"sched": 7.0}},
            strag=("node-02", excess_ms),
            layers={h: {"sched": ms} for h, ms in zip(HOSTS4, (87, 51, 764, 78))},
            spread_ms=26,
        )
    )
    steps = charge([*(at_median(x) for x in clean_steps(0, 20, rng)), s, at_median(summary(21, median_ms))])
    c = steps[20]["culprit"]
    assert (c["host"], c["layer"], c["starved"]) == ("node-02", "sched", True), c
    assert stall_alerts(steps) == ([("step_stall", "node-02", "sched")] if fires else [])


# 200 ms CPU bursts of node-00 every 3 s (live, 2026-12-06, /tmp/burst12/split200-n0-base; 2 of 13 named
# while stall_starved_floor_ns was 200 ms): (median ms, step ms, {host: sched evidence}, run-queue ms per
# host, straggler (host, excess ms), spread ms, fires). The bursts cost 132-220 ms at x1.98-x3.26, starved
# (3.4-11.5x the busiest peer's run-queue time); the floor is 100 ms (stall_specific_floor_ns's).
FLOOR_SHAPES = [
    # step 916: x2.17, 153 ms lost, 7 spreads, 3.9x the busiest peer's run-queue time
    (131, 284, {"node-00": 7.0, "node-01": 0.9}, (606, 109, 157, 60), ("node-00", 139), 16, True),
    # step 939: x1.98, 132 ms lost, a burst inside a collective (nobody late: source "layers")
    (135, 267, {"node-00": 0.7, "node-02": 0.3}, (410, 27, 44, 20), None, 13, True),
    # at the floor: x2.02 of a 100 ms median, 102 ms lost
    (100, 202, {"node-00": 7.0}, (400, 60, 80, 70), ("node-00", 98), 12, True),
    # just under it: x1.97, 97 ms lost (the peers waited 95)
    (100, 197, {"node-00": 7.0}, (400, 60, 80, 70), ("node-00", 95), 12, False),
    # step 916's shape at x1.85 (111 ms lost): under stall_starved_k (1.9), where the corpus' wrong starved
    # steps were (x1.59-x1.86)
    (131, 242, {"node-00": 7.0, "node-01": 0.9}, (606, 109, 157, 60), ("node-00", 100), 16, False),
]


@pytest.mark.parametrize("median_ms,tmax_ms,ev,sched,strag,spread_ms,fires", FLOOR_SHAPES)
def test_a_starved_burst_that_cost_the_job_100_ms_at_x1_9_fires(median_ms, tmax_ms, ev, sched, strag, spread_ms, fires):
    rng = __import__("random").Random(int(tmax_ms))
    at_median = at_median_of(median_ms)
    s = sched_step(median_ms, tmax_ms, ev, sched, strag, spread_ms)
    steps = charge([*(at_median(x) for x in clean_steps(0, 20, rng)), s, at_median(summary(21, median_ms))])
    c = steps[20]["culprit"]
    assert (c["host"], c["layer"], c["starved"]) == ("node-00", "sched", True), c
    assert stall_alerts(steps) == ([("step_stall", "node-00", "sched")] if fires else []), stall_alerts(steps)


def squeezed_steps(first, ratios, host="node-02", records=(29, 40, 37, 37)):
    """Steps of a memory cgroup squeezed to its page cache (the live 800 ms mem stalls of node-02,
    2026-12-06): each a little slower than the median, ``host`` with the kernel's reclaim retries in its
    memory row and none on its peers, and what else the live steps had in them: the host's own run-queue
    evidence, a straggler, a neighbour's two stray retransmits, a peer's run-queue time."""
    out = []
    for i, ratio in enumerate(ratios):
        tmax = ratio * MEDIAN_NS / 1e6
        shape = i % 4
        ev = {host: {"sched": 2.8}} if shape == 0 else {"node-00": {"network": 2.0}} if shape == 2 else {}
        s = summary(first + i, tmax, ev=ev, strag=(host, 30) if shape == 1 else None)
        s["layers"] = {h: {"sched": {"time_ns": 60_000_000, "count": 9, "max_ns": 5_000_000}} for h in HOSTS4}
        s["layers"]["node-03"]["sched"]["time_ns"] = 112_000_000 if shape == 3 else 60_000_000
        s["layers"][host]["memory"] = {"time_ns": 6_000_000, "count": records[i % len(records)], "max_ns": 2_600_000}
        out.append(s)
    return out


@pytest.mark.parametrize(
    "ratios,fires",
    [
        ((1.11, 1.26, 1.28, 1.30), True),  # the live 4th stall: 18, 40, 43, 47 ms lost, no step over x1.3
        ((1.2, 1.35, 1.45, 1.72), True),  # the live 1st stall's shape
        ((1.25, 1.3), False),  # 77 ms lost in 2 steps: under 100 ms in fewer than stall_episode_min_steps
    ],
)
def test_a_memory_stall_spread_over_several_slightly_slow_steps_fires_once_on_its_host(ratios, fires):
    # each step below every single-step gate (x1.1-x1.7, 15-90 ms over the median), with lateness,
    # run-queue noise or a neighbour's stray retransmits, but the kernel's reclaim retries on one host:
    # the culprit is its memory, and what the steps lost together is the stall. After 20 steps without
    # such a charge it is an episode (memory_stall_episode; a job at its memory limit all the time:
    # test_a_host_at_its_memory_limit_on_every_step_has_no_episode)
    rng = __import__("random").Random(11)
    squeezed = squeezed_steps(20, ratios)
    steps = charge([*clean_steps(0, 20, rng), *squeezed, *clean_steps(20 + len(ratios), 10, rng)])
    for s in squeezed:
        c = s["culprit"]
        assert (c["host"], c["layer"]) == ("node-02", "memory"), c  # a straggler's by blame, else "memlimit"
    fired = [(a["rule"], a["labels"]["host"], a["labels"]["layer"]) for a in fire(steps)]
    over = [f for f in fired if f[0].startswith("memory_stall")]
    assert over == ([("memory_stall_episode", "node-02", "memory")] if fires else []), fired
    # nothing else but a step_stall of the same host and layer (the x1.72 step is a specific stall alone)
    assert all(f[1:] == ("node-02", "memory") for f in fired) and (fires or not fired), fired


# The untuned host's 800 ms squeezes (lead, 2026-12-06, node-03, kept in /tmp/lead/mem-n03): each of a
# stall's 7-8 steps charged to node-03 / memory (memlimit) at x1.00-x1.30 of a 97 ms median; two of the
# four lost 62-66 ms in all, one 99 ms: under memory_stall_over_steps' x1.2 per step (and its 100 ms)
LIVE_SQUEEZES = {
    "first": (1.13, 1.07, 1.13, 1.14, 1.02, 1.05, 1.10, 1.04),  # 64 ms
    "second": (1.30, 1.30, 1.25, 1.22, 1.24, 1.10, 1.02),  # 138 ms (named on the base too, x1.2 steps)
    "third": (1.19, 1.15, 1.12, 1.13, 1.09, 1.19, 1.14),  # 98 ms
    "fourth": (1.05, 1.12, 1.05, 1.003, 1.15, 1.06, 1.23, 1.003),  # 65 ms
}
LIVE_MEDIAN_MS = 97.1


def squeeze_at(first, ratios, median_ms=LIVE_MEDIAN_MS, host="node-03"):
    """``squeezed_steps`` of ``host`` against a baseline median of ``median_ms`` (step time ``ratio`` x it)."""
    out = []
    for ratio, s in zip(ratios, squeezed_steps(first, ratios, host=host)):
        tmax = int(ratio * median_ms * 1e6)
        s["step_time_max_ns"], s["step_time_ns"] = tmax, dict.fromkeys(HOSTS4, tmax)
        out.append(at_median_of(median_ms)(s))
    return out


def clean_at(first, count, rng, median_ms=LIVE_MEDIAN_MS, limit_host=None, hi=1.19):
    """Clean steps around ``median_ms`` (x0.86-``hi``), with lateness and run-queue noise; ``limit_host``:
    a host whose memory cgroup is at its limit on every step (the kernel's reclaim retries in its memory
    row, 29-40 records, none on its peers), so each of these steps slower than the median is charged to it."""
    out = []
    for s in clean_steps(first, count, rng):
        tmax = int(rng.uniform(0.86, hi) * median_ms * 1e6)
        s["step_time_max_ns"], s["step_time_ns"] = tmax, dict.fromkeys(HOSTS4, tmax)
        if limit_host is not None:
            s["layers"] = {
                limit_host: {"memory": {"time_ns": 3_000_000, "count": rng.randint(29, 40), "max_ns": 900_000}}
            }
        out.append(at_median_of(median_ms)(s))
    return out


def memory_alerts(steps, every_s=0.1):
    """(rule, host, layer, annotated step) of every alert the builtin pack fires on ``steps``."""
    return [
        (a["rule"], a["labels"].get("host"), a["labels"].get("layer"), a["annotations"].get("step"))
        for a in fire(steps, every_s=every_s)
    ]


@pytest.mark.parametrize("which", list(LIVE_SQUEEZES))
def test_an_untuned_hosts_memory_squeeze_is_named_by_its_episode(which):
    # the episode (memory charge of node-03 after 40 steps without, 7-8 consecutive steps) fires once its
    # loss reaches stall_episode_floor_ns (50 ms) in 3 steps or more, or its host's reclaim reaches
    # stall_episode_reclaim_ns (5 ms; squeezed_steps: 6 ms a step, none on its peers) in 3 steps or more,
    # on the step that reaches either
    ratios = LIVE_SQUEEZES[which]
    rng = __import__("random").Random(30)
    squeezed = squeeze_at(40, ratios)
    steps = charge([*clean_at(0, 40, rng), *squeezed, *clean_at(40 + len(ratios), 30, rng)])
    assert all((s["culprit"]["host"], s["culprit"]["layer"]) == ("node-03", "memory") for s in squeezed)
    assert [s["memory_episode"]["steps"] for s in squeezed] == list(range(1, len(ratios) + 1))
    assert all(s["memory_episode"]["first_step"] == 40 for s in squeezed)
    assert not any("memory_episode" in s for s in steps if s not in squeezed)
    lost = [sum(r - 1 for r in ratios[: i + 1]) * LIVE_MEDIAN_MS for i in range(len(ratios))]
    reclaim = [6 * (i + 1) for i in range(len(ratios))]
    assert [s["memory_episode"]["reclaim_ns"] // 1_000_000 for s in squeezed] == reclaim
    at = next(i for i, ms in enumerate(lost) if (i >= 2 and (ms >= 50 or reclaim[i] >= 5)) or ms >= 100)
    assert memory_alerts(steps) == [("memory_stall_episode", "node-03", "memory", str(40 + at))]


def with_ratio(s, ratio, median_ms=LIVE_MEDIAN_MS):
    """``s`` lasting ``ratio`` times ``median_ms``."""
    tmax = int(ratio * median_ms * 1e6)
    s["step_time_max_ns"], s["step_time_ns"] = tmax, dict.fromkeys(HOSTS4, tmax)
    return at_median_of(median_ms)(s)


def off_the_limit(steps, rng, host="node-03"):
    """``steps`` with ``host``'s memory row under ``MEMLIMIT_MIN_RECORDS`` (10-15 records, 0.3 ms): reclaim
    on it still, but not its cgroup's limit (the live squeezes' edges, node-01's 10 and 15 of stall 1,
    memstall12 live-base)."""
    for s in steps:
        s["layers"][host]["memory"] = {"time_ns": 300_000, "count": rng.randint(10, 15), "max_ns": 100_000}
    return steps


@pytest.mark.parametrize(
    "gap,at_limit,at",
    [(2, False, 44), (3, False, None), (2, True, 42), (3, True, 42)],
)
def test_a_squeeze_whose_steps_faster_ones_interrupt_is_one_episode(gap, at_limit, at):
    # live on 1ce17ac, 2026-12-06 10:00, load 3.9 (kept in /tmp/memstall12/live-base, node-03's 3rd stall):
    # its charged steps 404 (x1.09), 405 (memory by blame), 407 (x1.07), 408 (x1.33), with 406 between,
    # x0.98: node-03's 27 reclaim records, but a step that lost nothing is charged to nobody's memory.
    # Off its limit (under MEMLIMIT_MIN_RECORDS), up to MEMORY_GAP_STEPS (2) such steps in a row do not end
    # the episode and add nothing; a third ends it. At its limit each is one of the episode's steps (its 3 ms
    # of reclaim counted, not its loss) and no gap at all
    rng = __import__("random").Random(3)
    first = squeeze_at(40, (1.09,))
    between = [with_ratio(s, r) for s, r in zip(clean_at(41, gap, rng, limit_host="node-03"), (0.98, 0.95, 0.97))]
    if not at_limit:
        off_the_limit(between, rng)
    rest = squeeze_at(41 + gap, (1.07, 1.33, 1.12))  # 59 ms with the first step's 9
    steps = charge([*clean_at(0, 40, rng), *first, *between, *rest, *clean_at(44 + gap, 30, rng)])
    assert not any((s["culprit"] or {}).get("layer") == "memory" for s in between)
    assert all("memory_episode" in s for s in between) == at_limit
    assert all("memory_episode" in s for s in rest) == (at is not None)
    if at is not None:
        ep = rest[-1]["memory_episode"]
        assert (ep["first_step"], ep["steps"]) == (40, 4 + (gap if at_limit else 0))
        assert ep["reclaim_ns"] == 4 * 6_000_000 + (gap * 3_000_000 if at_limit else 0)
        assert ep["lost_ns"] == sum(
            int(r * LIVE_MEDIAN_MS * 1e6) - int(LIVE_MEDIAN_MS * 1e6) for r in (1.09, 1.07, 1.33, 1.12)
        )
    # off the limit: fired on the episode's 3rd charged step (rest's 2nd: 18 ms of node-03's reclaim,
    # stall_episode_reclaim_ns; its loss reaches 50 ms one step later); at it, on its 3rd step (12 ms)
    want = [("memory_stall_episode", "node-03", "memory", str(at))] if at is not None else []
    assert memory_alerts(steps) == want


# shapes17's missed squeeze (d6f324f, 2026-12-06 22:29, node-01 mem 600 ms every 9 s, kept in
# /tmp/shapes17-runs/e-mem600p9, steps 438-443 in close order): node-01 at its memory cgroup's limit on 6
# steps in a row (20-48 reclaim records, 9.5 ms of reclaim, none on a peer) that lost little or nothing
# (x0.81-x1.06 of a 133.3 ms median): charged to its memory on the 2 slower ones, a peer's blame or nobody
# on the 3 between and the last
MISSED_600MS = {
    "ratios": (1.063, 0.92, 0.81, 0.96, 1.06, 0.94),
    "records": (20, 35, 26, 30, 48, 38),
    "reclaim_ms": (0.51, 1.90, 0.75, 2.34, 2.44, 1.57),
    "median_ms": 133.3,
}


@pytest.mark.parametrize("at_limit", [True, False])
def test_a_squeeze_at_its_limit_through_steps_that_lost_nothing_is_one_episode(at_limit):
    # at its limit on the 3 steps between its 2 charged ones, the squeeze is one episode of 6 steps and
    # memory_stall_episode fires on its 4th (5.5 ms of node-01's reclaim in 4 steps, none on a peer); on
    # d6f324f and 3ad97cf the 3 steps were a gap over MEMORY_GAP_STEPS: two 1-step pieces, no alert. The
    # same steps with node-01 off its limit in between (under MEMLIMIT_MIN_RECORDS) stay two pieces
    m = MISSED_600MS
    rng = __import__("random").Random(17)
    squeezed = squeeze_reclaiming(40, m["ratios"], m["reclaim_ms"], m["median_ms"])
    for s, n in zip(squeezed, m["records"]):
        s["layers"]["node-03"]["memory"]["count"] = n
    for s in (squeezed[1], squeezed[5]):  # the steps with a straggler: a peer's lateness (live: its blame)
        s["straggler"]["host"] = "node-01"
    if not at_limit:
        off_the_limit(squeezed[1:4], rng)
    steps = charge([*clean_at(0, 40, rng, m["median_ms"]), *squeezed, *clean_at(46, 30, rng, m["median_ms"])])
    charged = [s["step"] for s in squeezed if (s["culprit"] or {}).get("layer") == "memory"]
    assert charged == [40, 44]
    assert all((s["culprit"] or {}).get("host") == "node-03" for s in squeezed if s["step"] in charged)
    if at_limit:
        eps = [s["memory_episode"] for s in squeezed]
        assert [(e["first_step"], e["steps"], e["peer_reclaim_ns"]) for e in eps] == [(40, i, 0) for i in range(1, 7)]
        assert eps[-1]["reclaim_ns"] == sum(int(ms * 1e6) for ms in m["reclaim_ms"])
        assert eps[-1]["lost_ns"] < 20_000_000  # what the 2 charged steps lost: the loss names nothing
        assert memory_alerts(steps) == [("memory_stall_episode", "node-03", "memory", "43")]
    else:
        assert [s["step"] for s in squeezed if "memory_episode" in s] == [40]
        assert memory_alerts(steps) == []


def squeeze_reclaiming(first, ratios, reclaim_ms, median_ms, peer_ms=None):
    """``squeeze_at`` of node-03 with its memory time ``reclaim_ms`` per step (ms) and, with ``peer_ms``,
    node-01's memory row holding that much in 10 records (under half the host's: the charge stays)."""
    out = squeeze_at(first, ratios, median_ms=median_ms)
    for i, s in enumerate(out):
        s["layers"]["node-03"]["memory"]["time_ns"] = int(reclaim_ms[i] * 1e6)
        if peer_ms is not None:
            s["layers"]["node-01"]["memory"] = {"time_ns": int(peer_ms[i] * 1e6), "count": 10, "max_ns": 900_000}
    return out


# The two live squeezes under stall_episode_floor_ns (memstall12, node-03, 2026-12-06, kept in
# /tmp/memstall12/live-new and live-base): each step a little slower than the median, node-03 at its
# memory cgroup's limit (25-39 reclaim records a step) and no memory record on any peer
SUB_FLOOR_SQUEEZES = {
    # live-new steps 308-312: 27 ms lost in 5 charged steps, 9.4 ms of reclaim on node-03
    "27ms": ((1.099, 1.018, 1.058, 1.025, 1.071), (3.05, 3.37, 0.97, 0.75, 1.24), 99.5, 2),
    # live-base steps 495-497: 48.5 ms lost in 3 charged steps, 12.2 ms of reclaim on node-03
    "48.5ms": ((1.019, 1.094, 1.246), (5.63, 5.87, 0.65), 135.5, 2),
}


@pytest.mark.parametrize("which", list(SUB_FLOOR_SQUEEZES))
def test_a_squeeze_under_the_loss_floor_is_named_by_its_hosts_own_reclaim(which):
    # what these squeezes cost the job (27 and 48.5 ms) is within its clean jitter over as many steps; what
    # names them is the host's own reclaim, 5 ms (stall_episode_reclaim_ns) by their 3rd charged step with
    # none on a peer. Neither fired on 44484b4 (the loss alone, under 50 ms)
    ratios, reclaim, median_ms, at = SUB_FLOOR_SQUEEZES[which]
    rng = __import__("random").Random(14)
    squeezed = squeeze_reclaiming(40, ratios, reclaim, median_ms)
    steps = charge([*clean_at(0, 40, rng, median_ms), *squeezed, *clean_at(40 + len(ratios), 30, rng, median_ms)])
    assert all((s["culprit"]["host"], s["culprit"]["layer"]) == ("node-03", "memory") for s in squeezed)
    ep = squeezed[-1]["memory_episode"]
    assert (ep["steps"], ep["peer_reclaim_ns"]) == (len(ratios), 0)
    assert ep["reclaim_ns"] == sum(int(ms * 1e6) for ms in reclaim)
    assert ep["lost_ns"] < 50_000_000
    assert memory_alerts(steps) == [("memory_stall_episode", "node-03", "memory", str(40 + at))]


@pytest.mark.parametrize(
    "ratios,reclaim,peer,fires",
    [
        ((1.05, 1.05, 1.05), (2.0, 2.0, 1.0), None, True),  # 5.0 ms in 3 steps: at stall_episode_reclaim_ns
        ((1.05, 1.05, 1.05), (2.0, 2.0, 0.9), None, False),  # 4.9 ms
        ((1.05, 1.05), (10.0, 10.0), None, False),  # 20 ms in 2 steps: under stall_episode_min_steps
        ((1.05, 1.05, 1.05), (2.0, 2.0, 2.0), (1.0, 1.0, 1.0), True),  # the busiest peer's 3 ms: half of 6
        ((1.05, 1.05, 1.05), (2.0, 2.0, 2.0), (1.0, 1.0, 1.1), False),  # 3.1 ms: more than half
    ],
)
def test_the_episodes_reclaim_floor_and_its_peers(ratios, reclaim, peer, fires):
    # 3 steps of x1.05 (15 ms lost in all, far under the loss floors): only the reclaim key can fire
    rng = __import__("random").Random(15)
    squeezed = squeeze_reclaiming(40, ratios, reclaim, LIVE_MEDIAN_MS, peer)
    steps = charge([*clean_at(0, 40, rng), *squeezed, *clean_at(40 + len(ratios), 30, rng)])
    assert all((s["culprit"]["host"], s["culprit"]["layer"]) == ("node-03", "memory") for s in squeezed)
    assert squeezed[-1]["memory_episode"]["steps"] == len(ratios)
    want = [("memory_stall_episode", "node-03", "memory", str(40 + len(ratios) - 1))] if fires else []
    assert memory_alerts(steps) == want


def test_a_host_at_its_memory_limit_on_every_step_has_no_episode():
    # node-01 at its limit all the time: charged to its memory on each step slower than the median
    # (x1.0-x1.19), 300 steps; its jitter summed over any run of them exceeds 50 ms, but it has no onset
    rng = __import__("random").Random(7)
    steps = charge(clean_at(0, 300, rng, limit_host="node-01"))
    charged = [s for s in steps if (s["culprit"] or {}).get("layer") == "memory"]
    assert len(charged) > 100 and {s["culprit"]["host"] for s in charged} == {"node-01"}
    assert not any("memory_episode" in s for s in steps)
    assert memory_alerts(steps) == []
    # a squeeze on top of the limit (x1.3-x1.5 a step) has no onset either: memory_stall_over_steps names it
    rng = __import__("random").Random(7)
    steps = charge([*clean_at(0, 100, rng, limit_host="node-01"), *squeeze_at(100, (1.4, 1.5, 1.3), host="node-01")])
    assert memory_alerts(steps) == [("memory_stall_over_steps", "node-01", "memory", "102")]  # 39+49+29 ms


def test_an_episode_after_a_long_clean_run_fires_once_and_the_next_one_again():
    # 400 clean steps, an 8-step episode (64 ms), 60 clean steps, the same again: one alert per episode,
    # however many of its steps keep matching
    rng = __import__("random").Random(5)
    first, second = squeeze_at(400, LIVE_SQUEEZES["first"]), squeeze_at(468, LIVE_SQUEEZES["first"])
    steps = charge([*clean_at(0, 400, rng), *first, *clean_at(408, 60, rng), *second, *clean_at(476, 20, rng)])
    assert [s["memory_episode"]["lost_ns"] // 1_000_000 for s in (first[-1], second[-1])] == [66, 66]
    assert memory_alerts(steps, every_s=0.5) == [
        # its 3rd step: 18 ms of the host's reclaim (stall_episode_reclaim_ns); its loss (32, 46, 48, 52 ms
        # at its 3rd-6th step) reaches stall_episode_floor_ns at the 6th
        ("memory_stall_episode", "node-03", "memory", "402"),
        ("memory_stall_episode", "node-03", "memory", "470"),
    ]


def test_a_directed_or_specific_network_culprit_keeps_its_place_beside_a_memory_limit():
    s = squeezed_steps(20, (1.3,))[0]
    s["evidence"]["hosts"] = {"node-00": {"network": 3.0}}
    assert analysis.culprit(s)["layer"] == "network"
    s["evidence"]["hosts"] = {"node-00": {"network": 2.0}}
    assert (analysis.culprit(s)["host"], analysis.culprit(s)["layer"]) == ("node-02", "memory")
    s["net_directed"] = True
    assert (analysis.culprit(s)["host"], analysis.culprit(s)["layer"]) == ("node-00", "network")
    # a step that lost nothing names no memory culprit, and neither does a peer with half the records
    s = squeezed_steps(20, (0.95,))[0]
    assert (analysis.culprit(s) or {}).get("layer") != "memory"
    s = squeezed_steps(20, (1.3,), records=(30,))[0]
    s["layers"]["node-01"]["memory"] = {"time_ns": 1_000_000, "count": 16, "max_ns": 100_000}
    assert (analysis.culprit(s) or {}).get("layer") != "memory"


@pytest.mark.parametrize(
    "peer_ev,peer_sched_ms,named",
    [
        (7.0, 600, "node-03"),  # a CPU burst's run-queue evidence
        (3.0, 600, "node-03"),  # SPECIFIC_EVIDENCE
        (None, 600, "node-03"),  # no evidence, starved by its run-queue time alone (`layers`)
        (2.5, 90, "node-02"),  # run-queue noise of a peer: the memory limit's retries are the better word
    ],
)
def test_a_host_routinely_at_its_memory_limit_does_not_take_over_another_hosts_cpu_burst(peer_ev, peer_sched_ms, named):
    # node-02 reads through its page cache at its memory cgroup's limit every step (a data loader: 30
    # reclaim records a step, none on its peers) while node-03's CPU burst stalls the step x3.5: the
    # burst's host is the culprit, not node-02 (a memory-limit culprit outranks lateness and noise only)
    s = squeezed_steps(20, (3.5,), records=(30,))[0]
    s["evidence"]["hosts"] = {"node-03": {"sched": peer_ev}} if peer_ev else {}
    s["straggler"] = None
    s["layers"]["node-03"]["sched"]["time_ns"] = peer_sched_ms * 1_000_000
    c = analysis.culprit(s)
    assert (c["host"], c["layer"]) == (named, "memory" if named == "node-02" else "sched"), c


@pytest.mark.parametrize("gap,charged", [(0, True), (1, True), (2, False)])
def test_a_slowed_step_naming_nobody_right_after_a_host_link_was_named_is_that_link(gap, charged):
    # persistent 8 % loss of node-03 (stall9, `--fault-hosts 3`): the first slowed step named node-03 /
    # network (4 spreads); the next, x6.2, had no straggler, no directed view and no evidence of its own
    # (a retransmission back-off across the boundary) and fired step_stall_unexplained. Within
    # STARVED_NEXT_STEPS (2) steps it is the link's; later, with fast steps between, it is judged alone.
    rng = __import__("random").Random(5)
    first = summary(20, 980, ev={"node-03": {"network": 4.0}})
    first["net_directed"] = True
    between = clean_steps(21, gap, rng)
    nobody = summary(21 + gap, 6.2 * MEDIAN_NS / 1e6)
    steps = charge([*clean_steps(0, 20, rng), first, *between, nobody, *clean_steps(22 + gap, 5, rng)])
    c = steps[21 + gap]["culprit"]
    fired = [(a["rule"], a["labels"].get("host"), a["labels"].get("layer")) for a in fire(steps)]
    if charged:
        assert (c["host"], c["layer"], c["source"]) == ("node-03", "network", "persistent"), c
        assert "this slowed step names nobody" in c["why"], c["why"]
        # one alert for both steps (its 2 s window), no unexplained stall beside it
        assert [f for f in fired if f[0].startswith("step_stall")] == [("step_stall", "node-03", "network")], fired
    else:
        assert c is None, c
        assert ("step_stall_unexplained", None, None) in fired, fired


def alike_step(step, ratio=7.6):
    """A slowed step with two hosts late alike and nothing below the framework: node-02 and node-03 at 7.0
    and 6.5 spreads (the first slowed step of node-03's persistent net-slow, stall10's node-03 campaign)."""
    s = summary(step, ratio * MEDIAN_NS / 1e6, ev={"node-02": {"pytorch": 7.0}, "node-03": {"pytorch": 6.5}})
    s["straggler"] = {
        "host": "node-02",
        "excess_ns": 140_000_000,
        "reason": "last at 2/3 collectives",
        "group": [{"host": "node-02", "late_ns": 140_000_000}, {"host": "node-03", "late_ns": 130_000_000}],
    }
    return s


def test_a_step_with_two_hosts_late_alike_waits_for_the_next_step_that_names_one():
    # the first slowed step of a persistent net-slow of node-03 had node-02 and node-03 late alike and
    # closed before any running record: it named nobody and fired step_stall_unexplained (x7.6) beside
    # the right alert. Held one step, the next one names node-03 / network and nothing else fires.
    rng = __import__("random").Random(7)
    named = [summary(s, 8.0 * MEDIAN_NS / 1e6, ev={"node-03": {"network": 5.0}}) for s in (21, 22, 23)]
    for s in named:
        s["net_directed"] = True
    steps = charge([*clean_steps(0, 20, rng), alike_step(20), *named, *clean_steps(24, 5, rng)])
    assert steps[20]["culprit"] is None and steps[20]["ambiguous"] == ["node-02", "node-03"], steps[20]
    assert not steps[21].get("unexplained_before"), steps[21]
    fired = [(a["rule"], a["labels"].get("host"), a["labels"].get("layer")) for a in fire(steps)]
    assert [f for f in fired if f[0].startswith("step_stall")][:1] == [("step_stall", "node-03", "network")], fired
    assert not [f for f in fired if f[0] in ("step_stall_unexplained", "step_stall_ambiguous")], fired


@pytest.mark.parametrize(
    "after,reported_at",
    [
        ("fast", 21),  # the stall is over and named nobody: a stall of two hosts at once, reported next step
        ("nobody", 22),  # slowed steps that name nobody: reported with the second step after it
        ("lateness", 22),  # the next step names node-02's lateness only (process): no layer of its own
        ("other", 21),  # another pair alike: reported at once, the new pair held in turn
        # the next step is not slowed but names node-03 by a layer of its own (a fast step's run-queue
        # noise, x1.11): it explains nothing, the stall is over; 2 ranks per host, cpu burst of rank 5,
        # newuser18's kept run, step 341 (x7.03, node-02 and node-03 alike) was dropped by step 343
        ("noise", 21),
    ],
)
def test_a_step_with_two_hosts_late_alike_that_no_later_step_explains_is_still_reported(after, reported_at):
    rng = __import__("random").Random(8)
    nxt = {
        "fast": clean_steps(21, 2, rng),
        "nobody": [summary(21, 6.0 * MEDIAN_NS / 1e6), summary(22, 6.0 * MEDIAN_NS / 1e6)],
        "lateness": [
            summary(21, 6.0 * MEDIAN_NS / 1e6, ev={"node-02": {"pytorch": 7.0}}, strag=("node-02", 700)),
            summary(22, 6.0 * MEDIAN_NS / 1e6),
        ],
        "other": [summary(21, 6.0 * MEDIAN_NS / 1e6, ev={"node-00": {"pytorch": 7.0}, "node-01": {"pytorch": 6.8}})]
        + clean_steps(22, 1, rng),
        "noise": [
            summary(21, 155, ev={"node-03": {"sched": 3.0}}, layers={"node-03": {"sched": 30}}),
            summary(22, 150),
        ],
    }[after]
    steps = charge([*clean_steps(0, 20, rng), alike_step(20), *nxt, *clean_steps(23, 5, rng)])
    reports = [(s["step"], s["unexplained_before"]["step"]) for s in steps if s.get("unexplained_before")]
    assert reports[0] == (reported_at, 20), reports
    fired = [a for a in fire(steps) if a["rule"] == "step_stall_ambiguous"]
    assert len(fired) == 1, fired
    assert fired[0]["annotations"]["step"] == "20", fired[0]["annotations"]
    assert "node-02 and node-03 late alike" in fired[0]["annotations"]["summary"], fired[0]["annotations"]


def two_per_host_burst_step(step, rank_sched_ms):
    """newuser18's kept run, step 341 (x7.03, 931 ms, 2 ranks per host on 2 cores, cpu burst of global rank
    5 on node-02): node-02 at 7.0 spreads of sched, node-03 at 7.0 of lateness and 6.08 of sched, both late
    by 397 ms (rank 4 and rank 6, rank 5's ring neighbours), spread 10.5 ms; ``rank_sched_ms`` ``{(host,
    rank): run-queue ms}`` (the live step's: rank 5 1,349 ms, every other rank 45-102 ms)."""
    layers: dict[str, dict] = {}
    for (h, _r), ms in rank_sched_ms.items():
        layers.setdefault(h, {"sched": 0.0})["sched"] += ms
    s = summary(
        step,
        931,
        ev={"node-00": {"pytorch": 0.587}, "node-02": {"sched": 7.0}, "node-03": {"pytorch": 7.0, "sched": 6.077}},
        layers=layers,
        spread_ms=10.514,
    )
    s["baseline"]["median_ns"] = 132_539_847
    s["straggler"] = {
        "host": "node-02",
        "rank": 4,
        "excess_ns": 397_350_108,
        "reason": "last at all_reduce pg=0 seq=1029, 397.350 ms after the median arrival",
        "group": [
            {"host": "node-02", "late_ns": 397_350_108, "rank": 4},
            {"host": "node-03", "late_ns": 397_026_903, "rank": 6},
        ],
    }
    s["ranks"] = {}
    for (h, r), ms in rank_sched_ms.items():
        s["ranks"].setdefault(h, {})[str(r)] = {
            "layers": {"sched": {"time_ns": int(ms * 1e6), "count": 1, "max_ns": 0}}
        }
    return s


NEWUSER18_341 = {
    ("node-00", 0): 45, ("node-00", 1): 57, ("node-01", 2): 70, ("node-01", 3): 57,
    ("node-02", 4): 51, ("node-02", 5): 1349, ("node-03", 6): 102, ("node-03", 7): 89,
}  # fmt: skip


@pytest.mark.parametrize(
    "other_ms,want",
    [
        # the live step: rank 5's run queue is 13 times any other rank's; node-03 waited for it in the ring
        # (its 6.08 spreads of sched are 64 ms over its peers'): node-02 / sched, starved, rank 5 (it
        # named nobody and fired step_stall_ambiguous on f10ef77)
        (102, ("node-02", "sched", 5)),
        # two hosts starved at once: node-03's rank 6 waited 900 ms in its run queue too, nobody stands out
        (900, None),
    ],
)
def test_hosts_late_alike_name_the_one_whose_rank_starved_beyond_every_rank_of_the_job(other_ms, want):
    s = two_per_host_burst_step(341, {**NEWUSER18_341, ("node-03", 6): other_ms})
    c = analysis.culprit_rank(analysis.culprit(s), s)
    rng = __import__("random").Random(9)
    steps = charge([*clean_steps(0, 20, rng), s, *clean_steps(21, 3, rng)])
    if want is None:
        assert c is None and steps[20]["ambiguous"] == ["node-02", "node-03"], (c, steps[20].get("ambiguous"))
        fired = [a["rule"] for a in fire(steps) if a["rule"].startswith("step_stall")]
        assert fired == ["step_stall_ambiguous"], fired
        return
    assert c is not None and (c["host"], c["layer"], c["rank"]) == want and c["starved"], c
    assert "node-03 late alike" in c["why"] and "7.3x the busiest peer's" in c["why"], c["why"]
    assert stall_alerts(steps) == [("step_stall", "node-02", "sched")]


@pytest.mark.parametrize(
    "late_ms,sched_ms,want",
    [
        # node-02's link queued at 20 Mbit for 300 ms (tbf, stall11): x3, 4 retransmits toward it on each
        # busy connection, and 12 ms of a loaded machine's run-queue noise over its peers, late by as much:
        # the noise explains 4 % of the 260 ms the step lost, not its link
        (12, 17, ("node-02", "network")),
        # a CPU burst that starved node-02 and made it late by most of the stall: its peers' retransmits
        # toward it are its slow answers, and its run queue is the culprit, as before
        (240, 250, ("node-02", "sched")),
    ],
)
def test_run_queue_noise_does_not_hide_a_links_retransmits_in_a_step_that_lost_far_more(late_ms, sched_ms, want):
    accs = ring_accs({"node-01": {"node-02": 4}, "node-03": {"node-02": 4}}, 390, {"node-02": sched_ms})
    for key, c in accs["node-02"]["colls"].items():
        if key == "0#1":
            c[1] += late_ms * MS  # node-02 last at one all-reduce by late_ms
    s = ring_summary(400, accs)
    c = s["culprit"]
    assert c is not None and (c["host"], c["layer"]) == want, (c, s["evidence"]["hosts"])


@pytest.mark.parametrize("rank, label", [(1, "1"), (None, None)])
def test_a_step_stall_alert_carries_its_culprits_rank_and_no_rank_label_when_none_is_known(rank, label):
    """step_stall's `rank` label is its culprit's global rank; a culprit without one (a host's link) gives
    no `rank` label, not an empty one (it gave `rank=""` before)."""
    changes: list[dict] = []
    engine = Engine(builtin_pack(), changes.append)
    culprit = {"host": "vm", "rank": rank, "layer": "process", "evidence": 0.0, "source": "stopped", "why": "x"}
    rec = {
        "job": "llm",
        "step": 41,
        "step_time_max_ns": 640_000_000,
        "stall": True,
        "stall_ratio": 9.4,
        "baseline": {"median_ns": 68_100_000, "p99_ns": 90_000_000, "n": 50, "spread_ns": 4_000_000},
        "culprit": culprit,
        "closed_at_ns": 1_767_225_600_000_000_000,
    }
    engine.process("steps", fields.step_record(rec))
    engine.tick(rec["closed_at_ns"] + 1_000_000_000)
    (fired,) = [c for c in changes if c["status"] == "firing" and c["rule"] == "step_stall"]
    assert fired["labels"]["host"] == "vm" and fired["labels"].get("rank") == label, fired["labels"]
    assert ("rank" in fired["labels"]) == (label is not None), fired["labels"]


@pytest.mark.parametrize("rank, label", [(3, "3"), (None, None)])
def test_a_memory_episode_alert_carries_its_rank_and_no_rank_label_when_none_is_known(rank, label):
    """memory_stall_episode names the rank of the episode's first charged step as its `rank` label, as
    step_stall does its culprit's; when the summary knew none (the straggler was another host's) the alert
    carries no `rank` label at all, not an empty one (a null group-by value is no label). It had no
    rank label either way before."""
    changes: list[dict] = []
    engine = Engine(builtin_pack(), changes.append)
    t0 = 1_767_225_600_000_000_000
    for i, (lost_ms, ratio) in enumerate(((13.0, 1.13), (55.1, 1.43), (61.6, 1.07))):
        t = t0 + i * 100_000_000
        episode = {"host": "node-03", "rank": rank, "first_step": 315, "steps": i + 1, "lost_ns": int(lost_ms * 1e6)}
        rec = {
            "job": "llm",
            "step": 315 + i,
            "step_time_max_ns": int(97.9e6 * ratio),
            "stall_ratio": ratio,
            "baseline": {"median_ns": 97_900_000, "p99_ns": 120_000_000, "n": 50, "spread_ns": 4_000_000},
            "culprit": {"host": "node-03", "layer": "memory", "evidence": 0.0, "source": "memlimit", "why": "x"},
            "memory_episode": episode,
            "closed_at_ns": t,
        }
        engine.process("steps", fields.step_record(rec))
        engine.tick(t + 50_000_000)
    (fired,) = [c for c in changes if c["status"] == "firing" and c["rule"] == "memory_stall_episode"]
    assert fired["labels"]["host"] == "node-03" and fired["labels"].get("rank") == label, fired["labels"]
    assert ("rank" in fired["labels"]) == (label is not None), fired["labels"]


def test_step_stall_description_names_every_floor_its_condition_fires_from():
    """The description every step_stall alert carries said "at least stall_k = 3 times the baseline median",
    while a specific culprit fires from stall_specific_k (1.5): the demo's first alert read "x2.0 the median
    step" beside it (newuser15). It names the lowest ratio and floor the condition fires from."""
    import re

    text = (REPO / "obshub" / "rules" / "builtin" / "15_stall.yaml").read_text()
    k = re.search(r'^  stall_specific_k: "([\d.]+)"', text, re.M).group(1)
    floor_ms = int(re.search(r'^  stall_specific_floor_ns: "(\d+)"', text, re.M).group(1)) // 1_000_000
    desc = " ".join(builtin_pack().rules["step_stall"].description.split())
    assert f"from {k} times and {floor_ms} ms more" in desc, desc


# 4 hosts x 4 ranks of torch on 2 cores (untuned14 r1, 2026-12-06): every rank waits 150-400 ms a step in
# its run queue; a 300 ms CPU burst on node-01's local rank 3 (global 7) slowed the step x1.70-x1.93 while
# every rank's run-queue time rose with the load (150-430 ms), so rank 7 stood 1.2-2.2x the busiest other
# rank and node-01's sum under 3x its peers' rise. What tells the burst: rank 7 rose 550-760 ms over its
# own recent steps, 1.8-3.5x any other rank's rise. (rank 7's usual ms, each rank's rise ms, rank 7's
# extra rise ms, named)
RANK_SELF_SHAPES = [
    (330, 150, 0, 550, True),  # the burst: rank 7 +700 ms, every other rank +150 (step 108's shape)
    (330, 150, 80, 0, False),  # node-01's ranks rose alike, 80 ms more than the rest: nobody's burst
    (330, 300, 0, 120, False),  # rank 7 rose a little more than the rest (+420 against +300): jitter
    (800, 150, 0, 0, False),  # rank 7 always busy: far above its peers in every step, never above its own
]


def _rank_step(step, tmax_ms, median_ms, per_rank_ms):
    """A step of 4 hosts x 4 ranks (global ranks 4h..4h+3 on node-0h) whose ranks waited ``per_rank_ms``
    (16 values, ms) in their run queue, nobody late; hosts' ``layers`` hold their ranks' sums."""
    cell = lambda ms: {"sched": {"time_ns": int(ms * 1e6), "count": 7, "max_ns": 0}}  # noqa: E731
    s = at_median_of(median_ms)(
        summary(step, tmax_ms, layers={h: {"sched": sum(per_rank_ms[4 * i : 4 * i + 4])} for i, h in enumerate(HOSTS4)})
    )
    s["ranks"] = {
        h: {str(4 * i + j): {"layers": cell(per_rank_ms[4 * i + j])} for j in range(4)} for i, h in enumerate(HOSTS4)
    }
    return s


@pytest.mark.parametrize("usual7,rise,host_extra,extra7,named", RANK_SELF_SHAPES)
def test_a_burst_on_one_rank_of_a_loaded_host_is_starved_against_that_ranks_own_recent_steps(
    usual7, rise, host_extra, extra7, named
):
    rng = __import__("random").Random(usual7 + rise + extra7)
    usual = [150 + 60 * (r % 4) for r in range(16)]  # 150-330 ms, every host alike
    usual[7] = usual7
    history = [_rank_step(i, rng.uniform(330, 390), 360, [u + rng.uniform(-30, 30) for u in usual]) for i in range(20)]
    burst = [u + rise + (host_extra if 4 <= r < 8 else 0) for r, u in enumerate(usual)]
    burst[7] += extra7
    s = _rank_step(20, 630, 360, burst)  # x1.75: 270 ms over the median
    steps = charge([*history, s, _rank_step(21, 360, 360, usual)])
    c = steps[20]["culprit"]
    if c is None:  # every rank of every host rose alike (+150 ms): the machine's, nobody's (_crowded_ranks)
        assert (usual7, host_extra, extra7, named) == (800, 0, 0, False) and stall_alerts(steps) == []
        return
    assert (c["host"], c["layer"]) == ("node-01", "sched"), c
    assert (c["starved"], c.get("starved_rank", False)) == (named, named), c["why"]
    if named:
        assert c["rank"] == 7 and "rank 7: run-queue" in c["why"], c
    assert stall_alerts(steps) == ([("step_stall", "node-01", "sched")] if named else []), c["why"]


def test_a_job_of_one_rank_per_host_keeps_its_hosts_run_queue_times_alone_and_one_of_several_keeps_its_ranks():
    one = at_median_of(360)(summary(0, 630, layers={h: {"sched": 100 + i} for i, h in enumerate(HOSTS4)}))
    one["ranks"] = {h: {str(i): {"layers": {"sched": {"time_ns": int((100 + i) * 1e6)}}}} for i, h in enumerate(HOSTS4)}
    # besides the units, a part keeps the step's own time and the host it named starved (quiet22's _crowded)
    own = (analysis.STEP_KEY, analysis.STARVED_KEY)
    part = analysis.charge_starved(one, [])
    assert {k: v for k, v in part.items() if k not in own} == {h: int((100 + i) * 1e6) for i, h in enumerate(HOSTS4)}
    assert (part[analysis.STEP_KEY], part[analysis.STARVED_KEY]) == (630_000_000, None)
    many = _rank_step(0, 630, 360, [10 * r for r in range(16)])
    part = analysis.charge_starved(many, [])
    assert part[("node-01", "7")] == 70_000_000 and part["node-01"] == 220_000_000 and len(part) == 20 + 2, part


# 4 hosts x 2 ranks on 2 cores (rank17, 2026-12-06, median step 146 ms): in a stretch of x1.3-x1.8 steps
# nobody stalled, node-02 rank 5 rose 274 ms over its own median, 1.74x the next rank's rise (158 ms), an
# excess of 116 ms that passed 60 % of the 146 ms median (88 ms): starved_rank at x1.73, 106 ms lost, a
# wrong alert. The rank test's bursts lost 275-400 ms (untuned14 r1). (step ms, rank 7's extra rise ms, fires)
RANK_FLOOR_SHAPES = [
    (252, 116, False),  # the slow stretch's step: 106 ms lost, under stall_starved_rank_floor_ns (200 ms)
    (420, 220, True),  # a burst that cost the job 274 ms (x2.88)
]


@pytest.mark.parametrize("tmax_ms,extra7,fires", RANK_FLOOR_SHAPES)
def test_a_rank_starved_against_its_own_steps_fires_only_when_the_step_lost_200_ms(tmax_ms, extra7, fires):
    rng = __import__("random").Random(tmax_ms)
    usual = [100.0] * 16
    history = [_rank_step(i, rng.uniform(135, 155), 146, [u + rng.uniform(-20, 20) for u in usual]) for i in range(20)]
    risen = [u + 158 for u in usual]
    risen[7] += extra7
    steps = charge([*history, _rank_step(20, tmax_ms, 146, risen), _rank_step(21, 146, 146, usual)])
    c = steps[20]["culprit"]
    assert (c["host"], c["layer"], c.get("rank"), c.get("starved_rank")) == ("node-01", "sched", 7, True), c
    assert stall_alerts(steps) == ([("step_stall", "node-01", "sched")] if fires else []), c["why"]


# A 1,000 ms blackout of node-03's link (shapes18 e-blackout1000p8, 2026-12-07, median step 83.8 ms): TCP's
# back-off held step 370 open 1.6 s; its running record 0.93 s after the blackout's start named node-03 /
# network by its own drops (3 spreads), its close 0.72 s later by the peers' retransmits (4 spreads).
BLACKOUT_BASELINE = {"median_ns": 83_770_803, "n": 50, "p99_ns": 94_151_616, "spread_ns": 6_154_985}


def _blackout_running(step: int, at_ns: int, ran_ns: int, median_ns: int = BLACKOUT_BASELINE["median_ns"]) -> dict:
    """The running record of ``step`` (as fold.running sends it) at ``at_ns``, ``ran_ns`` after the step's
    start, naming node-03 / network by its own drops."""
    return {
        "job": "j",
        "step": step,
        "closed_by": "running",
        "closed_at_ns": at_ns,
        "step_time_max_ns": ran_ns,
        "stall_ratio": round(ran_ns / median_ns, 3),
        "baseline": {**BLACKOUT_BASELINE, "median_ns": median_ns},
        "hosts": ["node-00", "node-01", "node-02", "node-03"],
        "culprit": {
            "host": "node-03",
            "layer": "network",
            "evidence": 3.0,
            "net_view": "drops",
            "rank": None,
            "runq_veto": False,
            "source": "evidence",
            "why": "network evidence 3 spreads of 6.2 ms",
        },
        "blame": [
            {
                "host": "node-03",
                "layer": "network",
                "count": 18,
                "excess_ns": 0,
                "straggler_ns": 0,
                "peer_median_ns": 0,
                "max_ns": 0,
                "rank": None,
            }
        ],
        "evidence": {"hosts": {"node-03": {"network": 3.0}}, "net_view": {"node-03": "drops"}, "spread_ns": 6_154_985},
    }


def _blackout_close(step: int, at_ns: int) -> dict:
    """The close of ``step`` at ``at_ns``: 1,605 ms, x19.2, node-03 / network by the peers' retransmits."""
    return {
        **_blackout_running(step, at_ns, 1_605_477_463),
        "closed_by": "complete",
        "stall": True,
        "net_directed": True,
        "culprit": {
            "host": "node-03",
            "layer": "network",
            "evidence": 4.0,
            "net_view": "rx",
            "rank": None,
            "source": "evidence",
            "why": "network evidence 4 spreads of 6.2 ms",
        },
        "evidence": {"hosts": {"node-03": {"network": 4.0}}, "net_view": {"node-03": "rx"}, "spread_ns": 6_154_985},
    }


def _firings(records: list[dict]) -> list[tuple[str, str, int]]:
    """``(rule, step, time s)`` of every firing change of a stall rule of the builtin pack over ``records``
    (in order; the CUSUM rules need the clean steps between, which these records leave out)."""
    changes: list[dict] = []
    engine = Engine(builtin_pack(), changes.append)
    for r in records:
        engine.tick(r["closed_at_ns"])  # the rules service's timer: an alert past its window resolves first
        engine.process("steps", fields.step_record(r))
        engine.tick(r["closed_at_ns"])
    engine.tick(engine.now_ns + 60_000_000_000)
    return [
        (c["rule"], c["annotations"].get("step"), round(c["starts_at_ns"] / 1e9, 2))
        for c in changes
        if c["status"] == "firing" and c["rule"] in STALL_RULES
    ]


def test_a_blackout_is_named_from_its_running_record_once_and_its_close_does_not_fire_again():
    """step_stall fires from the running record (0.93 s after the blackout's start) instead of the close
    (1.65 s); the next running record and the close of the same step stay that one alert; 8 s later the
    next blackout is a new alert, and two stalls (each a running record and a close) do not escalate."""
    s = 1_000_000_000
    records = [
        _blackout_running(370, 100 * s + 930_000_000, 930_000_000),
        _blackout_running(370, 100 * s + 1_430_000_000, 1_430_000_000),
        _blackout_close(370, 100 * s + 1_650_000_000),
        _blackout_running(448, 108 * s + 950_000_000, 950_000_000),
        _blackout_close(448, 108 * s + 1_670_000_000),
    ]
    assert _firings(records) == [("step_stall", "370", 100.93), ("step_stall", "448", 108.95)]
    changes: list[dict] = []
    engine = Engine(builtin_pack(), changes.append)
    engine.process("steps", fields.step_record(records[0]))
    (c,) = [c for c in changes if c["status"] == "firing"]
    assert c["labels"]["host"] == "node-03" and c["labels"]["layer"] == "network" and "rank" not in c["labels"]
    assert c["annotations"]["summary"] == (
        "node-03 stalled step 370 of j (network): 930.0 ms so far, x11.1 the median step of 83.8 ms"
    )
    assert c["annotations"]["evidence"] == "network evidence 3 spreads of 6.2 ms; network 18 events; step still runs"


def test_a_third_blackout_escalates_on_its_close_counting_each_stall_once():
    """step_stall_recurring counts the closes only: 3 stalls, each with 2 running records, escalate at the
    third close (count 3), not at the second stall's records."""
    s = 1_000_000_000
    records = []
    for i, step in enumerate((370, 448, 528)):
        t = (100 + 8 * i) * s
        records += [
            _blackout_running(step, t + 930_000_000, 930_000_000),
            _blackout_running(step, t + 1_430_000_000, 1_430_000_000),
            _blackout_close(step, t + 1_650_000_000),
        ]
    got = _firings(records)
    assert [x for x in got if x[0] == "step_stall_recurring"] == [("step_stall_recurring", "528", 117.65)]


@pytest.mark.parametrize(
    "ran_ms,median_ms,why",
    [
        (500, 200, "x2.5: under stall_k (3)"),
        (330, 100, "x3.3 but 230 ms over the median: under stall_floor_ns (250 ms)"),
    ],
)
def test_a_running_record_of_a_step_not_yet_far_beyond_the_median_fires_nothing(ran_ms, median_ms, why):
    rec = _blackout_running(370, 100_000_000_000, ran_ms * 1_000_000, median_ms * 1_000_000)
    assert _firings([rec]) == [], why


def test_a_running_record_naming_a_host_by_undirected_evidence_or_vetoed_fires_nothing():
    """Only a blackout's charge counts: an undirected rx/rtt view of 3 spreads, or a culprit another host's
    run queue vetoes, waits for the close."""
    rec = _blackout_running(370, 100_000_000_000, 930_000_000)
    rec["culprit"] = {**rec["culprit"], "net_view": "rtt"}
    vetoed = _blackout_running(370, 100_000_000_000, 930_000_000)
    vetoed["culprit"] = {**vetoed["culprit"], "runq_veto": True}
    assert _firings([rec]) == [] and _firings([vetoed]) == []
