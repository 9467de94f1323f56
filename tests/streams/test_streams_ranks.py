"""Several ranks per host (docs/ANALYSIS.md "Several ranks per host"): synthetic multi-rank batches
through the real ingest, fold and analysis (``streams.inproc``): the slow rank among its host's peers is
named with its host, a one-node job names its slow rank, a hang names the rank that holds it up, and a
one-rank-per-host job keeps its summaries' meaning."""

from __future__ import annotations

import dataclasses

import msgspec

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


def test_a_one_node_job_names_its_cpu_starved_rank_starved():
    """One host, 4 ranks, rank 2 waiting 40 ms a step in the run queue (a CPU burst pinned to it): the ranks
    are each other's peers for ``starved`` too (the host has no peer host, so a one-node job's burst was
    never starved and its single step was left to ``stall_sched_k``: 400 ms bursts on rank 2 of 4 at
    x4.2-x4.3 missed 4 of 6, untuned14). A node whose ranks all wait alike (a loaded node) is not starved."""
    import copy

    from obshub.streams import analysis

    scn = synthetic.Scenario(hosts=4, steps=24, straggler=2, guilty_steps=GUILTY, guilty_layer="sched")
    sums = _run(scn, 4)
    for step in GUILTY[:2]:  # the third is the persistent fault's (source "persistent")
        c = sums[step]["culprit"]
        assert (c["host"], c["layer"], c["rank"], c["source"]) == ("node0", "sched", 2, "evidence"), c
        assert c["starved"] and "starved: rank 2: run-queue 40 ms" in c["why"], c["why"]
    loaded = copy.deepcopy(sums[GUILTY[0]])
    for row in loaded["ranks"]["node0"].values():
        row["layers"]["sched"]["time_ns"] = 40_000_000
    assert analysis.culprit(loaded)["starved"] is False
    # the same burst inside a collective: nobody late, no straggler, no evidence; rank 2's run queue names it
    inside = copy.deepcopy(sums[GUILTY[0]])
    inside.update(straggler=None, blame=[])
    inside["evidence"]["hosts"] = {"node0": {k: 0.0 for k in inside["evidence"]["hosts"]["node0"]}}
    c = analysis.culprit_rank(analysis.culprit(inside), inside)
    assert (c["host"], c["layer"], c["rank"], c["source"], c["starved"]) == ("node0", "sched", 2, "layers", True), c
    assert "rank 2's sched time" in c["why"], c["why"]
    # a step of a 2-host job that only this host reached is no one-node job: its ranks are not the peers
    assert analysis.culprit(dict(inside, expected_hosts=["node0", "node1"])) is None
    assert all(sums[k]["culprit"] is None for k in range(2, GUILTY[0]))  # the clean steps before it


def test_a_cpu_starved_rank_among_four_per_host_is_starved_against_the_jobs_ranks():
    """3 hosts x 4 ranks, rank 6 (node1) waiting 40 ms a step in the run queue and every other rank 5 ms (a
    loaded machine): node1's run queue is its 4 ranks' sum (55 ms), 2.75x each other host's (20 ms), so the
    host comparison alone never called it starved (untuned14, 4 ranks per host: every host >= 1.8 s a step);
    its rank against the job's other ranks is 8x: starved, rank 6, with or without a straggler. Ranks of a
    host all waiting alike (15 ms each against 8 ms elsewhere) are not starved."""
    import copy

    from obshub.streams import analysis

    scn = synthetic.Scenario(hosts=12, steps=24, straggler=6, guilty_steps=GUILTY, guilty_layer="sched")
    sums = _run(scn, 4)

    def loaded(each: int, node1: int | None = None) -> dict:
        s = copy.deepcopy(sums[GUILTY[0]])
        for h, rows in s["ranks"].items():
            for r, row in rows.items():
                if r != "6" or node1 is not None:
                    row["layers"]["sched"]["time_ns"] = node1 if h == "node1" and node1 is not None else each
            s["layers"][h]["sched"]["time_ns"] = sum(row["layers"]["sched"]["time_ns"] for row in rows.values())
        return s

    burst = loaded(5_000_000)
    assert burst["layers"]["node1"]["sched"]["time_ns"] < 3 * burst["layers"]["node0"]["sched"]["time_ns"]
    c = analysis.culprit_rank(analysis.culprit(burst), burst)
    assert (c["host"], c["layer"], c["rank"], c["source"], c["starved"]) == ("node1", "sched", 6, "evidence", True), c
    assert "starved: rank 6: run-queue 40 ms" in c["why"], c["why"]
    # the same burst inside a collective: nobody late, no straggler; node1's run queue names it, rank 6's starves it
    inside = dict(burst, straggler=None, blame=[])
    inside["evidence"] = dict(burst["evidence"], hosts={}, ranks={})
    c = analysis.culprit_rank(analysis.culprit(inside), inside)
    assert (c["host"], c["layer"], c["rank"], c["source"], c["starved"]) == ("node1", "sched", 6, "layers", True), c
    even = loaded(8_000_000, node1=15_000_000)
    c = analysis.culprit(even)
    assert c is not None and c["host"] == "node1" and c["layer"] == "sched" and c["starved"] is False, c


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
    # a's two ranks and b's rank 2, which reached the collective: 3 of 4 wait (2 before: b's own left out)
    assert summary["hang"]["waiting"] == ["a"] and summary["hang"]["waiting_ranks"] == 3

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
    assert summary["hang"]["waiting"] == ["solo"] and summary["hang"]["waiting_ranks"] == 2  # ranks 0 and 2


def test_a_stopped_rank_found_outside_a_collective_counts_its_hosts_other_rank_as_waiting():
    """Live 2 x 2 demo (`--fault hang --fault-host 1 --fault-rank 1`, 2026-12-06): the hang was found by
    rank 3's state with no collective its rows knew (pg "-"); the page said "2 of 4 ranks wait" while
    node-01's rank 2 waited too."""
    from obshub.streams import accumulate
    from obshub.streams.analysis.running import hang_ranks

    found = {"pg": "-", "coll_seq": -1, "op": "step", "hosts": [{"host": "b", "state": "stopped"}], "waiting": ["a"]}
    pids = {"a": {10: (0, 0), 11: (1, 1)}, "b": {20: (2, 0), 21: (3, 1)}}
    b = accumulate.new_acc("b", 1)  # b's rank rows: rank 2 in all-reduce 7 (open), rank 3 stopped before it
    b.ranks = {"2": accumulate.new_rank_row(20, 0), "3": accumulate.new_rank_row(21, 1)}
    b.ranks["2"].colls["0#7"] = ["all_reduce", 5_000, None, None]
    for accs in ({}, {"b": b}):
        got = hang_ranks(found, accs, pids, {"b": {21: ("stopped", 0, 5)}})
        assert [(h["host"], h["rank"]) for h in got["hosts"]] == [("b", 3)] and got["waiting_ranks"] == 3
        # the whole host stopped: none of its ranks waits
        got = hang_ranks(found, accs, pids, {"b": {20: ("stopped", 0, 5), 21: ("stopped", 0, 6)}})
        assert [(h["host"], h["rank"]) for h in got["hosts"]] == [("b", 2)] and got["waiting_ranks"] == 2


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


def _reference_lateness(units: dict[str, dict]) -> tuple[dict[str, int], dict[str, int]]:
    """``rank_lateness`` as first written (per collective, sort ``(arrival, unit key)`` pairs): the
    reference the one-pass version must equal, ties included."""
    by_key: dict[str, list[tuple[int, str]]] = {}
    for u, a in units.items():
        for key, c in a["colls"].items():
            if c[1] is not None:
                by_key.setdefault(key, []).append((c[1], u))
    late = dict.fromkeys(units, 0)
    last_n: dict[str, int] = {}
    for arr in by_key.values():
        if len(arr) < 2:
            continue
        arr.sort()
        n = len(arr)
        med = arr[n // 2][0] if n % 2 else (arr[n // 2 - 1][0] + arr[n // 2][0]) // 2
        unc = units[arr[0][1]]["unc_ns"] + units[arr[-1][1]]["unc_ns"]
        for t, u in reversed(arr):
            if t - med <= unc:
                break
            late[u] = max(late[u], t - med)
        (t2, u2), (t1, u1) = arr[-2], arr[-1]
        if t1 - t2 > units[u1]["unc_ns"] + units[u2]["unc_ns"]:
            last_n[u1] = last_n.get(u1, 0) + 1
    return late, last_n


def _wide_accs(hosts: int, per_host: int, seed: int) -> dict[str, dict]:
    """Host accumulators of ``hosts`` x ``per_host`` ranks, three collectives, arrivals on a coarse grid
    (many ties, at the first, second and last arrival too), clock uncertainties differing per host and
    rank, a collective some ranks never reached."""
    import random

    rnd = random.Random(seed)
    accs = {}
    for h in range(hosts):
        rows = {}
        for lr in range(per_host):
            r = h * per_host + lr
            colls = {}
            for k in range(3):
                if k == 2 and rnd.random() < 0.2:
                    continue
                t = 1_000_000 * k + rnd.choice((0, 0, 10_000, 20_000, 50_000, 400_000))
                colls[f"0#{k}"] = ["all_reduce", t, t + 90_000, 90_000 - (t % 1_000_000)]
            row = accumulate.new_rank_row(1000 + lr, lr)
            row.update(step_ns=rnd.choice((900_000, 950_000)), unc_ns=rnd.choice((0, 5_000, 20_000)), colls=colls)
            row["layers"] = {"sched": [rnd.randrange(10**6), 3, 10]}
            rows[str(r)] = row
        acc = accumulate.new_acc(f"n{h:03d}", h)
        acc.update(unc_ns=rnd.choice((0, 10_000)), ranks=rows, step_ns=950_000)
        acc["colls"] = {k: ["all_reduce", 0, 90_000, 90_000] for k in ("0#0", "0#1", "0#2")}
        accs[f"n{h:03d}"] = acc
    return accs


def test_lean_rank_rows_equal_the_reference_ties_and_wide_steps_included():
    """The close's lean rank path (docs/BENCHMARKS.md 7b) changes no summary: ``rank_lateness`` equals the
    per-collective sort it replaced on arrivals full of ties; ``host_ranks`` of a wide step (each host's
    named rank's row, then ``fill_rows`` for the kept hosts) equals the full rows; the host view equals
    the per-collective scan over rank rows (the first rank row of the latest arrival on a tie)."""
    from obshub.streams.analysis import ranks as R

    for seed in range(6):
        accs = _wide_accs(9, 4, seed)
        units = R.rank_units(accs)
        assert R.rank_lateness(units) == _reference_lateness(units)
        full = R.host_ranks(accs)
        lean = R.host_ranks(accs, layers_for=set(), rows_for=set())
        assert {h: v["rank"] for h, v in lean.items()} == {h: v["rank"] for h, v in full.items()}
        assert all(list(lean[h]["rows"]) == [full[h]["rank"]] for h in full)
        kept = {"n001", "n004"}
        R.fill_rows(lean, accs, kept)
        R.fill_layers(lean, accs, kept)
        assert {h: lean[h]["rows"] for h in kept} == {h: full[h]["rows"] for h in kept}
    # a tie at the second-latest arrival: the larger key's clock (5 µs) makes rank 3's 3 µs lead no lead
    units = {
        f"h#{r}": {"unc_ns": u, "colls": {"0#1": ["all_reduce", t, None, None]}}
        for r, (t, u) in enumerate(((0, 0), (100, 0), (100, 5_000), (3_100, 0)))
    }
    assert R.rank_lateness(units) == _reference_lateness(units) and R.rank_lateness(units)[1] == {}
    for seed in range(2):
        accs = _wide_accs(9, 4, seed)
        view = R.host_view(accs)
        for h, a in accs.items():
            for key in a["colls"]:
                have = [row["colls"][key] for row in a["ranks"].values() if key in row["colls"]]
                want = list(max(have, key=lambda c: c[1])) if have else ["all_reduce", None, None, None]
                assert view[h]["colls"][key] == want


def test_tail_steps_names_the_rank_of_the_straggler_and_of_a_hung_host():
    """`obshub tail steps` on a host of several ranks: the straggler and a hung host carry their global
    rank (a new user read "straggler vm" and "HANG: vm,vm" for two ranks of one host)."""
    from obshub.streams.cli import _line

    s = {
        "job": "j",
        "step": 9,
        "closed_by": "hang",
        "hosts": ["vm"],
        "expected_hosts": ["vm"],
        "step_time_max_ns": 0,
        "missing_hosts": [],
        "hang": {
            "hosts": [{"host": "vm", "rank": 1}, {"host": "vm", "rank": 3}],
            "op": "all_reduce",
            "pg": "0",
            "coll_seq": 4,
            "waiting": ["vm"],
            "waited_ns": 2_000_000_000,
        },
        "straggler": {"host": "vm", "rank": 1, "score": 0.7, "excess_ns": 40_000_000},
        "blame": [],
        "stall": False,
        "quality": {},
    }
    line = _line(s)
    assert "HANG: vm rank 1,vm rank 3 never arrived" in line and "straggler vm rank 1[/yellow]" in line
    s["straggler"] = {"host": "vm", "score": 0.7, "excess_ns": 40_000_000}  # an older summary: no rank
    assert "straggler vm[/yellow]" in _line(s)


def test_two_jobs_on_one_node_keep_their_own_ranks():
    """One agent serving two 2-rank jobs on one node (both have a rank 0 and a rank 1, other pids): each
    job's summaries keep both rank rows and close complete, and job A's slow rank is named. The host's
    rank map was one per agent: job B's REGISTER of rank 0 evicted job A's rank 0 (a new user's second
    job on a node had ``ranks: {}`` and closed by its window in every step)."""
    a = synthetic.Scenario(job="ja", hosts=2, steps=20, straggler=1, guilty_steps=GUILTY, guilty_layer="sched")
    b = synthetic.Scenario(job="jb", hosts=2, steps=20)
    batches = []
    for k, ((_ka, ba), (_kb, bb)) in enumerate(zip(synthetic.generate_ranks(a, 2), synthetic.generate_ranks(b, 2))):
        agent = "node0/agent"
        batches.append(dataclasses.replace(ba, agent_id=agent, seq=2 * k))
        evs = [e._replace(pid=e.pid + 1000, tid=e.tid + 1000) for e in bb.events]
        batches.append(dataclasses.replace(bb, agent_id=agent, seq=2 * k + 1, events=evs))
    pipe = InProcess(partitions=2)
    for batch in batches:
        pipe.feed(schema.encode_batch(batch))
    pipe.close_all()
    by_job: dict[str, dict[int, dict]] = {}
    for s in pipe.summaries:
        by_job.setdefault(s["job"], {})[s["step"]] = s
    for job, pids in (("ja", {"0": 1000, "1": 1001}), ("jb", {"0": 2000, "1": 2001})):
        sums = by_job[job]
        assert len(sums) == 20 and all(s["closed_by"] == "complete" for s in sums.values()), job
        assert all({r: row["pid"] for r, row in s["ranks"]["node0"].items()} == pids for s in sums.values()), job
    for step in GUILTY:
        assert (by_job["ja"][step]["straggler"]["host"], by_job["ja"][step]["straggler"]["rank"]) == ("node0", 1)
    assert all(s["straggler"] is None for k, s in by_job["jb"].items() if k >= 2)


def test_a_step_of_thousands_of_collectives_keeps_the_latest_of_each_group_bounded():
    """A 2-rank host whose step ran 3,000 all-reduces on group 0 and 5 on group 1, in two batches: each
    accumulator (host and rank rows, packed or not) keeps the latest ``COLLS_MAX`` of group 0 and every one
    of group 1, so the part written to the changelog stays small (10,000 collectives per rank made a
    17 MB record that crashed the worker)."""
    K = schema.Kind
    cap = accumulate.COLLS_MAX

    def ev(kind, t, pid, seq, pg="0", dur=0):
        return schema.Event(kind, t, dur, 0, 3, pid, pid, -1, 0, {"pg": pg, "coll_seq": seq, "op": "all_reduce"})

    def batch(seqs, seq_no):
        evs = [
            schema.Event(
                K.REGISTER, 0, 0, 0, -1, 100 + r, 100 + r, -1, r, {"job": "j", "world_size": 2, "local_rank": r}
            )
            for r in (0, 1)
        ]
        for s in seqs:
            for r in (0, 1):
                t = 1_000_000 + s * 1_000 + r * 400  # rank 1 arrives 400 ns after rank 0
                evs.append(ev(K.COLLECTIVE_BEGIN, t, 100 + r, s))
                evs.append(ev(K.COLLECTIVE_END, t + 500, 100 + r, s, dur=500))
        if seq_no == 0:
            evs += [ev(K.COLLECTIVE_BEGIN, 500 + s, 100, s, pg="1") for s in range(5)]
        return schema.Batch("j", "h", 0, "h/a", seq_no, evs, schema.Clock(), 0)

    ranks = {100: (0, 0), 101: (1, 1)}
    a = accumulate.reduce_batch(batch(range(0, 1_500), 0), ranks=ranks)[3]
    b = accumulate.reduce_batch(batch(range(1_500, 3_000), 1), ranks=ranks)[3]
    assert len(a["colls"]) == cap + 5 and all(len(r["colls"]) <= cap + 5 for r in a["ranks"].values())
    merged = accumulate.merge(accumulate.pack_ranks(a), accumulate.pack_ranks(b))
    pg0 = sorted(int(k.split("#")[1]) for k in merged["colls"] if k.startswith("0#"))
    assert pg0 == list(range(3_000 - cap, 3_000)), "the latest of group 0"
    assert sum(k.startswith("1#") for k in merged["colls"]) == 5, "a small group is kept whole"
    rows = accumulate.rank_rows(merged)
    assert sorted(int(k.split("#")[1]) for k in rows["1"]["colls"] if k.startswith("0#")) == pg0
    assert len(msgspec.msgpack.encode(merged)) < 400_000
