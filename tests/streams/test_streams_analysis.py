"""Unit tests of the pure parts of the streams stage: batch reduction, merging, the analysis formulas
and the synthetic generator's ground truth (no Kafka, no Faust)."""

from __future__ import annotations

import copy
import math
import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from obshub.core import schema
from obshub.core.schema import Batch, Clock, Event, Kind
from obshub.rules import fields
from obshub.streams import accumulate, analysis, offline, synthetic


def _batch(events, host="h0", host_id=0, seq=0, offset=1_000, unc=10):
    return Batch("job", host, host_id, f"{host}-a", seq, events, Clock(offset, unc, 0), 1)


def test_reduce_batch_splits_steps_and_applies_kind_rules():
    evs = [
        Event(Kind.REGISTER, 5, value=0, payload={"world_size": 2, "job": "job", "host_id": 0, "local_rank": 0}),
        Event(Kind.STEP_BEGIN, 100, step=1),
        Event(Kind.SCHED_OFFCPU, 110, duration_ns=500, step=1, value=0),  # preempted: counts
        Event(Kind.SCHED_OFFCPU, 120, duration_ns=9_000, step=1, value=1),  # voluntary sleep: time 0
        Event(Kind.SCHED_RUNQ, 130, duration_ns=40, step=1),
        Event(Kind.TCP_RETRANSMIT, 140, step=1, value=3),
        Event(Kind.TCP_RTT, 150, duration_ns=70_000, step=1),
        Event(Kind.COLLECTIVE_BEGIN, 200, step=1, payload={"pg": "0", "coll_seq": 4, "op": "all_reduce"}),
        Event(Kind.COLLECTIVE_END, 260, duration_ns=60, step=1, payload={"pg": "0", "coll_seq": 4, "op": "all_reduce"}),
        Event(Kind.STEP_END, 300, duration_ns=200, step=1),
        Event(Kind.MEM_RECLAIM, 400, duration_ns=77, step=2),
        Event(Kind.AGENT_LOSS, 410, value=6),  # outside a step: lowest step
    ]
    parts = accumulate.reduce_batch(_batch(evs))
    assert sorted(parts) == [1, 2]
    a = parts[1]
    assert a["step_ns"] == 200 and a["begin_rt"] == 1_100 and a["end_rt"] == 1_300
    assert a["layers"]["sched"] == [540, 3, 500]
    assert a["layers"]["network"] == [0, 3, 70_000]
    assert a["colls"]["0#4"] == ["all_reduce", 1_200, 1_260, 60]
    assert a["ringbuf_lost"] == 6 and a["events"] == 9 and a["unc_ns"] == 10
    assert parts[2]["layers"]["memory"] == [77, 1, 77]
    assert accumulate.registrations(_batch(evs)) == [
        {"job": "job", "host": "h0", "host_id": 0, "rank": 0, "world_size": 2, "pid": 0}
    ]


def test_merge_sums_counts_and_keeps_first_times():
    a = accumulate.reduce_batch(_batch([Event(Kind.SCHED_RUNQ, 10, 5, step=0), Event(Kind.STEP_BEGIN, 1, step=0)]))[0]
    b = accumulate.reduce_batch(
        _batch([Event(Kind.SCHED_RUNQ, 20, 9, step=0), Event(Kind.STEP_END, 50, 49, step=0)], seq=1)
    )[0]
    m = accumulate.merge(a, b)
    assert m["layers"]["sched"] == [14, 2, 9] and m["step_ns"] == 49 and m["begin_rt"] == 1_001
    assert m["events"] == 4


def test_medians_percentile_and_union():
    assert analysis.median_int([]) == 0 and analysis.median_int([5, 1, 3]) == 3
    assert analysis.median_int([1, 2, 3, 10]) == 2
    assert analysis.p99_int(list(range(1, 101))) == 99 and analysis.p99_int([7]) == 7
    assert analysis.union_ns([(0, 10), (5, 20), (30, 40)]) == 30
    assert analysis.union_ns([]) == 0


def _acc(host, step_ns, arrivals, unc=1_000, layers=None, coll_ns=0):
    a = accumulate.new_acc(host, 0)
    a["step_ns"], a["unc_ns"] = step_ns, unc
    for i, t in enumerate(arrivals):
        a["colls"][f"0#{i}"] = ["all_reduce", t, t + coll_ns, coll_ns]
    a["layers"] = {k: list(v) for k, v in (layers or {}).items()}
    return a


def test_collective_skew_last_arriver_and_uncertainty():
    accs = {
        "a": _acc("a", 100, [1_000, 5_000], unc=10),
        "b": _acc("b", 100, [4_000, 5_100], unc=20),
        "c": _acc("c", 100, [1_500, 5_050], unc=5),
    }
    colls = analysis.collectives(accs)
    assert [(c["coll_seq"], c["skew_ns"], c["last_host"], c["uncertainty_ns"]) for c in colls] == [
        (0, 3_000, "b", 30),
        (1, 100, "b", 30),
    ]
    assert colls[0]["lead_ns"] == 2_500 and colls[0]["lead_uncertainty_ns"] == 25


def test_straggler_named_only_above_threshold():
    th = analysis.Thresholds()
    ms = 1_000_000
    late = {
        "a": _acc("a", 100 * ms, [10 * ms]),
        "b": _acc("b", 100 * ms, [10 * ms + 200_000]),
        "c": _acc("c", 100 * ms, [40 * ms]),
    }
    layers = analysis.layer_table(late)
    s = analysis.find_straggler(late, analysis.collectives(late), layers, th)
    assert s["host"] == "c" and s["excess_ns"] == 40 * ms - (10 * ms + 200_000)
    assert s["score"] == round(s["excess_ns"] / (100 * ms), 3)
    clean = {"a": _acc("a", 100 * ms, [10 * ms]), "b": _acc("b", 100 * ms, [11 * ms])}
    # 1 ms lead < max(2 ms, 5% of 100 ms): clean
    assert analysis.find_straggler(clean, analysis.collectives(clean), analysis.layer_table(clean), th) is None
    # lead inside the clock uncertainty never counts
    fuzzy = {"a": _acc("a", 100 * ms, [10 * ms], unc=30 * ms), "b": _acc("b", 100 * ms, [50 * ms], unc=30 * ms)}
    assert analysis.find_straggler(fuzzy, analysis.collectives(fuzzy), analysis.layer_table(fuzzy), th) is None


def test_blame_subtracts_lower_layers_from_compute_and_ranks_counts_after_time():
    th = analysis.Thresholds()
    ms = 1_000_000
    layers = {
        "s": {
            "pytorch": {"time_ns": 90 * ms, "count": 3, "max_ns": 0},
            "sched": {"time_ns": 31 * ms, "count": 5, "max_ns": 8 * ms},
            "network": {"time_ns": 0, "count": 9, "max_ns": 0},
        },
        "p1": {
            "pytorch": {"time_ns": 60 * ms, "count": 3, "max_ns": 0},
            "sched": {"time_ns": 1 * ms, "count": 1, "max_ns": 0},
            "network": {"time_ns": 0, "count": 1, "max_ns": 0},
        },
        "p2": {
            "pytorch": {"time_ns": 59 * ms, "count": 3, "max_ns": 0},
            "sched": {"time_ns": 1 * ms, "count": 1, "max_ns": 0},
        },
    }
    out = analysis.blame("s", layers, 30 * ms, th)
    assert [(b["layer"], b["excess_ns"]) for b in out] == [("sched", 30 * ms), ("network", 0)]
    assert out[0]["peer_median_ns"] == 1 * ms and out[0]["count"] == 5 and out[0]["max_ns"] == 8 * ms
    # the compute excess (90 - 59.5 = 30.5 ms) is explained by sched (30 ms): 0.5 ms residual, not blamed
    assert all(b["layer"] != "pytorch" for b in out)


def test_baseline_and_stall():
    th = analysis.Thresholds(baseline_min_n=3)
    hist = [[s, 100] for s in range(10)] + [[20, 999]]
    b = analysis.baseline(hist, 10, th)
    assert b == analysis.Baseline(median_ns=100, p99_ns=100, n=10, spread_ns=th.spread_min_ns)
    accs = {"a": _acc("a", 150, [])}
    s = analysis.summarize(
        "j", 10, accs, expected_hosts=["a", "b"], history=hist, quality={}, closed_by="window", closed_at_ns=1, th=th
    )
    assert s["stall"] is True and s["stall_ratio"] == 1.5 and s["missing_hosts"] == ["b"]
    assert set(s) == set(schema.STEP_SUMMARY_FIELDS) - schema.STEP_HELD_FIELDS  # the worker adds those when held


@pytest.mark.parametrize("layer", ["sched", "memory", "cuda", "nic", "pytorch"])
def test_offline_analysis_finds_synthetic_ground_truth(layer):
    scn = synthetic.Scenario(job="j", steps=30, guilty_steps=(4, 17), guilty_layer=layer, straggler=1, seed=3)
    batches = [b for _k, b in synthetic.generate(scn)]
    for b in batches:  # the generator's output is valid on the wire
        assert schema.decode_batch(schema.encode_batch(b)) == b
    res = offline.summarize_batches(batches)
    truth = synthetic.expected(scn)
    for (_job, step), s in res.items():
        if step in truth:
            assert s["straggler"]["host"] == truth[step][0]
            assert s["blame"][0]["layer"] == truth[step][1]
            assert s["blame"][0]["excess_ns"] > 30_000_000
        else:
            assert s["straggler"] is None and s["blame"] == [], step


def test_count_only_layer_is_blamed_by_count():
    scn = synthetic.Scenario(job="j", steps=5, guilty_steps=(2,), guilty_layer="network", straggler=0)
    res = offline.summarize_batches([b for _k, b in synthetic.generate(scn)])
    s = res[("j", 2)]
    assert s["straggler"]["host"] == "node0"
    net = [b for b in s["blame"] if b["layer"] == "network"]
    # its own 12 retransmits plus 3 on its link to each of the 3 other hosts (synthetic._link_events)
    assert net and net[0]["count"] == 12 + 3 * 3 and net[0]["excess_ns"] == 0


def _tcp(kind, ts, src, dst, step=-1, value=1):
    return Event(
        kind,
        ts,
        duration_ns=50_000 if kind == Kind.TCP_RTT else 0,
        step=step,
        value=value,
        payload={"saddr": src, "daddr": dst, "sport": 1, "dport": 2},
    )


def test_stepless_tcp_events_are_charged_to_the_step_the_host_was_in():
    """Retransmits fire in softirq/timer context without a TraceKey (step -1): they go to the step of the
    latest stepped event before them; connections are keyed by the sorted IPv4 pair (mapped IPv6
    unwrapped), and the host's own addresses are the source addresses."""
    evs = [
        _tcp(Kind.TCP_RETRANSMIT, 50, "10.0.0.1", "10.0.0.2"),  # before any step: first step
        Event(Kind.STEP_BEGIN, 100, step=1),
        _tcp(Kind.TCP_RTT, 150, "::ffff:a00:1", "::ffff:a00:2"),
        _tcp(Kind.TCP_RETRANSMIT, 160, "10.0.0.1", "10.0.0.3", value=2),
        Event(Kind.STEP_BEGIN, 200, step=2),
        _tcp(Kind.TCP_RETRANSMIT, 250, "10.0.0.1", "10.0.0.2"),
        _tcp(Kind.TCP_RTT, 260, "127.0.0.1", "127.0.0.1"),  # loopback: ignored
    ]
    parts = accumulate.reduce_batch(_batch(evs))
    assert accumulate.to_dict(parts[1]["net"]) == {  # [rtt samples, retransmits, rtt sum, retransmits a->b, b->a]
        "addrs": {"10.0.0.1": 1},
        "pairs": {"10.0.0.1|10.0.0.2": [1, 1, 50_000, 1, 0], "10.0.0.1|10.0.0.3": [0, 2, 0, 2, 0]},
    }
    assert parts[2]["net"]["pairs"] == {"10.0.0.1|10.0.0.2": [0, 1, 0, 1, 0]}
    merged = accumulate.merge(parts[1], parts[2])
    assert merged["net"]["pairs"]["10.0.0.1|10.0.0.2"] == [1, 2, 50_000, 2, 0]
    old = {k: v for k, v in accumulate.new_acc("h0", 0).items() if k != "net"}  # an older worker's value
    assert accumulate.merge(old, parts[2])["net"]["pairs"] == {"10.0.0.1|10.0.0.2": [0, 1, 0, 1, 0]}
    # a pair of three values (an older worker's changelog) merges into the first three
    older = {**accumulate.new_acc("h0", 0), "net": {"addrs": {}, "pairs": {"10.0.0.1|10.0.0.2": [2, 5, 10]}}}
    assert accumulate.merge(older, parts[2])["net"]["pairs"]["10.0.0.1|10.0.0.2"] == [2, 6, 10, 1, 0]
    # the peer's report of the same connection counts in the other direction
    peer = accumulate.reduce_batch(
        _batch([Event(Kind.STEP_BEGIN, 100, step=2), _tcp(Kind.TCP_RETRANSMIT, 150, "10.0.0.2", "10.0.0.1", value=3)])
    )
    assert accumulate.merge(parts[2], peer[2])["net"]["pairs"]["10.0.0.1|10.0.0.2"] == [0, 4, 0, 1, 3]


def test_a_hosts_own_drops_outside_its_process_count_in_the_step_it_was_in():
    """A blacked-out host's own segments dropped by netfilter in softirq or timer context (the agent's
    SKB_DROP of a watched socket, no TraceKey: step -1, tid 0) count in the network layer of the step the
    host was in, like its retransmits; a drop in the process's context keeps its step."""
    drop = {"reason": "NETFILTER_DROP"}
    evs = [
        Event(Kind.REGISTER, 5, pid=7, value=0, payload={"world_size": 2, "job": "job", "host_id": 0, "local_rank": 0}),
        Event(Kind.STEP_BEGIN, 100, step=1, pid=7),
        Event(Kind.SKB_DROP, 110, step=1, pid=7, tid=7, value=12, payload=drop),  # in the process's context
        Event(Kind.SKB_DROP, 150, pid=7, value=12, payload=drop),  # retransmit timer, softirq: step -1
        Event(Kind.SKB_DROP, 160, pid=7, value=12, payload=drop),
        Event(Kind.STEP_END, 300, duration_ns=200, step=1, pid=7),
        Event(Kind.STEP_BEGIN, 400, step=2, pid=7),
        Event(Kind.SKB_DROP, 450, pid=7, value=12, payload=drop),
    ]
    parts = accumulate.reduce_batch(_batch(evs))
    assert parts[1]["layers"]["network"] == [0, 3, 0]
    assert parts[2]["layers"]["network"] == [0, 1, 0]
    # and in the host's own drops (the drops view); a receiving socket's discard (a duplicate of a peer's
    # spurious retransmit) counts in the layer only
    assert (parts[1].net.drops, parts[2].net.drops) == (3, 1)
    old_data = Event(Kind.SKB_DROP, 460, pid=7, value=5, payload={"reason": "TCP_OLD_DATA"})
    more = accumulate.reduce_batch(_batch([*evs, old_data]))[2]
    assert more["layers"]["network"] == [0, 2, 0] and more.net.drops == 1
    # parts merge by sum, and the field survives the dict form (absent where none: an older worker's)
    assert accumulate.merge(copy.deepcopy(parts[1]), parts[2]).net.drops == 4
    assert accumulate.as_acc(accumulate.to_dict(parts[1])).net.drops == 3
    assert "drops" not in accumulate.to_dict(accumulate.reduce_batch(_batch([old_data, *evs[:2]]))[1]).get("net", {})


def _net_acc(host, addr, pairs):
    a = accumulate.new_acc(host, 0)
    a["net"] = {"addrs": {addr: 1}, "pairs": {k: list(v) for k, v in pairs.items()}}
    return a


def test_network_blame_names_the_host_whose_every_connection_retransmits():
    """A 4-host ring 1-2-3-4-1 with loss on host 2's link: its two connections retransmit, and so does
    one connection of each neighbour (1 and 3). Summed per host, the neighbour that sends into the drops
    looks as bad; the fewest retransmits over a host's busy connections names host 2 alone."""
    ip = {f"n{i}": f"10.0.0.{i}" for i in range(1, 5)}
    p12, p23, p34, p14 = "10.0.0.1|10.0.0.2", "10.0.0.2|10.0.0.3", "10.0.0.3|10.0.0.4", "10.0.0.1|10.0.0.4"
    accs = {  # each side reports what it sent: host 3 retransmits a lot towards host 2
        "n1": _net_acc("n1", ip["n1"], {p12: (10, 4), p14: (10, 1)}),
        "n2": _net_acc("n2", ip["n2"], {p12: (10, 2), p23: (10, 2)}),
        "n3": _net_acc("n3", ip["n3"], {p23: (10, 30), p34: (10, 0)}),
        "n4": _net_acc("n4", ip["n4"], {p34: (10, 1), p14: (10, 0)}),
    }
    th = analysis.Thresholds()
    got = analysis.net_blame(accs, th)
    assert [(e.host, e.layer, e.count, e.excess_ns) for e in got] == [("n2", "network", 6, 0)]
    # loss spread over the ring (every connection alike): nobody stands out
    even = {h: _net_acc(h, ip[h], {k: (10, 5) for k in a["net"]["pairs"]}) for h, a in accs.items()}
    assert analysis.net_blame(even, th) == []
    # 2 hosts: both ends share the one link, no blame
    assert analysis.net_blame({"n1": accs["n1"], "n2": accs["n2"]}, th) == []


def _dir_acc(host, addr, sent):
    """A host accumulator whose agent reported ``sent``: ``{peer address: (rtt samples, retransmits it
    sent there)}``, counted in the direction of the pair as ``accumulate`` does."""
    a = accumulate.new_acc(host, 0)
    pairs = {}
    for peer, (n, rx) in sent.items():
        lo, hi = sorted((addr, peer))
        pairs[f"{lo}|{hi}"] = [n, rx, n * 1_000_000, rx if addr == lo else 0, 0 if addr == lo else rx]
    a["net"] = {"addrs": {addr: 1}, "pairs": pairs}
    return a


def _loss8_step():
    """The recorded demo step with 8 % loss on node-02's link (ring 0-1-2-3-0): node-01 and node-03 sent
    2 and 12 retransmits toward node-02, node-00 6 toward node-03. Returns ``(addresses, accumulators)``."""
    ip = {f"node-0{i}": f"10.77.0.{11 + i}" for i in range(4)}
    accs = {
        "node-00": _dir_acc("node-00", ip["node-00"], {ip["node-01"]: (2, 0), ip["node-03"]: (2, 6)}),
        "node-01": _dir_acc("node-01", ip["node-01"], {ip["node-00"]: (2, 0), ip["node-02"]: (2, 2)}),
        "node-02": _dir_acc("node-02", ip["node-02"], {ip["node-01"]: (2, 0), ip["node-03"]: (2, 0)}),
        "node-03": _dir_acc("node-03", ip["node-03"], {ip["node-00"]: (2, 0), ip["node-02"]: (2, 12)}),
    }
    return ip, accs


def test_network_evidence_in_the_directed_view_spares_the_neighbour_of_a_lossy_host():
    """A recorded demo step with 8 % loss on node-02's link (ring 0-1-2-3-0, each host reporting the
    retransmits it sent): node-01 and node-03 retransmit towards node-02 (2 and 12), and node-00 sent 6
    towards node-03. Both directions together, node-03's fewest over its connections (6) beat node-02's
    (2), so it was blamed; in the directed view node-02 is the only host whose every connection lost
    segments in one direction (towards it), and node-03 (one lossy connection each way) has none."""
    ip, accs = _loss8_step()
    th = analysis.Thresholds()
    rx = analysis.net_stats(accs, th).rx
    assert rx == {"node-00": 0, "node-01": 0, "node-02": 2, "node-03": 0}
    assert {h: e.z for h, e in analysis.net_evidence(accs, th).items()} == {"node-02": 2.0}
    # without the direction (pairs of an older worker) both directions count together, as before
    undirected = {h: _net_acc(h, ip[h], {k: v[:3] for k, v in a["net"]["pairs"].items()}) for h, a in accs.items()}
    rx = analysis.net_stats(undirected, th).rx
    assert rx == {"node-00": 0, "node-01": 0, "node-02": 2, "node-03": 6}
    # a one-way ring (each host sends to the next only): no host loses in one direction on every
    # connection, so both directions count together and the lossy host is still found
    one_way = {
        "node-00": _dir_acc("node-00", ip["node-00"], {ip["node-01"]: (2, 0), ip["node-03"]: (2, 0)}),
        "node-01": _dir_acc("node-01", ip["node-01"], {ip["node-00"]: (2, 0), ip["node-02"]: (2, 5)}),
        "node-02": _dir_acc("node-02", ip["node-02"], {ip["node-01"]: (2, 0), ip["node-03"]: (2, 4)}),
        "node-03": _dir_acc("node-03", ip["node-03"], {ip["node-00"]: (2, 0), ip["node-02"]: (2, 0)}),
    }
    rx = analysis.net_stats(one_way, th).rx
    assert rx == {"node-00": 0, "node-01": 0, "node-02": 4, "node-03": 0}


def _queued(acc, host, wait_ns, step=20):
    """``acc`` merged with the part of one batch of ``host`` holding a TCP_QUEUE of ``wait_ns`` (no TraceKey:
    charged to the step the host was in, as the agent's record from qdisc:qdisc_dequeue is)."""
    evs = [Event(Kind.STEP_BEGIN, 100, step=step), Event(Kind.TCP_QUEUE, 150, duration_ns=wait_ns, value=2)]
    return accumulate.merge(copy.deepcopy(acc), accumulate.reduce_batch(_batch(evs, host=host))[step])


def _slowed_toward(accs, th):
    """The network evidence of a slowed step (``window_stats`` given: the toward view is read)."""
    return analysis.net_evidence(accs, th, window_stats=analysis.net_stats(accs, th, window={}))


def _tbf_step():
    """The wrong step of the tbf rate spike (below): node-02 sent 38 retransmits toward node-01, node-03 2
    toward node-02, 4 RTT samples per connection of the ring. Returns ``(addresses, accumulators)``."""
    ip = {f"node-0{i}": f"10.77.0.{11 + i}" for i in range(4)}
    accs = {
        "node-00": _dir_acc("node-00", ip["node-00"], {ip["node-01"]: (4, 0), ip["node-03"]: (4, 0)}),
        "node-01": _dir_acc("node-01", ip["node-01"], {ip["node-00"]: (4, 0), ip["node-02"]: (4, 0)}),
        "node-02": _dir_acc("node-02", ip["node-02"], {ip["node-01"]: (4, 38), ip["node-03"]: (4, 0)}),
        "node-03": _dir_acc("node-03", ip["node-03"], {ip["node-00"]: (4, 0), ip["node-02"]: (4, 2)}),
    }
    return ip, accs


def _slowed_summary(accs):
    """The summary of step 20 of ``accs`` after 20 steps of 100 ms, every host's step 2.7 s (a slowed step:
    the window and the toward view are read)."""
    hist = [[s, 100 * MS, 10 * MS] for s in range(20)]
    for a in accs.values():
        a["step_ns"] = 2_700 * MS
    kw = dict(expected_hosts=sorted(accs), history=hist, quality={}, closed_by="complete", closed_at_ns=1)
    return analysis.summarize("j", 20, accs, window={}, **kw)


def test_the_toward_view_names_the_sender_whose_own_egress_queue_held_its_segments():
    """A wrong step of the tbf rate spike (stall13 shape, tbfq12's traces, 2026-12-06): node-02's link is
    shaped (20 Mbit for 300 ms, both directions) and node-02 itself sent 38 retransmits toward its
    healthy neighbour node-01 (node-03 2 toward node-02). By counts node-01 is the receiver (3.0). Its
    sender's own egress queue held a watched socket's segment 284 ms (TCP_QUEUE): the evidence goes to
    node-02; without that record (an agent without the probe, or a queue under 100 ms) to node-01."""
    ip, accs = _tbf_step()
    th = analysis.Thresholds()
    assert analysis.net_toward_evidence(accs, th) == {"node-01": analysis.NetEvidence(3.0, 38, 2, 0, 0, "toward")}
    queued = {**accs, "node-02": _queued(accs["node-02"], "node-02", 284 * MS)}
    assert queued["node-02"].net.queue_max_ns == 284 * MS
    assert analysis.net_toward_evidence(queued, th) == {
        "node-02": analysis.NetEvidence(3.0, 38, 2, 0, 0, "sender_queue")
    }
    assert {h: e.z for h, e in _slowed_toward(queued, th).items()} == {"node-02": 3.0}
    # parts merge by max (a later batch's shorter wait keeps the longest); under net_queue_min_ns: the receiver
    twice = _queued(queued["node-02"], "node-02", 12 * MS)
    assert twice.net.queue_max_ns == 284 * MS
    short = {**accs, "node-02": _queued(accs["node-02"], "node-02", 99 * MS)}
    assert analysis.net_toward_evidence(short, th) == {"node-01": analysis.NetEvidence(3.0, 38, 2, 0, 0, "toward")}
    # the receiver's own queue says nothing about the sender's
    rx_queued = {**accs, "node-01": _queued(accs["node-01"], "node-01", 284 * MS)}
    assert analysis.net_toward_evidence(rx_queued, th) == {"node-01": analysis.NetEvidence(3.0, 38, 2, 0, 0, "toward")}
    # a summary of the slowed step names node-02 (the field survives the dict form and the changelog's arrays)
    got = _slowed_summary(queued)
    assert {h: e["network"] for h, e in got["evidence"]["hosts"].items() if e.get("network")} == {"node-02": 3.0}
    assert accumulate.to_dict(queued["node-02"])["net"]["queue_max_ns"] == 284 * MS
    assert accumulate.as_acc(accumulate.to_dict(queued["node-02"])).net.queue_max_ns == 284 * MS


def test_a_network_culprit_says_which_view_of_the_connections_gave_its_evidence():
    """The tbf step above (node-02 sent 38 retransmits toward node-01, node-03 2 toward node-02), summarised
    as a slowed step: with node-02's egress queue at 284 ms the culprit is node-02 by the toward view moved to
    the sender (``net_view`` "sender_queue"), without it node-01 by the toward view ("toward"); the recorded
    8 % loss step names node-02 by its own connections' retransmits ("rx"). A summary of an older worker
    (no ``evidence.net_view``) gives a culprit without it, and the rules read it as before."""
    ip, accs = _tbf_step()
    queued = _slowed_summary({**accs, "node-02": _queued(accs["node-02"], "node-02", 284 * MS)})
    assert queued["evidence"]["net_view"] == {"node-02": "sender_queue"}
    c = queued["culprit"]
    assert (c["host"], c["layer"], c["source"], c["net_view"]) == ("node-02", "network", "evidence", "sender_queue")
    plain = _slowed_summary(copy.deepcopy(accs))
    assert plain["evidence"]["net_view"] == {"node-01": "toward", "node-02": "rx"}
    assert (plain["culprit"]["host"], plain["culprit"]["net_view"]) == ("node-01", "toward")
    _ip, loss = _loss8_step()
    assert {h: e.view for h, e in analysis.net_evidence(loss, analysis.Thresholds()).items()} == {"node-02": "rx"}
    # an older worker's summary: no net_view anywhere, the culprit the same otherwise, loadable by the rules
    old = copy.deepcopy(queued)
    del old["evidence"]["net_view"]
    got = analysis.culprit(old)
    assert got is not None and "net_view" not in got and (got["host"], got["layer"]) == ("node-02", "network")
    rec = fields.step_record(dict(old, culprit=got))
    assert "net_view" not in rec["culprit"] and "net_view" not in rec["evidence"]
    # a step without network evidence carries no net_view (its summary as before)
    calm = {h: _dir_acc(h, ip[h], {p: (4, 0) for p in ip.values() if p != ip[h]}) for h in accs}
    quiet = _slowed_summary(calm)
    assert quiet["evidence"]["hosts"] == {} and "net_view" not in quiet["evidence"]


def test_the_recorded_8_percent_loss_step_keeps_its_receiver_when_the_sender_queued_nothing():
    """The recorded demo step with 8 % loss on node-02's link (node-03 sent 12 toward node-02, node-01 2,
    node-00 6 toward node-03): a chain node-00 -> node-03 -> node-02 by counts, like the tbf's wrong step.
    A loss fault queues nothing at the sender (no TCP_QUEUE, or one below ``net_queue_min_ns``): the toward
    view keeps the receiver node-02."""
    ip, accs = _loss8_step()
    th = analysis.Thresholds()
    want = {"node-02": analysis.NetEvidence(3.0, 14, 6, 0, 0, "toward")}
    assert analysis.net_toward_evidence(accs, th) == want
    # node-03's sockets waited 99 ms in its egress queue (a loaded machine's worst), under the 100 ms
    near = {**accs, "node-03": _queued(accs["node-03"], "node-03", 99 * MS)}
    assert analysis.net_toward_evidence(near, th) == want
    assert {h: e.z for h, e in _slowed_toward(near, th).items()}["node-02"] == 3.0
    # at net_queue_min_ns it is the sender's own queue that held the exchange
    at = {**accs, "node-03": _queued(accs["node-03"], "node-03", 100 * MS)}
    assert analysis.net_toward_evidence(at, th) == {"node-03": analysis.NetEvidence(3.0, 14, 6, 0, 0, "sender_queue")}


def _dropped(acc, host, n, step=20, reason="NETFILTER_DROP"):
    """``acc`` merged with one batch of ``host`` holding ``n`` SKB_DROPs of its watched sockets outside its
    process (no TraceKey: charged to the step the host was in, as the agent's records of a blackout)."""
    evs = [Event(Kind.STEP_BEGIN, 100, step=step)]
    evs += [Event(Kind.SKB_DROP, 150 + i, pid=7, value=12, payload={"reason": reason}) for i in range(n)]
    return accumulate.merge(copy.deepcopy(acc), accumulate.reduce_batch(_batch(evs, host=host))[step])


def _blackout_404():
    """The missed stall of netdrop16 (a 200 ms blackout of node-01, step 404, x3.06): ring 0-1-2-3-0,
    node-00 and node-02 each sent one retransmit toward node-01 (node-01's network count 3, theirs 2), 4 RTT
    samples per connection. Returns ``(addresses, accumulators)`` without any drop."""
    hosts = [f"node-0{i}" for i in range(4)]
    ip = {h: f"10.77.0.{10 + i}" for i, h in enumerate(hosts)}
    sent = {("node-00", "node-01"): 1, ("node-02", "node-01"): 1}  # (sender, receiver): retransmits
    ring = {h: (hosts[i - 1], hosts[(i + 1) % 4]) for i, h in enumerate(hosts)}
    accs = {h: _dir_acc(h, ip[h], {ip[p]: (4, sent.get((h, p), 0)) for p in ring[h]}) for h in hosts}
    return ip, accs


def test_a_blacked_out_hosts_own_drops_name_it_when_its_peers_barely_retransmitted():
    """netdrop16's missed stall: its peers sent node-01 one retransmit per connection (no back-off: the
    toward view names nobody, nor do its connections), but node-01's agent saw its own segments dropped by
    the blackout's netfilter. A slowed step names node-01 / network by the drops view (3.0, the toward
    view's clip); the same step without the drops, or a step of usual length, names nobody."""
    _ip, accs = _blackout_404()
    th = analysis.Thresholds()
    assert _slowed_toward(accs, th) == {}
    assert _slowed_summary(copy.deepcopy(accs))["culprit"] is None
    dark = {**accs, "node-01": _dropped(accs["node-01"], "node-01", 3)}
    assert analysis.net_drops_evidence(dark, th, {}) == {"node-01": analysis.NetEvidence(3.0, 3, 0, 0, 0, "drops")}
    got = _slowed_summary(dark)
    assert got["evidence"]["net_view"] == {"node-01": "drops"}
    c = got["culprit"]
    assert (c["host"], c["layer"], c["evidence"], c["net_view"]) == ("node-01", "network", 3.0, "drops")
    assert c["runq_veto"] is False
    # a step of usual length reads no drops view (nor the window's, nor the toward view)
    assert analysis.net_evidence(dark, th) == {}
    # the stalled steps of the same run: 12-20 drops against none elsewhere, still the clip
    many = {**accs, "node-01": _dropped(accs["node-01"], "node-01", 15)}
    assert analysis.net_drops_evidence(many, th, {})["node-01"].z == 3.0


@pytest.mark.parametrize(
    "drops,window,reason,want",
    [
        ({"node-01": 3}, {}, "NETFILTER_DROP", {"node-01": 3.0}),
        ({"node-01": 2}, {}, "NETFILTER_DROP", {}),  # under net_drops_min: a loaded machine's chance
        ({"node-02": 2, "node-01": 1}, {}, "NETFILTER_DROP", {}),  # a peer at noise level
        ({"node-01": 6, "node-02": 4}, {}, "NETFILTER_DROP", {}),  # two hosts alike: no single host's link
        ({"node-01": 8, "node-02": 2}, {}, "NETFILTER_DROP", {"node-01": 3.0}),  # (8 - 2) / sqrt(3)
        ({"node-01": 5}, {"node-01": 3}, "NETFILTER_DROP", {}),  # its usual drops over the recent steps
        ({"node-01": 5}, {"node-02": 9}, "NETFILTER_DROP", {"node-01": 3.0}),  # another host's usual drops
        ({"node-01": 9}, {}, "TCP_OLD_DATA", {}),  # a receiver's discards of a sender's excess
        ({"node-01": 9}, {}, "SOCKET_RCVBUFF", {}),
        ({"node-01": 9}, {}, "NOT_SPECIFIED", {"node-01": 3.0}),  # a qdisc reset dropping its own segments
    ],
)
def test_drops_name_a_host_only_when_they_stand_out_from_the_others_and_its_own_recent_steps(
    drops, window, reason, want
):
    """The drops view counts a host's own dropped segments (not a receiving socket's discards) when they are
    at least ``net_drops_min`` and ``count_factor`` times both the most any other host dropped and the
    host's own drops over the job's recent steps (the window)."""
    _ip, accs = _blackout_404()
    th = analysis.Thresholds()
    for h, n in drops.items():
        accs[h] = _dropped(accs[h], h, n, reason=reason)
    got = analysis.net_drops_evidence(accs, th, window)
    assert {h: e.z for h, e in got.items()} == want
    # the worker's window carries each host's drops beside the connections' retransmits
    part = analysis.net_window_part(accs)
    counted = {h: n for h, n in drops.items() if reason == "NETFILTER_DROP" or reason == "NOT_SPECIFIED"}
    assert {k[1:]: v for k, v in part.items() if k.startswith("@")} == {h: [n, 0, 0] for h, n in counted.items()}
    win = {f"@{h}": [n, 0, 0] for h, n in window.items()}
    st = analysis.net_stats(accs, th, window=win)
    assert st.drops == window
    assert {h: e.z for h, e in analysis.net_evidence(accs, th, window_stats=st).items() if e.view == "drops"} == want


def _drops_over_every_host(accs, th, window_drops):
    """``net_drops_evidence`` as drops17 wrote it: a count for every host (0 without TCP data), all sorted."""
    drops = {h: (a.net.drops if a.net else 0) or 0 for h, a in accs.items()}
    if len(drops) < 3 or not any(drops.values()):
        return {}
    ranked = sorted(drops, key=lambda h: (-drops[h], h))
    best, n = ranked[0], drops[ranked[0]]
    ref = max(drops[ranked[1]], int(window_drops.get(best, 0)))
    if n < th.net_drops_min or n < th.count_factor * max(ref, 1):
        return {}
    z = round(min(th.evidence_clip, th.net_toward_clip, (n - ref) / math.sqrt(ref + 1)), 3)
    return {best: analysis.NetEvidence(z, n, ref, 0, 0, "drops")} if z > 0 else {}


def test_drops_of_a_wide_step_read_only_the_hosts_with_tcp_data_and_give_the_same_evidence():
    """A wide step's drops view reads the few hosts with TCP data (the others dropped nothing): the same
    evidence as counting every host, with ties (the smaller name), a second host's drops, the host's own
    window and hosts with a TCP view but no drop."""
    th = analysis.Thresholds()
    rnd = random.Random(17)
    named = 0
    for _case in range(300):
        hosts = [f"node-{i:03d}" for i in range(rnd.choice((3, 4, 40)))]
        accs = {}
        for h in hosts:
            r = rnd.random()
            net = accumulate.HostNet(drops=rnd.choice((1, 2, 3, 5, 9, 9, 20))) if r < 0.15 else None
            if 0.15 <= r < 0.3:
                net = accumulate.HostNet()  # TCP data, no drop
            accs[h] = accumulate.HostAcc(step_ns=10**9, net=net)
        window = {h: rnd.choice((0, 1, 4)) for h in rnd.sample(hosts, 2)}
        got = analysis.net_drops_evidence(accs, th, window)
        assert got == _drops_over_every_host(accs, th, window), (_case, accs, window)
        named += bool(got)
    assert named >= 20


def test_drops_of_a_neighbour_do_not_move_a_loss_bursts_culprit():
    """The recorded 8 % loss step of node-02 (its own connections' retransmits name it, 2.0 by ``rx``; the
    toward view 3.0): a loss burst inside node-02's namespace drops its own segments (the drops view agrees),
    and a neighbour with a few drops of its own at noise level takes nothing from it."""
    _ip, accs = _loss8_step()
    accs["node-02"] = _dropped(accs["node-02"], "node-02", 7)
    accs["node-03"] = _dropped(accs["node-03"], "node-03", 2)
    got = _slowed_summary(accs)
    assert {h: e["network"] for h, e in got["evidence"]["hosts"].items() if e.get("network")} == {"node-02": 3.0}
    assert (got["culprit"]["host"], got["culprit"]["layer"]) == ("node-02", "network")
    # a neighbour dropping as much as the lossy host gets no drops view; the toward view keeps node-02
    accs["node-03"] = _dropped(accs["node-03"], "node-03", 5)
    got = _slowed_summary(accs)
    assert got["evidence"]["net_view"] == {"node-02": "toward"} and got["culprit"]["host"] == "node-02"
    # a sender whose segments were dropped in its own context on their way into the receiver (one machine's
    # namespaces: a veth hands them over inline), the receiver dropping none of its own: the peers' back-off
    # toward node-02 names it, and the sender's drops take nothing from it
    _ip, accs = _loss8_step()
    accs["node-03"] = _dropped(accs["node-03"], "node-03", 9)
    assert set(analysis.net_drops_evidence(accs, analysis.Thresholds(), {})) == {"node-03"}
    got = _slowed_summary(accs)
    assert got["evidence"]["net_view"] == {"node-02": "toward"} and got["culprit"]["host"] == "node-02"


def test_a_step_that_misses_the_directed_condition_reads_it_from_the_jobs_recent_steps():
    """A recorded demo step with 8 % loss on node-02's link: node-03 sent 19 retransmits towards node-02,
    node-01 none this time, and node-00 sent 3 towards node-03. No host has retransmits on every busy
    connection in one direction, so on its own the step reads both directions together and node-03's
    fewest (3) blame it, a neighbour of the lossy host (a wrong alert on the demo). The job's earlier
    steps met the directed condition: with ``recent_directed`` nobody is blamed in this step."""
    ip = {f"node-0{i}": f"10.77.0.{11 + i}" for i in range(4)}
    accs = {
        "node-00": _dir_acc("node-00", ip["node-00"], {ip["node-01"]: (4, 0), ip["node-03"]: (4, 3)}),
        "node-01": _dir_acc("node-01", ip["node-01"], {ip["node-00"]: (4, 0), ip["node-02"]: (4, 0)}),
        "node-02": _dir_acc("node-02", ip["node-02"], {ip["node-01"]: (4, 0), ip["node-03"]: (4, 0)}),
        "node-03": _dir_acc("node-03", ip["node-03"], {ip["node-00"]: (4, 0), ip["node-02"]: (4, 19)}),
    }
    th = analysis.Thresholds()
    st = analysis.net_stats(accs, th)
    assert not st.directed and st.rx["node-03"] == 3
    assert {h: e.z for h, e in analysis.net_evidence(accs, th).items()} == {"node-03": 3.0}
    st = analysis.net_stats(accs, th, recent_directed=True)
    assert not st.directed and set(st.rx.values()) == {0}
    assert analysis.net_evidence(accs, th, recent_directed=True) == {}
    assert analysis.net_blame(accs, th, recent_directed=True) == []
    # the summary says whether the step met the condition; the evidence follows recent_directed
    hist = [[s, 100 * MS, 10 * MS] for s in range(20)]
    kw = dict(expected_hosts=sorted(accs), history=hist, quality={}, closed_by="complete", closed_at_ns=1)
    alone = analysis.summarize("j", 20, accs, **kw)
    assert alone["net_directed"] is False and alone["evidence"]["hosts"]["node-03"]["network"] == 3.0
    recent = analysis.summarize("j", 20, accs, recent_directed=True, **kw)
    assert recent["evidence"]["hosts"] == {} and recent["blame"] == []


def test_network_blame_by_rtt_names_the_host_behind_a_slow_link():
    """A rate-limited link (net-slow: delay, few drops): both connections of host 2 have a mean RTT of
    30 ms, every other connection 2 ms; no retransmits. Blamed by RTT, with the RTT as evidence."""
    ms = 1_000_000
    p12, p23, p34, p14 = "10.0.0.1|10.0.0.2", "10.0.0.2|10.0.0.3", "10.0.0.3|10.0.0.4", "10.0.0.1|10.0.0.4"
    slow, fast = (10, 0, 10 * 30 * ms), (10, 0, 10 * 2 * ms)
    accs = {
        "n1": _net_acc("n1", "10.0.0.1", {p12: slow, p14: fast}),
        "n2": _net_acc("n2", "10.0.0.2", {p12: slow, p23: slow}),
        "n3": _net_acc("n3", "10.0.0.3", {p23: slow, p34: fast}),
        "n4": _net_acc("n4", "10.0.0.4", {p34: fast, p14: fast}),
    }
    got = analysis.net_blame(accs, analysis.Thresholds())
    assert [(e.host, e.layer, e.straggler_ns, e.peer_median_ns) for e in got] == [
        ("n2", "network", 30 * ms, 2 * ms)
    ]  # mean RTT per sample over both ends


def _coll_acc(host, step_ns, colls, unc=0, layers=None, seen_phase=None):
    """A host accumulator with collectives ``{seq: (arrive, duration_ns | None)}`` on process group 0."""
    a = accumulate.new_acc(host, 0)
    a["step_ns"], a["unc_ns"] = step_ns, unc
    for seq, (t, dur) in colls.items():
        a["colls"][f"0#{seq}"] = ["all_reduce", t, None if dur is None else t + dur, dur]
    a["layers"] = {k: list(v) for k, v in (layers or {}).items()}
    if seen_phase:
        a["last_phase"] = list(seen_phase)
    return a


MS = 1_000_000


def test_pairing_check_reports_impossible_pairs_and_never_blames_them():
    """A rank cannot wait longer than its collective lasted, and paired intervals must overlap: such a
    collective is listed in ``inconsistent`` and does not name a straggler."""
    # a waits 30 ms for b, but a's all-reduce lasted 1 ms: not the same collective
    accs = {
        "a": _coll_acc("a", 100 * MS, {0: (10 * MS, 1 * MS)}),
        "b": _coll_acc("b", 100 * MS, {0: (40 * MS, 1 * MS)}),
    }
    s = analysis.summarize(
        "j", 1, accs, expected_hosts=["a", "b"], history=[], quality={}, closed_by="complete", closed_at_ns=0
    )
    assert s["straggler"] is None and s["collectives"] == []
    assert s["inconsistent"] == [
        {"pg": "0", "coll_seq": 0, "op": "all_reduce", "why": "a's collective ended 29.000 ms before b's began"}
    ]
    # only a duration known (no end time): the same check on the duration
    accs["a"]["colls"]["0#0"][2] = None
    s = analysis.summarize(
        "j", 1, accs, expected_hosts=["a", "b"], history=[], quality={}, closed_by="complete", closed_at_ns=0
    )
    assert s["inconsistent"][0]["why"] == "a waited 30.000 ms for b but its collective lasted 1.000 ms"
    # the same arrivals with a's collective lasting until b came: consistent, b is the straggler
    ok = {"a": _coll_acc("a", 100 * MS, {0: (10 * MS, 31 * MS)}), "b": _coll_acc("b", 100 * MS, {0: (40 * MS, 1 * MS)})}
    s = analysis.summarize(
        "j", 1, ok, expected_hosts=["a", "b"], history=[], quality={}, closed_by="complete", closed_at_ns=0
    )
    assert s["inconsistent"] == [] and s["straggler"]["host"] == "b"
    assert s["world_size"] == 2


def test_late_group_names_the_last_arriver_with_each_late_rank():
    """Three of eight ranks arrive 7 ms late within 0.5 ms of each other (no single leader): the last is
    the step's straggler, without a baseline, and the group lists each one's lateness."""
    arrive = {
        f"r{i}": t for i, t in enumerate([0, 100_000, 200_000, 300_000, 400_000, 7_000_000, 7_200_000, 7_500_000])
    }
    end = 7_600_000
    accs = {h: _coll_acc(h, 20 * MS, {0: (t, end - t)}) for h, t in arrive.items()}
    s = analysis.summarize(
        "j",
        3,
        accs,
        expected_hosts=sorted(accs),
        history=[],
        quality={},
        closed_by="complete",
        closed_at_ns=0,
        world_size=128,
    )
    st = s["straggler"]
    assert st["host"] == "r7" and st["excess_ns"] == 7_500_000 - 350_000
    assert [(g["host"], g["late_ns"]) for g in st["group"]] == [("r7", 7_150_000), ("r6", 6_850_000), ("r5", 6_650_000)]
    assert "late group of 3" in st["reason"]
    assert s["world_size"] == 128 and s["baseline"]["n"] == 0


def test_dlrm_trace_names_its_straggler_with_the_late_group():
    """The real 8-rank DLRM step: rank7 reaches the first all_to_all 7.6 ms after rank1 in a ~16 ms step,
    with ranks 2 and 6 within 0.5 ms of it. The summary names rank7 and the late group."""
    from tests.apps.test_replay_common import dlrm_batches

    s = offline.summarize_batches(dlrm_batches("dlrm-u"))[("dlrm-u", 10)]
    assert s["straggler"]["host"] == "rank7"
    assert [g["host"] for g in s["straggler"]["group"]] == ["rank7", "rank6", "rank2"]
    assert s["inconsistent"] == [] and s["world_size"] == 8


def test_evidence_counts_a_lower_layer_only_as_far_as_it_made_the_host_late():
    th = analysis.Thresholds()
    hist = [[s, 100 * MS, 4 * MS] for s in range(20)]
    sched = {"sched": [60 * MS, 10, 5 * MS]}
    quiet = {"sched": [1 * MS, 10, 1 * MS]}
    # c is 40 ms late and has 59 ms of extra run-queue time: sched evidence = min(40, 59) / 4 ms, clipped to 7
    accs = {
        "a": _coll_acc("a", 100 * MS, {0: (10 * MS, 41 * MS)}, layers=quiet),
        "b": _coll_acc("b", 100 * MS, {0: (10 * MS, 41 * MS)}, layers=quiet),
        "c": _coll_acc("c", 100 * MS, {0: (50 * MS, 1 * MS)}, layers=sched),
    }
    s = analysis.summarize(
        "j",
        20,
        accs,
        expected_hosts=sorted(accs),
        history=hist,
        quality={},
        closed_by="complete",
        closed_at_ns=0,
        th=th,
    )
    assert s["baseline"]["spread_ns"] == 4 * MS and s["late_max_ns"] == 40 * MS
    assert s["evidence"]["hosts"] == {
        "c": {"sched": 7.0, "memory": 0.0, "cuda": 0.0, "nic": 0.0, "network": 0.0, "pytorch": 0.0}
    }
    # a victim with the same run-queue excess that arrived on time: no evidence against it
    victim = dict(accs, a=_coll_acc("a", 100 * MS, {0: (10 * MS, 41 * MS)}, layers=sched))
    s = analysis.summarize(
        "j",
        20,
        victim,
        expected_hosts=sorted(accs),
        history=hist,
        quality={},
        closed_by="complete",
        closed_at_ns=0,
        th=th,
    )
    assert "a" not in s["evidence"]["hosts"] and s["evidence"]["hosts"]["c"]["sched"] == 7.0
    # without a baseline the lateness-based evidence is off (start-up steps are noisy)
    s = analysis.summarize(
        "j",
        20,
        accs,
        expected_hosts=sorted(accs),
        history=hist[:3],
        quality={},
        closed_by="complete",
        closed_at_ns=0,
        th=th,
    )
    assert s["evidence"]["hosts"] == {}
    assert analysis.history_entry(s) == [20, 100 * MS, 40 * MS]


def test_network_evidence_names_the_host_behind_a_slow_link():
    p12, p23, p34, p14 = "10.0.0.1|10.0.0.2", "10.0.0.2|10.0.0.3", "10.0.0.3|10.0.0.4", "10.0.0.1|10.0.0.4"
    slow, fast = (10, 0, 10 * 30 * MS), (10, 0, 10 * 2 * MS)
    accs = {
        "n1": _net_acc("n1", "10.0.0.1", {p12: slow, p14: fast}),
        "n2": _net_acc("n2", "10.0.0.2", {p12: slow, p23: slow}),
        "n3": _net_acc("n3", "10.0.0.3", {p23: slow, p34: fast}),
        "n4": _net_acc("n4", "10.0.0.4", {p34: fast, p14: fast}),
    }
    ev = analysis.evidence(
        accs, dict.fromkeys(accs, 0), analysis.layer_table(accs), analysis.Baseline(spread_ns=MS), analysis.Thresholds()
    )
    assert list(ev.hosts) == ["n2"] and ev.hosts["n2"].network == 7.0


def test_spread_is_a_high_quantile_of_the_lateness_so_heavy_tailed_noise_stays_below_it():
    """On a shared machine the latest rank's lateness is small in most steps and large in a few: the
    spread is the 90th percentile (nearest rank) of the per-step largest lateness, not its median, so a
    host that is as late as the noise gets at most one spread of evidence."""
    th = analysis.Thresholds()
    lates = [3 * MS] * 40 + [30 * MS] * 5 + [60 * MS] * 5  # heavy tail: 20 % of the steps 10-20x the median
    hist = [[s, 100 * MS, x] for s, x in enumerate(lates)]
    assert analysis.quantile_int([x for x in lates], 0.9) == 30 * MS
    assert analysis.baseline(hist, 50, th).spread_ns == 30 * MS
    assert analysis.baseline(hist, 50, analysis.Thresholds(spread_q=0.5)).spread_ns == 3 * MS
    # the floor still holds: 2 % of the median step time
    slow = [[s, 1_000 * MS, 1 * MS] for s in range(20)]
    assert analysis.baseline(slow, 20, th).spread_ns == 20 * MS
    assert analysis.quantile_int([], 0.9) == 0 and analysis.quantile_int([5], 0.01) == 5
    # 2 ranks: the later one is 30 ms late (as late as the tail of the noise): one spread, not the clip
    quiet = {"sched": [1 * MS, 10, 1 * MS]}
    accs = {
        "a": _coll_acc("a", 100 * MS, {0: (10 * MS, 70 * MS)}, layers=quiet),
        "b": _coll_acc("b", 100 * MS, {0: (70 * MS, 1 * MS)}, layers={"sched": [90 * MS, 10, 9 * MS]}),
    }
    s = analysis.summarize(
        "j", 50, accs, expected_hosts=["a", "b"], history=hist, quality={}, closed_by="complete", closed_at_ns=0
    )
    assert s["evidence"]["hosts"]["b"]["sched"] == 1.0 and "a" not in s["evidence"]["hosts"]


def test_network_evidence_blames_the_host_whose_link_drops_not_the_sender_that_retransmits():
    """Loss on host n2's link: its peers send into the drops, so they count the retransmits (n3 counts
    30, n2 itself 2). n3 is also the late rank of the step. The evidence names n2 by its connections, and
    n3's own retransmit count is no evidence against n3."""
    ip = {f"n{i}": f"10.0.0.{i}" for i in range(1, 5)}
    p12, p23, p34, p14 = "10.0.0.1|10.0.0.2", "10.0.0.2|10.0.0.3", "10.0.0.3|10.0.0.4", "10.0.0.1|10.0.0.4"
    pairs = {
        "n1": {p12: (10, 4, 10 * 2 * MS), p14: (10, 1, 10 * 2 * MS)},
        "n2": {p12: (10, 2, 10 * 2 * MS), p23: (10, 2, 10 * 2 * MS)},
        "n3": {p23: (10, 30, 10 * 2 * MS), p34: (10, 0, 10 * 2 * MS)},
        "n4": {p34: (10, 1, 10 * 2 * MS), p14: (10, 0, 10 * 2 * MS)},
    }
    accs = {h: _net_acc(h, ip[h], pairs[h]) for h in pairs}
    accs["n3"]["layers"] = {"network": [0, 30, 0]}  # its own TCP_RETRANSMIT events (the sender's count)
    th = analysis.Thresholds()
    late = {"n1": 0, "n2": 0, "n3": 40 * MS, "n4": 0}
    bl = analysis.Baseline(n=20, spread_ns=4 * MS)
    ev = analysis.evidence(accs, late, analysis.layer_table(accs), bl, th)
    # rx(n2) = 6 (fewest over its connections), the others' median 1: (6 - 1) / sqrt(1 + 1)
    assert ev.hosts["n2"].network == 3.536
    assert ev.hosts.get("n3", analysis.HostEvidence()).network == 0.0
    # a light loss: 2 retransmits on each of n2's connections (counted by n2), none elsewhere: (2 - 0) /
    # sqrt(1) = 2 spreads, which the CUSUM adds up over steps; 1 retransmit is no evidence
    for n, want in ((2, 2.0), (1, 0.0)):
        light = {h: {k: (10, n if h == "n2" else 0, 10 * 2 * MS) for k in p} for h, p in pairs.items()}
        accs_l = {h: _net_acc(h, ip[h], light[h]) for h in light}
        on_time = dict.fromkeys(accs_l, 0)
        ev = analysis.evidence(accs_l, on_time, analysis.layer_table(accs_l), bl, th)
        assert ev.hosts == ({"n2": analysis.HostEvidence(network=2.0)} if want else {})
    # with 2 hosts both ends share the one link: no network evidence at all, whoever retransmits
    two = {"n2": accs["n2"], "n3": accs["n3"]}
    ev = analysis.evidence(two, {"n2": 0, "n3": 40 * MS}, analysis.layer_table(two), bl, th)
    assert all(v.network == 0.0 for v in ev.hosts.values())


def test_a_host_late_from_its_own_cpu_keeps_sched_evidence_when_its_connections_also_look_slow():
    """A host starved of CPU answers its peers late: every one of its connections shows a high RTT, as
    behind a slow link. When its own run-queue excess made it at least one spread late, the step's
    evidence stays on sched; a host late without such an excess (behind a slow link) gets network."""
    ip = {f"n{i}": f"10.0.0.{i}" for i in range(1, 5)}
    p12, p23, p34, p14 = "10.0.0.1|10.0.0.2", "10.0.0.2|10.0.0.3", "10.0.0.3|10.0.0.4", "10.0.0.1|10.0.0.4"
    slow, fast = (10, 0, 10 * 30 * MS), (10, 0, 10 * 2 * MS)
    pairs = {"n1": {p12: slow, p14: fast}, "n2": {p12: slow, p23: slow}, "n3": {p23: slow, p34: fast}}
    pairs["n4"] = {p34: fast, p14: fast}
    th = analysis.Thresholds()
    bl = analysis.Baseline(n=20, spread_ns=10 * MS)
    late = {"n1": 0, "n2": 30 * MS, "n3": 0, "n4": 0}

    def accs_with(n2_sched_ns):
        accs = {h: _net_acc(h, ip[h], pairs[h]) for h in pairs}
        for h, a in accs.items():
            a["layers"] = {"sched": [n2_sched_ns if h == "n2" else 5 * MS, 10, 1 * MS]}
        return accs

    starved = accs_with(80 * MS)  # 75 ms over its peers: 30 ms late -> 3 spreads of sched
    ev = analysis.evidence(starved, late, analysis.layer_table(starved), bl, th)
    assert ev.hosts["n2"].sched == 3.0 and ev.hosts["n2"].network == 0.0
    behind_slow_link = accs_with(6 * MS)  # 1 ms over its peers: 0.1 spread of sched
    ev = analysis.evidence(behind_slow_link, late, analysis.layer_table(behind_slow_link), bl, th)
    assert ev.hosts["n2"].network == 7.0 and ev.hosts["n2"].sched == 0.0


def test_hang_check_names_the_silent_rank_that_never_arrived():
    now = 100_000 * MS
    hist = [[s, 300 * MS, 10 * MS] for s in range(20)]
    accs = {
        "a": _coll_acc("a", None, {7: (now - 3_000 * MS, None)}),
        "b": _coll_acc("b", None, {7: (now - 2_900 * MS, None)}),
        "c": _coll_acc("c", None, {6: (now - 3_500 * MS, None)}, seen_phase=(now - 3_600 * MS, "backward")),
    }
    seen = {"a": now - 2_900 * MS, "b": now - 2_800 * MS, "c": now - 3_400 * MS}
    got = analysis.hang_check(accs, ["a", "b", "c", "d"], seen, now - 4_000 * MS, hist, 20, now)
    assert (got["pg"], got["coll_seq"], got["waiting"]) == ("0", 7, ["a", "b"])
    assert got["after_ns"] == 3_000 * MS and got["waited_ns"] == 2_900 * MS
    # c is inside the previous all-reduce; d sent nothing in this step (silent since the step opened)
    assert got["hosts"] == [
        {
            "host": "c",
            "last_step": 20,
            "last_phase": "in all_reduce pg=0 seq=6",
            "silent_ns": 3_400 * MS,
            "state": "silent",
        },
        {
            "host": "d",
            "last_step": 19,
            "last_phase": "no data in this step",
            "silent_ns": 4_000 * MS,
            "state": "silent",
        },
    ]
    # a rank that is late but still sends data is slow, not hung; and a short wait is no hang
    assert (
        analysis.hang_check(accs, ["a", "b", "c"], dict(seen, c=now - 100 * MS), now - 4_000 * MS, hist, 20, now)
        is None
    )
    assert analysis.hang_check(accs, ["a", "b", "c"], seen, now - 4_000 * MS, hist, 20, now - 2_000 * MS) is None


def test_a_step_read_long_after_it_ran_never_hangs():
    # a worker started on retained input reads an ended job's last step: its ranks arrived 2 h ago, the
    # worker opened the step (and heard from its hosts) seconds ago
    now = 10_000_000 * MS
    hist = [[s, 300 * MS, 10 * MS] for s in range(20)]
    ran = now - 7_200_000 * MS
    accs = {
        "a": _coll_acc("a", None, {7: (ran, None)}),
        "b": _coll_acc("b", None, {7: (ran + 100 * MS, None)}),
    }
    seen = {"a": now - 4_000 * MS, "b": now - 4_000 * MS}
    th = analysis.Thresholds()
    assert analysis.hang_check(accs, ["a", "b", "c"], seen, now - 4_000 * MS, hist, 20, now, th) is None
    held = analysis.Thresholds(hang_hold_ns=8_000_000 * MS)  # the same data within the hold: c hangs
    got = analysis.hang_check(accs, ["a", "b", "c"], seen, now - 4_000 * MS, hist, 20, now, held)
    assert [h["host"] for h in got["hosts"]] == ["c"]


def test_exits_read_long_after_they_happened_in_a_step_without_collectives_never_hang():
    """The history check counts a step's exits when it saw no collective: ranks killed in forward, whose
    exits a worker reads 8 min later (a demo resumed the previous demo's job), name nobody; read at once,
    the rank that exited first is named."""
    hist = [[s, 60 * MS, 2 * MS] for s in range(30)]
    t = 10_000_000 * MS
    stopped = {"a": ("exited", t, t), "b": ("exited", t, t + 300 * MS), "c": ("exited", t, t + 310 * MS)}
    accs = {}
    for h in "abc":
        accs[h] = _coll_acc(h, None, {}, seen_phase=(t - 10 * MS, "forward"))
        accs[h]["phases"] = {"forward": 50 * MS}
    seen = {h: t for h in "abc"}
    now = t + 2_000 * MS
    got = analysis.hang_check(accs, list("abc"), seen, t - 200 * MS, hist, 30, now, stopped=stopped)
    assert [(h["host"], h["state"]) for h in got["hosts"]] == [("a", "exited")]
    late = t + 480_000 * MS
    assert analysis.hang_check(accs, list("abc"), seen, t - 200 * MS, hist, 30, late, stopped=stopped) is None


def test_hang_check_names_a_rank_its_agent_found_stopped_without_waiting_for_silence():
    """A rank frozen inside a collective every rank reached: nobody is missing and nobody is silent for
    long, but its agent reported it frozen; it is named once the others waited ``hang_state_wait_ns`` in
    that collective. The same state at the job's end (every rank finished its step) names nobody."""
    now = 100_000 * MS
    hist = [[s, 300 * MS, 10 * MS] for s in range(20)]
    accs = {
        "a": _coll_acc("a", None, {7: (now - 700 * MS, None)}),
        "b": _coll_acc("b", None, {7: (now - 650 * MS, None)}),
        "c": _coll_acc("c", None, {7: (now - 800 * MS, None)}, seen_phase=(now - 900 * MS, "backward")),
    }
    seen = {"a": now - 100 * MS, "b": now - 100 * MS, "c": now - 600 * MS}
    stopped = {"c": ("frozen", now - 500 * MS)}
    got = analysis.hang_check(accs, ["a", "b", "c"], seen, now - 1_000 * MS, hist, 20, now, stopped=stopped)
    assert (got["pg"], got["coll_seq"], got["op"], got["waiting"]) == ("0", 7, "all_reduce", ["a", "b"])
    assert got["waited_ns"] == 650 * MS and got["after_ns"] == analysis.Thresholds().hang_state_wait_ns
    assert got["hosts"] == [
        {
            "host": "c",
            "last_step": 20,
            "last_phase": "in all_reduce pg=0 seq=7",
            "silent_ns": 600 * MS,
            "state": "frozen",
        }
    ]
    # without the state nothing is named: the silence is too short
    assert analysis.hang_check(accs, ["a", "b", "c"], seen, now - 1_000 * MS, hist, 20, now) is None
    # the others have not waited long enough yet
    assert (
        analysis.hang_check(accs, ["a", "b", "c"], seen, now - 1_000 * MS, hist, 20, now - 300 * MS, stopped=stopped)
        is None
    )
    # an exited rank with no data in the step, the others blocked in their first collective of it
    accs2 = {h: accs[h] for h in ("a", "b")}
    got = analysis.hang_check(
        accs2, ["a", "b", "c"], seen, now - 1_000 * MS, hist, 20, now, stopped={"c": ("exited", now)}
    )
    assert got["hosts"][0]["host"] == "c" and got["hosts"][0]["state"] == "exited"
    assert got["hosts"][0]["last_step"] == 19 and got["hosts"][0]["last_phase"] == "no data in this step"
    # the job's end: every other rank finished its step, so nobody waits
    done = {h: _coll_acc(h, 300 * MS, {7: (now - 700 * MS, 5 * MS)}) for h in ("a", "b")}
    assert analysis.hang_check(done, ["a", "b", "c"], seen, now - 1_000 * MS, hist, 20, now, stopped=stopped) is None


@given(st.lists(st.integers(min_value=0, max_value=50), min_size=1, max_size=40), st.data())
def test_leave_one_out_median_equals_the_median_of_the_others(values, data):
    """The peer median of each host from one sort equals ``median_int`` of the other hosts' values."""
    i = data.draw(st.integers(min_value=0, max_value=len(values) - 1))
    others = values[:i] + values[i + 1 :]
    assert analysis.LeaveOneOut(values).median_without(values[i]) == analysis.median_int(others)


def test_leave_one_out_rejects_a_value_not_among_them():
    with pytest.raises(ValueError, match="not one of the values"):
        analysis.LeaveOneOut([1, 2, 3]).median_without(7)


def test_hang_check_names_the_rank_that_exited_first_when_the_waiting_ranks_failed_after_it():
    """A killed rank's peers fail on the closed connection inside their all-reduce and exit too: the one
    that exited ``hang_exit_gap_ns`` before the others is named, the others are listed as waiting; exits
    closer together than that name nobody (no order to tell)."""
    now = 100_000 * MS
    hist = [[s, 300 * MS, 10 * MS] for s in range(20)]
    accs = {h: _coll_acc(h, None, {7: (now - 900 * MS + i * MS, None)}) for i, h in enumerate("abc")}
    seen = {h: now - 800 * MS for h in "abc"}
    t = now - 800 * MS
    stopped = {"b": ("exited", now - 300 * MS, t), "a": ("exited", now, t + 60 * MS), "c": ("exited", now, t + 80 * MS)}
    # the later exits reported first, the earliest not yet: nothing is judged before the exits settle
    later = {h: stopped[h] for h in "ac"}
    assert (
        analysis.hang_check(accs, ["a", "b", "c"], seen, now - 1_000 * MS, hist, 20, t + 500 * MS, stopped=later)
        is None
    )
    got = analysis.hang_check(accs, ["a", "b", "c"], seen, now - 1_000 * MS, hist, 20, now, stopped=stopped)
    assert [(h["host"], h["state"]) for h in got["hosts"]] == [("b", "exited")]
    assert (got["pg"], got["coll_seq"], got["waiting"]) == ("0", 7, ["a", "c"])
    together = {h: ("exited", now, t + i * MS) for i, h in enumerate("abc")}
    assert analysis.hang_check(accs, ["a", "b", "c"], seen, now - 1_000 * MS, hist, 20, now, stopped=together) is None
    # a still waits inside the collective: only the earliest exit is named, not c that failed after it
    one_waits = {h: stopped[h] for h in "bc"}
    got = analysis.hang_check(accs, ["a", "b", "c"], seen, now - 1_000 * MS, hist, 20, now, stopped=one_waits)
    assert [h["host"] for h in got["hosts"]] == ["b"] and got["waiting"] == ["a"]


def test_hang_check_names_the_rank_that_exited_first_when_the_others_failed_outside_any_collective():
    """A rank killed during backward: its peers fail in DDP's gradient all-reduce, which shows no
    collective event, and exit after it. Every collective seen in the step had ended, so no rank waits in
    one; the rank that exited first is still named, with the others as waiting (they ended their forward
    phase). Ranks that exit after finishing their last step (a job's normal end) name nobody, nor do ranks
    whose only work in the step was collectives that all ended (a closing ``dist.barrier()`` after the
    loop, one rank late to it while it saved a checkpoint: a new user's jobs paged at 7 of 9 clean ends)."""
    now = 100_000 * MS
    hist = [[s, 300 * MS, 10 * MS] for s in range(20)]
    accs = {
        h: _coll_acc(h, None, {6: (now - 950 * MS, 2 * MS), 7: (now - 940 * MS, 1 * MS)}, seen_phase=(0, "forward"))
        for h in "abc"
    }
    seen = {h: now - 800 * MS for h in "abc"}
    t = now - 800 * MS
    stopped = {"b": ("exited", now - 300 * MS, t), "a": ("exited", now, t + 60 * MS), "c": ("exited", now, t + 80 * MS)}
    got = analysis.hang_check(accs, ["a", "b", "c"], seen, now - 1_000 * MS, hist, 20, now, stopped=stopped)
    assert [(h["host"], h["state"]) for h in got["hosts"]] == [("b", "exited")]
    assert (got["pg"], got["coll_seq"], got["waiting"], got["waited_ns"]) == ("0", 7, ["a", "c"], 800 * MS)
    finished = {h: _coll_acc(h, 290 * MS, {7: (now - 940 * MS, 1 * MS)}) for h in "abc"}
    assert (
        analysis.hang_check(finished, ["a", "b", "c"], seen, now - 1_000 * MS, hist, 20, now, stopped=stopped) is None
    )
    barrier = {
        h: _coll_acc(h, None, {7: (now - 940 * MS + i * 50 * MS, 1 * MS)}, seen_phase=(0, "data"))
        for i, h in enumerate("abc")
    }
    assert analysis.hang_check(barrier, ["a", "b", "c"], seen, now - 1_000 * MS, hist, 20, now, stopped=stopped) is None


def test_ranks_exiting_in_the_data_phase_after_their_last_step_name_nobody():
    """A training loop's normal end: the hooks open step N+1 and its data phase at the last optimizer step
    and close the data phase at exit, so each rank has an open step with only a data phase when it exits,
    one after the other (a new user's 2-rank DDP job fired a critical ``rank_hang`` at 11 of 14 clean
    ends). Nobody is named. The same exits after a forward phase (a peer lost inside backward, where no
    collective event shows) still name the first rank."""
    now = 100_000 * MS
    hist = [[s, 60 * MS, 2 * MS] for s in range(30)]
    t = now - 1_100 * MS
    stopped = {
        "a": ("exited", now - 1_000 * MS, t),
        "b": ("exited", now, t + 300 * MS),
        "c": ("exited", now, t + 310 * MS),
    }
    seen = {h: now - 1_000 * MS for h in "abc"}

    def accs(phase):
        out = {}
        for h in "abc":
            a = _coll_acc(h, None, {}, seen_phase=(t - 10 * MS, phase))
            a["phases"] = {phase: 50 * MS}
            out[h] = a
        return out

    ended = accs("data")
    assert analysis.hang_check(ended, list("abc"), seen, now - 1_200 * MS, hist, 30, now, stopped=stopped) is None
    failed = accs("forward")
    got = analysis.hang_check(failed, list("abc"), seen, now - 1_200 * MS, hist, 30, now, stopped=stopped)
    assert [(h["host"], h["state"]) for h in got["hosts"]] == [("a", "exited")]
    assert got["waiting"] == ["b", "c"]


def test_the_step_after_a_loops_last_names_no_straggler():
    """The step the hooks open at the last optimizer step holds only data phases (closed at exit): a rank
    that saved a checkpoint for 8 s after the loop was named its straggler, +8,000 ms (a new user's job).
    Nobody waited for it there: no straggler, no blame. The same times in a forward phase still name it."""
    hist = [[s, 60 * MS, 2 * MS] for s in range(30)]

    def summary(phase):
        accs = {}
        for h, ms in (("a", 50), ("b", 8_050), ("c", 52)):
            a = accumulate.new_acc(h, 0)
            a["phases"], a["last_phase"] = {phase: ms * MS}, [10**12, phase]
            a["layers"] = {"pytorch": [ms * MS, 1, ms * MS]}
            accs[h] = a
        return analysis.summarize(
            "j", 30, accs, expected_hosts=list("abc"), history=hist, quality={}, closed_by="window", closed_at_ns=0
        )

    end = summary("data")
    assert end["straggler"] is None and end["blame"] == []
    assert summary("forward")["straggler"]["host"] == "b"


def test_a_stopped_rank_that_never_arrived_is_named_after_the_short_wait_not_the_silence():
    """The usual freeze: the others finished the collectives they were seen in and block in the next
    (not seen yet), the frozen rank has no data in the step; named once they waited
    ``hang_state_wait_ns`` after their last arrival, long before ``hang_min_ns`` of silence."""
    now = 100_000 * MS
    hist = [[s, 130 * MS, 10 * MS] for s in range(20)]
    accs = {h: _coll_acc(h, None, {7: (now - 600 * MS, 2 * MS)}) for h in "abc"}
    seen = {"a": now - 50 * MS, "b": now - 50 * MS, "c": now - 50 * MS, "d": now - 700 * MS}
    stopped = {"d": ("frozen", now - 400 * MS, now - 650 * MS)}
    got = analysis.hang_check(accs, list("abcd"), seen, now - 800 * MS, hist, 20, now, stopped=stopped)
    assert [(h["host"], h["state"], h["last_phase"]) for h in got["hosts"]] == [("d", "frozen", "no data in this step")]
    assert (got["coll_seq"], got["waiting"], got["after_ns"]) == (7, ["a", "b", "c"], 500 * MS)
    assert analysis.hang_check(accs, list("abcd"), seen, now - 800 * MS, hist, 20, now) is None  # silence: not yet
    # exited after the others ended collective 7 (now - 598 ms): judged once the exits settled
    exited = {"d": ("exited", now - 400 * MS, now - 590 * MS)}
    assert (
        analysis.hang_check(accs, list("abcd"), seen, now - 800 * MS, hist, 20, now - 200 * MS, stopped=exited) is None
    )
    later = now + 200 * MS
    assert (
        analysis.hang_check(accs, list("abcd"), seen, now - 800 * MS, hist, 20, later, stopped=exited)["hosts"][0][
            "host"
        ]
        == "d"
    )
    # exited before the others ended collective 7: they went on without it (a rank that ended early)
    early = {"d": ("exited", now - 400 * MS, now - 800 * MS)}
    assert analysis.hang_check(accs, list("abcd"), seen, now - 800 * MS, hist, 20, later, stopped=early) is None


def test_a_frozen_rank_is_named_when_the_step_stalls_though_every_collective_seen_ended():
    """The frozen rank arrived at and finished every collective seen, like the others, who block where
    no collective event shows: named once the step has been open ``hang_factor`` median steps (and at
    least ``hang_state_wait_ns``); not while the step is young, and never for an exit alone."""
    now = 100_000 * MS
    hist = [[s, 130 * MS, 10 * MS] for s in range(20)]
    accs = {h: _coll_acc(h, None, {7: (now - 600 * MS, 2 * MS)}) for h in "abcd"}
    seen = {h: now - 500 * MS for h in "abcd"}
    frozen = {"d": ("frozen", now - 400 * MS, now - 550 * MS)}
    got = analysis.hang_check(accs, list("abcd"), seen, now - 700 * MS, hist, 20, now, stopped=frozen)
    assert [(h["host"], h["state"]) for h in got["hosts"]] == [("d", "frozen")]
    assert (got["pg"], got["coll_seq"], got["waiting"], got["waited_ns"]) == ("0", 7, ["a", "b", "c"], 700 * MS)
    assert analysis.hang_check(accs, list("abcd"), seen, now - 300 * MS, hist, 20, now, stopped=frozen) is None
    exited = {"d": ("exited", now - 400 * MS, now - 900 * MS)}
    assert analysis.hang_check(accs, list("abcd"), seen, now - 700 * MS, hist, 20, now, stopped=exited) is None


def test_ranks_silent_behind_a_frozen_rank_are_not_named():
    """Ranks blocked on a frozen one fall silent too: with a rank known frozen only it is named, however
    long the silence of the others."""
    now = 100_000 * MS
    hist = [[s, 130 * MS, 10 * MS] for s in range(20)]
    accs = {"a": _coll_acc("a", None, {9: (now - 3_700 * MS, None)})}
    accs.update({h: _coll_acc(h, None, {8: (now - 3_900 * MS, 2 * MS)}) for h in "bcd"})
    seen = {"a": now - 3_600 * MS, "b": now - 3_500 * MS, "c": now - 3_900 * MS, "d": now - 3_500 * MS}
    frozen = {"c": ("frozen", now - 3_800 * MS, now - 3_900 * MS)}
    got = analysis.hang_check(accs, list("abcd"), seen, now - 4_000 * MS, hist, 20, now, stopped=frozen)
    assert [(h["host"], h["state"]) for h in got["hosts"]] == [("c", "frozen")]
    silent = analysis.hang_check(accs, list("abcd"), seen, now - 4_000 * MS, hist, 20, now)
    assert [h["host"] for h in silent["hosts"]] == ["b", "c", "d"]  # by silence alone: every silent rank


def test_missing_ranks_that_still_send_data_name_nobody_by_silence():
    """A step stalled by retransmission timeouts on one host's lossy link: one rank arrived at the next
    collective and waits; the other three are blocked together before it, and only those that retransmit
    send data. The one without retransmits of its own is silent, but it is no hang: nobody is named while
    a missing rank still sends data; once every missing rank is silent, they are."""
    now = 100_000 * MS
    hist = [[s, 130 * MS, 10 * MS] for s in range(20)]
    accs = {"a": _coll_acc("a", None, {9: (now - 6_000 * MS, None)})}
    accs.update({h: _coll_acc(h, None, {8: (now - 6_400 * MS, 2 * MS)}) for h in "bcd"})
    seen = {"a": now - 6_000 * MS, "b": now - 3_500 * MS, "c": now - 200 * MS, "d": now - 400 * MS}
    assert analysis.hang_check(accs, list("abcd"), seen, now - 6_500 * MS, hist, 20, now) is None
    seen.update(c=now - 3_600 * MS, d=now - 3_700 * MS)
    got = analysis.hang_check(accs, list("abcd"), seen, now - 6_500 * MS, hist, 20, now)
    assert [h["host"] for h in got["hosts"]] == ["b", "c", "d"] and got["waiting"] == ["a"]


def test_a_silent_rank_its_peers_retransmit_toward_is_unreachable_not_stopped():
    """The campaign's stall: the lossy host's rank is blocked in the gradient all-reduce and sends
    nothing while the three others wait at the next collective. Its peers' retransmits toward it make it
    ``unreachable`` (its link holds up the collective); retransmits toward another host, too few of them,
    or a host whose own address is unknown in the step leave it ``silent``."""
    now = 100_000 * MS
    hist = [[s, 100 * MS, 10 * MS] for s in range(20)]
    ip = {h: f"10.0.0.{i}" for i, h in enumerate("abcd", 1)}

    def accs_with(sent: dict[str, dict[str, tuple[int, int]]], b_addr: bool = True) -> dict:
        accs = {h: _coll_acc(h, None, {9: (now - 4_000 * MS, None)}) for h in "acd"}
        accs["b"] = _coll_acc("b", None, {8: (now - 4_200 * MS, 3 * MS)}, seen_phase=(now - 3_500 * MS, "backward"))
        for h, acc in accs.items():
            if h != "b" or b_addr:
                acc["net"] = _dir_acc(h, ip[h], {ip[p]: v for p, v in sent.get(h, {}).items()})["net"]
        return accs

    seen = {"a": now - 3_900 * MS, "b": now - 3_100 * MS, "c": now - 3_900 * MS, "d": now - 3_900 * MS}
    lossy = accs_with({"a": {"b": (10, 3), "d": (10, 0)}, "c": {"b": (10, 2), "d": (10, 0)}, "b": {"a": (10, 0)}})
    got = analysis.hang_check(lossy, list("abcd"), seen, now - 4_500 * MS, hist, 20, now)
    assert got["waiting"] == ["a", "c", "d"]
    assert [(h["host"], h["state"], h.get("toward")) for h in got["hosts"]] == [("b", "unreachable", 5)]
    assert got["after_ns"] == 3_000 * MS
    # the retransmits go toward d, which arrived: b is silent
    elsewhere = accs_with({"a": {"d": (10, 3), "b": (10, 0)}, "c": {"d": (10, 2), "b": (10, 0)}, "b": {"a": (10, 0)}})
    got = analysis.hang_check(elsewhere, list("abcd"), seen, now - 4_500 * MS, hist, 20, now)
    assert [(h["host"], h["state"]) for h in got["hosts"]] == [("b", "silent")] and "toward" not in got["hosts"][0]
    # one retransmit toward b is below net_count_min
    one = accs_with({"a": {"b": (10, 1), "d": (10, 0)}, "b": {"a": (10, 0)}})
    assert (
        analysis.hang_check(one, list("abcd"), seen, now - 4_500 * MS, hist, 20, now)["hosts"][0]["state"] == "silent"
    )
    # b's own address is unknown in the step: the retransmits cannot be tied to it
    unknown = accs_with({"a": {"b": (10, 3), "d": (10, 0)}, "c": {"b": (10, 2), "d": (10, 0)}}, b_addr=False)
    assert (
        analysis.hang_check(unknown, list("abcd"), seen, now - 4_500 * MS, hist, 20, now)["hosts"][0]["state"]
        == "silent"
    )
    assert analysis.retransmits_toward(lossy) == {"a": 0, "b": 5, "c": 0, "d": 0}


def test_stepless_tcp_events_of_a_batch_without_a_step_go_to_the_step_left_running():
    """A rank blocked in a long collective emits no stepped event: a batch sealed by age then holds only
    TCP events. They go to the step the host's previous batch left running (none when that batch ended
    its step: they are dropped, as before)."""
    before = [Event(Kind.STEP_BEGIN, 100, step=7), Event(Kind.COLLECTIVE_BEGIN, 120, step=7, payload={"pg": "0"})]
    assert accumulate.running_step(_batch(before), None) == 7
    ended = before + [Event(Kind.STEP_END, 150, step=7, duration_ns=50), Event(Kind.SCHED_STEP_SUM, 151, step=7)]
    assert accumulate.running_step(_batch(ended), None) is None
    only_tcp = [_tcp(Kind.TCP_RTT, 300, "10.0.0.1", "10.0.0.2"), _tcp(Kind.TCP_RTT, 400, "10.0.0.1", "10.0.0.3")]
    assert accumulate.running_step(_batch(only_tcp), 7) == 7  # no stepped event: unchanged
    parts = accumulate.reduce_batch(_batch(only_tcp), 7)
    assert list(parts) == [7]
    assert parts[7]["net"]["pairs"] == {
        "10.0.0.1|10.0.0.2": [1, 0, 50_000, 0, 0],
        "10.0.0.1|10.0.0.3": [1, 0, 50_000, 0, 0],
    }
    assert accumulate.reduce_batch(_batch(only_tcp), None) == {}


def _running_accs(n2_sched_ns=5 * MS, ended=()):
    """4 hosts in a ring 1-2-3-4-1 inside step 40, begun at 0 (CLOCK_REALTIME): host 2's two connections
    have a mean RTT of 30 ms, every other connection 2 ms; no host reported its STEP_END yet."""
    ip = {f"n{i}": f"10.0.0.{i}" for i in range(1, 5)}
    p12, p23, p34, p14 = "10.0.0.1|10.0.0.2", "10.0.0.2|10.0.0.3", "10.0.0.3|10.0.0.4", "10.0.0.1|10.0.0.4"
    slow, fast = (10, 0, 10 * 30 * MS), (10, 0, 10 * 2 * MS)
    pairs = {"n1": {p12: slow, p14: fast}, "n2": {p12: slow, p23: slow}, "n3": {p23: slow, p34: fast}}
    pairs["n4"] = {p34: fast, p14: fast}
    accs = {h: _net_acc(h, ip[h], pairs[h]) for h in pairs}
    for h, a in accs.items():
        a["begin_rt"] = 0
        a["layers"] = {"sched": [n2_sched_ns if h == "n2" else 5 * MS, 10, 1 * MS]}
        if h in ended:
            a["step_ns"] = 90 * MS
    return accs


def test_running_check_names_the_host_behind_a_slow_link_while_its_step_still_runs():
    """A rate-limited link makes a 100 ms step last seconds; the summary of that step comes only when it
    ends. Inside the running step, once it has run max(0.5 s, 3 x the median step), the host whose every
    busy connection is slow is named from the partial accumulators, never its ring neighbours."""
    th = analysis.Thresholds()
    hist = [[s, 100 * MS, 5 * MS] for s in range(20, 40)]
    accs = _running_accs()
    assert analysis.running_check(accs, hist, 40, 0, 400 * MS, th) is None  # 0.4 s: not long yet
    got = analysis.running_check(accs, hist, 40, 0, 600 * MS, th)
    assert got is not None and got["after_ns"] == 500 * MS and got["elapsed_ns"] == 600 * MS
    assert list(got["hosts"]) == ["n2"]
    n2 = got["hosts"]["n2"]
    assert (n2["z"], n2["rtt_ns"], n2["peer_rtt_ns"], n2["rx"]) == (7.0, 30 * MS, 2 * MS, 0)
    # the step opened in the worker after it began on the hosts: elapsed counts from the earliest begin
    assert analysis.running_check(accs, hist, 40, 300 * MS, 600 * MS, th) is not None
    # a job of 1 s steps: 3 s before a step is long
    slow_job = [[s, 1_000 * MS, 5 * MS] for s in range(20, 40)]
    assert analysis.running_check(accs, slow_job, 40, 0, 2_900 * MS, th) is None
    assert analysis.running_check(accs, slow_job, 40, 0, 3_000 * MS, th) is not None


def test_running_check_leaves_cpu_starved_stopped_finished_and_young_jobs_to_the_step_close():
    th = analysis.Thresholds()
    hist = [[s, 100 * MS, 5 * MS] for s in range(20, 40)]
    now = 1_000 * MS
    # a host starved of CPU answers late on every connection: its own run-queue excess (100 ms of a 1 s
    # step, over 5 %) explains it, so its connections are no evidence
    assert analysis.running_check(_running_accs(n2_sched_ns=105 * MS), hist, 40, 0, now, th) is None
    assert analysis.running_check(_running_accs(n2_sched_ns=40 * MS), hist, 40, 0, now, th) is not None
    # a rank found frozen: the step hangs (hang_check), it is not a slow link
    assert analysis.running_check(_running_accs(), hist, 40, 0, now, th, stopped={"n3": ("frozen", 0, 0)}) is None
    # every host finished: the summary comes with the close
    assert analysis.running_check(_running_accs(ended=("n1", "n2", "n3", "n4")), hist, 40, 0, now, th) is None
    assert analysis.running_check(_running_accs(ended=("n1", "n3", "n4")), hist, 40, 0, now, th) is not None
    # no baseline yet (the first steps of a job are noisy); fewer than 3 hosts
    assert analysis.running_check(_running_accs(), hist[:5], 40, 0, now, th) is None
    two = {h: a for h, a in _running_accs().items() if h in ("n1", "n2")}
    assert analysis.running_check(two, hist, 40, 0, now, th) is None


@pytest.mark.parametrize("n2_phases, named", [(10, True), (8, False), (12, True)])
def test_running_check_names_no_link_of_a_host_behind_its_peers_at_its_own_work(n2_phases, named):
    """The shape of a live running record (frame22-accum-2 step 505, an 800 ms CPU burst of node-01): the
    starved host answered late on its connections, so a view a late host gives too (here its connections'
    RTT) named its network, while it had ended 8 phases of the step against its peers' 10 and its
    run-queue time was not there yet (a waiting thread's is recorded once it runs). A host behind its peers
    at its own work is left to the close; one as far as its peers (inside the collective they wait in, as
    a blackout's host is) or further is named as before."""
    th = analysis.Thresholds()
    hist = [[s, 100 * MS, 5 * MS] for s in range(20, 40)]
    accs = _running_accs()
    for h, a in accs.items():
        a["layers"]["pytorch"] = [0, n2_phases if h == "n2" else 10, 0]
    got = analysis.running_check(accs, hist, 40, 0, 1_000 * MS, th)
    assert (got is not None and list(got["hosts"]) == ["n2"]) is named, got
    # a host of 2 ranks counts its ranks' phases: 16 for 2 ranks is 8 a rank, behind 10
    rows = {"0": accumulate.new_rank_row(1, 0), "1": accumulate.new_rank_row(2, 1)}
    accs["n2"]["ranks"] = rows
    accs["n2"]["layers"]["pytorch"] = [0, 2 * n2_phases, 0]
    got = analysis.running_check(accs, hist, 40, 0, 1_000 * MS, th)
    assert (got is not None and list(got["hosts"]) == ["n2"]) is named, got


def test_a_running_record_behind_its_peers_by_a_view_of_its_own_link_is_still_named():
    """Its own dropped segments (``drops``), a window of lossy steps or its own egress queue are the link's
    own evidence: a host named by them stays named however far it is at its own work."""
    counts = {"a": (8, 1), "b": (10, 1), "c": (10, 1)}
    for view in ("drops", "window", "sender_queue"):
        assert not analysis.running_own_work("a", view, counts)
    for view in ("toward", "rx", "rtt", ""):
        assert analysis.running_own_work("a", view, counts)
        assert not analysis.running_own_work("b", view, counts)  # as far as its busiest peer
    assert not analysis.running_own_work("z", "toward", counts)  # no count: not judged
    assert not analysis.running_own_work("a", "toward", {"a": (8, 1), "b": (16, 2)})  # 8 a rank each


def test_a_slowed_step_reads_the_jobs_recent_retransmits_against_connections_away_from_the_host():
    """The shape of a recorded demo step with 8 % loss on node-01's link (ring 0-1-2-3-0, 1.7 s into a
    retransmission-timeout stall): node-02 sent 14 retransmits towards node-01 and node-01 one towards
    node-00, so node-01's fewest over its two connections is 1 and the step alone names nobody. With the
    job's previous steps (``window``), node-01's fewest is 10. Its neighbour node-00 has 5 (1 shared + its
    other connection's noise, 5 over the window), above the other hosts' median (2), but a busy connection
    that does not end at node-00 carries 23 (the median of 44 and 2): no evidence against it."""
    ip = {f"node-0{i}": f"10.77.0.{11 + i}" for i in range(4)}
    accs = {
        "node-00": _dir_acc("node-00", ip["node-00"], {ip["node-01"]: (4, 0), ip["node-03"]: (4, 0)}),
        "node-01": _dir_acc("node-01", ip["node-01"], {ip["node-00"]: (4, 1), ip["node-02"]: (4, 0)}),
        "node-02": _dir_acc("node-02", ip["node-02"], {ip["node-01"]: (4, 14), ip["node-03"]: (4, 0)}),
        "node-03": _dir_acc("node-03", ip["node-03"], {ip["node-00"]: (4, 0), ip["node-02"]: (4, 0)}),
    }

    def key(a, b):
        return "|".join(sorted((ip[a], ip[b])))

    window = {  # [retransmits, a_to_b, b_to_a] of the previous steps (a < b by address)
        key("node-01", "node-02"): [30, 0, 30],
        key("node-00", "node-01"): [9, 3, 6],
        key("node-00", "node-03"): [5, 5, 0],
        key("node-02", "node-03"): [2, 0, 2],
    }
    th = analysis.Thresholds()
    assert analysis.net_evidence(accs, th) == {}
    stats = analysis.net_stats(accs, th, window=window)
    rx, ref = stats.rx, stats.ref
    assert rx == {"node-00": 5, "node-01": 10, "node-02": 2, "node-03": 0}  # node-03: no retransmit of its own
    assert ref == {"node-00": 23, "node-01": 3, "node-02": 7, "node-03": 27}
    got = analysis.net_evidence(accs, th, window_stats=stats)
    assert {h: v.z for h, v in got.items()} == {"node-01": 3.5}  # (10 - 3) / sqrt(3 + 1)
    # the gates over a window: node-01's 10 is net_window_min, and 3 x its reference 3 is 9
    # (what is left is the slowed step's retransmits toward node-01, net_toward_evidence: 14 vs 1 toward
    # node-00, the same host, clipped to net_toward_clip)
    gated = analysis.net_evidence(accs, analysis.Thresholds(net_window_min=11), window_stats=stats)
    assert gated == {"node-01": analysis.NetEvidence(3.0, 14, 1, 0, 0, "toward")}
    # with the per-step gates and without the reference the neighbour would count: (5 - 2) / sqrt(2 + 1)
    no_ref = analysis._net_z(accs, th, analysis.NetStats(stats.rx, stats.rtt, stats.directed, {}))
    assert round(no_ref["node-00"].z, 3) == 1.732
    # in a summary the window applies to a slowed step only (its longest step time >= 2 x the median)
    hist = [[s, 100 * MS, 10 * MS] for s in range(20)]
    kw = dict(expected_hosts=sorted(accs), history=hist, quality={}, closed_by="complete", closed_at_ns=1)
    for a in accs.values():
        a["step_ns"] = 300 * MS
    slowed = analysis.summarize("j", 20, accs, window=window, **kw)
    assert {h: e["network"] for h, e in slowed["evidence"]["hosts"].items()} == {"node-01": 3.5}
    for a in accs.values():
        a["step_ns"] = 150 * MS
    usual = analysis.summarize("j", 20, accs, window=window, **kw)
    assert all(e["network"] == 0.0 for e in usual["evidence"]["hosts"].values())
    # the window's parts: a step's retransmits per connection, only connections that have some
    part = analysis.net_window_part(accs)
    assert part == {key("node-00", "node-01"): [1, 0, 1], key("node-01", "node-02"): [14, 0, 14]}
    assert analysis.net_window([part, part]) == {k: [2 * x for x in v] for k, v in part.items()}


def test_median_without_all_equals_the_median_of_what_is_left():
    """``LeaveOneOut.median_without_all`` (a host's few connections left out of a job's thousands) equals
    ``median_int`` of the values with those occurrences removed, duplicates included, over random cases."""
    rnd = random.Random(7)
    for _ in range(3000):
        vals = [rnd.randint(0, 6) for _ in range(rnd.randint(1, 12))]
        gone = rnd.sample(vals, rnd.randint(0, len(vals)))
        left = list(vals)
        for v in gone:
            left.remove(v)
        assert analysis.LeaveOneOut(vals).median_without_all(gone) == analysis.median_int(left), (vals, gone)
