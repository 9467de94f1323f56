"""The engine's fast paths keep the rules' meaning: running window aggregates agree with a fresh
computation over the hits, and `foreach` rules evaluated without re-converting the record per item (the
sentinel item for item-invariant expressions, the one-pass walk otherwise) give exactly the alerts, state
changes, window contents and error counts of evaluating every item on its own full record."""

from __future__ import annotations

import math
import random
from pathlib import Path

import pytest

from obshub.rules import fields
from obshub.rules.engine import Engine
from obshub.rules.expr import item_invariant
from obshub.rules.loader import load_ruleset
from obshub.rules.testing import BASE_NS
from obshub.rules.window import Window

S = 1_000_000_000
BUILTIN = Path(__file__).resolve().parents[2] / "obshub" / "rules" / "builtin"

RULES = """\
version: 1
rules:
  - id: vote
    description: item-invariant sum of votes, group-by item
    severity: warning
    signal: steps
    foreach: hosts
    condition: "true"
    group_by: {job: job, host: item}
    window: 5s
    threshold: {aggregate: sum, of: "straggler != null && straggler.host == item ? 1.0 : -0.5", at_least: 2}
  - id: timed
    description: per-item errors (hosts without a step time) in the condition and in `of`
    severity: warning
    signal: steps
    foreach: hosts
    condition: step_time_ns[item] > 50
    group_by: {host: item}
    window: 4s
    threshold: {aggregate: max, of: "step_time_ns[item]", at_least: 90}
  - id: named
    description: not item-invariant (string functions on the item)
    severity: info
    signal: steps
    foreach: hosts
    condition: item.endsWith('1') || blame.exists(b, b.host == item)
    group_by: {host: item, len: "size(item)"}
    window: 3s
    threshold: {aggregate: count, at_least: 2}
  - id: blamed
    description: foreach over maps
    severity: info
    signal: steps
    foreach: blame
    condition: item.excess_ns > 10
    group_by: {host: item.host, layer: item.layer}
    window: 6s
    threshold: {aggregate: avg, of: item.excess_ns, at_least: 40}
  - id: grouperr
    description: a group-by that fails for some items (counted, no hit)
    severity: info
    signal: steps
    foreach: hosts
    condition: "true"
    group_by: {host: item, by: "item == 'h1' ? blame[0].host : job"}
    window: 2s
    threshold: {aggregate: min, of: "1.0", at_least: 1}
  - id: keyed
    description: item-invariant, reads a per-host map only by the item (entries shared by many hosts)
    severity: info
    signal: steps
    foreach: hosts
    condition: "item in evidence.hosts ? evidence.hosts[item].sched >= 0.0 : closed_by != 'hang'"
    group_by: {job: job, host: item}
    window: 5s
    threshold: {aggregate: sum, of: "(item in evidence.hosts ? evidence.hosts[item].sched : 0.0) - 0.5", at_least: 1}
  - id: keyed_mentioned
    description: the keyed map, and the item mentioned elsewhere too; errors for hosts without an entry
    severity: info
    signal: steps
    foreach: hosts
    condition: "evidence.hosts[item].memory >= 0.0 || (straggler != null && straggler.host == item)"
    group_by: {host: item}
    window: 4s
    threshold: {aggregate: max, of: "straggler != null && straggler.host == item ? 9.0 : evidence.hosts[item].memory", at_least: 1.5}
  - id: missing
    description: item-invariant, mentioned by a literal
    severity: info
    signal: steps
    foreach: missing_hosts
    condition: item != 'h3' && item in expected_hosts
    group_by: {host: item}
    window: 10s
    threshold: {aggregate: count, at_least: 3}
"""

HOSTS = [f"h{i}" for i in range(12)]
LAYERS = ["sched", "memory", "network", "cuda"]


def summaries(seed: int, n: int) -> list[dict]:
    """``n`` random step summaries of one job, 1 s apart: a straggler that persists for a while, blame,
    collectives, step times for most hosts, some hosts missing."""
    rnd = random.Random(seed)
    out, culprit = [], rnd.choice(HOSTS)
    for i in range(n):
        if rnd.random() < 0.15:
            culprit = rnd.choice(HOSTS)
        missing = rnd.sample(HOSTS, rnd.choice([0, 0, 1, 2]))
        hosts = [h for h in HOSTS if h not in missing]
        strag = (
            {
                "host": culprit,
                "score": rnd.choice([0.05, 0.3, 1.2]),
                "excess_ns": rnd.randint(0, 10**8),
                "reason": "slow",
                # the late group names many hosts in members no builtin foreach rule reads (a rule reading
                # straggler.rank must not evaluate every host of the group one by one)
                "group": [{"host": h, "late_ns": 5} for h in rnd.sample(HOSTS, rnd.randint(0, len(HOSTS)))],
                "rank": rnd.choice([None, 0, 3]),
            }
            if rnd.random() < 0.8
            else None
        )
        blame = [
            {
                "host": rnd.choice([culprit] * 3 + hosts),
                "layer": rnd.choice(LAYERS),
                "excess_ns": rnd.choice([0, 5, 30, 80]),
                "straggler_ns": 9,
                "peer_median_ns": 1,
                "count": 3,
                "max_ns": 2,
            }
            for _ in range(rnd.randint(0, 3))
        ]
        colls = [
            {
                "pg": "0",
                "coll_seq": j,
                "op": "all_reduce",
                "skew_ns": rnd.choice([10, 6 * 10**7]),
                "uncertainty_ns": 1,
                "last_host": rnd.choice([culprit] + hosts),
            }
            for j in range(rnd.randint(0, 2))
        ]
        times = {h: rnd.randint(10, 100) for h in hosts if rnd.random() < 0.8}
        # evidence of a wide step: many hosts with the same small entry, a few with their own, now and
        # then an int where a double is expected (a CEL type error) or a nested value
        shared = {layer: 0.0 for layer in LAYERS} | {"pytorch": rnd.choice([0.001, 0.002])}
        evidence = {
            h: rnd.choice(
                [
                    shared,
                    dict(shared),
                    {**shared, "sched": rnd.choice([0.5, 2.0, 7.0])},
                    {**shared, "memory": rnd.choice([1.0, 3.0])},
                    {**shared, "sched": 1},
                    {**shared, "memory": [1.0]},
                ]
            )
            for h in hosts
            if rnd.random() < 0.6
        }
        out.append(
            fields.step_record(
                {
                    "job": "j",
                    "step": i,
                    "closed_at_ns": BASE_NS + (i + 1) * S,
                    "hosts": hosts,
                    "expected_hosts": HOSTS,
                    "missing_hosts": missing,
                    "step_time_ns": times,
                    "step_time_max_ns": max(times.values(), default=0),
                    "straggler": strag,
                    "blame": blame,
                    "collectives": colls,
                    "stall": strag is not None,
                    "stall_ratio": 1.5,
                    "quality": {"ringbuf_lost": rnd.choice([0, 0, 0, 4])},
                    "evidence": {
                        "spread_ns": 10**7,
                        "hosts": evidence,
                        "ranks": {h: j for j, h in enumerate(HOSTS) if rnd.random() < 0.5},
                    },
                }
            )
        )
    return out


def run(ruleset, records: list[dict], per_item: bool) -> tuple[list[dict], int, dict]:
    changes: list[dict] = []
    eng = Engine(ruleset, changes.append)
    if per_item:  # the reference: every foreach item evaluated on its own full copy of the record
        eng._plans = {rid: None for rid in eng._plans}
    for rec in records:
        eng.process("steps", rec)
        eng.tick(rec["time_ns"] + S // 2)
    return changes, eng.eval_errors, eng.snapshot()


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_foreach_fast_paths_equal_per_item_evaluation(tmp_path, seed):
    p = tmp_path / "r.yaml"
    p.write_text(RULES)
    ruleset = load_ruleset([p, BUILTIN])
    records = summaries(seed, 60)
    fast, fast_errors, fast_state = run(ruleset, records, per_item=False)
    ref, ref_errors, ref_state = run(ruleset, records, per_item=True)
    assert fast == ref
    assert fast_errors == ref_errors and ref_errors > 0  # the error paths were exercised
    assert fast_state == ref_state
    fired = {c["rule"] for c in ref if c["status"] == "firing"}
    assert {"vote", "timed", "named", "blamed", "grouperr", "keyed", "keyed_mentioned"} <= fired, fired


def test_item_invariance_is_recognised_only_where_it_holds():
    assert item_invariant("straggler != null && straggler.host == item && blame.exists(b, b.host == item)")
    assert item_invariant("item in ['a', 'b'] || m[0].host != item")
    for expr in (
        "item",
        "size(item) > 2",
        "item == b.host + 'x'",
        "string(x) == item",
        "item.startsWith('a')",
        "x.map(item, item == 1)",
        "a == item == b",
        "item == f(x)",
        "item < 'b'",
    ):
        assert not item_invariant(expr), expr


def naive(kind: str, hits: list[tuple[int, float]], at_least: float, w: int) -> tuple[float, int]:
    """The window aggregate and the time the condition stops holding, computed afresh from the hits."""

    def agg(vals):
        if not vals:
            return 0.0
        if kind == "cusum":
            s = 0.0
            for v in vals:
                s = max(0.0, s + v)
            return s
        return {"count": len(vals), "sum": sum(vals), "max": max(vals), "min": min(vals)}.get(
            kind, sum(vals) / len(vals)
        )

    hits = sorted(hits, key=lambda h: h[0])  # time order (stable: equal times keep their arrival order)
    best = 0
    for c in sorted(t + w for t, _ in hits):
        alive = [v for t, v in hits if c - w <= t < c]
        if alive and agg(alive) >= at_least:
            best = c
    if kind == "count":
        n = max(1, math.ceil(at_least))
        best = sorted(t for t, _ in hits)[-n] + w if len(hits) >= n else 0
    return float(agg([v for _, v in hits])), best


@pytest.mark.parametrize("kind", ["count", "sum", "avg", "max", "min", "cusum"])
def test_running_window_aggregates_equal_a_fresh_computation(kind):
    rnd = random.Random(kind)
    w_ns, at_least = 10, 3.0
    win, hits, now = Window(kind, 10_000), [], 0
    for _ in range(400):
        now += rnd.choice([0, 1, 1, 2])
        t = now - rnd.choice([0, 0, 0, 0, 1, 3])  # some hits arrive out of order
        v = float(rnd.choice([-1, 0, 1, 1, 2, 5]))
        win.add(t, v)
        hits.append((t, v))
        horizon = now - w_ns
        win.prune(horizon)
        hits = [h for h in hits if h[0] > horizon]
        want_value, want_until = naive(kind, hits, at_least, w_ns)
        assert win.value(at_least) == pytest.approx(want_value)
        assert len(win) == len(hits)
        if want_value >= at_least:
            assert win.true_until(at_least, w_ns) == want_until
    assert Window.from_list(kind, 10_000, win.to_list()).to_list() == win.to_list()


def test_snapshots_of_every_version_restore_the_same_windows(tmp_path):
    p = tmp_path / "r.yaml"
    p.write_text(RULES)
    ruleset = load_ruleset([p, BUILTIN])
    _changes, _errors, snap = run(ruleset, summaries(5, 20), per_item=False)
    assert snap["v"] == 3 and any(rt["fps"] for rt in snap["runtime"].values())

    def older(version: int) -> dict:
        """The same state in the layout of an earlier version (hits per group: pairs, or two columns)."""
        rt_out = {}
        for rid, rt in snap["runtime"].items():
            hits, i = {}, 0
            for fp, n in zip(rt["fps"], rt["n"]):
                ts, vs = rt["t"][i : i + n], rt["v"][i : i + n]
                hits[fp] = [list(ts), list(vs)] if version == 2 else [[t, v] for t, v in zip(ts, vs)]
                i += n
            rt_out[rid] = {"hits": hits, "this_buf": rt["this_buf"], "other_buf": rt["other_buf"]}
        return {**snap, "v": version, "runtime": rt_out}

    def no_jobs(s: dict) -> dict:  # the groups' job labels (retention) are in version 3 only
        return {**s, "runtime": {rid: {k: v for k, v in rt.items() if k != "job"} for rid, rt in s["runtime"].items()}}

    for old in (snap, older(2), older(1)):
        eng = Engine(ruleset, lambda _c: None)
        eng.restore(old)
        got = eng.snapshot()
        assert got == snap if old is snap else no_jobs(got) == no_jobs(snap)


def test_item_keyed_paths_only_where_the_map_is_read_by_the_item_alone():
    from obshub.rules.expr import item_keyed_paths, project_item

    ev = ("evidence", "hosts")
    assert item_keyed_paths("item in evidence.hosts ? evidence.hosts[item].sched : 0.0") == {ev}
    assert item_keyed_paths("evidence.hosts[item].x > evidence.spread_ns") == {ev}  # a sibling is fine
    for expr in (
        "size(evidence.hosts) > 0 && evidence.hosts[item].x > 1",  # the map read whole
        "has(evidence.hosts) && evidence.hosts[item].x > 1",
        "evidence.hosts[item].x > 1 && evidence == null",  # a part of the path read whole
        "evidence.hosts[item].x > evidence.hosts.h1.x",  # a path through the map
        "evidence.hosts.exists(h, h == item)",  # a comprehension
    ):
        assert item_keyed_paths(expr) == frozenset(), expr
    data = {"evidence": {"spread_ns": 5, "hosts": {"a": {"x": 1}, "b": {"x": 2}}}, "job": "j"}
    assert project_item(data, frozenset({ev}), "b") == {
        "evidence": {"spread_ns": 5, "hosts": {"b": {"x": 2}}},
        "job": "j",
    }
    assert project_item(data, frozenset({ev}), "z")["evidence"]["hosts"] == {}
    assert project_item(data, frozenset({ev}), "a", key_as="s")["evidence"]["hosts"] == {"s": {"x": 1}}
    assert data["evidence"]["hosts"] == {"a": {"x": 1}, "b": {"x": 2}}  # left as it was


def test_entries_share_an_evaluation_only_when_cel_cannot_tell_them_apart():
    from obshub.rules.expr import frozen

    assert frozen({"a": 1}) != frozen({"a": 1.0}) and frozen({"a": 1}) != frozen({"a": True})
    assert frozen({"a": 0.0}) != frozen({"a": -0.0})
    assert frozen({"a": float("nan"), "b": [1.0, {"c": None}]}) == frozen({"b": [1.0, {"c": None}], "a": float("nan")})
    with pytest.raises(TypeError):
        frozen({"a": object()})


def test_group_fingerprints_equal_the_lifecycle_fingerprint_of_their_labels(tmp_path):
    """The engine builds a group's fingerprint from a per-rule template (no sort per group); it must equal
    ``lifecycle.fingerprint`` of the group's labels whatever the names, values and overrides."""
    from obshub.rules import lifecycle

    (tmp_path / "r.yaml").write_text(
        """\
version: 1
rules:
  - id: fp
    description: fingerprint template
    severity: warning
    signal: steps
    foreach: hosts
    condition: "true"
    group_by: {job: job, host: item, layer: "'x'", z_e: closed_by, a: stall}
    labels: {layer: static, category: c, Zeta: omega}
    annotations: {summary: s}
"""
    )
    eng = Engine(load_ruleset([tmp_path / "r.yaml"]), lambda _c: None)
    rule = eng.ruleset.rules["fp"]
    for key in [("j", "h1", "x", "complete", True), ("", "é,:1", "x", "", False), (None, "a=b\n", "x", 2**70, None)]:
        fp, labels = eng._fingerprint(rule, key)
        assert labels["layer"] == "x" and labels["category"] == "c" and labels["Zeta"] == "omega"
        assert fp == lifecycle.fingerprint(labels), key


def test_hosts_named_only_where_a_rule_does_not_read_are_no_mention(monkeypatch):
    """A wide slow step whose evidence names 1,500 hosts in ``evidence.ranks`` (host -> rank) and whose
    straggler lists them in its ``group``: the builtin CUSUM rules read ``evidence.hosts`` (by item) and
    ``straggler.host``/``.rank``, neither of those, so those hosts share the sentinel's evaluation. Before,
    every string of a field a rule reads counted as a mention: ~7,500 per-item evaluations a step, the pack
    114-166 ms per 2,048-host straggler step (`bench.rules_fleet`), now a few."""
    hosts = [f"n{i}" for i in range(2_000)]
    small = {"sched": 0.0, "memory": 0.0, "cuda": 0.0, "nic": 0.0, "network": 0.0, "pytorch": 0.004}
    calls = []
    real = Engine._eval_item
    monkeypatch.setattr(Engine, "_eval_item", lambda self, *a, **k: calls.append(1) or real(self, *a, **k))
    eng = Engine(load_ruleset([BUILTIN]), lambda _c: None)
    for i in range(12):
        slow = i >= 10
        rec = {
            "job": "j",
            "step": i,
            "closed_by": "complete",
            "closed_at_ns": BASE_NS + (i + 1) * S,
            "hosts": hosts,
            "expected_hosts": hosts,
            "step_time_max_ns": 300 * 10**6 if slow else 100 * 10**6,
            "straggler": {
                "host": "n2",
                "rank": 2,
                "score": 3.0,
                "excess_ns": 2 * 10**8,
                "reason": "slow",
                "group": [{"host": h, "late_ns": 5} for h in hosts[:1_500]],
            }
            if slow
            else None,
            "evidence": {
                "spread_ns": 10**7,
                "hosts": {h: dict(small, sched=4.0 if h == "n2" else 0.0) for h in hosts},
                "ranks": {h: i for i, h in enumerate(hosts[:1_500])},  # the rank of each evidence host
            },
        }
        calls.clear()
        eng.process("steps", fields.step_record(rec))
        if slow:
            assert len(calls) < 100, len(calls)
