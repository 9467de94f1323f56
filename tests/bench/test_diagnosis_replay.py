"""bench/diagnosis_replay.py: the per-episode split of sequence runs and the worker-faithful replay."""

from __future__ import annotations

import dataclasses
import json

from bench import diagnosis_replay as dr
from obshub.core import schema
from obshub.streams import synthetic


def _sent_at_last_event(batches: list[schema.Batch]) -> list[schema.Batch]:
    """The synthetic batches, each sent at its last event's CLOCK_REALTIME time (as an agent seals it)."""
    out = []
    for b in batches:
        last = max((schema.to_realtime_ns(e.ts_ns, b.clock) for e in b.events), default=0)
        out.append(dataclasses.replace(b, sent_ns=last + 1_000_000))
    return out


def test_the_worker_replay_summarises_every_step_and_names_the_guilty_host_and_layer():
    """Ten steps in a row where node2's run-queue time makes it late: both replays name node2 / sched, the
    worker's one from summaries it closed at the batches' send times (a step closes when its last host's
    batch arrives, never before)."""
    scn = synthetic.Scenario(job="j", hosts=4, steps=60, straggler=2, guilty_steps=tuple(range(30, 40)))
    batches = _sent_at_last_event([b for _k, b in synthetic.generate(scn)])
    rules = [dr.BUILTIN]
    summaries, fired = dr.replay_worker(batches, rules)
    assert sorted(step for _job, step in summaries) == list(range(60))
    last_sent = {}
    for b in batches:
        for e in b.events:
            if e.kind == schema.Kind.STEP_END:
                last_sent[e.step] = max(last_sent.get(e.step, 0), b.sent_ns)
    assert all(s["closed_at_ns"] == last_sent[step] for (_j, step), s in summaries.items())
    assert {(a.host, a.layer) for a in fired} == {("node2", "sched")}
    _off, fired_offline = dr.replay(batches, rules)
    assert {(a.host, a.layer) for a in fired_offline} == {("node2", "sched")}


def test_a_sequence_run_is_judged_per_episode(tmp_path):
    """A report with episodes gives one entry per episode, each judged from its injection (the first from
    the start) to the next one; the last ends at its removal plus the settle time."""
    run = tmp_path / "demo-1"
    run.mkdir()
    report = {
        "scenario": {"run_id": "r1", "job": "j", "fault": "cpu", "hosts": 4, "settle_s": 6.0},
        "verdict": {},
        "episodes": [
            {"kind": "cpu", "host": "node-01", "t0_ns": 100, "removed_ns": 150},
            {"kind": "mem", "host": "node-02", "t0_ns": 300, "removed_ns": 350},
        ],
    }
    (run / "report.json").write_text(json.dumps(report))
    got = dr.read_runs(tmp_path)
    assert [(r["run_id"], r["fault"], r["host"], r["from_ns"], r["until_ns"]) for r in got] == [
        ("r1#0", "cpu", "node-01", 0, 300),
        ("r1#1", "mem", "node-02", 300, 350 + 6_000_000_000),
    ]
