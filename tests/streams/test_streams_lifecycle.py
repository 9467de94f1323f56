"""Job lifecycle through the agent's publisher and a real broker (docs/STREAMS.md "Restarts, resumes and
world-size changes"): a job whose ranks end at different times, and one job name that lives four lives: a
rank killed and the job restarted by torchrun (steps from 0 again), then resumed from a checkpoint under
the same name (steps continue from 8), then restarted elastically with half its world (4 -> 2 ranks).

The agents' batches (synthetic steps of real shape: REGISTER with rank, world size and pid, per-step
batches that ship a running step before its end, RANK_STATE exits) go through
``producer.publisher.Publisher`` to the session's broker and are read back in order; the worker's logic
(ingest + fold, ``streams.inproc.InProcess``) runs on them with its clock at each batch's send time,
checking hangs every 250 ms and closing steps by their 10 s window as the ``expire`` timer would. Each life
must give every step once, complete (never closed by the window), with no missing host and no hang named
in a life that runs normally, and every summary carries its ``life``."""

from __future__ import annotations

import dataclasses
import time
import uuid
from collections import defaultdict

import pytest
from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from obshub.core import schema
from obshub.core.schema import Batch, Event, Kind
from obshub.streams import synthetic
from obshub.streams.inproc import InProcess

pytestmark = pytest.mark.kafka

S = 1_000_000_000
TICK = S // 4
LONG_STEP = {"forward_ms": 100.0, "optimizer_ms": 700.0, "jitter_ms": 0.3}  # ~0.85 s a step


def _rt(b: Batch, e: Event) -> int:
    return e.ts_ns + synthetic._offset(b.host_id)


def _life(job: str, hosts: int, steps: int, first: int, pid0: int, start_ns: int) -> list[Batch]:
    """One life of ``job``: ``hosts`` ranks (one per host, pids ``pid0 + i``) registering at
    ``start_ns`` and running steps ``first..first+steps-1``; each step leaves a host in two batches, the
    running step up to its last collective and then the rest (agents ship a running step)."""
    scn = synthetic.Scenario(job=job, hosts=hosts, steps=steps, first_step=first, start_ns=start_ns, **LONG_STEP)
    out = []
    for _key, b in synthetic.generate(scn):
        evs = [e._replace(pid=pid0 + b.host_id, tid=pid0 + b.host_id) for e in b.events]
        cut = max((k for k, e in enumerate(evs) if e.kind == Kind.COLLECTIVE_END), default=None)
        if cut is None:
            out.append(dataclasses.replace(b, events=evs))
            continue
        first_part = dataclasses.replace(b, events=evs[: cut + 1], sent_ns=_rt(b, evs[cut]))
        out += [first_part, dataclasses.replace(b, events=evs[cut + 1 :], sent_ns=_rt(b, evs[-1]))]
    return out


def _exit(job: str, i: int, pid: int, at_ns: int) -> Batch:
    """Host ``i``'s agent reporting that process ``pid`` exited at CLOCK_REALTIME ``at_ns``."""
    off = synthetic._offset(i)
    ev = Event(int(Kind.RANK_STATE), at_ns - off, 0, 0, -1, pid, pid, -1, 3, {"state": "exited"})
    return Batch(job, f"node{i}", i, f"{job}/node{i}/a1", 0, [ev], schema.Clock(off, 20_000, 0), at_ns)


def _end(batches: list[Batch]) -> int:
    return max(b.sent_ns for b in batches)


def _uneven(job: str, t0: int) -> list[Batch]:
    """Four ranks; node3's rank ends after step 4 and exits, the other three go on to step 15 (about
    10 s more) and exit."""
    out = [b for b in _life(job, 4, 16, 0, 1000, t0) if not (b.host == "node3" and b.events[0].step > 4)]
    last3 = max(b.sent_ns for b in out if b.host == "node3")
    out.append(_exit(job, 3, 1003, last3 + S // 10))
    end = _end(out)
    out += [_exit(job, i, 1000 + i, end + S // 10) for i in range(3)]
    return out


def _lives(job: str, t0: int) -> tuple[list[Batch], list[int]]:
    """Life 0: 4 ranks, steps 0-5, node2's rank killed in step 6 while the others wait in its first
    all_reduce; torchrun stops them 1.5 s later. Life 1 (torchrun restart, 3 s later): steps 0-7, then the
    job stops. Life 2 (resumed from a checkpoint 5 s later): steps 8-11. Life 3 (elastic, 2 ranks of
    node0/node1): steps 12-15. Returns the batches and when each life registered (ns)."""
    out, starts = [], [t0]
    life0 = _life(job, 4, 7, 0, 1000, t0)
    for b in life0:
        step = max((e.step for e in b.events), default=-1)
        if step < 6:
            out.append(b)
        elif b.events[0].kind == Kind.STEP_BEGIN:  # the running part of step 6: cut inside the all_reduce
            stop = Kind.COLLECTIVE_BEGIN if b.host == "node2" else Kind.COLLECTIVE_END
            k = next(k for k, e in enumerate(b.events) if e.kind == stop)
            keep = b.events[:k]
            out.append(dataclasses.replace(b, events=keep, sent_ns=_rt(b, keep[-1])))
    killed = _end(out) + S // 5
    out.append(_exit(job, 2, 1002, killed))
    out += [_exit(job, i, 1000 + i, killed + 3 * S // 2) for i in (0, 1, 3)]
    for life, (hosts, steps, first) in enumerate([(4, 8, 0), (4, 4, 8), (2, 4, 12)], start=1):
        start = _end(out) + (3 if life == 1 else 5) * S
        starts.append(start)
        batches = _life(job, hosts, steps, first, 1000 * (life + 1), start)
        out += batches
        if life < 3:  # the job stops (a crash, a preemption) before its next life
            out += [_exit(job, i, 1000 * (life + 1) + i, _end(batches) + S // 10) for i in range(hosts)]
    return out, starts


def _through_broker(kafka, batches: list[Batch], spool) -> list[Batch]:
    """Send every batch in time order (sequence numbers per agent instance) through the agent's
    ``Publisher`` to a fresh one-partition topic and read them back in order."""
    from obshub.core.settings import agent_config
    from obshub.producer.publisher import Publisher

    batches = sorted(batches, key=lambda b: b.sent_ns)
    seq: dict[str, int] = defaultdict(int)
    ordered = []
    for b in batches:
        ordered.append(dataclasses.replace(b, seq=seq[b.agent_id]))
        seq[b.agent_id] += 1
    topic = f"life-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": kafka.bootstrap_servers})
    admin.create_topics([NewTopic(topic, 1, 1)])[topic].result()
    cfg = agent_config(
        job="life", host="h", host_id=0, kafka={"bootstrap": kafka.bootstrap_servers}, spool={"dir": spool}
    )
    pub = Publisher(cfg.kafka, topic=topic)
    errors = []
    for b in ordered:
        assert pub.produce(b.host.encode(), schema.encode_batch(b), lambda err: err and errors.append(err))
    deadline = time.monotonic() + 30
    while pub.outstanding and time.monotonic() < deadline:
        pub.poll(0.1)
    pub.close()
    assert not errors and pub.delivered == len(ordered), errors
    c = Consumer({"bootstrap.servers": kafka.bootstrap_servers, "group.id": topic, "enable.auto.commit": False})
    c.assign([TopicPartition(topic, 0, 0)])
    back: list[Batch] = []
    deadline = time.monotonic() + 30
    while len(back) < len(ordered) and time.monotonic() < deadline:
        m = c.poll(0.2)
        if m is not None and not m.error():
            back.append(schema.decode_batch(m.value()))
    c.close()
    assert [(b.agent_id, b.seq) for b in back] == [(b.agent_id, b.seq) for b in ordered]
    return back


def _run(batches: list[Batch]) -> tuple[InProcess, list[tuple[int, dict]]]:
    """The worker's logic over ``batches`` with its clock at each send time: hangs checked and steps
    past the window closed every 250 ms in between. Returns the pipeline and the hang records (ns, summary)."""
    now = [batches[0].sent_ns]
    pipe = InProcess(clock=lambda: now[0])
    hangs: list[tuple[int, dict]] = []

    def tick(t: int) -> None:
        now[0] = t
        hangs.extend((t, s) for _sk, s, _first in pipe.fold.hangs())
        for key, st in pipe.fold.open_steps():
            if t - st["opened_ns"] >= pipe.fold.window_ns:
                pipe._apply({"t": "close", "key": key}, st["p"])

    for b in batches:
        t = now[0] + TICK
        while t < b.sent_ns:
            tick(t)
            t += TICK
        now[0] = max(now[0], b.sent_ns)
        pipe.feed(schema.encode_batch(b))
    for _ in range(1, 50):  # 12 s after the last batch: every step that can close has closed
        tick(now[0] + TICK)
    return pipe, hangs


@pytest.fixture(scope="module")
def replayed(kafka, tmp_path_factory):
    """Both jobs' batches through the broker, then through the worker's logic (one run, both tests)."""
    tag = uuid.uuid4().hex[:6]
    t0 = synthetic.Scenario().start_ns
    uneven = _uneven(f"uneven-{tag}", t0)
    lives, starts = _lives(f"lives-{tag}", t0)
    pipe, hangs = _run(_through_broker(kafka, uneven + lives, tmp_path_factory.mktemp("spool")))
    exits0 = max(b.sent_ns for b in lives if b.events[0].kind == Kind.RANK_STATE and b.events[0].pid < 2000)
    return {"tag": tag, "summaries": pipe.summaries, "hangs": hangs, "starts": starts, "pipe": pipe, "exits0": exits0}


def _of(replayed, job: str) -> list[dict]:
    return [s for s in replayed["summaries"] if s["job"] == f"{job}-{replayed['tag']}"]


def test_a_rank_that_ends_early_is_neither_missing_nor_hung(replayed):
    got = _of(replayed, "uneven")
    assert sorted(s["step"] for s in got) == list(range(16))
    for s in got:
        assert s["closed_by"] == "complete", (s["step"], s["closed_by"], s["missing_hosts"])
        assert s["missing_hosts"] == [], (s["step"], s["missing_hosts"])
        assert s["life"] == 0
        want = ["node0", "node1", "node2", "node3"] if s["step"] <= 4 else ["node0", "node1", "node2"]
        assert s["hosts"] == want, (s["step"], s["hosts"])
    named = [(t, s["hang"]["hosts"]) for t, s in replayed["hangs"] if s["job"].startswith("uneven-")]
    assert named == []


def test_restart_resume_and_world_size_change_are_lives_of_one_job(replayed):
    got = _of(replayed, "lives")
    by_life: dict[int, list[dict]] = defaultdict(list)
    for s in got:
        by_life[s["life"]].append(s)
    assert sorted(by_life) == [0, 1, 2, 3]
    steps = {life: sorted(s["step"] for s in ss) for life, ss in by_life.items()}
    assert steps == {0: list(range(7)), 1: list(range(8)), 2: list(range(8, 12)), 3: list(range(12, 16))}
    # the step the kill interrupted is summarised once, by the restart, with what arrived
    (cut,) = [s for s in by_life[0] if s["step"] == 6]
    assert cut["closed_by"] == "restart"
    for s in by_life[0]:
        if s["step"] < 6:
            assert s["closed_by"] == "complete" and s["missing_hosts"] == [], s["step"]
    four = ["node0", "node1", "node2", "node3"]
    for life, hosts in ((1, four), (2, four), (3, ["node0", "node1"])):
        for s in by_life[life]:
            assert s["closed_by"] == "complete", (life, s["step"], s["closed_by"], s["missing_hosts"])
            assert s["missing_hosts"] == [] and s["hosts"] == hosts, (life, s["step"], s["missing_hosts"])
            assert s["expected_hosts"] == hosts and s["world_size"] == len(hosts), (life, s["step"])
    # the kill in life 0 may be named (node2 did exit in a step, the others waited in its all_reduce), only
    # node2, and once the others' exits have arrived (nothing left to hang) at most once more
    ours = [(t, s) for t, s in replayed["hangs"] if s["job"].startswith("lives-")]
    assert all([(h["host"], h["state"]) for h in s["hang"]["hosts"]] == [("node2", "exited")] for _t, s in ours)
    assert len([t for t, s in ours if s["life"] == 0 and t > replayed["exits0"]]) <= 1, len(ours)
    # no hang named once the restarted job registered
    after = [(t, s["life"], s["hang"]["hosts"]) for t, s in replayed["hangs"] if s["job"].startswith("lives-")]
    assert [h for h in after if h[0] >= replayed["starts"][1] or h[1] > 0] == []
