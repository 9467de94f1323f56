"""The stream application end to end: real broker (session fixture ``kafka``), real ``obshub streams
worker`` subprocesses, synthetic agent batches with a known answer. Every test uses its own job names,
and the multi-worker and crash tests their own topics and app ids.

Step windows are short (WINDOW_S) only where expiry is under test and 60 s elsewhere, so a worker
starved of CPU on a loaded machine cannot close a step early; no assertion is on timing (waits are
generous upper bounds)."""

from __future__ import annotations

import re
import socket
import time
import uuid

import httpx
import msgpack
import pytest

from obshub.core import registry, schema
from obshub.core.schema import Batch, Clock, Event, Kind
from obshub.streams import offline, synthetic
from tests.support import testkit

pytestmark = pytest.mark.kafka

WINDOW_S = 3.0
IDLE_S = 2.0  # the short worker's --read-idle-every-s (default 5 s): the idle test counts for a few seconds only
# what must be identical between the workers' output and the offline reference (closed_at_ns is wall
# time; baseline/stall depend on the order steps closed in; quality.late_events is 0 in the reference)
ANALYSIS_FIELDS = (
    "job",
    "step",
    "hosts",
    "expected_hosts",
    "missing_hosts",
    "step_time_ns",
    "step_time_max_ns",
    "straggler",
    "blame",
    "collectives",
    "layers",
    "closed_by",
)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _view(s: dict) -> dict:
    return {k: s[k] for k in ANALYSIS_FIELDS}


def _reference(scn: synthetic.Scenario) -> dict[int, dict]:
    return {
        step: _view(s) for (_j, step), s in offline.summarize_batches(b for _k, b in synthetic.generate(scn)).items()
    }


def _by_job(settings, topic, job, n, timeout_s=90.0) -> list[dict]:
    """Summaries of ``job`` on ``topic`` once ``n`` of them arrived, re-read 1.5 s later so that a duplicate
    written just after the n-th would be seen."""

    def enough(msgs):
        return sum(1 for m in msgs if m.key() == job.encode()) >= n

    msgs = testkit.collect(settings, topic, until=enough, timeout_s=timeout_s)
    if enough(msgs):
        time.sleep(1.5)
        msgs = testkit.collect(settings, topic, until=lambda ms: len(ms) >= len(msgs), timeout_s=timeout_s)
    return [s for s in testkit.summaries(msgs) if s["job"] == job]


def _metric(port: int, name: str) -> float:
    """Value of metric ``name`` on the worker's /metrics, summed over its label sets."""
    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
    return sum(float(v) for v in re.findall(rf"^{name}(?:{{[^}}]*}})? ([0-9.e+]+)$", text, re.M))


@pytest.fixture(scope="module")
def workers(kafka, tmp_path_factory):
    """Two single workers on their own topics, shared by the single-worker tests (each test uses its own
    job): ``long`` (60 s window: steps close when complete, a starved worker on a loaded machine cannot
    make a step expire early) and ``short`` (WINDOW_S, for the expiry tests). Started in parallel."""
    out, started = {}, []
    try:
        for name, window in (("long", 60.0), ("short", WINDOW_S)):
            tag = f"st-{uuid.uuid4().hex[:8]}"
            topics = testkit.make_topics(kafka, tag, partitions=4)
            port = _free_port()
            w = testkit.Worker(
                topics,
                f"{tag}-app",
                101 + len(started),
                tmp_path_factory.mktemp("streams") / "w.log",
                window_s=window,
                metrics_port=port,
                args=["--read-idle-every-s", str(IDLE_S)] if name == "short" else None,
            )
            started.append(w)
            out[name] = {"topics": topics, "port": port, "worker": w, "app_id": f"{tag}-app"}
        for w in started:
            w.wait_ready()
        yield out
    finally:
        testkit.stop_together(started)


@pytest.fixture(scope="module")
def shared(workers):
    return workers["long"]


@pytest.fixture(scope="module")
def short(workers):
    return workers["short"]


def test_straggler_and_guilty_layer_named_exactly(kafka, shared, unique):
    scn = synthetic.Scenario(
        job=f"strag-{unique}",
        hosts=4,
        steps=50,
        straggler=2,
        guilty_steps=(7, 8, 23, 41),
        guilty_layer="sched",
        seed=11,
    )
    testkit.publish(kafka, shared["topics"].events, synthetic.generate(scn))
    got = _by_job(kafka, shared["topics"].steps, scn.job, 50)
    steps = [s["step"] for s in got]
    assert sorted(steps) == list(range(50)), "exactly one summary per step"
    comps = {c["name"]: c for c in registry.components(kafka)}
    assert comps["streams-101"]["running"] and comps["streams-101"]["output"] == shared["topics"].steps
    truth = synthetic.expected(scn)
    for s in got:
        # every field, but those of a held step (ambiguous hosts: schema.STEP_HELD_FIELDS) only on such a step
        assert set(schema.STEP_SUMMARY_FIELDS) - schema.STEP_HELD_FIELDS <= set(s) <= set(schema.STEP_SUMMARY_FIELDS)
        assert s["closed_by"] == "complete" and s["missing_hosts"] == []
        if s["step"] in truth:
            assert (s["straggler"]["host"], s["blame"][0]["layer"]) == truth[s["step"]]
            assert s["stall"] is (s["baseline"]["n"] >= 10)
        else:
            assert s["straggler"] is None and s["blame"] == []
    ref = _reference(scn)
    assert {s["step"]: _view(s) for s in got} == ref


def test_malformed_truncated_wrong_version_and_huge_go_to_dlq(kafka, shared, unique):
    good = synthetic.Scenario(job=f"dlq-{unique}", hosts=2, steps=3)
    valid = schema.encode_batch(synthetic.generate(good)[2][1])
    wrong_v = msgpack.unpackb(valid)
    wrong_v["v"] = 2
    huge = b"\x92" + b"x" * (schema.MAX_BATCH_BYTES + 1024)
    bad = {
        f"{unique}-malformed".encode(): b"\xc1\xc1 not msgpack",
        f"{unique}-truncated".encode(): valid[: len(valid) // 2],
        f"{unique}-version".encode(): msgpack.packb(wrong_v),
        f"{unique}-huge".encode(): huge,
    }
    items = [(k, v) for k, v in bad.items()] + synthetic.generate(good)
    testkit.publish(kafka, shared["topics"].events, items)
    # a message's own headers stay on its dead letter, before the DLQ's
    own = [("traceparent", b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")]
    p = testkit.producer(kafka)
    p.produce(shared["topics"].events, key=f"{unique}-headers".encode(), value=b"\xc1 not msgpack", headers=own)
    assert p.flush(30) == 0
    bad[f"{unique}-headers".encode()] = b"\xc1 not msgpack"
    got = _by_job(kafka, shared["topics"].steps, good.job, 3)
    assert sorted(s["step"] for s in got) == [0, 1, 2], "the valid batches are still processed"
    msgs = testkit.collect(
        kafka, shared["topics"].dlq, until=lambda ms: {m.key() for m in ms} >= set(bad), timeout_s=60
    )
    recs = {m.key(): m for m in msgs if m.key() in bad}
    assert set(recs) == set(bad)
    for key, m in recs.items():
        h = {k: v.decode() for k, v in m.headers()}
        assert set(schema.DLQ_HEADERS) <= set(h)
        assert h["obshub.source.topic"] == shared["topics"].events
        assert int(h["obshub.source.partition"]) >= 0 and int(h["obshub.source.offset"]) >= 0
        if key.endswith(b"huge"):
            assert "exceed" in h["obshub.reason"] and h["obshub.field"] == "message"
            assert h["obshub.truncated"] == str(len(huge)) and huge.startswith(m.value())
        else:
            assert m.value() == bad[key], "the DLQ keeps the original value"
        if key.endswith(b"headers"):
            assert m.headers()[0] == own[0] and h["obshub.reason"]
    reasons = {k: dict(m.headers())["obshub.reason"].decode() for k, m in recs.items()}
    assert "not valid msgpack" in reasons[f"{unique}-malformed".encode()]
    assert "not valid msgpack" in reasons[f"{unique}-truncated".encode()]
    assert "unsupported schema version 2" in reasons[f"{unique}-version".encode()]
    assert _metric(shared["port"], "obshub_streams_dlq_total") >= 4


def test_an_internal_message_the_fold_cannot_use_is_dead_lettered_counted_and_passed(kafka, shared, unique):
    """A bug's shape: an internal message the fold fails on (here a malformed ``read`` report written to
    the repartition topic) is logged, counted in ``obshub_streams_processing_errors_total{stage="fold"}``,
    sent to the DLQ naming the internal topic and the reason, and the worker goes on with other jobs."""
    internal = f"{shared['app_id']}-steps"
    before = _metric(shared["port"], "obshub_streams_processing_errors_total")
    p = testkit.producer(kafka)
    p.produce(internal, key=b"batch", value=msgpack.packb({"t": "read", "read": 5, "mark": unique}), partition=0)
    assert p.flush(30) == 0
    msgs = testkit.collect(
        kafka,
        shared["topics"].dlq,
        until=lambda ms: any(dict(m.headers() or []).get("obshub.source.topic") == internal.encode() for m in ms),
        timeout_s=60,
    )
    dead = [m for m in msgs if dict(m.headers() or []).get("obshub.source.topic") == internal.encode()]
    assert dead, "the internal message was not dead-lettered"
    h = {k: v.decode() for k, v in dead[-1].headers()}
    assert set(schema.DLQ_HEADERS) <= set(h) and h["obshub.source.partition"] == "0"
    assert h["obshub.reason"].startswith("fold failed: TypeError"), h["obshub.reason"]
    assert msgpack.unpackb(dead[-1].value())["mark"] == unique
    assert _metric(shared["port"], "obshub_streams_processing_errors_total") >= before + 1
    good = synthetic.Scenario(job=f"after-{unique}", hosts=2, steps=3)
    testkit.publish(kafka, shared["topics"].events, synthetic.generate(good))
    assert sorted(s["step"] for s in _by_job(kafka, shared["topics"].steps, good.job, 3)) == [0, 1, 2]


def test_host_that_stops_sending_closes_by_window_and_is_missing(kafka, short, unique):
    scn = synthetic.Scenario(job=f"stop-{unique}", hosts=4, steps=8, stop_host=3, stop_after=3)
    testkit.publish(kafka, short["topics"].events, synthetic.generate(scn))
    got = {s["step"]: s for s in _by_job(kafka, short["topics"].steps, scn.job, 8)}
    assert sorted(got) == list(range(8))
    for step, s in got.items():
        if step <= 3:
            assert s["closed_by"] == "complete" and s["missing_hosts"] == []
        else:
            assert s["closed_by"] == "window" and s["missing_hosts"] == ["node3"]
            assert s["hosts"] == ["node0", "node1", "node2"]
            assert s["expected_hosts"] == ["node0", "node1", "node2", "node3"]
    # the silent host comes back with step 5 after that step closed: counted late, not mixed in
    late0 = _metric(short["port"], "obshub_streams_late_events_total")
    full = synthetic.generate(synthetic.Scenario(job=scn.job, hosts=4, steps=8))
    key, late = next((k, b) for k, b in full if b.host == "node3" and b.events[0].step == 5)
    testkit.publish(kafka, short["topics"].events, [(key, late)])
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and _metric(short["port"], "obshub_streams_late_events_total") == late0:
        time.sleep(0.2)
    assert _metric(short["port"], "obshub_streams_late_events_total") - late0 == len(late.events)
    time.sleep(1.0)
    again = _by_job(kafka, short["topics"].steps, scn.job, 8)
    assert len(again) == 8, "no second summary for the closed step"


def test_single_event_window_closes_without_more_input(kafka, short, unique):
    job = f"one-{unique}"
    b = Batch(
        job, "solo", 9, f"{job}/solo", 0, [Event(int(Kind.STEP_BEGIN), 5_000, step=3, value=3)], Clock(1_000, 50, 0), 1
    )
    testkit.publish(kafka, short["topics"].events, [(b"solo", b)])
    got = _by_job(kafka, short["topics"].steps, job, 1, timeout_s=60)
    assert len(got) == 1
    s = got[0]
    assert (s["step"], s["closed_by"], s["hosts"], s["straggler"]) == (3, "window", ["solo"], None)
    assert s["layers"] == {"solo": {}} and s["step_time_ns"] == {}


def _read_reports(settings, topic: str, partitions: int, seconds: float) -> int:
    """``read`` reports written to ``topic`` (every partition, from its end) in the next ``seconds``."""
    from confluent_kafka import OFFSET_END, Consumer, TopicPartition

    c = Consumer({"bootstrap.servers": settings.bootstrap_servers, "group.id": f"count-{uuid.uuid4().hex}"})
    try:
        c.assign([TopicPartition(topic, p, OFFSET_END) for p in range(partitions)])
        n, deadline = 0, time.monotonic() + seconds
        while (left := deadline - time.monotonic()) > 0:
            msg = c.poll(min(left, 0.5))
            if msg is not None and msg.error() is None and msg.key() == b"read":
                n += 1
        return n
    finally:
        c.close()


def test_an_idle_worker_writes_its_read_report_rarely(kafka, short, unique):
    """With no new input and no open step the ``progress`` timer writes one ``read`` report per
    --read-idle-every-s (IDLE_S here) to each partition of its internal topic, not two a second
    (streams.app.ReadReports); after new input, every tick again (the window closes of
    test_single_event_window_closes_without_more_input)."""
    scn = synthetic.Scenario(job=f"idle-{unique}", hosts=2, steps=2)
    testkit.publish(kafka, short["topics"].events, synthetic.generate(scn))
    assert len(_by_job(kafka, short["topics"].steps, scn.job, 2)) == 2
    time.sleep(WINDOW_S + 3.0)  # the window and two read margins after the last input
    internal = f"{short['app_id']}-steps"
    idle = _read_reports(kafka, internal, 4, 2.5 * IDLE_S)
    assert 1 <= idle <= 3 * 4, idle  # IDLE_S apart: at most 3 rounds of 4 partitions in 2.5 x IDLE_S (40 before)
    testkit.publish(kafka, short["topics"].events, synthetic.generate(synthetic.Scenario(job=f"{scn.job}-b", hosts=2)))
    assert _read_reports(kafka, internal, 4, 3.0) >= 2 * 4  # new input: every 0.5 s tick again


def test_sequence_gaps_and_duplicates_counted_exactly(kafka, shared, unique):
    scn = synthetic.Scenario(job=f"seq-{unique}", hosts=1, steps=14)
    all_b = synthetic.generate(scn)  # seq 0 = registration, seq n = step n-1
    lost0, dup0 = (_metric(shared["port"], f"obshub_streams_{n}_total") for n in ("lost_batches", "duplicate_batches"))
    drop, dup = {3, 4, 9}, {6, 10}
    items = []
    for key, b in all_b:
        if b.seq in drop:
            continue
        items.append((key, b))
        if b.seq in dup:
            items.append((key, b))
    testkit.publish(kafka, shared["topics"].events, items)
    n_steps = 14 - len(drop)
    got = _by_job(kafka, shared["topics"].steps, scn.job, n_steps)
    assert len(got) == n_steps
    assert sum(s["quality"]["lost_batches"] for s in got) == 3
    assert sum(s["quality"]["duplicate_batches"] for s in got) == 2
    assert sum(s["quality"]["late_events"] for s in got) == 0
    lost = {s["step"]: s["quality"]["lost_batches"] for s in got if s["quality"]["lost_batches"]}
    assert lost == {4: 2, 9: 1}, "a gap is reported on the step of the batch after it"
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if _metric(shared["port"], "obshub_streams_duplicate_batches_total") - dup0 >= 2:
            break
        time.sleep(0.2)
    assert _metric(shared["port"], "obshub_streams_lost_batches_total") - lost0 == 3
    assert _metric(shared["port"], "obshub_streams_duplicate_batches_total") - dup0 == 2


def test_two_workers_give_identical_summaries(kafka, tmp_path, unique):
    tag = f"two-{unique}"
    topics = testkit.make_topics(kafka, tag, partitions=4)
    scn = synthetic.Scenario(
        job=f"strag-{unique}",
        hosts=4,
        steps=50,
        straggler=1,
        guilty_steps=(3, 19, 20, 44),
        guilty_layer="memory",
        seed=5,
    )
    ws = [testkit.Worker(topics, f"{tag}-app", 200 + i, tmp_path / f"w{i}.log", window_s=60.0) for i in range(2)]
    try:
        _wait_settled(*ws)
        _wait_group_members(kafka, f"{tag}-app", 2)
        _wait_settled(*ws)
        testkit.publish(kafka, topics.events, synthetic.generate(scn))
        got = _by_job(kafka, topics.steps, scn.job, 50)
        assert sorted(s["step"] for s in got) == list(range(50)), "exactly one summary per step"
        partial = [
            (s["step"], s["closed_by"], s["hosts"], s["quality"])
            for s in got
            if len(s["hosts"]) < 4 or s["quality"]["lost_batches"]
        ]
        assert not partial, f"steps joined without every host: {partial}"
        assert {s["step"]: _view(s) for s in got} == _reference(scn)
        assert _wait_group_members(kafka, f"{tag}-app", 2) == 2, "both workers stayed in the group"
    finally:
        testkit.stop_together(ws)


def _wait_settled(*ws: testkit.Worker, timeout_s: float = 90.0) -> None:
    """Wait until every worker is ready after its latest assignment (docs/STREAMS.md: Faust can skip input
    that arrives while a worker is still finishing a rebalance or its recovery)."""
    for w in ws:
        w.wait_ready(timeout_s=timeout_s)
    deadline = time.monotonic() + timeout_s
    while not all(w.settled() for w in ws):
        assert time.monotonic() < deadline, "workers did not settle"
        time.sleep(0.2)


def _wait_group_members(settings, group: str, n: int, timeout_s: float = 60.0) -> int:
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": settings.bootstrap_servers})
    deadline, count = time.monotonic() + timeout_s, 0
    while time.monotonic() < deadline:
        d = admin.describe_consumer_groups([group])[group].result()
        count = len(d.members)
        state = getattr(d.state, "name", str(d.state))
        if count >= n and state == "STABLE":
            break
        time.sleep(0.5)
    return count


def _committed_everything(settings, group: str, topic: str, timeout_s: float = 60.0) -> None:
    """Wait until ``group`` has committed the end offset of every partition of ``topic``."""
    from confluent_kafka import Consumer, ConsumerGroupTopicPartitions, TopicPartition
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": settings.bootstrap_servers})
    c = Consumer({"bootstrap.servers": settings.bootstrap_servers, "group.id": f"probe-{uuid.uuid4().hex}"})
    try:
        parts = admin.list_topics(topic, timeout=10).topics[topic].partitions
        ends = {p: c.get_watermark_offsets(TopicPartition(topic, p), timeout=5)[1] for p in parts}
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            res = admin.list_consumer_group_offsets([ConsumerGroupTopicPartitions(group)])[group].result()
            done = {tp.partition: tp.offset for tp in res.topic_partitions if tp.topic == topic}
            if all(done.get(p, -1) >= end for p, end in ends.items() if end > 0):
                return
            time.sleep(0.3)
        raise AssertionError(f"{group} did not commit {topic} to {ends} in {timeout_s} s")
    finally:
        c.close()


def test_sigkill_mid_run_and_restart_summarises_every_step_once(kafka, tmp_path, unique):
    tag = f"kill-{unique}"
    topics = testkit.make_topics(kafka, tag, partitions=4)
    scn = synthetic.Scenario(
        job=f"kill-{unique}", hosts=4, steps=50, straggler=3, guilty_steps=(12, 27, 33, 45), guilty_layer="cuda", seed=9
    )
    batches = synthetic.generate(scn)
    step_of = lambda kb: kb[1].events[0].step  # noqa: E731
    # phase 1: registrations + steps 0..24 complete, steps 25..29 from hosts 0 and 1 only (left open)
    first = [kb for kb in batches if step_of(kb) < 25 or (step_of(kb) < 30 and kb[1].host_id < 2)]
    second = [kb for kb in batches if kb not in first and step_of(kb) < 40]
    third = [kb for kb in batches if step_of(kb) >= 40]
    app = f"{tag}-app"
    w1 = testkit.Worker(topics, app, 301, tmp_path / "w1.log", window_s=60.0)
    try:
        w1.wait_ready()
        testkit.publish(kafka, topics.events, first)
        got = _by_job(kafka, topics.steps, scn.job, 25)
        assert sorted(s["step"] for s in got) == list(range(25))
        _committed_everything(kafka, app, topics.events)
        time.sleep(1.5)  # one more commit interval: the fold agent's input offsets too
    finally:
        w1.kill()  # steps 25..29 are open: only the 'open' changelog holds their first half
    # phase 2: a new worker finishes 25..39 and is killed as soon as they are out (offsets not committed:
    # the next worker replays them, which must neither re-emit nor count duplicates or late events)
    w2 = testkit.Worker(topics, app, 302, tmp_path / "w2.log", window_s=60.0)
    try:
        _wait_settled(w2)
        testkit.publish(kafka, topics.events, second)
        _by_job(kafka, topics.steps, scn.job, 40, timeout_s=120)
    finally:
        w2.kill()
    w3 = testkit.Worker(topics, app, 303, tmp_path / "w3.log", window_s=60.0)
    try:
        _wait_settled(w3)
        testkit.publish(kafka, topics.events, third)
        got = _by_job(kafka, topics.steps, scn.job, 50, timeout_s=120)
    finally:
        w3.stop()
    steps = [s["step"] for s in got]
    assert sorted(set(steps)) == list(range(50)), f"every step summarised, got {sorted(steps)}"
    dups = len(steps) - len(set(steps))
    # documented residual window (crash between the summary and its 'closed' record): a repeat must be
    # the same summary; with the replay handled by the tables there should be none at all
    assert dups == 0, f"{dups} steps summarised twice"
    for s in got:
        # open steps 25..29 were completed from the recovered 'open' table; the recovered 'agents' table
        # saw no false gaps or duplicates on replay; the recovered 'closed' table saw no late events
        assert s["closed_by"] == "complete" and s["hosts"] == ["node0", "node1", "node2", "node3"]
        assert s["quality"] == {"lost_batches": 0, "duplicate_batches": 0, "late_events": 0, "ringbuf_lost": 0}
    assert {s["step"]: _view(s) for s in got} == _reference(scn)


def test_tail_steps_prints_readably_and_dedupes_by_key(kafka, unique):
    import json
    import subprocess
    import sys

    topics = testkit.make_topics(kafka, f"tail-{unique}", partitions=1)
    scn = synthetic.Scenario(
        job=f"tail-{unique}", hosts=3, steps=4, straggler=1, guilty_steps=(2,), guilty_layer="sched"
    )
    sums = [s for (_j, _st), s in sorted(offline.summarize_batches(b for _k, b in synthetic.generate(scn)).items())]
    # out of order (3 before 1, as partitions deliver closes), step 2 twice; then step 0 of the job's next
    # life (a restart numbers its steps again): printed in (job, life, step) order
    ordered = [sums[0], sums[3], sums[1], sums[2], sums[2], dict(sums[0], life=1)]
    items = [(scn.job.encode(), json.dumps(s).encode()) for s in ordered]
    testkit.publish(kafka, topics.steps, items)
    base = [
        sys.executable,
        "-m",
        "obshub.cli",
        "tail",
        "steps",
        "--topic",
        topics.steps,
        "--from-beginning",
        "--timeout-s",
        "20",
    ]
    out = subprocess.run(
        base + ["--json", "--count", "5"], capture_output=True, text=True, timeout=60, cwd=testkit.REPO
    ).stdout.splitlines()
    got = [(json.loads(x).get("life", 0), json.loads(x)["step"]) for x in out]
    assert got == [(0, 0), (0, 1), (0, 2), (0, 3), (1, 0)], "in step order; the repeated (job, life, step) once"
    text = subprocess.run(
        base + ["--count", "5"], capture_output=True, text=True, timeout=60, cwd=testkit.REPO
    ).stdout.splitlines()
    assert len(text) == 5 and "straggler node1" in text[2] and "blame sched" in text[2] and "clean" in text[0]
    assert "step 0 (life 1)" in text[4] and "(life" not in text[0], text
    # the wait ends before --count summaries arrived: exit 1, saying how many came
    short = subprocess.run(
        base[:-1] + ["4", "--count", "9", "--hold-s", "0"], capture_output=True, text=True, timeout=60, cwd=testkit.REPO
    )
    assert short.returncode == 1 and "only 5 of 9 summaries" in short.stderr, short.stderr
    # a tail joins no consumer group: nothing is left behind in `obshub status` after it
    from confluent_kafka.admin import AdminClient

    groups = AdminClient({"bootstrap.servers": kafka.bootstrap_servers}).list_consumer_groups().result(timeout=30)
    assert not [g.group_id for g in groups.valid if g.group_id.startswith("obshub-tail-")]
    missing = subprocess.run(
        base[:6] + [f"no-such-{unique}", "--timeout-s", "10"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=testkit.REPO,
    )
    assert missing.returncode == 1 and f"no-such-{unique}" in missing.stderr and "Traceback" not in missing.stderr
