"""The column-wise close of a wide step (issue #30 item 4, docs/ARCHITECTURE.md "Stream processing") gives
every summary byte for byte as the per-host close it replaced: the layer table held per layer
(``analysis.LayerColumns``: rows built only for the hosts a summary keeps, the job-wide statistics from the
columns), the host view's collective records read without copying the accumulators (``view_colls``) and
each host's named rank built when read (``ranks.LazyNamed``). The reference is the same worker with those
three switched back to the per-host forms (a layer row per host, a host view copied per host, an entry per
host), on wide steps of one and several ranks per host, of every guilty layer, and on random layer tables
with missing layers, ties and hosts without a compute time."""

from __future__ import annotations

import json
import random

import pytest

from obshub.core import schema
from obshub.streams import accumulate, compact, synthetic
from obshub.streams.analysis import ranks as R
from obshub.streams.analysis import straggler as S
from obshub.streams.analysis.evidence import Baseline, evidence
from obshub.streams.analysis.thresholds import Thresholds
from obshub.streams.inproc import InProcess

summary_mod = __import__("obshub.streams.analysis.summary", fromlist=["summarize"])


def _per_host(m: pytest.MonkeyPatch) -> None:
    """The close as it was before the columns: a dict row per host, a copied host view, every entry."""
    m.setattr(summary_mod, "layers_of", lambda accs, wide, vc=None, cols=None: S.layer_table(accs, vc))
    m.setattr(summary_mod, "view_columns", lambda accs: ({h: a.colls for h, a in R.host_view(accs).items()}, None))
    real = R.host_ranks

    def every_entry(accs, th=Thresholds(), layers_for=None, rows_for=None):
        if rows_for is not None and not rows_for:
            rows_for = {"\0"}  # no such host: each host gets its named rank's entry at once
        return real(accs, th, layers_for, rows_for)

    m.setattr(summary_mod, "host_ranks", every_entry)


def _run(msgs: list[bytes], every: int) -> list[str]:
    pipe = InProcess(partitions=2, clock=lambda: 1)
    for i in range(0, len(msgs), every):
        pipe.feed_round(msgs[i : i + every])
    pipe.close_all()
    return [json.dumps(s) for s in pipe.summaries]


@pytest.mark.parametrize(
    ("hosts", "per_host", "layer"),
    [(80, 1, "sched"), (80, 1, "memory"), (72, 1, "network"), (72, 1, "cuda"), (68, 2, "sched"), (66, 3, "memory")],
)
def test_a_wide_step_summarises_byte_for_byte_as_the_per_host_close(monkeypatch, hosts, per_host, layer):
    n = hosts * per_host  # the scenario's hosts are ranks when several share a host
    scn = synthetic.Scenario(
        job=f"cols-{layer}", hosts=n, steps=9, straggler=n // 3, guilty_steps=(6, 7, 8), guilty_layer=layer
    )
    gen = synthetic.generate(scn) if per_host == 1 else synthetic.generate_ranks(scn, per_host)
    msgs = [schema.encode_batch(b) for _k, b in gen]
    got = _run(msgs, 37)
    with monkeypatch.context() as m:
        _per_host(m)
        want = _run(msgs, 37)
    assert len(got) == scn.steps and got == want
    assert any(json.loads(s)["layers_omitted"] > 0 for s in got)  # wide: compacted


def _random_accs(seed: int) -> dict:
    """Host accumulators of a wide step with random layers (some missing on some hosts, many ties), hosts
    without a step time (phases instead, or nothing), collectives with and without ends."""
    rnd = random.Random(seed)
    accs = {}
    for h in rnd.sample(range(400), rnd.randint(65, 140)):
        acc = accumulate.new_acc(f"n{h:03d}", h)
        acc.layers = {
            layer: [rnd.choice((0, 5, 5, 1_000, rnd.randrange(10**7))), rnd.choice((0, 1, 3, 3, 40)), rnd.randrange(9)]
            for layer in ("sched", "memory", "cuda", "network", "pytorch", "nic")
            if rnd.random() < 0.7
        }
        acc.colls = {}
        for k in range(rnd.randint(0, 4)):
            t = 10**9 + rnd.choice((0, 0, 7, 500_000, rnd.randrange(10**6)))
            end = rnd.choice((None, t + 2_000, t + 3 * 10**6, t + 3 * 10**6))
            acc.colls[f"0#{k}"] = ["all_reduce", t, end, rnd.choice((None, 5_000, 2 * 10**6))]
        kind = rnd.random()
        acc.step_ns = rnd.choice((9 * 10**6, 10**7, 12 * 10**6)) if kind < 0.8 else None
        if 0.8 <= kind < 0.9:
            acc.phases = {"forward": rnd.randrange(10**7)}
        accs[acc.host] = acc
    return dict(sorted(accs.items()))


def test_a_wide_collective_read_with_numpy_equals_the_per_host_records(monkeypatch):
    """``collectives`` of 60 random wide steps (ties at the first, second and last arrival, unknown ends
    and durations, pairing checks that fail): the numpy path gives the per-host records' results."""
    th = Thresholds()
    failed = wide = 0
    for seed in range(60):
        accs = _random_accs(seed)
        got = S.collectives(accs, th)
        with monkeypatch.context() as m:
            m.setattr(S, "WIDE_COLLECTIVE", 10**9)
            want = S.collectives(accs, th)
        assert json.dumps(got) == json.dumps(want), seed
        failed += sum(not c["consistent"] for c in got)
        wide += sum(len(c["late"]) >= S.WIDE_COLLECTIVE for c in got)
    assert failed > 20 and wide > 60  # the pairing check fails often, the numpy path is taken


def test_the_layer_columns_read_as_the_layer_table():
    """Rows, layer statistics, outlier hosts, blame, straggler, lateness and evidence from the columns
    equal those from the dict table, on 60 random wide steps."""
    th = Thresholds()
    for seed in range(60):
        accs = _random_accs(seed)
        table = S.layer_table(accs)
        cols = S.LayerColumns(accs)
        assert dict(cols.items()) == table and list(cols) == list(table)
        assert all(json.dumps(cols[h]) == json.dumps(table[h]) for h in list(table)[::7]), seed
        assert compact.layer_stats(cols) == compact.layer_stats(table), seed
        colls = S.collectives(accs, th)
        summ = {"layers": table, "step_time_ns": {h: a.step_ns for h, a in accs.items() if a.step_ns is not None}}
        assert compact.outlier_hosts(dict(summ, layers=S.LayerColumns(accs))) == compact.outlier_hosts(summ), seed
        for host in list(accs)[:: max(1, len(accs) // 5)] + ["nobody"]:
            assert S.blame(host, S.LayerColumns(accs), 10**6, th) == S.blame(host, table, 10**6, th), (seed, host)
        assert S.find_straggler(accs, colls, S.LayerColumns(accs), th) == S.find_straggler(accs, colls, table, th)
        assert S.lateness(accs, [], S.LayerColumns(accs)) == S.lateness(accs, [], table), seed
        late = S.lateness(accs, colls, table)
        for spread in (10**5, 7, 3 * 10**6):  # clipped values, values rounded to 0, values in between
            bl = Baseline(10**7, 2 * 10**7, 20, spread)
            got = evidence(accs, late, S.LayerColumns(accs), bl, th)
            assert got == evidence(accs, late, table, bl, th), (seed, spread)
            assert got.hosts or not any(v > 0 for v in late.values()), (seed, spread)


def test_evidence_beyond_the_column_bound_takes_the_per_host_loop():
    """A wide step with a layer time or a lateness beyond ``2**59`` ns (a damaged clock) gives the same
    evidence from the columns as from the dict table: no int64 overflow in the column-wise sums."""
    th = Thresholds()
    bl = Baseline(10**7, 2 * 10**7, 20, 10**5)
    for seed, (time_ns, late_ns) in enumerate([(2**63, 10**6), (2**62, 2**62), (5, 2**62)]):
        accs = _random_accs(seed)
        h = next(iter(accs))
        for layer in ("sched", "memory", "cuda", "nic"):  # four excesses of 2**62: their sum beyond int64
            accs[h].layers[layer] = [time_ns, 1, 1]
        late = {g: (late_ns if g == h else 10**5 * (k % 3)) for k, g in enumerate(accs)}
        want = evidence(accs, late, S.layer_table(accs), bl, th)
        assert evidence(accs, late, S.LayerColumns(accs), bl, th) == want and h in want.hosts, seed


def test_a_memory_limit_culprit_reads_the_memory_column_as_the_layer_table():
    """``culprit._memory_at_limit`` on a wide step's columns (its memory column alone, no row built but the
    culprit's own) gives the dict table's result, on 60 random wide steps with one host at its limit or none."""
    import importlib

    culprit = importlib.import_module("obshub.streams.analysis.culprit")
    named = 0
    for seed in range(60):
        accs = _random_accs(seed)
        host = list(accs)[seed % len(accs)]
        if seed % 3:  # at the limit: 30 records, none like it elsewhere (a peer with 40 in every 6th)
            for h, acc in accs.items():
                if "memory" in acc.layers and (seed % 6 != 1 or h != list(accs)[-1]):
                    acc.layers["memory"][1] = min(acc.layers["memory"][1], 3)
            accs[host].layers["memory"] = [2_000_000, 30 + seed % 3, 100_000]
        cols = S.LayerColumns(accs)
        got = culprit._memory_at_limit({"layers": cols}, 10**8)
        assert got == culprit._memory_at_limit({"layers": S.layer_table(accs)}, 10**8), seed
        assert len(cols._rows) <= 1, seed  # the culprit's row alone was built
        named += got is not None
    assert named >= 20  # the limit is found on the columns too


def test_a_layers_culprit_reads_the_sched_and_memory_columns_as_the_layer_table():
    """``culprit._layer_culprit`` and ``_starved`` on a wide step's columns (no host's row built but the
    culprit's own) give the dict table's results, on 60 random wide steps, one host burst in most of them.
    Iterating the columns' rows built every host's: 65-75 ms of a 2,048 x 8 close whenever a step lost
    time with no straggler (bench.width steps 2 and 4, 2026-12-06)."""
    import importlib

    culprit = importlib.import_module("obshub.streams.analysis.culprit")
    named = starved = 0
    for seed in range(60):
        accs = _random_accs(seed)
        host = list(accs)[seed % len(accs)]
        if seed % 4:  # a burst: its run-queue (or reclaim) time far above every peer's
            layer = "sched" if seed % 4 != 3 else "memory"
            accs[host].layers[layer] = [400_000_000 + seed, 9, 10**6]
        lost = (300 + seed) * 10**6
        ev = {"spread_ns": 10**7, "hosts": {}}
        cols = S.LayerColumns(accs)
        table = S.layer_table(accs)
        got = culprit._layer_culprit({"layers": cols, "evidence": ev}, lost)
        assert got == culprit._layer_culprit({"layers": table, "evidence": ev}, lost), seed
        for h in (host, list(accs)[-1]):
            want = culprit._starved({"layers": table, "evidence": ev}, h, None, lost)
            assert culprit._starved({"layers": cols, "evidence": ev}, h, None, lost) == want, (seed, h)
            starved += want is not None
        assert len(cols._rows) <= 2, seed  # the culprit's row and the last host's alone were built
        named += got is not None
    assert named >= 40 and starved >= 20  # bursts are named, and starved, on the columns too


def test_each_hosts_named_rank_is_built_when_read_as_it_was_at_once():
    """``host_ranks`` of a wide step (no rows nor layers asked for) gives, host by host, the entry the
    per-host loop gave (named rank, its row, the pending rows), ties of lateness included."""
    from test_streams_packed_ranks import _accs, _packed  # noqa: PLC0415 (the same generated ranks)

    for seed in range(6):
        accs = _packed(_accs(70, 4, seed))
        lazy = R.host_ranks(accs, layers_for=set(), rows_for=set())
        eager = R.host_ranks(accs, layers_for=set(), rows_for={"\0"})
        assert isinstance(lazy, R.LazyNamed) and list(lazy) == list(eager)
        for h in eager:
            got, want = dict(lazy[h]), dict(eager[h])
            assert got.pop("_late")[2:4] == want.pop("_late")[2:4] and got == want, (seed, h)


def test_order_stats_from_an_array_equal_the_lists():
    """``_order_stats_arr`` (numpy sort) gives ``_order_stats_of``'s first, second-latest and last hosts and
    median on 400 random arrivals: ties at any of them (coarse grids), odd and even counts, 3 to 300 hosts."""
    import numpy as np  # noqa: PLC0415

    rnd = random.Random(7)
    ties = 0
    for _ in range(400):
        n = rnd.choice((3, 4, 5, 64, 65, 300))
        grid = rnd.choice((1, 3, 10**6))
        hs = [f"h{i:03d}" for i in rnd.sample(range(1000), n)]
        ts = [10**18 + rnd.randrange(grid) * 1_000 for _ in range(n)]
        got = S._order_stats_arr(hs, ts, np.array(ts, dtype=np.int64))
        assert got == S._order_stats_of(hs, ts), (hs, ts)
        ties += len(set(ts)) < n
    assert ties > 100  # the tie paths are taken


def test_the_collective_columns_read_as_the_per_host_records():
    """``view_columns``: the host view's records as ``view_colls`` gives them, and column-wise when every
    host has the same keys; ``collectives`` and ``compute_many`` read from the columns give the per-host
    records' results (unknown arrivals and durations, ties, three or more ranks); hosts of other keys, or
    a host of one rank, give no columns."""
    from test_streams_packed_ranks import _accs, _packed  # noqa: PLC0415 (the same generated ranks)

    th = Thresholds()
    seen = 0
    for seed in range(12):
        accs = _packed(_accs(70, 3 + seed % 3, seed))
        vc, cols = R.view_columns(accs)
        assert vc == R.view_colls(accs)
        if len({tuple(v) for v in vc.values()}) > 1:
            assert cols is None, seed
            continue
        seen += 1
        assert cols is not None and cols.hosts == list(accs)
        assert {k: list(v) for k, v in cols.recs.items()} == {k: [vc[h][k] for h in accs] for k in vc[cols.hosts[0]]}
        want = S.collectives(accs, th, vc)
        assert json.dumps(S.collectives(accs, th, vc, cols)) == json.dumps(want), seed
        hosts = sorted(accs)
        assert S.compute_many(accs, hosts, vc, cols) == S.compute_many(accs, hosts, vc), seed
        assert S.compute_many(accs, hosts[::-1], vc, cols) == S.compute_many(accs, hosts[::-1], vc), seed
        layered = S.LayerColumns(accs, vc, cols)
        assert layered.cells == S.LayerColumns(accs, vc).cells, seed
    assert seen >= 6
    accs = _packed(_accs(70, 3, 1))
    odd = next(iter(accs))
    one = _packed(_accs(1, 1, 1))["n000"]  # a host of one rank: its own records, not a rank table's
    assert R.view_columns({**accs, "zz": one})[1] is None
    accs[odd].rt.k = accs[odd].rt.k[::-1]
    accs[odd].rt.hv = accs[odd].rt.hv[::-1]
    assert R.view_columns(accs)[1] is None


def test_a_wide_steps_host_records_are_built_when_read():
    """``view_columns`` of hosts of the same collective keys: each host's records (``ranks.ViewColls``) are
    ``view_colls``' dict, built when first read and kept (the same object on the next read), in the
    accumulators' order; an unknown host raises KeyError. Hosts of other keys get the plain dicts."""
    from test_streams_packed_ranks import _accs, _packed  # noqa: PLC0415 (the same generated ranks)

    for seed in range(12):
        accs = _packed(_accs(70, 3 + seed % 3, seed))
        vc, cols = R.view_columns(accs)
        want = R.view_colls(accs)
        if cols is None:
            assert type(vc) is dict and vc == want, seed
            continue
        assert isinstance(vc, R.ViewColls) and list(vc) == list(accs) and len(vc) == len(accs), seed
        h = list(accs)[seed]
        assert vc[h] == want[h] and vc[h] is vc[h] and h in vc, seed
        assert dict(vc.items()) == want, seed
        assert "zz" not in vc
        with pytest.raises(KeyError):
            vc["zz"]


def test_the_layer_cells_keep_the_host_by_host_order_of_columns_and_hosts(monkeypatch):
    """``LayerColumns.cells`` is built column by column: the same columns, in the order a host-by-host pass
    meets them (each host's layers, then ``pytorch`` for a host with a compute time), each holding the
    same values in host order, whether a host lacks a layer, brings a layer no host before it had,
    carries a ``pytorch`` layer, has a compute time or none (a summary's JSON keeps this order)."""
    rnd = random.Random(11)
    names = ["sched", "network", "memory", "cuda", "pytorch"]
    for trial in range(40):
        accs, comps = {}, []
        for i in range(rnd.randrange(1, 30)):
            acc = accumulate.new_acc(f"h{i:02d}", i)
            picked = rnd.sample(names, rnd.randrange(0, len(names) + 1))
            acc.layers = {n: [rnd.randrange(10**6), rnd.randrange(5), rnd.randrange(10**5)] for n in picked}
            accs[acc.host] = acc
            comps.append(rnd.choice((None, rnd.randrange(10**6))) if trial % 4 else None)
        hosts = sorted(accs)
        monkeypatch.setattr(S, "compute_many", lambda a, h, c=None, k=None, comps=comps: comps)
        want: dict[str, dict] = {}  # the host-by-host pass
        for host, comp in zip(hosts, comps):
            for layer, v in accs[host].layers.items():
                want.setdefault(layer, {})[host] = v
            if comp is not None:
                col = want.setdefault("pytorch", {})
                have = col.get(host)
                col[host] = (comp, 0, 0) if have is None else (comp, have[1], have[2])
        got = S.LayerColumns(accs).cells
        assert list(got) == list(want), trial
        for layer in want:
            assert list(got[layer].items()) == list(want[layer].items()), (trial, layer)
