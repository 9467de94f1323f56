"""Several ranks per host (docs/ANALYSIS.md "Several ranks per host"): synthetic multi-rank batches
through the real ingest, fold and analysis (``streams.inproc``): the slow rank among its host's peers is
named with its host, a one-node job names its slow rank, a hang names the rank that holds it up, and a
one-rank-per-host job keeps its summaries' meaning."""

from __future__ import annotations

from obshub.core import schema
from obshub.streams import accumulate, synthetic
from obshub.streams.inproc import InProcess

GUILTY = (14, 15, 16)


def _run(scn: synthetic.Scenario, ranks_per_host: int) -> dict[int, dict]:
    pipe = InProcess(partitions=2)
    for _key, b in synthetic.generate_ranks(scn, ranks_per_host):
        pipe.feed(schema.encode_batch(b))
    pipe.close_all()
    return {s["step"]: s for s in pipe.summaries}


def test_a_slow_rank_among_four_on_one_host_is_named_with_its_host():
    """3 hosts x 4 ranks; global rank 6 (node1, local rank 2) waits for a CPU in steps 14-16. Its host's
    first rank arrives on time at every collective (the host accumulator's arrival), so only the rank
    rows show it: the straggler is node1 / rank 6, blamed for sched, and the culprit names the rank."""
    scn = synthetic.Scenario(hosts=12, steps=24, straggler=6, guilty_steps=GUILTY, guilty_layer="sched")
    sums = _run(scn, 4)
    assert len(sums) == 24 and all(s["closed_by"] == "complete" for s in sums.values())
    for step in GUILTY:
        s = sums[step]
        st = s["straggler"]
        assert (st["host"], st["rank"], st["local_rank"]) == ("node1", 6, 2), st
        assert s["blame"][0]["layer"] == "sched" and (s["blame"][0]["host"], s["blame"][0]["rank"]) == ("node1", 6)
        rows = s["ranks"]["node1"]
        assert sorted(rows) == ["4", "5", "6", "7"] and rows["6"]["late_ns"] > 10 * max(
            rows[r]["late_ns"] for r in ("4", "5", "7")
        )
        assert rows["6"]["pid"] == 1002 and rows["6"]["layers"]["sched"]["time_ns"] > 0
        assert s["culprit"]["host"] == "node1" and s["culprit"]["rank"] == 6
    clean = [s for k, s in sums.items() if k not in GUILTY and k >= 2]
    assert all(s["straggler"] is None for s in clean)
    assert all(sorted(s["ranks"]) == ["node0", "node1", "node2"] for s in sums.values())


def test_a_one_node_job_names_its_slow_rank():
    """One host, 4 ranks, rank 2 slowed by memory reclaim: nothing to compare across hosts, so the ranks
    are compared with each other: straggler node0 / rank 2, memory blamed on that rank."""
    scn = synthetic.Scenario(hosts=4, steps=24, straggler=2, guilty_steps=GUILTY, guilty_layer="memory")
    sums = _run(scn, 4)
    assert len(sums) == 24
    for step in GUILTY:
        s = sums[step]
        assert s["hosts"] == ["node0"]
        assert (s["straggler"]["host"], s["straggler"]["rank"]) == ("node0", 2), s["straggler"]
        assert [g["rank"] for g in s["straggler"]["group"]][0] == 2
        assert (s["blame"][0]["layer"], s["blame"][0]["rank"]) == ("memory", 2)
        assert s["culprit"]["host"] == "node0" and s["culprit"]["rank"] == 2
        assert "node0#" not in s["straggler"]["reason"]
    assert all(s["straggler"] is None for k, s in sums.items() if k not in GUILTY and k >= 2)


def test_one_rank_per_host_summaries_keep_their_meaning_and_name_the_rank():
    """The usual one-rank-per-host job: no rank rows (the host row is its rank's), the same straggler,
    blame and culprit hosts as the host-level analysis, each with the host's registered rank."""
    scn = synthetic.Scenario(hosts=4, steps=24, straggler=3, guilty_steps=GUILTY, guilty_layer="sched")
    pipe = InProcess(partitions=2)
    for _key, b in synthetic.generate(scn):
        pipe.feed(schema.encode_batch(b))
    sums = {s["step"]: s for s in pipe.summaries}
    assert {k: (sums[k]["straggler"]["host"], sums[k]["blame"][0]["layer"]) for k in GUILTY} == synthetic.expected(scn)
    for k in GUILTY:
        assert sums[k]["ranks"] == {} and sums[k]["straggler"]["rank"] == 3 and sums[k]["blame"][0]["rank"] == 3
    assert all(s["straggler"] is None for k, s in sums.items() if k not in GUILTY and k >= 2)


def _hang_pipe(now, hosts, per_host):
    pipe = InProcess(partitions=2, clock=lambda: now[0])
    world = len(hosts) * per_host

    def batch(i, seq, events):
        h = hosts[i]
        return schema.encode_batch(schema.Batch("j", h, i, f"agent-{h}", seq, events))

    for i in range(len(hosts)):
        regs = [
            schema.Event(
                schema.Kind.REGISTER,
                1,
                pid=100 + lr,
                value=i * per_host + lr,
                payload={"world_size": world, "job": "j", "local_rank": lr},
            )
            for lr in range(per_host)
        ]
        pipe.feed(batch(i, 0, regs))
    return pipe, batch


def test_a_hang_of_one_rank_names_its_host_and_rank():
    """2 hosts x 2 ranks: every rank but rank 3 (host b, local rank 1) reached all-reduce 7, and b's agent
    reports rank 3's process frozen. b's rank 2 arrived, yet b has not (its last rank has not): the hang
    names b / rank 3. The same in a one-node job (one host, 3 ranks, rank 1 frozen before the
    collective): its ranks are judged as hosts would be."""
    now = [1_000_000_000_000]
    pipe, batch = _hang_pipe(now, ("a", "b"), 2)
    t0 = now[0] - 50_000_000
    coll = {"pg": "0", "coll_seq": 7, "op": "all_reduce"}
    for i in range(2):
        evs = []
        for lr in range(2):
            evs.append(schema.Event(schema.Kind.STEP_BEGIN, t0, step=5, pid=100 + lr, value=5))
            if (i, lr) != (1, 1):
                evs.append(
                    schema.Event(schema.Kind.COLLECTIVE_BEGIN, t0 + 10_000_000 + lr, step=5, pid=100 + lr, payload=coll)
                )
        pipe.feed(batch(i, 1, evs))
    frozen = schema.Event(schema.Kind.RANK_STATE, t0 + 20_000_000, pid=101, value=1, payload={"state": "frozen"})
    pipe.feed(batch(1, 2, [frozen]))
    now[0] += 600_000_000
    ((_sk, summary, first),) = pipe.fold.hangs()
    assert first and summary["hang"]["coll_seq"] == 7
    assert [(h["host"], h["rank"], h["state"]) for h in summary["hang"]["hosts"]] == [("b", 3, "frozen")]

    now = [1_000_000_000_000]
    pipe, batch = _hang_pipe(now, ("solo",), 3)
    evs = []
    for lr in range(3):
        evs.append(schema.Event(schema.Kind.STEP_BEGIN, t0, step=5, pid=100 + lr, value=5))
        if lr != 1:
            evs.append(schema.Event(schema.Kind.COLLECTIVE_BEGIN, t0 + 10_000_000, step=5, pid=100 + lr, payload=coll))
    pipe.feed(batch(0, 1, evs))
    frozen = schema.Event(schema.Kind.RANK_STATE, t0 + 20_000_000, pid=101, value=1, payload={"state": "frozen"})
    pipe.feed(batch(0, 2, [frozen]))
    now[0] += 600_000_000
    ((_sk, summary, _first),) = pipe.fold.hangs()
    assert [(h["host"], h["rank"], h["state"]) for h in summary["hang"]["hosts"]] == [("solo", 1, "frozen")]
    assert summary["hang"]["waiting"] == ["solo"]


def test_a_host_is_done_with_a_step_only_when_each_of_its_ranks_ended_it():
    """A host's first rank to end a step does not complete the step for its host: the step closes once
    the host's last rank's STEP_END arrives (in a later batch), so the slow rank's row is in the summary."""
    now = [1_000_000_000_000]
    pipe, batch = _hang_pipe(now, ("a",), 2)
    t0 = 5_000_000
    end0 = schema.Event(schema.Kind.STEP_END, t0 + 100, step=0, pid=100, duration_ns=100)
    pipe.feed(batch(0, 1, [schema.Event(schema.Kind.STEP_BEGIN, t0, step=0, pid=100), end0]))
    assert pipe.summaries == []
    pipe.feed(batch(0, 2, [schema.Event(schema.Kind.STEP_END, t0 + 900, step=0, pid=101, duration_ns=900)]))
    (s,) = pipe.summaries
    assert s["closed_by"] == "complete" and s["step_time_ns"] == {"a": 900}
    assert {r: row["step_ns"] for r, row in s["ranks"]["a"].items()} == {"0": 100, "1": 900}


def test_rank_rows_merge_like_their_host_and_tcp_events_stay_with_the_host():
    """``reduce_batch`` with two known ranks: each rank's events in its own row (its GPU index kept), the
    TCP events of a rank's pid host-level only; ``merge`` sums rows of the same rank."""
    ranks = {100: (0, 0), 101: (1, 1)}
    evs = [
        schema.Event(schema.Kind.SCHED_RUNQ, 10, duration_ns=5, step=3, pid=100),
        schema.Event(schema.Kind.CUDA_SYNC, 11, duration_ns=7, step=3, pid=101, gpu=1),
        schema.Event(
            schema.Kind.TCP_RTT, 12, duration_ns=9, step=3, pid=101, payload={"saddr": "10.0.0.1", "daddr": "10.0.0.2"}
        ),
    ]
    (acc,) = accumulate.reduce_batch(schema.Batch("j", "h", 0, "a", 1, evs), ranks=ranks).values()
    rows = acc["ranks"]
    assert rows["0"]["layers"] == {"sched": [5, 1, 5]} and rows["1"]["gpu"] == 1
    assert "network" not in rows["1"]["layers"] and "network" in acc["layers"]
    (again,) = accumulate.reduce_batch(schema.Batch("j", "h", 0, "a", 2, evs[:1]), ranks=ranks).values()
    accumulate.merge(acc, again)
    assert acc["ranks"]["0"]["layers"]["sched"] == [10, 2, 5]
