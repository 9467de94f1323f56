"""The join's state layout without a broker (``streams.inproc``: the worker's ingest and fold code over
tables that encode every write like a changelog): same summaries as the offline reference, replays change
nothing, a worker recovered from the changelogs mid-run finishes every step exactly once, late data is
counted, and one part is one small write whatever the job's width."""

from __future__ import annotations

import msgspec
import pytest

from obshub.core import schema
from obshub.streams import accumulate, analysis, offline, synthetic, wire
from obshub.streams import fold as fold_mod
from obshub.streams.inproc import InProcess

FIELDS = (
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


def _view(s: dict) -> dict:
    return {k: s[k] for k in FIELDS}


def _scenario(**kw) -> tuple[synthetic.Scenario, list[bytes]]:
    scn = synthetic.Scenario(
        **{
            "job": "j",
            "hosts": 6,
            "steps": 30,
            "straggler": 2,
            "guilty_steps": (4, 9, 17),
            "guilty_layer": "sched",
            "seed": 3,
            **kw,
        }
    )
    return scn, [schema.encode_batch(b) for _k, b in synthetic.generate(scn)]


def _reference(scn) -> dict[int, dict]:
    return {
        step: _view(s) for (_j, step), s in offline.summarize_batches(b for _k, b in synthetic.generate(scn)).items()
    }


def test_same_summaries_as_the_offline_reference():
    scn, msgs = _scenario()
    pipe = InProcess(partitions=3)
    for v in msgs:
        pipe.feed(v)
    got = {s["step"]: s for s in pipe.summaries}
    assert len(pipe.summaries) == scn.steps and {k: _view(s) for k, s in got.items()} == _reference(scn)
    assert all(
        s["quality"] == {"lost_batches": 0, "duplicate_batches": 0, "late_events": 0, "ringbuf_lost": 0}
        for s in got.values()
    )
    assert not pipe.tables["parts"] and not pipe.tables["steps"], "closed steps leave no open state"


def test_rounds_give_the_same_summaries_with_fewer_table_writes():
    scn, msgs = _scenario()
    one = InProcess(partitions=3)
    for v in msgs:
        one.feed(v)
    rounds = InProcess(partitions=3)
    for i in range(0, len(msgs), 16):
        rounds.feed_round(msgs[i : i + 16])
    assert {s["step"]: _view(s) for s in rounds.summaries} == _reference(scn)
    assert len(rounds.summaries) == scn.steps
    assert not rounds.tables["parts"] and not rounds.tables["steps"]
    writes = {n: t.records for n, t in rounds.tables.items() if n != "agents"}  # the fold's tables
    writes_one = {n: t.records for n, t in one.tables.items() if n != "agents"}
    assert writes["parts"] < writes_one["parts"] / 2 and sum(writes.values()) < sum(writes_one.values()) / 2
    assert rounds.internal < one.internal


def test_a_replayed_round_changes_nothing():
    scn, msgs = _scenario()
    pipe = InProcess(partitions=3)
    for i in range(0, len(msgs), 8):
        pipe.feed_round(msgs[i : i + 8])
        pipe.offset -= len(msgs[i : i + 8])
        pipe.feed_round(msgs[i : i + 8])  # the whole round again at its offsets: a replay after a crash
    assert sorted(s["step"] for s in pipe.summaries) == list(range(scn.steps))
    assert {s["step"]: _view(s) for s in pipe.summaries} == _reference(scn)


def test_writeback_reads_its_own_writes_and_writes_each_key_once():
    counted = {"w": 0}

    class Counting(dict):
        def __setitem__(self, k, v):
            counted["w"] += 1
            super().__setitem__(k, v)

        def __delitem__(self, k):
            counted["w"] += 1
            super().__delitem__(k)

    under = Counting({"a": 1, "gone": 2})
    table = fold_mod.WriteBack(under)
    table["a"] = 3
    table["a"] = 4
    table["new"] = 5
    del table["new"]  # never reaches the table
    del table["gone"]
    assert table.get("a") == 4 and table.get("new") is None and table.get("gone", "x") == "x"
    assert dict(table.items()) == {"a": 4} and under == {"a": 1, "gone": 2}
    table.flush()
    assert dict(under) == {"a": 4} and counted["w"] == 2


def test_replayed_input_changes_nothing():
    scn, msgs = _scenario()
    pipe = InProcess(partitions=3)
    for i, v in enumerate(msgs):
        pipe.feed(v, offset=i)
        pipe.feed(v, offset=i)  # the same input offset again: a replay after a restart
    assert sorted(s["step"] for s in pipe.summaries) == list(range(scn.steps))
    assert {s["step"]: _view(s) for s in pipe.summaries} == _reference(scn)
    assert sum(s["quality"]["late_events"] + s["quality"]["duplicate_batches"] for s in pipe.summaries) == 0


def test_recovered_worker_finishes_every_step_exactly_once():
    scn, msgs = _scenario(steps=40)
    cut = len(msgs) * 2 // 3
    pipe = InProcess(partitions=4)
    for v in msgs[:cut]:
        pipe.feed(v)
    first = list(pipe.summaries)
    assert pipe.tables["parts"], "some steps are open at the crash"
    again = pipe.restarted()
    for i, v in enumerate(msgs[cut - 20 :], start=cut - 20):  # the last 20 messages were not committed
        again.feed(v, offset=i)
    steps = [s["step"] for s in first + again.summaries]
    assert sorted(steps) == list(range(scn.steps)), "every step once"
    assert {s["step"]: _view(s) for s in first + again.summaries} == _reference(scn)
    assert (
        sum(
            s["quality"]["late_events"] + s["quality"]["duplicate_batches"] + s["quality"]["lost_batches"]
            for s in first + again.summaries
        )
        == 0
    )


def test_late_data_counted_and_closed_records_bounded():
    scn, msgs = _scenario(steps=30)
    pipe = InProcess(partitions=1)
    pipe.fold.closed_keep = 5
    for v in msgs:
        pipe.feed(v)
    assert len(pipe.tables["closed"]) == 5
    # the same batches from a new agent instance: not replays, every event is late (kept or dropped record)
    for v in msgs:
        raw = schema.decode_batch(v)
        raw.agent_id += "-2"
        pipe.feed(schema.encode_batch(raw))
    js = pipe.tables["jobs"]["j@0"]
    late = sum(
        len(schema.decode_batch(v).events) for v in msgs if any(e.step >= 0 for e in schema.decode_batch(v).events)
    )
    assert js["pending"]["late_events"] == late
    assert len(pipe.summaries) == scn.steps, "no step summarised twice"


def test_one_part_is_one_small_write_whatever_the_width():
    per_step = {}
    for hosts in (8, 64):
        _scn, msgs = _scenario(hosts=hosts, steps=6, guilty_steps=(), straggler=None)
        pipe = InProcess(partitions=2)
        regs = [v for v in msgs if all(e.step < 0 for e in schema.decode_batch(v).events)]
        for v in regs:
            pipe.feed(v)
        b0, r0 = pipe.changelog_bytes, sum(t.records for t in pipe.tables.values())
        for v in msgs:
            if v not in regs:
                pipe.feed(v)
        per_step[hosts] = ((pipe.changelog_bytes - b0) / 6, (sum(t.records for t in pipe.tables.values()) - r0) / 6)
    bytes_ratio = per_step[64][0] / per_step[8][0]
    records_ratio = per_step[64][1] / per_step[8][1]
    assert bytes_ratio < 8 * 1.3 and records_ratio < 8 * 1.3, per_step  # linear: 8x the hosts, ~8x the bytes
    assert fold_mod.bucket_of("node-1") == fold_mod.bucket_of("node-1") < fold_mod.BUCKETS


def test_derived_counts_recounted_after_a_rebalance():
    scn, msgs = _scenario(steps=20)
    pipe = InProcess(partitions=2)
    for i, v in enumerate(msgs):
        pipe.feed(v)
        if i % 3 == 0:
            pipe.fold.forget()  # what a rebalance does once the tables are recovered
    assert {s["step"]: _view(s) for s in pipe.summaries} == _reference(scn)
    assert len(pipe.summaries) == scn.steps


def test_a_rank_reported_frozen_inside_a_collective_every_rank_reached_is_hung_until_it_runs_again():
    """Every rank arrived at all-reduce 7 and nobody finished the step; c's agent reports c frozen (a
    RANK_STATE event, no step). Once the others waited ``hang_state_wait_ns`` the fold's hang check
    names c with its state, without the seconds of silence; c running again ends the hang."""
    now = [1_000_000_000_000]
    pipe = InProcess(partitions=2, clock=lambda: now[0])
    hosts = ("a", "b", "c")

    def batch(i, h, seq, events):
        return schema.encode_batch(schema.Batch("j", h, i, f"agent-{h}", seq, events))

    for i, h in enumerate(hosts):
        reg = schema.Event(schema.Kind.REGISTER, 1, pid=100 + i, value=i, payload={"world_size": 3, "job": "j"})
        pipe.feed(batch(i, h, 0, [reg]))
    t0 = now[0] - 50_000_000  # the agents' monotonic clock; batch offset 0
    coll = {"pg": "0", "coll_seq": 7, "op": "all_reduce"}
    for i, h in enumerate(hosts):
        evs = [
            schema.Event(schema.Kind.STEP_BEGIN, t0, step=5, pid=100 + i, value=5),
            schema.Event(schema.Kind.COLLECTIVE_BEGIN, t0 + 10_000_000 + i, step=5, pid=100 + i, payload=coll),
        ]
        pipe.feed(batch(i, h, 1, evs))
    frozen = schema.Event(schema.Kind.RANK_STATE, t0 + 20_000_000, pid=102, value=1, payload={"state": "frozen"})
    pipe.feed(batch(2, "c", 2, [frozen]))
    assert pipe.fold.hangs() == []  # the others have waited 40 ms only
    now[0] += 600_000_000
    (got,) = pipe.fold.hangs()
    sk, summary, first = got
    assert first and summary["closed_by"] == "hang" and summary["step"] == 5
    hang = summary["hang"]
    assert (hang["pg"], hang["coll_seq"], hang["waiting"]) == ("0", 7, ["a", "b"])
    assert [(h["host"], h["state"], h["last_phase"]) for h in hang["hosts"]] == [
        ("c", "frozen", "in all_reduce pg=0 seq=7")
    ]
    running = schema.Event(schema.Kind.RANK_STATE, t0 + 900_000_000, pid=102, value=0, payload={"state": "running"})
    pipe.feed(batch(2, "c", 3, [running]))
    assert pipe.fold.hangs() == []


def _ring_job(now):
    """A 4-host job (ring a-b-c-d-a, 10.0.0.1-4) through ingest and fold: 12 steps of 100 ms closed, then
    step 12 begun on every host. Returns ``(pipe, batch(host index, events))``."""
    pipe = InProcess(partitions=2, clock=lambda: now[0])
    hosts = ("a", "b", "c", "d")
    seqs = dict.fromkeys(hosts, 0)

    def batch(i, events):
        h = hosts[i]
        b = schema.Batch("j", h, i, f"agent-{h}", seqs[h], events)
        seqs[h] += 1
        pipe.feed(schema.encode_batch(b))

    for i in range(4):
        batch(i, [schema.Event(schema.Kind.REGISTER, 1, pid=100 + i, value=i, payload={"world_size": 4, "job": "j"})])
    t = now[0] - 10_000_000_000  # monotonic ns of the agents (batch offset 0)
    for step in range(12):
        for i in range(4):
            batch(
                i,
                [
                    schema.Event(schema.Kind.STEP_BEGIN, t, step=step, pid=100 + i, value=step),
                    schema.Event(
                        schema.Kind.STEP_END, t + 100_000_000, step=step, pid=100 + i, duration_ns=100_000_000
                    ),
                ],
            )
        t += 110_000_000
    assert len(pipe.summaries) == 12
    for i in range(4):
        batch(i, [schema.Event(schema.Kind.STEP_BEGIN, now[0], step=12, pid=100 + i, value=12)])
    return pipe, batch


@pytest.mark.parametrize("after_slow", [False, True])
def test_a_slow_link_is_named_while_its_step_still_runs_from_tcp_events_without_a_step(after_slow):
    """Host b's link is rate-limited: step 12 runs on and on. The agents' next batches (sealed by age)
    hold only RTT samples (the ranks block in the all-reduce: no stepped event); ingest charges them to
    the step each host left running, and the fold's running check names b in an interim summary.
    ``after_slow``: the step before took 3 s already (the fault's first slowed step, in the baseline now:
    its p99), so the closed step is no ``stall``, yet x21 the median (persistent net-slow of node-00,
    2026-12-05: step 647 x14.5 fired ``step_stall_unexplained``)."""
    now = [1_000_000_000_000]
    pipe, batch = _ring_job(now)
    if after_slow:
        for jk in list(pipe.fold.jobs):
            js = pipe.fold.jobs[jk]
            if js.get("history"):
                js["history"][-1][1] = 3_000_000_000
                pipe.fold.jobs[jk] = js
    ip = ["10.0.0.1", "10.0.0.2", "10.0.0.3", "10.0.0.4"]
    ring = [(0, 1), (1, 2), (2, 3), (3, 0)]
    for i in range(4):
        evs = []
        for a, b in ring:
            if i not in (a, b):
                continue
            peer = b if i == a else a
            rtt = 30_000_000 if 1 in (a, b) else 2_000_000
            for k in range(5):
                evs.append(
                    schema.Event(
                        schema.Kind.TCP_RTT,
                        now[0] + k * 100_000_000,
                        duration_ns=rtt,
                        payload={"saddr": ip[i], "daddr": ip[peer], "sport": 1, "dport": 2},
                    )
                )
        batch(i, evs)
    now[0] += 400_000_000
    assert pipe.fold.running() == []  # 0.4 s: within max(0.5 s, 3 x 100 ms)
    now[0] += 200_000_000
    ((sk, s),) = pipe.fold.running()
    assert sk == "j|12" and s["closed_by"] == "running" and s["straggler"] is None
    # its step time: how long the open step has run so far (since its earliest STEP_BEGIN), and that over
    # the median step (the rule step_stall reads both; a running record of f10ef77 carried 0 and 0.0)
    assert (s["step_time_max_ns"], s["stall_ratio"], s["baseline"]["median_ns"]) == (600_000_000, 6.0, 100_000_000)
    assert s["evidence"]["hosts"] == {
        "b": {**dict.fromkeys(("sched", "memory", "cuda", "nic", "pytorch"), 0.0), "network": 7.0}
    }
    assert [(x["host"], x["layer"], x["straggler_ns"], x["peer_median_ns"]) for x in s["blame"]] == [
        ("b", "network", 30_000_000, 2_000_000)
    ]
    # which view named it: b's lowest mean RTT over its busy connections (a running record of 44484b4 had none)
    assert s["evidence"]["net_view"] == {"b": "rtt"} and s["culprit"]["net_view"] == "rtt"
    assert len(pipe.summaries) == 12  # an interim record: the step stays open
    # the step closes x15 the median with b late and 30 ms of run-queue time of b's (a loaded machine):
    # until stall11 its connections' evidence gave way to those 30 ms and the close, naming nobody of its
    # own, was charged to the link its running record named (the first step of a tbf-slowed link,
    # 2026-12-05 campaign); 30 ms of a 2 s loss explain nothing, so the closed step names the link itself
    end = now[0] + 1_500_000_000
    coll = {"pg": "0", "coll_seq": 3, "op": "all_reduce"}
    for i in range(4):
        evs = [
            schema.Event(
                schema.Kind.COLLECTIVE_BEGIN,
                now[0] + (400 if i == 1 else 1) * 1_000_000,
                step=12,
                pid=100 + i,
                payload=coll,
            ),
            schema.Event(schema.Kind.STEP_END, end, step=12, pid=100 + i, duration_ns=2_100_000_000),
        ]
        if i == 1:
            evs.append(
                schema.Event(schema.Kind.SCHED_RUNQ, now[0] + 2_000_000, step=12, pid=101, duration_ns=30_000_000)
            )
        batch(i, evs)
    now[0] = end + 2_000_000_000
    for i in range(4):
        batch(i, [schema.Event(schema.Kind.STEP_BEGIN, end + 10_000_000, step=13, pid=100 + i, value=13)])
    closed = pipe.summaries[12] if isinstance(pipe.summaries[12], dict) else pipe.summaries[12][1]
    assert closed["step"] == 12 and closed["closed_by"] == "complete" and closed["stall"] is not after_slow
    assert closed["evidence"]["hosts"]["b"]["network"] == 7.0 and closed["straggler"]["host"] == "b"
    c = closed["culprit"]
    assert (c["host"], c["layer"], c["source"], c["evidence"]) == ("b", "network", "evidence", 7.0), c
    assert pipe.fold.running_named == {}  # dropped at the close


def _ring_rtt(now, i, slow, stepped=()):
    """Host ``i``'s RTT samples on its two ring connections (5 each, 20 ms apart from ``now[0]``): 30 ms on
    a connection that touches host ``slow``, 2 ms elsewhere; ``stepped``: events to send with them."""
    ip = ["10.0.0.1", "10.0.0.2", "10.0.0.3", "10.0.0.4"]
    evs = list(stepped)
    for a, b in [(0, 1), (1, 2), (2, 3), (3, 0)]:
        if i not in (a, b):
            continue
        peer = b if i == a else a
        for k in range(5):
            evs.append(
                schema.Event(
                    schema.Kind.TCP_RTT,
                    now[0] + k * 20_000_000,
                    duration_ns=30_000_000 if slow in (a, b) else 2_000_000,
                    payload={"saddr": ip[i], "daddr": ip[peer], "sport": 1, "dport": 2},
                )
            )
    return evs


def test_a_step_left_open_by_one_host_while_the_others_run_the_next_is_named_while_it_runs():
    """A 1 s blackout of host c that starts as step 12's last all-reduce segments reach it: a, b and d
    have all they need, end step 12 and block in step 13's all-reduce; c waits in step 12 for segments
    that TCP retransmits after the blackout (live, 1,000 ms blackouts of node-03, early18: 3 of 10 stalled
    steps had no running record and were named only at their close, 1.78-1.96 s). c's age-sealed batch
    holds only its connections' TCP events (charged to step 12, the step it left running). Step 12 is no
    longer its job's latest (a part of step 13 arrived), and step 13 has nothing of c: on 91d0221 neither
    step got a running record. Now step 12, one step behind the latest and not done by c, is checked."""
    now = [1_000_000_000_000]
    pipe, batch = _ring_job(now)
    t_end = now[0] + 100_000_000
    for i in (0, 1, 3):
        end = schema.Event(schema.Kind.STEP_END, t_end, step=12, pid=100 + i, duration_ns=100_000_000)
        begin = schema.Event(schema.Kind.STEP_BEGIN, t_end + 1_000_000, step=13, pid=100 + i, value=13)
        batch(i, _ring_rtt(now, i, 2, [end, begin]))
    batch(2, _ring_rtt(now, 2, 2))  # c: TCP events only (its rank blocks in step 12's all-reduce)
    now[0] += 400_000_000
    assert pipe.fold.running() == []  # 0.4 s: within max(0.5 s, 3 x 100 ms)
    now[0] += 200_000_000
    ((sk, s),) = pipe.fold.running()
    assert sk == "j|12" and s["closed_by"] == "running" and s["step"] == 12
    assert list(s["evidence"]["hosts"]) == ["c"] and s["evidence"]["hosts"]["c"]["network"] == 7.0
    assert (s["culprit"]["host"], s["culprit"]["layer"]) == ("c", "network")
    assert (s["step_time_max_ns"], s["stall_ratio"]) == (600_000_000, 6.0)
    assert pipe.fold.running_named["j|12"]["host"] == "c"
    # c's step ends: step 12 closes charged to c's link, and nothing is checked behind it any more
    end = schema.Event(schema.Kind.STEP_END, now[0] + 900_000_000, step=12, pid=102, duration_ns=1_000_000_000)
    batch(2, [end, schema.Event(schema.Kind.STEP_BEGIN, now[0] + 901_000_000, step=13, pid=102, value=13)])
    closed = pipe.summaries[12] if isinstance(pipe.summaries[12], dict) else pipe.summaries[12][1]
    assert closed["step"] == 12 and closed["closed_by"] == "complete"
    assert (closed["culprit"]["host"], closed["culprit"]["layer"]) == ("c", "network")
    assert pipe.fold.running_named == {} and pipe.fold.running() == []


def test_a_running_record_names_no_host_done_with_the_step():
    """A stall split across two steps by rank (a framework that opens each step with a collective: PyTorch
    Lightning broadcasts from rank 0 at every batch's start): hosts a and b end step 12 and wait at step
    13's first collective, while c and d are still held in step 12, whose connections toward a are slow
    (their retransmits and RTT toward a done host: live, frame21 step 483, an 800 ms blackout of node-01
    held node-00 and node-01 while node-03, done in 148 ms, was named by 2 retransmits toward it). A host
    done with the step holds nobody up in it: no running record names a (on 0d7639e one did)."""
    now = [1_000_000_000_000]
    pipe, batch = _ring_job(now)
    t_end = now[0] + 100_000_000
    for i in (0, 1):
        end = schema.Event(schema.Kind.STEP_END, t_end, step=12, pid=100 + i, duration_ns=100_000_000)
        begin = schema.Event(schema.Kind.STEP_BEGIN, t_end + 1_000_000, step=13, pid=100 + i, value=13)
        batch(i, _ring_rtt(now, i, 0, [end, begin]))
    for i in (2, 3):
        batch(i, _ring_rtt(now, i, 0))  # still in step 12
    now[0] += 600_000_000
    assert [(sk, s["culprit"]) for sk, s in pipe.fold.running()] == []
    assert pipe.fold.running_named == {}


def _rtt(now, i, peer, n, ms):
    """``n`` RTT samples of ``ms`` ms from host ``i`` toward host ``peer`` (ring addresses of ``_ring_rtt``)."""
    ip = ["10.0.0.1", "10.0.0.2", "10.0.0.3", "10.0.0.4"]
    return [
        schema.Event(
            schema.Kind.TCP_RTT,
            now[0] + k * 1_000_000,
            duration_ns=ms * 1_000_000,
            payload={"saddr": ip[i], "daddr": ip[peer], "sport": 1, "dport": 2},
        )
        for k in range(n)
    ]


def test_a_running_step_named_on_strong_evidence_names_no_weaker_host_later():
    """While step 12 runs, b's every ring connection is slow: a running record names b (7 spreads). The
    step's traffic then shifts: b's connection to c carries most of its samples, its connection to a stops
    counting as busy, b's evidence ends, and d's two slowish connections (10-13 ms) are left to name at
    5 spreads. A later record of the same open step names no host on less evidence than the one it named
    (live, lead23-makedemo-final step 149: node-01's lossy link named at 7.0, then node-00 at 2.0 by two
    retransmits per connection, 3.4 s into the step: a wrong step_stall; on 7bd97fe the record names d)."""
    now = [1_000_000_000_000]
    pipe, batch = _ring_job(now)
    for i in range(4):
        batch(i, _ring_rtt(now, i, 1))
    now[0] += 600_000_000
    ((sk, s),) = pipe.fold.running()
    assert (s["culprit"]["host"], s["culprit"]["evidence"]) == ("b", 7.0)
    now[0] += 100_000_000
    batch(1, _rtt(now, 1, 2, 50, 30))  # b-c: 60 samples, a-b: 10 (under 1/4 of b's busiest)
    batch(3, _rtt(now, 3, 0, 40, 12) + _rtt(now, 3, 2, 3, 50))  # d-a: 50 at 10 ms, c-d: 13 at 13 ms
    now[0] += 500_000_000
    later = pipe.fold.running() + [(sk, x) for x in pipe.running]
    assert [x["culprit"]["host"] for _sk, x in later] == []
    assert pipe.fold.running_named[sk]["host"] == "b"  # what the close is charged with when it names nobody


@pytest.mark.parametrize("behind", [2, 3])
def test_a_step_two_or_more_behind_its_jobs_latest_gets_no_running_record(behind):
    """Only the job's latest step and the one just before it are checked while they run: a step further
    behind (a host whose data lags, or the job ran on) is judged at its close, so a lagging host cannot
    make every open step of its job send records."""
    now = [1_000_000_000_000]
    pipe, batch = _ring_job(now)
    t_end = now[0] + 100_000_000
    for i in (0, 1, 3):
        evs = [schema.Event(schema.Kind.STEP_END, t_end, step=12, pid=100 + i, duration_ns=100_000_000)]
        for k in range(1, behind + 1):
            evs.append(
                schema.Event(schema.Kind.STEP_BEGIN, t_end + k * 1_000_000, step=12 + k, pid=100 + i, value=12 + k)
            )
            if k < behind:
                evs.append(
                    schema.Event(
                        schema.Kind.STEP_END,
                        t_end + k * 1_000_000 + 500_000,
                        step=12 + k,
                        pid=100 + i,
                        duration_ns=500_000,
                    )
                )
        batch(i, _ring_rtt(now, i, 2, evs))
    batch(2, _ring_rtt(now, 2, 2))
    now[0] += 600_000_000
    assert [sk for sk, _s in pipe.fold.running()] == []


def test_a_long_step_is_checked_when_its_blocked_hosts_batches_arrive_not_only_on_the_timer():
    """Step 12 runs long (every rank blocks in the all-reduce while host b's link is down): the worker's
    0.5 s timer found nothing at 0.6 s (no TCP event of the step had arrived: the agents seal a blocked
    rank's batch by age, at most 1 s). The hosts' age-sealed batches then arrive between two ticks, b's last;
    the fold checks the step on those new parts and emits the running record at once (``("running", job,
    summary)``, ``InProcess.running``). On 91d0221 only the timer checked: a step that closed before the
    next tick had no running record (live 1 s blackouts of node-03, early18: 3 of 10, named at the close)."""
    now = [1_000_000_000_000]
    pipe, batch = _ring_job(now)
    now[0] += 600_000_000
    assert pipe.fold.running() == []  # the timer: 0.6 s, nothing to name yet
    for i in (0, 2, 3):
        now[0] += 20_000_000
        batch(i, _ring_rtt(now, i, 1))
    assert pipe.fold.running_named == {}  # b's own connections are not in yet: nobody named
    now[0] += 110_000_000
    batch(1, _ring_rtt(now, 1, 1))  # b's batch, 0.77 s into the step, before the next tick
    assert pipe.fold.running_named["j|12"]["host"] == "b"
    (s,) = pipe.running
    assert (s["step"], s["closed_by"], s["culprit"]["host"], s["culprit"]["layer"]) == (12, "running", "b", "network")
    assert list(s["evidence"]["hosts"]) == ["b"] and s["step_time_max_ns"] == 770_000_000
    # more parts within RUNNING_ARRIVAL_EVERY_NS (100 ms) of that check wait: no second record yet
    now[0] += 50_000_000
    batch(0, _ring_rtt(now, 0, 1))
    assert len(pipe.running) == 1
    now[0] += 60_000_000  # past it: the step, still due, is checked on the next round
    batch(2, _ring_rtt(now, 2, 1))
    assert [x["step"] for x in pipe.running] == [12, 12] and pipe.running[1]["step_time_max_ns"] == 880_000_000
    # the step closes: nothing is due or remembered for it any more
    end = now[0] + 100_000_000
    for i in range(4):
        batch(i, [schema.Event(schema.Kind.STEP_END, end, step=12, pid=100 + i, duration_ns=1_000_000_000)])
    assert "j|12" not in pipe.fold.running_at and "j|12" not in pipe.fold.running_due
    assert len(pipe.running) == 2


def test_parts_of_a_young_step_or_of_a_worker_behind_on_its_input_emit_no_running_record():
    """Parts of a step younger than ``running_min_ns`` (0.5 s) are not checked on arrival (the timer checks
    it once it is old enough), and none is checked while an input partition was not read to its end in the
    last 3 s (a backlog makes steps look long), as the timer's records."""
    now = [1_000_000_000_000]
    pipe, batch = _ring_job(now)
    now[0] += 300_000_000
    for i in range(4):
        batch(i, _ring_rtt(now, i, 1))
    assert pipe.running == [] and pipe.fold.running_due == set()
    pipe.fold.input_partitions = 1
    pipe.fold.read_ns[0] = now[0]
    now[0] += 3_500_000_000
    for i in range(4):
        batch(i, _ring_rtt(now, i, 1))
    assert pipe.running == [] and pipe.fold.running_due == set()
    pipe.fold.read_ns[0] = now[0]
    now[0] += 10_000_000
    batch(1, _ring_rtt(now, 1, 1))
    assert [(s["step"], s["culprit"]["host"]) for s in pipe.running] == [(12, "b")]


def test_the_steps_after_a_hang_carry_no_sequential_evidence():
    """A rank frozen in step 12 then thawed: the hung step and the next ``hang_quiet_steps`` steps close
    with no evidence (the ranks resynchronise), and a hung step is never judged as running."""
    now = [1_000_000_000_000]
    pipe, batch = _ring_job(now)
    coll = {"pg": "0", "coll_seq": 3, "op": "all_reduce"}
    for i in (0, 1, 2):
        batch(i, [schema.Event(schema.Kind.COLLECTIVE_BEGIN, now[0] + 1_000_000, step=12, pid=100 + i, payload=coll)])
    batch(3, [schema.Event(schema.Kind.RANK_STATE, now[0] + 2_000_000, pid=103, value=1, payload={"state": "frozen"})])
    now[0] += 2_000_000_000
    ((sk, s, first),) = pipe.fold.hangs()
    assert sk == "j|12" and first and pipe.fold.running() == []
    batch(3, [schema.Event(schema.Kind.RANK_STATE, now[0], pid=103, value=0, payload={"state": "running"})])
    assert pipe.fold.hangs() == []  # resumed: no longer hung
    t = now[0]
    for step in range(12, 18):
        for i in range(4):
            evs = [schema.Event(schema.Kind.STEP_END, t + 100_000_000, step=step, pid=100 + i, duration_ns=100_000_000)]
            if step > 12:
                evs.insert(0, schema.Event(schema.Kind.STEP_BEGIN, t, step=step, pid=100 + i, value=step))
            # host d is the last to arrive and spends 80 ms on the run queue
            evs.append(
                schema.Event(
                    schema.Kind.SCHED_RUNQ,
                    t + 1_000,
                    step=step,
                    pid=100 + i,
                    duration_ns=80_000_000 if i == 3 else 1_000,
                )
            )
            evs.append(
                schema.Event(
                    schema.Kind.COLLECTIVE_BEGIN,
                    t + (90_000_000 if i == 3 else 5_000_000),
                    step=step,
                    pid=100 + i,
                    payload={"pg": "0", "coll_seq": 10 + step, "op": "all_reduce"},
                )
            )
            batch(i, evs)
        t += 110_000_000
    by_step = {s["step"]: s["evidence"]["hosts"] for s in pipe.summaries}
    assert [by_step[k] for k in (12, 13, 14, 15)] == [{}, {}, {}, {}]
    # the hung step is charged to the frozen rank (the single-step stall rules' culprit), the quiet steps
    # after it to their straggler's blamed layer
    culprit = {s["step"]: s["culprit"] for s in pipe.summaries}
    assert {k: culprit[12][k] for k in ("host", "layer", "source")} == {
        "host": "d",
        "layer": "process",
        "source": "hang",
    }
    assert "frozen" in culprit[12]["why"]
    assert (culprit[13]["host"], culprit[13]["layer"], culprit[13]["source"]) == ("d", "sched", "blame")
    assert by_step[16]["d"]["sched"] > 0 and by_step[17]["d"]["sched"] > 0


def _lossy_steps(directed_first: bool) -> list[dict]:
    """Steps 12 and 13 of ``_ring_job`` with TCP events (ring a-b-c-d-a, every connection busy): in step
    12 either a and c both retransmit towards b (the directed view's condition) or nobody retransmits; in
    step 13, as in a recorded demo step with loss on b's link, c sent 19 retransmits towards b, a none,
    and d sent 3 towards c. Returns the summaries of steps 12 and 13."""
    sent = {12: {(0, 1): 3, (2, 1): 3} if directed_first else {}, 13: {(2, 1): 19, (3, 2): 3}}
    pipe = _ring_tcp_steps(sent, {12: 100_000_000, 13: 100_000_000})
    by_step = {s["step"]: s for s in pipe.summaries}
    return [by_step[12], by_step[13]]


def _ring_tcp_steps(sent: dict[int, dict], durations: dict[int, int]) -> InProcess:
    """Steps 12 and 13 of ``_ring_job`` (ring a-b-c-d-a, 10.0.0.1-4, every connection busy: one RTT
    sample each way), ``sent[step][(i, j)]`` retransmits from host i towards host j, each step taking
    ``durations[step]`` ns on every host. Returns the pipe."""
    now = [1_000_000_000_000]
    pipe, batch = _ring_job(now)
    ip = ["10.0.0.1", "10.0.0.2", "10.0.0.3", "10.0.0.4"]
    ring = [(0, 1), (1, 2), (2, 3), (3, 0)]
    t = now[0]
    for step in (12, 13):
        dur = durations[step]
        for i in range(4):
            evs = [] if step == 12 else [schema.Event(schema.Kind.STEP_BEGIN, t, step=step, pid=100 + i, value=step)]
            for a, b in ring:
                if i in (a, b):
                    peer = b if i == a else a
                    tcp = {"saddr": ip[i], "daddr": ip[peer], "sport": 1, "dport": 2}
                    evs.append(schema.Event(schema.Kind.TCP_RTT, t + 1_000, duration_ns=1_000_000, payload=tcp))
                    n = sent[step].get((i, peer), 0)
                    if n:
                        evs.append(schema.Event(schema.Kind.TCP_RETRANSMIT, t + 2_000, value=n, payload=tcp))
            evs.append(schema.Event(schema.Kind.STEP_END, t + dur, step=step, pid=100 + i, duration_ns=dur))
            batch(i, evs)
        t += dur + 10_000_000
    return pipe


def test_a_job_whose_recent_step_met_the_directed_condition_keeps_the_directed_view():
    """Step 13 alone blames c, the neighbour that sends into b's drops (its fewest retransmits over
    both directions, 3); after step 12 met the directed view's condition, the worker reads step 13 in
    the directed view and blames nobody."""
    first, second = _lossy_steps(directed_first=True)
    assert first["net_directed"] is True and set(first["evidence"]["hosts"]) == {"b"}
    assert second["net_directed"] is False and second["evidence"]["hosts"] == {} and second["blame"] == []
    first, second = _lossy_steps(directed_first=False)
    assert first["net_directed"] is False and first["evidence"]["hosts"] == {}
    assert second["evidence"]["hosts"]["c"]["network"] == 3.0


def test_a_step_spread_over_rounds_writes_one_parts_record_per_round_not_per_host(monkeypatch):
    """Rounds that each hold a share of a step's hosts write that share as one ``parts`` record (chunked
    at ``PART_RECORD_MAX`` hosts), and a worker recovered between them finishes every step exactly once
    with the offline reference's summaries."""
    monkeypatch.setattr(fold_mod, "PART_RECORD_MAX", 5)
    scn, msgs = _scenario(hosts=12, steps=10)
    regs = [v for v in msgs if all(e.step < 0 for e in schema.decode_batch(v).events)]
    rest = [v for v in msgs if v not in regs]
    pipe = InProcess(partitions=1)
    for v in regs:
        pipe.feed(v)
    r0 = pipe.tables["parts"].records
    half = len(rest) // 2 + 5  # mid-step
    for i in range(0, half, 7):  # rounds of 7 messages: most steps span two or three rounds
        pipe.feed_round(rest[i : min(i + 7, half)])
    parts_records = pipe.tables["parts"].records - r0
    host_parts = sum(len(accumulate_steps(v)) for v in rest[:half])
    assert pipe.tables["parts"], "some steps are open at the crash"
    assert all("|r" in k for k in pipe.tables["parts"])
    assert all(len(rec) <= 5 for rec in pipe.tables["parts"].values())
    assert 0 < parts_records < host_parts / 2, (parts_records, host_parts)
    again = pipe.restarted()
    for i in range(half, len(rest), 7):
        again.feed_round(rest[i : i + 7])
    got = pipe.summaries + again.summaries
    assert sorted(s["step"] for s in got) == list(range(scn.steps))
    assert {s["step"]: _view(s) for s in got} == _reference(scn)
    assert not again.tables["parts"] and not again.tables["steps"], "closed steps leave no parts record"


def accumulate_steps(value: bytes) -> set[int]:
    """The steps one input message has events of (one part per step)."""
    return {e.step for e in schema.decode_batch(value).events if e.step >= 0}


def test_a_host_updated_in_a_later_round_is_read_from_its_latest_record_after_recovery():
    """A host whose step spans two units has its entry in two records; a worker recovered after each
    message rebuilds the index from the keys and reads the later (cumulative) one: same summaries as the
    offline reference, every event counted once."""
    _scn, msgs = _scenario(hosts=3, steps=5, straggler=None, guilty_steps=())
    split = []
    for v in msgs:
        b = schema.decode_batch(v)
        if b.host == "node0" and b.seq >= 3:  # node0's step 2 (seq 3) in two batches; later seqs move up
            if b.seq == 3:
                k = len(b.events) // 2
                split.append(schema.encode_batch(schema.Batch(b.job, b.host, b.host_id, b.agent_id, 3, b.events[:k])))
                split.append(schema.encode_batch(schema.Batch(b.job, b.host, b.host_id, b.agent_id, 4, b.events[k:])))
                continue
            b.seq += 1
            v = schema.encode_batch(b)
        split.append(v)
    pipe = InProcess(partitions=1)
    summaries = []
    spans = 0
    for v in split:
        pipe.feed(v)
        spans = max(spans, len(pipe.fold.step_parts("j|2")[1]))
        summaries += pipe.summaries
        pipe = pipe.restarted()  # every message applied by a worker recovered from the changelogs
    ref = offline.summarize_batches(schema.decode_batch(v) for v in split)
    assert spans >= 2, "node0's part of step 2 was in two records"
    assert sorted(s["step"] for s in summaries) == list(range(5))
    assert {s["step"]: _view(s) for s in summaries} == {step: _view(s) for (_j, step), s in ref.items()}


def test_a_per_host_parts_record_of_the_older_layout_is_read_and_deleted_at_close():
    scn, msgs = _scenario(hosts=4, steps=3, straggler=None, guilty_steps=())
    pipe = InProcess(partitions=1)
    for v in msgs:
        pipe.feed(v)
    want = {s["step"]: _view(s) for s in pipe.summaries}
    # the same input, but every parts record rewritten per host (``job|step|host`` -> entry) before close
    old = InProcess(partitions=1)
    for v in msgs[:-2]:
        old.feed(v)
    for k, rec in list(old.tables["parts"].items()):
        sk = k.rpartition("|")[0]
        del old.tables["parts"][k]
        for h, entry in rec.items():
            old.tables["parts"][f"{sk}|{h}"] = accumulate.to_dict(entry)  # the dict form of the older worker
    assert sorted(old.tables["parts"]) == ["j|2|node0", "j|2|node1"]
    again = old.restarted()
    for v in msgs[-2:]:
        again.feed(v)
    again.close_all()
    got = {s["step"]: _view(s) for s in old.summaries + again.summaries}
    assert got == want and not again.tables["parts"]


def test_writeback_reads_each_key_of_the_table_once():
    reads = {"n": 0}

    class Counting(dict):
        def get(self, k, default=None):
            reads["n"] += 1
            return super().get(k, default)

    table = fold_mod.WriteBack(Counting({"a": 1}))
    assert [table.get("a"), table.get("a"), table.get("b"), table.get("b", 7)] == [1, 1, None, 7]
    assert reads["n"] == 2
    table["b"] = 2
    assert table.get("b") == 2 and reads["n"] == 2


def test_closed_records_recovered_from_a_json_changelog_still_recognise_replays():
    """Older workers wrote their changelogs in Faust's JSON (``wire.CHANGELOG_JSON``), which writes the
    ``closed`` record's digest bytes as the text of their repr; the worker's codec (``wire.CHANGELOG``)
    still reads them: after such a recovery a replayed batch of a closed step is still a replay (nothing
    counted), and a new agent instance's batch is still late data."""
    from faust.serializers import codecs

    from obshub.streams import wire

    json_codec = codecs.get_codec(wire.CHANGELOG_JSON)
    scn, msgs = _scenario(hosts=3, steps=4, straggler=None, guilty_steps=())
    pipe = InProcess(partitions=1)
    for v in msgs:
        pipe.feed(v)
    again = pipe.restarted()
    for k, rec in list(again.tables["closed"].items()):
        dict.__setitem__(again.tables["closed"], k, codecs.loads(wire.CHANGELOG, json_codec.dumps(rec)))
    assert all(isinstance(r["bids"], str) for r in again.tables["closed"].values())
    again.feed(msgs[-1], offset=len(msgs) - 1)  # a replay of the last step's batch after the restart
    assert again.tables["jobs"]["j@0"]["pending"]["late_events"] == 0
    raw = schema.decode_batch(msgs[-1])
    raw.agent_id += "-2"
    again.feed(schema.encode_batch(raw))  # the same events from a new agent instance: late
    assert again.tables["jobs"]["j@0"]["pending"]["late_events"] == len(raw.events)
    assert again.tables["closed"][f"j|{scn.steps - 1}"]["late"] == len(raw.events)


def _window_steps(slowed: bool) -> dict:
    """Steps 12 and 13 of ``_ring_job`` with TCP events (ring a-b-c-d-a), loss on b's link spread thin:
    in step 12 c sent 12 retransmits towards b, b sent 10 towards a and d 1 towards a; in step 13 c sent 5
    towards b and b 1 towards a, so b's fewest over its two connections is 1 in the step alone. Step 13
    takes 300 ms (3 x the job's median) when ``slowed``, else 100 ms. Returns step 13's summary."""
    sent = {12: {(2, 1): 12, (1, 0): 10, (3, 0): 1}, 13: {(2, 1): 5, (1, 0): 1}}
    pipe = _ring_tcp_steps(sent, {12: 100_000_000, 13: 300_000_000 if slowed else 100_000_000})
    assert analysis.net_window(pipe.fold.net_recent["j"]) == {
        "10.0.0.1|10.0.0.2": [11, 0, 11],
        "10.0.0.2|10.0.0.3": [17, 0, 17],
        "10.0.0.1|10.0.0.4": [1, 0, 1],
    }, "the window holds the retransmits of every step closed so far"
    return {s["step"]: s for s in pipe.summaries}[13]


def test_a_slowed_step_reads_its_retransmits_with_the_jobs_previous_steps():
    """Alone, step 13 names nobody (b's fewest retransmits over its connections is 1); when it is slowed,
    the worker reads it with step 12's retransmits (``Fold.net_window``): b's fewest is 11 (at least
    ``net_window_min``) against a reference of 0, evidence 7.0 (the clip). The neighbour a (one lossy
    connection shared with b, 1 on the other) gets none: a connection that does not end at a carries 8
    (the median of 17 and 0)."""
    slowed = _window_steps(slowed=True)
    assert slowed["stall_ratio"] >= 2.0
    assert {h: e["network"] for h, e in slowed["evidence"]["hosts"].items()} == {"b": 7.0}
    plain = _window_steps(slowed=False)
    assert all(e["network"] == 0.0 for e in plain["evidence"]["hosts"].values())


def test_the_worker_charges_culprits_as_the_offline_reference_does_through_a_persistent_fault():
    # a persistent sched fault on host 2 from step 12, then clean again: each step's culprit (with the job's
    # recent culprits, analysis.charge_persistent) is the offline reference's
    scn, msgs = _scenario(steps=40, guilty_steps=tuple(range(12, 28)), extra_ms=300.0)
    pipe = InProcess(partitions=3)
    for v in msgs:
        pipe.feed(v)
    ref = offline.summarize_batches(b for _k, b in synthetic.generate(scn))
    got = {s["step"]: s["culprit"] for s in pipe.summaries}
    assert got == {step: s["culprit"] for (_j, step), s in ref.items()}
    assert {(c["host"], c["layer"]) for st, c in got.items() if 12 <= st < 28 and c} == {("node2", "sched")}


def test_parts_records_are_cut_by_hosts_and_by_bytes():
    """A unit's changed host entries go out in records of at most PART_RECORD_MAX hosts and about
    PART_RECORD_BYTES: 300 small entries make 256 + 44; entries of ~1.2 MB each (1,024 collectives on
    eight rank rows and the host, two groups) go 3 to a record, under the changelog's 16 MiB."""
    from obshub.streams import fold as fold_mod

    small = {f"h{i}": {"acc": {"colls": {}}, "bids": ["a:1"]} for i in range(300)}
    assert [len(c) for c in fold_mod._chunks(small)] == [fold_mod.PART_RECORD_MAX, 300 - fold_mod.PART_RECORD_MAX]
    colls = {f"{pg}#{s}": ["all_reduce", 1, 2, 1] for pg in (0, 1) for s in range(1024)}
    big = {
        f"h{i}": {"acc": {"colls": colls, "ranks": {str(r): {"colls": colls} for r in range(8)}}, "bids": []}
        for i in range(10)
    }
    sizes = [len(c) for c in fold_mod._chunks(big)]
    assert sum(sizes) == 10 and max(sizes) == 3 and list(big) == [h for c in fold_mod._chunks(big) for h in c]
    assert all(
        sum(fold_mod._entry_bytes(big[h]) for h in c) <= fold_mod.PART_RECORD_BYTES for c in fold_mod._chunks(big)
    )


def _counting_clock():
    t = [1_000_000_000_000]

    def clock() -> int:
        t[0] += 1_000_000  # 1 ms a call: both paths call it alike, so the tables' bytes must match
        return t[0]

    return clock


def _parts_of_scenario(pipe: InProcess, msgs: list[bytes]) -> tuple[list[bytes], list[tuple[bytes, int]]]:
    """Registrations fed to ``pipe``; the other inputs' internal messages as ``(msgpack bytes, partition)``."""
    regs = [v for v in msgs if all(e.step < 0 for e in schema.decode_batch(v).events)]
    for v in regs:
        pipe.feed(v)
    return regs, [
        (wire.packb(m), p) for v in msgs if v not in regs for m, p in pipe.parts_of(v) if m.get("t") == "part"
    ]


def test_a_run_of_parts_folds_exactly_as_one_part_at_a_time():
    """``Fold.parts_run`` (a batch's parts with their step's lookups made once) against the same parts
    applied one by one in the same unit: replays inside the run, parts of a step after it closed in the
    run (replays and a new agent's late data), an unregistered host, a host split over two parts: the same
    summaries, tables and changelog bytes."""
    from obshub.streams import accumulate as acc_mod

    scn, msgs = _scenario(hosts=5, steps=12)
    extra, _ = _scenario(hosts=6, steps=12, job="j")  # node5 sends data without registering below
    pipes = {k: InProcess(partitions=2, clock=_counting_clock(), window_ns=10**15) for k in ("run", "one")}
    regs, parts = _parts_of_scenario(pipes["one"], msgs)
    for v in regs:
        pipes["run"].feed(v)
    late = []
    for raw, p in parts:  # the same parts from another agent instance: new batch ids, late once closed
        m = acc_mod.decode_internal(raw)
        late.append((wire.packb(msgspec.structs.replace(m, bid="other:" + m.bid)), p))
    unreg = [
        (wire.packb(m), p)
        for _k, b in synthetic.generate(extra)
        if b.host == "node5"
        for m, p in pipes["one"].parts_of(schema.encode_batch(b))
        if m.get("t") == "part"
    ]
    stream = []
    for i in range(0, len(parts), 4):
        stream += (
            parts[i : i + 4] + parts[i : i + 2] + (late[i - 8 : i - 4] if i >= 8 else []) + unreg[i // 4 : i // 4 + 1]
        )
    per: dict[int, list[bytes]] = {}
    for raw, p in stream:
        per.setdefault(p, []).append(raw)
    for p, raws in sorted(per.items()):
        for i in range(0, len(raws), 37):  # units of 37 messages: runs cross steps and closes
            chunk = raws[i : i + 37]
            pipes["run"]._apply({"t": "batch", "msgs": chunk}, p)
            pipes["one"].apply_unit([acc_mod.decode_internal(r) for r in chunk], p)  # part by part
    run, one = pipes["run"], pipes["one"]
    assert len(run.summaries) == len(one.summaries) >= scn.steps // 2
    assert [wire.packb(s) for s in run.summaries] == [wire.packb(s) for s in one.summaries]
    for name in ("parts", "steps", "members", "jobs", "closed"):
        assert run.tables[name].log == one.tables[name].log, name
        assert run.tables[name].records == one.tables[name].records, name
    assert run.fold.ended == one.fold.ended and run.fold.last_seen == one.fold.last_seen


def test_a_batch_of_one_steps_parts_looks_its_step_and_job_up_once(monkeypatch):
    """The ~512 parts of one step a worker's round brings at 2,048 x 8 (issue #30 item 4) read the step's
    ``closed`` and ``steps`` records and the job's record once per run, not once per part."""
    _scn, msgs = _scenario(hosts=24, steps=3, guilty_steps=(), straggler=None)
    pipe = InProcess(partitions=1)
    _regs, parts = _parts_of_scenario(pipe, msgs)
    step1 = [raw for raw, _p in parts if accumulate.decode_internal(raw).step == 1]
    assert len(step1) == 24
    reads: dict[str, int] = {}
    get = fold_mod.WriteBack.get

    def counting(self, key, default=None):
        reads[key] = reads.get(key, 0) + 1
        return get(self, key, default)

    monkeypatch.setattr(fold_mod.WriteBack, "get", counting)
    pipe._apply({"t": "batch", "msgs": step1[:20]}, 0)  # open, not complete: no close reads
    assert reads["j|1"] <= 3 and reads["j@0"] <= 1, reads  # closed, steps; steps again at the write-back


def test_a_one_rank_hosts_culprit_names_its_rank_on_every_path_it_is_named_by():
    # a job of one rank per host: node2's CPU slowed every other step. Its own steps name node2 / sched by its
    # evidence (the straggler's rank, 2); the steps between are charged to it as a persistent fault's victims
    # (charge_persistent), whose straggler is another host or nobody: on f6666cb those culprits named no
    # rank, so a host's alerts carried a `rank` label on some steps or episodes and not on others
    # (docs/RULES.md "Builtin pack and runbooks"). Through the worker's ingest and fold and the offline
    # reference alike.
    scn, msgs = _scenario(steps=60, guilty_steps=tuple(range(30, 50, 2)), extra_ms=8.0, jitter_ms=2.0, seed=1)
    pipe = InProcess(partitions=3)
    for v in msgs:
        pipe.feed(v)
    ref = offline.summarize_batches(b for _k, b in synthetic.generate(scn))
    for name, culprits in (
        ("worker", [s["culprit"] for s in pipe.summaries]),
        ("offline", [s["culprit"] for s in ref.values()]),
    ):
        mine = [c for c in culprits if c and c["host"] == "node2"]
        assert {c["source"] for c in mine} >= {"evidence", "persistent"}, (name, mine)
        assert [c for c in mine if c.get("rank") != 2] == [], name
    # a host's link names no rank, and a culprit of a host of several ranks keeps an unknown rank
    acc = accumulate.HostAcc(rank=[5, 0, 1000])
    assert analysis.one_rank_culprit({"host": "h", "layer": "network", "rank": None}, {"h": acc})["rank"] is None
    assert analysis.one_rank_culprit({"host": "h", "layer": "memory", "rank": None}, {"h": acc})["rank"] == 5
    assert (
        analysis.one_rank_culprit({"host": "h", "layer": "sched", "rank": None}, {"h": accumulate.HostAcc()})["rank"]
        is None
    )
    assert analysis.one_rank_culprit(None, {"h": acc}) is None
