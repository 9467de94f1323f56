"""Windows counted in steps, a per-step count for event rules, closed steps by default (interim records by
opting in), explicit warm-up, and notifying again on a new match while firing (issue #31); the two rules of
the trial are written as asked and their `rules test` file passes."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from obshub.rules import fields
from obshub.rules.engine import STEP_HOLD_NS, Engine
from obshub.rules.errors import RuleValidationError
from obshub.rules.loader import load_ruleset
from obshub.rules.testing import BASE_NS, run_test_file

S = 1_000_000_000
REPO = Path(__file__).resolve().parents[2]
OBSHUB = [sys.executable, "-m", "obshub.cli"]
TRIAL = REPO / "tests" / "rules" / "trial"

RULES = """\
version: 1
rules:
  - id: slow_allreduce
    description: slow all-reduce enqueue in 3 of the host's last 10 steps
    severity: warning
    signal: events
    kinds: [NCCL_COLL]
    condition: duration_ms > 5.0
    group_by: {job: job, host: host}
    window: 10 steps
    threshold: {at_least: 3}
  - id: stalled
    description: a stall over 5x the median
    severity: critical
    signal: steps
    condition: stall_ratio > 5.0
    group_by: {job: job}
    window: 1 step
    warmup_steps: 10
    renotify: {limit: 2, after: 10s}
  - id: any_open_step
    description: reads interim records
    severity: info
    signal: steps
    condition: closed_by == 'running'
    interim: true
    group_by: {job: job}
    window: 1m
"""


def ev(t_s: float, step: int, ms: float, host: str = "n2", job: str = "llm") -> dict:
    spec = {"kind": "NCCL_COLL", "ts_ns": BASE_NS + int(t_s * S), "step": step, "host": host, "job": job}
    return fields.event_record_from_test({**spec, "duration_ns": int(ms * 1e6)})


def step(t_s: float, n: int, **kw) -> dict:
    return fields.step_record({"job": "llm", "step": n, "closed_at_ns": BASE_NS + int(t_s * S), **kw})


def make(tmp_path: Path, text: str = RULES):
    p = tmp_path / "r.yaml"
    p.write_text(text)
    changes: list[dict] = []
    return Engine(load_ruleset([p]), changes.append), changes


def active(eng: Engine) -> list[tuple[str, str]]:
    return [(i.rule, i.labels.get("host", i.labels.get("job", ""))) for i in eng.active()]


def test_event_rule_counts_steps_with_a_match_in_the_jobs_last_n_steps(tmp_path):
    eng, _ = make(tmp_path)
    for k in range(5):  # five slow calls in one step: one step
        eng.process("events", ev(k * 0.1, 1, 7.0))
    assert active(eng) == []
    assert eng.runtime["slow_allreduce"].hits and len(next(iter(eng.runtime["slow_allreduce"].hits.values()))) == 1
    eng.process("events", ev(1, 4, 7.0))
    eng.process("events", ev(2, 4, 1.0, host="n1"))  # a fast call: no match
    assert active(eng) == []
    eng.process("events", ev(3, 10, 9.0))
    assert active(eng) == [("slow_allreduce", "n2")]
    # another host's record moves the job to step 11: step 1 is out of the last 10 steps
    eng.process("events", ev(4, 11, 1.0, host="n1"))
    eng.tick(BASE_NS + 5 * S)
    assert active(eng) == []
    # windows are per group: n1's slow steps do not count for n2
    for k, s in enumerate((12, 13)):
        eng.process("events", ev(6 + k, s, 8.0, host="n1"))
    eng.process("events", ev(9, 14, 8.0))
    assert active(eng) == []


def test_step_window_is_per_job_and_a_stopped_job_resolves_after_the_hold(tmp_path):
    eng, changes = make(tmp_path)
    for s in (1, 2, 3):
        eng.process("events", ev(s, s, 7.0, job="a"))
    assert active(eng) == [("slow_allreduce", "n2")]
    # job b's steps (much further on) do not move job a's window
    eng.process("events", ev(4, 500, 1.0, job="b"))
    assert active(eng) == [("slow_allreduce", "n2")]
    # job a sends nothing more: its alert ends STEP_HOLD_NS after its last record
    eng.tick(BASE_NS + 3 * S + STEP_HOLD_NS - S)
    assert active(eng) == [("slow_allreduce", "n2")]
    eng.tick(BASE_NS + 3 * S + STEP_HOLD_NS + S)
    assert active(eng) == [] and changes[-1]["status"] == "resolved"


def test_steps_rules_skip_interim_records_and_warm_up_unless_they_opt_in(tmp_path):
    eng, changes = make(tmp_path)
    base = {"median_ns": 100, "p99_ns": 100, "spread_ns": 1}
    eng.process("steps", step(1, 5, stall_ratio=9.0, baseline={**base, "n": 5}))  # warm-up
    assert active(eng) == []
    eng.process("steps", step(2, 20, stall_ratio=9.0, closed_by="running", baseline={**base, "n": 19}))
    assert active(eng) == [("any_open_step", "llm")]  # only the rule that opted in read it
    eng.process("steps", step(3, 20, stall_ratio=9.0, closed_by="hang", baseline={**base, "n": 19}))
    assert ("stalled", "llm") not in active(eng)
    eng.process("steps", step(4, 20, stall_ratio=6.0, baseline={**base, "n": 19}))
    assert ("stalled", "llm") in active(eng)
    eng.process("steps", step(5, 21, stall_ratio=1.0, baseline={**base, "n": 20}))
    assert ("stalled", "llm") not in active(eng)  # `window: 1 step`: the next closed step ends it
    assert [c["status"] for c in changes if c["rule"] == "stalled"] == ["firing", "resolved"]


def test_renotify_sends_firing_again_on_a_new_match_with_its_own_limit(tmp_path):
    text = RULES.replace("window: 1 step\n", "window: 3 steps\n")
    eng, changes = make(tmp_path, text)
    base = {"median_ns": 100, "p99_ns": 100, "spread_ns": 1, "n": 20}
    for k, (t, ratio) in enumerate([(0, 9.0), (5, 8.0), (20, 7.0), (40, 6.0), (60, 9.0)]):
        eng.process("steps", step(t, 30 + k, stall_ratio=ratio, baseline=base))
    got = [(c["status"], c.get("renotified", 0)) for c in changes if c["rule"] == "stalled"]
    # the first page; 5 s later a new match is within `after: 10s`: no repeat; then two repeats (limit 2)
    assert got == [("firing", 0), ("firing", 1), ("firing", 2)], got
    # after it resolves, a new firing starts its own count
    for k in range(3):
        eng.process("steps", step(70 + k, 40 + k, stall_ratio=1.0, baseline=base))
    eng.process("steps", step(80, 50, stall_ratio=9.0, baseline=base))
    eng.process("steps", step(95, 51, stall_ratio=9.0, baseline=base))
    got = [(c["status"], c.get("renotified", 0)) for c in changes if c["rule"] == "stalled"]
    assert got[3:] == [("resolved", 0), ("firing", 0), ("firing", 1)], got


def test_snapshot_keeps_step_windows_and_job_steps(tmp_path):
    eng, _ = make(tmp_path)
    for s in (1, 2):
        eng.process("events", ev(s, s, 7.0))
    snap = eng.snapshot()
    eng2, _ = make(tmp_path)
    eng2.restore(snap)
    eng2.process("events", ev(3, 3, 7.0))
    assert active(eng2) == [("slow_allreduce", "n2")]
    eng2.process("events", ev(4, 12, 1.0, host="n1"))
    eng2.tick(BASE_NS + 5 * S)
    assert active(eng2) == []


@pytest.mark.parametrize(
    "old,new,where,msg",
    [
        ("window: 10 steps", "window: 10 stepz", "10:13", "is neither a duration (e.g. 30s, 5m) nor a number"),
        ("window: 10 steps", "window: 10 sec", "10:13", "e.g. 30s, 5m"),
        ("window: 1m\n", "window: 1 min\n", "28:13", "(e.g. 30s, 5m) nor a number of the job's last steps"),
        ("renotify: {limit: 2, after: 10s}", "renotify: {limit: 2, after: 10 s}", "20:33", "e.g. 10s, 5m"),
    ],
)
def test_bad_windows_and_durations_name_an_example(tmp_path, old, new, where, msg):
    p = tmp_path / "r.yaml"
    assert old in RULES
    p.write_text(RULES.replace(old, new, 1))
    with pytest.raises(RuleValidationError) as exc:
        load_ruleset([p])
    text = str(exc.value)
    assert f"{p}:{where}: " in text and msg in text, text


def test_step_options_on_signals_that_have_no_steps_are_refused(tmp_path):
    p = tmp_path / "r.yaml"
    p.write_text(
        RULES
        + """\
  - id: lagging
    description: d
    severity: info
    signal: health
    condition: lag_messages > 10
    window: 3 steps
  - id: ev_interim
    description: d
    severity: info
    signal: events
    kinds: [CUDA_SYNC]
    condition: duration_ns > 10
    interim: true
    warmup_steps: 3
"""
    )
    with pytest.raises(RuleValidationError) as exc:
        load_ruleset([p])
    got = [str(x) for x in exc.value.problems]
    assert any(":34:13: " in g and "health records have no step" in g for g in got), got
    assert any(":41:5: " in g and "interim: only applies to signal 'steps'" in g for g in got), got
    assert any(":42:5: " in g and "warmup_steps: only applies to signal 'steps'" in g for g in got), got


def test_the_two_rules_of_the_trial_pass_check_and_their_tests():
    res = subprocess.run([*OBSHUB, "rules", "check", str(TRIAL / "trial_rules.yaml")], capture_output=True, text=True)
    assert res.returncode == 0, res.stdout + res.stderr
    results = run_test_file(TRIAL / "trial_test.yaml")
    assert len(results) == 2 and all(r.ok for r in results), [r.failures for r in results]


def test_rules_check_on_a_test_file_points_to_rules_test_and_test_inputs_accept_n(tmp_path):
    res = subprocess.run([*OBSHUB, "rules", "check", str(TRIAL / "trial_test.yaml")], capture_output=True, text=True)
    out = res.stdout + res.stderr
    assert res.returncode == 1 and f"{TRIAL / 'trial_test.yaml'}:2:1: this is a rule test file" in out, out
    assert "run it with `obshub rules test" in out, out
    # `baseline: {n: 3}` (the schema's own key) is read as the key 'n', not refused as a YAML 1.1 boolean
    assert "baseline: {n: 3" in (TRIAL / "trial_test.yaml").read_text()


def test_renotify_reaches_a_sink_again_through_the_dispatcher(tmp_path):
    """The repeated `firing` change of `renotify` is delivered again (a console sink prints it), while a
    firing alert without `renotify` is notified once for all its matches."""
    import io
    import time

    from obshub.rules.dispatch import Dispatcher
    from obshub.rules.sinks.base import DeliveryPolicy
    from obshub.rules.sinks.config import Route
    from obshub.rules.sinks.console import ConsoleSink

    rule = """\
  - id: {id}
    description: a stall over 5x the median
    severity: critical
    signal: steps
    condition: stall_ratio > 5.0
    group_by: {{job: job}}
    window: 3 steps
"""
    p = tmp_path / "r.yaml"
    p.write_text(
        "version: 1\nrules:\n"
        + rule.format(id="paged_again")
        + "    renotify: {limit: 2}\n"
        + rule.format(id="paged_once")
    )
    out, acked, sent = io.StringIO(), [], []
    d = Dispatcher(
        [ConsoleSink("console", stream=out)],
        Route(group_by=["alertname"], group_wait="0s", group_interval="0s", repeat_interval="4h"),
        [],
        None,
        DeliveryPolicy(max_attempts=1, max_elapsed_s=5, timeout_s=2, backoff_initial_s=0.01, backoff_max_s=0.05),
        acked.extend,
    )
    changes: list[dict] = []
    eng = Engine(load_ruleset([p]), changes.append)
    base = {"median_ns": 100, "p99_ns": 100, "spread_ns": 1, "n": 20}
    try:
        for k in range(4):  # four stalled steps in a row: a first page and (for one rule) two repeats
            eng.process("steps", step(k, 30 + k, stall_ratio=9.0, baseline=base))
            for c in changes:
                sent.append(len(sent))
                d.submit(c, sent[-1], now_ns=BASE_NS + k * S)
            changes.clear()
            d.tick(BASE_NS + k * S)
            deadline = time.monotonic() + 10
            while sorted(acked) != sent and time.monotonic() < deadline:
                time.sleep(0.02)
        lines = out.getvalue().splitlines()
        assert sum(x.startswith("[FIRING] paged_again") for x in lines) == 3, lines
        assert sum(x.startswith("[FIRING] paged_once") for x in lines) == 1, lines
    finally:
        d.close()


def test_a_jobs_events_of_the_next_step_do_not_push_its_step_summary_out_of_a_step_window(tmp_path):
    """Events of step N+1 arrive before the summary of step N is closed: the step axis of a steps rule
    is the job's step summaries, of an events rule its events."""
    eng, _ = make(tmp_path)
    base = {"median_ns": 100, "p99_ns": 100, "spread_ns": 1, "n": 20}
    eng.process("events", ev(0, 21, 1.0))  # the job's events are already in step 21
    eng.process("steps", step(1, 20, stall_ratio=9.0, baseline=base))  # step 20 closes
    assert ("stalled", "llm") in active(eng)
    eng.process("steps", step(2, 21, stall_ratio=1.0, baseline=base))
    assert ("stalled", "llm") not in active(eng)


def test_a_new_life_of_a_job_starts_its_windows_in_steps_again(tmp_path):
    """A restarted job numbers its steps again (docs/STREAMS.md "Restarts, resumes and world-size
    changes"): the new life's steps count in a window of steps from its first record, the old life's
    matches never count with them, and a late record of the old life counts nowhere."""
    rules = RULES + (
        "  - id: missing\n    description: a host missing in 3 of the last 10 steps\n    severity: warning\n"
        "    signal: steps\n    condition: size(missing_hosts) > 0\n    group_by: {job: job}\n"
        "    window: 10 steps\n    threshold: {at_least: 3}\n"
    )
    eng, _ = make(tmp_path, rules)
    miss = {"missing_hosts": ["n3"]}
    for k, n in enumerate((50, 51)):
        eng.process("steps", step(k, n, life=0, **miss))
    eng.process("steps", step(3, 0, life=1, **miss))  # restarted from step 0: 2 old + 1 new are no 3
    eng.process("steps", step(4, 52, life=0, **miss))  # a late record of the old life
    assert active(eng) == []
    eng.process("steps", step(5, 1, life=1, **miss))
    assert active(eng) == []
    eng.process("steps", step(6, 2, life=1, **miss))
    assert active(eng) == [("missing", "llm")]
    assert eng.snapshot()["lives"] == {"llm": 1}
