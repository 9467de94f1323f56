"""A stream worker failover is not a dead host: two real workers share a job's partitions, one is
SIGKILLed while steps stream in with a window shorter than the failover (the group's 6 s session timeout
plus table recovery), and no step summary may list a host as missing (real broker, real workers)."""

from __future__ import annotations

import time

import pytest

from obshub.streams import synthetic
from tests.streams.test_streams_worker import _by_job, _wait_group_members, _wait_settled
from tests.support import testkit

pytestmark = pytest.mark.kafka

WINDOW_S = 2.0  # far below the failover: the dead worker's input partitions go unread for 6 s or more


def test_sigkill_of_one_of_two_workers_calls_no_live_host_missing(kafka, tmp_path, unique):
    tag = f"fo-{unique}"
    topics = testkit.make_topics(kafka, tag, partitions=4)
    # 8 hosts cover all 4 input partitions, so the killed worker always carried some of them
    scn = synthetic.Scenario(job=f"fo-{unique}", hosts=8, steps=30, straggler=1, seed=11)
    batches = synthetic.generate(scn)
    app = f"{tag}-app"
    ws = [testkit.Worker(topics, app, 400 + i, tmp_path / f"w{i}.log", window_s=WINDOW_S) for i in range(2)]
    try:
        _wait_settled(*ws)
        _wait_group_members(kafka, app, 2)
        _wait_settled(*ws)
        by_step: dict[int, list] = {}
        regs = [kb for kb in batches if kb[1].events[0].step < 0]
        for kb in batches:
            if kb not in regs:
                by_step.setdefault(kb[1].events[0].step, []).append(kb)
        testkit.publish(kafka, topics.events, regs)
        for step in sorted(by_step):  # the job runs at 0.4 s per step while one worker dies
            testkit.publish(kafka, topics.events, by_step[step])
            if step == 5:
                ws[1].kill()
            time.sleep(0.4)
        got = _by_job(kafka, topics.steps, scn.job, scn.steps, timeout_s=60)
    finally:
        for w in ws:
            w.stop()
    got = [s for s in got if s["closed_by"] != "hang"]
    missing = [(s["step"], s["closed_by"], s["missing_hosts"]) for s in got if s["missing_hosts"]]
    assert not missing, f"live hosts called missing during the failover: {missing}"
    steps = [s["step"] for s in got]
    assert sorted(steps) == list(range(scn.steps)), f"every step summarised once, got {sorted(steps)}"
    assert all(len(s["hosts"]) == 8 for s in got)
