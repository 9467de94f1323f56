"""The engine's semantics: windows and thresholds per group, `for` and keep_firing_for, correlation in
order, foreach, fingerprints, state snapshot/restore, and hot reload that keeps the old rules when the
new files are broken. No Kafka, no HTTP: changes go to an injected notify function."""

from __future__ import annotations

import logging
from pathlib import Path

from obshub.core.settings import load_settings
from obshub.rules import fields
from obshub.rules.engine import Engine
from obshub.rules.lifecycle import fingerprint
from obshub.rules.loader import load_ruleset
from obshub.rules.service import RuleService
from obshub.rules.sinks.config import AlertingConfig
from obshub.rules.testing import BASE_NS

S = 1_000_000_000

RULES = """\
version: 1
rules:
  - id: slow_sync
    description: three slow syncs in 10 s per host
    severity: warning
    signal: events
    kinds: [CUDA_SYNC]
    condition: duration_ns > 1000
    group_by: {host: host}
    window: 10s
    threshold: {at_least: 3}
    for: 5s
    keep_firing_for: 5s
    annotations: {last: "{{ duration_ns }}"}
  - id: rdma_on_straggler
    description: correlated
    severity: critical
    signal: steps
    condition: stall == true && straggler != null
    correlate:
      signal: events
      kinds: [RDMA_CQ_DONE]
      condition: duration_us > 20.0
      this_keys: {host: straggler.host, step: step}
      other_keys: {host: host, step: step}
      within: 30s
      order: other_first
    group_by: {host: straggler.host}
    window: 10s
    annotations: {evidence: "{{ other.duration_us }} us"}
"""


def ev(kind: str, t_s: float, **kw) -> dict:
    return fields.event_record_from_test({"kind": kind, "ts_ns": BASE_NS + int(t_s * S), **kw})


def step(t_s: float, **kw) -> dict:
    return fields.step_record({"closed_at_ns": BASE_NS + int(t_s * S), **kw})


def make(tmp_path: Path, text: str = RULES):
    p = tmp_path / "r.yaml"
    p.write_text(text)
    changes: list[dict] = []
    return Engine(load_ruleset([p]), changes.append), changes


def states(changes: list[dict]) -> list[tuple[str, str]]:
    return [(c["rule"], c["status"]) for c in changes]


def test_threshold_for_and_keep_firing_for(tmp_path):
    eng, changes = make(tmp_path)
    for t in (0, 1):
        eng.process("events", ev("CUDA_SYNC", t, host="a", duration_ns=5000))
    eng.process("events", ev("CUDA_SYNC", 1.5, host="b", duration_ns=5000))  # other group
    eng.process("events", ev("CUDA_SYNC", 1.6, host="a", duration_ns=10))  # condition false
    assert changes == []
    eng.process("events", ev("CUDA_SYNC", 2, host="a", duration_ns=5000))  # third hit: pending
    assert states(changes) == [("slow_sync", "pending")]
    eng.tick(BASE_NS + 6 * S)  # for 5 s not yet over
    assert len(changes) == 1
    eng.tick(BASE_NS + 7 * S)
    assert states(changes)[-1] == ("slow_sync", "firing")
    fired = changes[-1]
    assert fired["labels"] == {"alertname": "slow_sync", "severity": "warning", "host": "a"}
    assert fired["fingerprint"] == fingerprint(fired["labels"]) and len(fired["fingerprint"]) == 16
    assert fired["annotations"]["last"] == "5000" and fired["starts_at"].endswith("Z")
    # the first hit leaves the 10 s window at t=10: condition false; keep firing 5 s more -> resolved at 15 s
    eng.tick(BASE_NS + 14 * S)
    assert states(changes)[-1] == ("slow_sync", "firing")
    eng.tick(BASE_NS + 16 * S)
    assert states(changes)[-1] == ("slow_sync", "resolved")
    assert changes[-1]["ends_at_ns"] == BASE_NS + 15 * S


def test_pending_that_ends_before_for_goes_inactive(tmp_path):
    eng, changes = make(tmp_path)
    for t in (0, 1, 2):
        eng.process("events", ev("CUDA_SYNC", t, host="a", duration_ns=5000))
    eng.tick(BASE_NS + 60 * S)  # window 10 s < for 5 s after pending at 2 s? pending at 2, true until 10 -> fires at 7
    assert states(changes) == [("slow_sync", "pending"), ("slow_sync", "firing"), ("slow_sync", "resolved")]
    text = RULES.replace("for: 5s", "for: 20s")
    eng, changes = make(tmp_path, text)
    for t in (0, 1, 2):
        eng.process("events", ev("CUDA_SYNC", t, host="a", duration_ns=5000))
    eng.tick(BASE_NS + 60 * S)
    assert states(changes) == [("slow_sync", "pending"), ("slow_sync", "inactive")]


def test_correlation_respects_keys_window_and_order(tmp_path):
    eng, changes = make(tmp_path)
    eng.process("events", ev("RDMA_CQ_DONE", 0, host="n2", step=5, duration_ns=45_000))
    eng.process("events", ev("RDMA_CQ_DONE", 0, host="n3", step=5, duration_ns=45_000))
    eng.process("events", ev("RDMA_CQ_DONE", 0, host="n2", step=6, duration_ns=10_000))  # fast: no match
    eng.process("steps", step(1, step=6, stall=True, straggler={"host": "n2"}))  # other step
    assert changes == []
    eng.process("steps", step(2, step=5, stall=True, straggler={"host": "n2"}))
    assert states(changes) == [("rdma_on_straggler", "firing")]  # for: 0 -> no pending change
    assert changes[-1]["labels"]["host"] == "n2" and changes[-1]["annotations"]["evidence"] == "45.0 us"
    # order other_first: an event after the step does not count
    eng2, ch2 = make(tmp_path)
    eng2.process("steps", step(0, step=9, stall=True, straggler={"host": "n1"}))
    eng2.process("events", ev("RDMA_CQ_DONE", 1, host="n1", step=9, duration_ns=45_000))
    assert ch2 == []
    # beyond `within` (30 s) no match either
    eng3, ch3 = make(tmp_path)
    eng3.process("events", ev("RDMA_CQ_DONE", 0, host="n1", step=9, duration_ns=45_000))
    eng3.process("steps", step(31, step=9, stall=True, straggler={"host": "n1"}))
    assert ch3 == []


def test_snapshot_restore_keeps_windows_and_alerts(tmp_path):
    eng, changes = make(tmp_path)
    for t in (0, 1):
        eng.process("events", ev("CUDA_SYNC", t, host="a", duration_ns=5000))
    snap = eng.snapshot()
    eng2, changes2 = make(tmp_path)
    eng2.restore(snap)
    eng2.process("events", ev("CUDA_SYNC", 2, host="a", duration_ns=5000))  # the third hit, after restart
    assert states(changes2) == [("slow_sync", "pending")]
    eng2.tick(BASE_NS + 8 * S)
    snap2 = eng2.snapshot()
    eng3, changes3 = make(tmp_path)
    eng3.restore(snap2)
    eng3.tick(BASE_NS + 9 * S)
    assert changes3 == []  # already firing: no duplicate firing change after a restart
    eng3.tick(BASE_NS + 20 * S)
    assert states(changes3) == [("slow_sync", "resolved")]


def test_hot_reload_keeps_old_rules_when_new_files_are_broken(tmp_path, caplog):
    settings = load_settings(home=tmp_path / "home")
    rules = tmp_path / "r.yaml"
    rules.write_text(RULES)
    svc = RuleService(settings, [rules], AlertingConfig())
    try:
        assert set(svc.ruleset.rules) == {"slow_sync", "rdma_on_straggler"}
        rules.write_text(RULES.replace("condition: duration_ns > 1000", "condition: duration_ns >"))
        import os

        os.utime(rules, (1, 1))  # make sure the mtime differs even on coarse clocks
        with caplog.at_level(logging.ERROR, logger="obshub.rules.service"):
            assert svc.maybe_reload() is False
        assert set(svc.engine.ruleset.rules) == {"slow_sync", "rdma_on_straggler"}
        assert f"{rules}:8:" in caplog.text and "CEL syntax error" in caplog.text
        # the old rules still evaluate
        for t in (0, 1, 2):
            svc.engine.process("events", ev("CUDA_SYNC", t, host="a", duration_ns=5000))
        assert [c["status"] for c in svc.outbox] == ["pending"]
        # a fixed file is picked up (SIGHUP path: request flag)
        rules.write_text(RULES.replace("id: slow_sync", "id: slow_sync2"))
        svc.reload_requested.set()
        assert svc.maybe_reload() is True
        assert set(svc.engine.ruleset.rules) == {"slow_sync2", "rdma_on_straggler"}
        assert svc.outbox[-1]["status"] == "inactive"  # the pending alert of the removed rule ended
        assert svc.maybe_reload() is None
    finally:
        svc.dispatcher.close()


def test_a_route_to_a_sink_the_config_lacks_refuses_to_start_and_a_reload_keeps_the_old_rules(tmp_path, caplog):
    """`routes: [oncal-slack]` (a typo) was a warning: the rule's alerts went to no sink. Now serve refuses to
    start, naming the rule's file:line, the sink and the nearest configured one; a reload keeps the old rules."""
    import os

    import pytest

    from obshub.rules.errors import SinkConfigError
    from obshub.rules.sinks.config import SinkSpec

    settings = load_settings(home=tmp_path / "home")
    config = AlertingConfig(
        sinks=[SinkSpec(name="oncall-slack", type="console"), SinkSpec(name="pager", type="console")]
    )
    rules = tmp_path / "r.yaml"
    rules.write_text(RULES.replace("    severity: warning\n", "    severity: warning\n    routes: [oncal-slack]\n"))
    with pytest.raises(SinkConfigError) as exc:
        RuleService(settings, [rules], config)
    assert (
        f"{rules}:3:1: rule \"slow_sync\": routes to sink 'oncal-slack', which the alerting config does not have"
        in str(exc.value)
    )
    assert "did you mean 'oncall-slack'? configured: oncall-slack, pager" in str(exc.value)
    rules.write_text(RULES.replace("    severity: warning\n", "    severity: warning\n    routes: [oncall-slack]\n"))
    svc = RuleService(settings, [rules], config)
    try:
        assert svc.ruleset.rules["slow_sync"].routes == ["oncall-slack"]
        rules.write_text(RULES.replace("    severity: critical\n", "    severity: critical\n    routes: [nowhere]\n"))
        os.utime(rules, (1, 1))
        with caplog.at_level(logging.ERROR, logger="obshub.rules.service"):
            assert svc.maybe_reload() is False
        assert "routes to sink 'nowhere'" in caplog.text and 'rule "rdma_on_straggler"' in caplog.text, caplog.text
        assert svc.engine.ruleset.rules["rdma_on_straggler"].routes == []  # the old rules keep running
    finally:
        svc.dispatcher.close()


def test_a_null_group_by_value_is_no_label_and_its_fingerprint_is_of_the_labels_carried(tmp_path):
    """A group-by value that evaluates to null gives the alert no such label (a rank the summary did not
    know), not an empty one (it gave `rank=""` before); a value of "" stays a label. The fingerprint is
    that of the labels the alert carries, so a restart or a reload finds it again."""
    engine, changes = make(
        tmp_path,
        """\
version: 1
rules:
  - id: slow
    description: a slow step
    severity: warning
    signal: steps
    condition: step_time_max_ns > 0
    group_by:
      job: job
      rank: "straggler != null && has(straggler.rank) ? straggler.rank : null"
      empty: "''"
""",
    )
    engine.process("steps", step(0, job="a", step=1, step_time_max_ns=5, straggler={"host": "h", "rank": 7}))
    engine.process("steps", step(0, job="b", step=1, step_time_max_ns=5))
    engine.tick(BASE_NS + S)
    got = {c["labels"]["job"]: c for c in changes if c["status"] == "firing"}
    assert got["a"]["labels"]["rank"] == "7" and got["a"]["labels"]["empty"] == ""
    assert "rank" not in got["b"]["labels"] and got["b"]["labels"]["empty"] == "", got["b"]["labels"]
    for c in got.values():
        assert c["fingerprint"] == fingerprint(c["labels"])
