"""Wide step summaries (obshub/streams/compact.py): outlier rows, quantiles over every host, size at 4,096 hosts."""

from __future__ import annotations

import json

from obshub.core import schema
from obshub.streams import compact


def _summary(n: int, straggler: str = "h0007") -> dict:
    """A summary of ``n`` hosts: sched time i µs on host i, cuda count 1 except 50 on h0003; network only
    on even hosts; ``straggler`` named with one late-group peer, a blame entry and evidence."""
    hosts = [f"h{i:04d}" for i in range(n)]
    layers = {}
    for i, h in enumerate(hosts):
        row = {
            "sched": {"time_ns": i * 1000, "count": 2, "max_ns": 10},
            "cuda": {"time_ns": 5, "count": 50 if h == "h0003" else 1, "max_ns": 5},
        }
        if i % 2 == 0:
            row["network"] = {"time_ns": 0, "count": 0, "max_ns": 0}
        layers[h] = row
    return {
        "job": "j",
        "step": 1,
        "hosts": hosts,
        "step_time_ns": {h: 1_000_000 + (7 if h == "h0001" else 0) for h in hosts},
        "straggler": {"host": straggler, "group": [{"host": straggler, "late_ns": 9}, {"host": "h0002", "late_ns": 8}]},
        "blame": [{"host": straggler, "layer": "sched"}, {"host": "h0005", "layer": "memory"}],
        "evidence": {"spread_ns": 1, "hosts": {"h0006": {"sched": 3.0}}},
        "collectives": [{"last_host": "h0004"}],
        "layers": layers,
    }


def test_narrow_step_keeps_every_row():
    s = compact.compact(_summary(64))
    assert len(s["layers"]) == 64 and s["layers_omitted"] == 0
    st = s["layer_stats"]
    assert st["sched"]["hosts"] == 64 and st["network"]["hosts"] == 32
    # nearest rank over 0, 1000, ..., 63000 ns: p50 = 32nd value, p90 = 58th, p99 = 64th
    assert (st["sched"]["time_p50_ns"], st["sched"]["time_p90_ns"], st["sched"]["time_p99_ns"]) == (31000, 57000, 63000)
    assert st["sched"]["time_max_ns"] == 63000 and st["sched"]["max_host"] == "h0063"
    assert st["cuda"]["count_p50"] == 1 and st["cuda"]["count_max"] == 50
    assert st["cuda"]["max_host"] == "h0000"  # every host ties at 5 ns: the first by name


def test_wide_step_keeps_outliers_and_describes_every_host():
    full = _summary(300)
    rows = dict(full["layers"])
    s = compact.compact(full)
    kept = set(s["layers"])
    named = {"h0007", "h0002", "h0005", "h0006", "h0004"}  # straggler, late group, blame, evidence, last arrival
    top_sched = {f"h{i:04d}" for i in range(292, 300)}
    assert named | top_sched | {"h0003", "h0001"} <= kept  # + largest cuda count, longest step time
    assert len(kept) < 40 and s["layers_omitted"] == 300 - len(kept)
    assert all(s["layers"][h] == rows[h] for h in kept)  # kept rows are complete
    assert s["layer_stats"]["sched"]["hosts"] == 300 and s["layer_stats"]["sched"]["time_max_ns"] == 299_000
    assert compact.compact(_summary(300)) == s  # deterministic


def test_wide_summary_fits_well_below_the_broker_limit():
    s = compact.compact(_summary(4096))
    for k in ("expected_hosts",):
        s[k] = s["hosts"]
    size = len(json.dumps(s, sort_keys=True, separators=(",", ":")).encode())
    assert size < 1_048_588 // 4, size
    full = len(json.dumps(_summary(4096), sort_keys=True, separators=(",", ":")).encode())
    assert full > 2 * size


def test_compacted_fields_are_documented_and_pass_the_reader():
    s = compact.compact(_summary(100))
    assert {"layer_stats", "layers_omitted"} <= set(schema.STEP_SUMMARY_FIELDS)
    decoded = schema.decode_step_summary(json.dumps(s).encode())
    assert decoded["layer_stats"] == s["layer_stats"] and decoded["layers_omitted"] == s["layers_omitted"]


def test_wide_step_keeps_the_rows_of_the_strongest_evidence_only():
    # a step every rank waited in: most hosts carry a trace of lateness in evidence.hosts
    full = _summary(300)
    full["evidence"]["hosts"] = {f"h{i:04d}": {"sched": 0.0, "pytorch": 0.001 + i / 1e5} for i in range(10, 290)}
    full["evidence"]["hosts"]["h0006"] = {"sched": 3.0, "pytorch": 0.0}
    s = compact.compact(full)
    kept = set(s["layers"])
    assert "h0006" in kept and {f"h{i:04d}" for i in range(283, 290)} <= kept  # the 8 largest
    assert not {f"h{i:04d}" for i in range(100, 283)} & kept and len(kept) < 50  # not the other listed hosts
    assert len(s["evidence"]["hosts"]) == 281  # the evidence itself stays complete


def test_top_hosts_are_the_heaps_on_ties_and_beyond_int64():
    """``_top_hosts`` (a partition instead of a heap over every host) keeps exactly the hosts the heap of
    ``(-value, host)`` kept: the largest values, the smaller name first on a tie, however many hosts tie
    at the cut (a count column is often one value on every host), and values beyond int64 take the heap."""
    import heapq
    import random

    rng = random.Random(30)

    def heap(values: list[int], hosts: list[str], top: int) -> list[str]:
        return [h for _v, h in heapq.nsmallest(top, zip([-v for v in values], hosts))]

    for _ in range(2000):
        n, top = rng.randrange(0, 80), rng.randrange(0, 10)
        hosts = rng.sample([f"h{i:04d}" for i in range(300)], n)
        values = [rng.randrange(rng.choice((1, 3, 10**9))) for _ in range(n)]
        assert compact._top_hosts(values, hosts, top) == heap(values, hosts, top)
    hosts = [f"h{i:04d}" for i in range(2048)][::-1]
    assert compact._top_hosts([64] * 2048, hosts, 8) == [f"h{i:04d}" for i in range(8)]  # all tied: by name
    big = [2**70, -(2**70)] + list(range(30))
    assert compact._top_hosts(big, hosts[:32], 3) == heap(big, hosts[:32], 3) == [hosts[0], hosts[31], hosts[30]]
