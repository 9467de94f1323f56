"""Retention of the rule engine's per-job state (docs/RULES.md "Retention"): a job without a record for
the retention has its firing alerts resolved (a pending one goes inactive), then its groups' windows and
cached fingerprints dropped; a live job keeps its state and its alert; a snapshot after the expiry holds
only the live job. No Kafka: changes go to an injected notify function."""

from __future__ import annotations

from pathlib import Path

from obshub.rules import fields
from obshub.rules.engine import Engine
from obshub.rules.loader import load_ruleset
from obshub.rules.testing import BASE_NS

S = 1_000_000_000
RETENTION_S = 120

RULES = """\
version: 1
rules:
  - id: slow_steps
    description: a slow step per job and host, held while it lasts
    severity: warning
    signal: steps
    condition: step_time_max_ns > 1000
    group_by: {job: job, host: straggler.host}
    window: 1h
    keep_firing_for: 1h
  - id: pending_steps
    description: slow steps that must last 1 h to fire
    severity: info
    signal: steps
    condition: step_time_max_ns > 1000
    group_by: {job: job}
    window: 1h
    for: 1h
"""


def step(t_s: float, job: str, n: int) -> dict:
    return fields.step_record(
        {
            "job": job,
            "step": n,
            "closed_at_ns": BASE_NS + int(t_s * S),
            "step_time_max_ns": 5000,
            "straggler": {"host": f"{job}-h0", "layer": "sched", "excess_ns": 10},
        }
    )


def make(tmp_path: Path):
    p = tmp_path / "r.yaml"
    p.write_text(RULES)
    changes: list[dict] = []
    return Engine(load_ruleset([p]), changes.append, retention_ns=RETENTION_S * S), changes


def _state_of(eng: Engine, job: str) -> dict[str, int]:
    """How much state names ``job``: alerts, windows, cached fingerprints, the job clock."""
    fps = {fp for rt in eng.runtime.values() for fp, labels in rt.fps.values() if labels.get("job") == job}
    return {
        "alerts": sum(1 for i in eng.instances.values() if i.labels.get("job") == job),
        "fingerprints": len(fps),
        "windows": sum(1 for rt in eng.runtime.values() for fp in rt.hits if fp in fps),
        "seen": int(job in eng.job_seen),
    }


def test_an_ended_jobs_alerts_resolve_then_its_state_is_dropped_and_a_live_jobs_is_kept(tmp_path):
    eng, changes = make(tmp_path)
    for i in range(3):
        eng.process("steps", step(i, "old", i))
    eng.tick(BASE_NS + 3 * S)
    assert {(c["rule"], c["status"]) for c in changes} == {("slow_steps", "firing"), ("pending_steps", "pending")}
    assert _state_of(eng, "old") == {"alerts": 2, "fingerprints": 2, "windows": 2, "seen": 1}

    for t in range(60, 60 + RETENTION_S + 30, 30):  # "live" sends a step every 30 s; "old" is silent
        eng.process("steps", step(t, "live", t))
        eng.tick(BASE_NS + t * S)
    ended = [c for c in changes if c["labels"].get("job") == "old"][2:]
    assert sorted((c["rule"], c["status"]) for c in ended) == [
        ("pending_steps", "inactive"),
        ("slow_steps", "resolved"),
    ]
    assert _state_of(eng, "old") == {"alerts": 0, "fingerprints": 0, "windows": 0, "seen": 0}
    live = _state_of(eng, "live")
    assert live == {"alerts": 2, "fingerprints": 2, "windows": 2, "seen": 1}
    assert [i.state for i in eng.instances.values() if i.rule == "slow_steps"] == ["firing"]

    # a restart from the snapshot holds only the live job, and it is dropped in turn once it ends
    again, changes2 = make(tmp_path)
    again.restore(eng.snapshot())
    assert _state_of(again, "old") == {"alerts": 0, "fingerprints": 0, "windows": 0, "seen": 0}
    assert _state_of(again, "live")["alerts"] == 2 and again.job_seen.keys() == {"live"}
    again.tick(BASE_NS + (60 + 2 * RETENTION_S + 60) * S)
    assert {(c["rule"], c["status"]) for c in changes2} == {("slow_steps", "resolved"), ("pending_steps", "inactive")}
    assert again.instances == {} and all(not rt.hits and not rt.fps for rt in again.runtime.values())


def test_resolve_all_ends_every_alert_of_an_engine_that_stops_for_good(tmp_path):
    """`rules serve --resolve-on-exit` (the demo): the demo's alerts stayed firing on the alerts topic after
    its engine stopped. At exit a firing alert publishes `resolved`, a pending one `inactive`, and no alert
    is left in the state."""
    eng, changes = make(tmp_path)
    for i in range(3):
        eng.process("steps", step(i, "demo", i))
    eng.tick(BASE_NS + 3 * S)
    before = len(changes)
    assert eng.resolve_all() == 1
    assert sorted((c["rule"], c["status"]) for c in changes[before:]) == [
        ("pending_steps", "inactive"),
        ("slow_steps", "resolved"),
    ]
    assert eng.instances == {} and eng.dirty


def test_an_alert_restored_without_job_times_counts_from_the_restore(tmp_path):
    eng, _changes = make(tmp_path)
    eng.process("steps", step(0, "j", 0))
    eng.tick(BASE_NS + 1 * S)
    snap = eng.snapshot()
    del snap["jobs"]  # as an older version saved it
    again, changes = make(tmp_path)
    again.restore(snap)
    again.tick(BASE_NS + (RETENTION_S - 10) * S)
    assert changes == [] and _state_of(again, "j")["alerts"] == 2
    again.tick(BASE_NS + (2 * RETENTION_S + 10) * S)
    assert {c["status"] for c in changes} == {"resolved", "inactive"} and again.instances == {}


STEP_RULES = """\
version: 1
rules:
  - id: slow_in_steps
    description: slow in 2 of the last 5 steps
    severity: warning
    signal: steps
    condition: step_time_max_ns > 1000
    group_by: {job: job}
    window: 5 steps
    threshold: {at_least: 2}
"""


def test_windows_in_steps_are_dropped_with_their_job(tmp_path):
    """A rule with a window counted in steps keeps per-job step counters and groups: both go with the job."""
    p = tmp_path / "s.yaml"
    p.write_text(STEP_RULES)
    eng = Engine(load_ruleset([p]), [].append, retention_ns=RETENTION_S * S)
    for n in range(3):
        eng.process("steps", step(n, "ended", n))
        eng.process("steps", step(n, "live", n))
    rt = eng.runtime["slow_in_steps"]
    assert "ended" in eng.job_steps["steps"] and "ended" in rt.job_groups and rt.hits
    eng.process("steps", step(RETENTION_S + 10, "live", 3))
    eng.tick(BASE_NS + (RETENTION_S + 11) * S)
    assert "ended" not in eng.job_steps["steps"] and "ended" not in rt.job_groups
    assert "live" in eng.job_steps["steps"] and set(rt.job_of.values()) == {"live"}
    assert len(rt.hits) == 1
