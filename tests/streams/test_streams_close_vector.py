"""The close's numpy order statistics (issue #30 item 4, docs/BENCHMARKS.md 7b) give exactly what the
per-collective Python lists gave: lateness per rank, last arrivals, the named rank of each host, on
arrivals full of ties, missing arrivals, hosts whose collectives come in another order and hosts of
different rank counts; arrivals outside int64 take the Python lists."""

from __future__ import annotations

import random

from obshub.streams import accumulate
from obshub.streams.analysis import ranks as R


def _blocks(seed: int) -> tuple[list[tuple[int, list[str], list]], list[int], list[str]]:
    """Random ``(blocks, unc, unit keys)`` of a step (``ranks._arrival_matrix``'s input)."""
    rnd = random.Random(seed)
    keys = [f"0#{i}" for i in range(rnd.randint(1, 5))]
    blocks, unc, names = [], [], []
    start = 0
    for h in range(rnd.randint(1, 12)):
        m = rnd.choice((1, 2, 4, 8)) if seed % 2 else 4
        ks = rnd.sample(keys, rnd.randint(0, len(keys))) if seed % 3 == 0 else list(keys)
        a = [
            None
            if rnd.random() < 0.1
            else 1_700_000_000_000_000_000 + rnd.choice((0, 100, 100, 5_000, rnd.randrange(10**6)))
            for _ in range(m * len(ks))
        ]
        blocks.append((start, ks, a))
        unc.extend(rnd.choice((0, 50, 5_000)) for _ in range(m))
        names.extend(R.unit_key(f"n{h:02d}", start + j) for j in range(m))
        start += m
    return blocks, unc, names


def test_numpy_lateness_equals_the_python_lists_on_ties_and_gaps():
    """``_lateness_matrix`` == ``_lateness_flat`` (the Python reference) for 150 random steps."""
    for seed in range(150):
        blocks, unc, names = _blocks(seed)
        km = R._arrival_matrix(blocks, len(unc))
        assert km is not None
        got = R._lateness_matrix(km, unc, names.__getitem__)
        want = R._lateness_flat(R._flat_of(blocks), len(unc), unc, names.__getitem__)
        assert got == want, seed
        assert all(type(x) is int for x in got[0])


def test_arrivals_beyond_int64_take_the_python_lists():
    """An arrival that numpy cannot hold exactly (beyond +-2**62 ns) gives no matrix: the caller keeps
    the exact Python ints (``host_ranks`` names the same rank either way)."""
    assert R._arrival_matrix([(0, ["0#1"], [2**63]), (1, ["0#1"], [1])], 2) is None
    assert R._arrival_matrix([(0, ["0#1"], [2**62]), (1, ["0#1"], [1])], 2) is None
    accs = {}
    for h, t in (("a", 2**64), ("b", 10)):
        rows = {}
        for r in range(2):
            row = accumulate.new_rank_row(100 + r, r)
            row.colls = {"0#1": ["all_reduce", t + 1_000_000 * r, None, None]}
            row.step_ns = 1_000
            rows[str(r + (0 if h == "a" else 2))] = row
        acc = accumulate.new_acc(h, 1)
        acc.ranks = rows
        acc.colls = {"0#1": ["all_reduce", t, None, None]}
        accs[h] = acc
    named = R.host_ranks(accs)
    assert named["a"]["rank"] == 1 and named["a"]["rows"][1]["late_ns"] > 0


def test_collective_order_statistics_equal_the_sorted_pairs():
    """``straggler._order_stats`` (one sort of the arrivals) names the first, second-latest and last
    host and the median as the sort of ``(arrival, host)`` pairs it replaced, ties at each place too."""
    from obshub.streams.analysis.straggler import _order_stats

    rnd = random.Random(7)
    for _ in range(400):
        hosts = rnd.sample([f"n{i:02d}" for i in range(40)], rnd.randint(2, 9))
        arr = {h: (rnd.choice((0, 5, 5, 9, 9, rnd.randrange(100))), 0) for h in hosts}
        order = sorted((v[0], h) for h, v in arr.items())
        n = len(order)
        med = order[n // 2][0] if n % 2 else (order[n // 2 - 1][0] + order[n // 2][0]) // 2
        assert _order_stats(arr) == (order[0][1], order[-2][1], order[-1][1], med), arr


def test_each_hosts_latest_rank_and_clock_uncertainty_per_rank():
    """``_latest_of_hosts`` (a reshape when every host has as many ranks, else per host) gives each host's
    one latest rank, -1 on a tie at the top; ``_unit_unc`` the larger of the rank's and its host's clock
    uncertainty, exact beyond int64 too."""
    rnd = random.Random(3)
    for sizes in ([4] * 6, [1, 8, 2, 8, 3]):
        spans, start = [], 0
        for i, m in enumerate(sizes):
            spans.append((f"h{i}", start, start + m, None))
            start += m
        for _ in range(50):
            late = [rnd.choice((0, 0, 7, 9, 9)) for _ in range(start)]
            want = []
            for _h, s, e, _t in spans:
                lt = late[s:e]
                want.append(s + lt.index(max(lt)) if lt.count(max(lt)) == 1 else -1)
            assert R._latest_of_hosts(late, spans) == want
        hus = [rnd.choice((0, 10, 2**70)) for _ in sizes]
        us = [rnd.choice((0, 5, 20)) for _ in range(start)]
        want_u = [max(u, hus[i]) for i, (_h, s, e, _t) in enumerate(spans) for u in us[s:e]]
        assert R._unit_unc(us, hus, spans) == want_u
        hus = [rnd.choice((0, 10)) for _ in sizes]
        want_u = [max(u, hus[i]) for i, (_h, s, e, _t) in enumerate(spans) for u in us[s:e]]
        assert R._unit_unc(us, hus, spans) == want_u
