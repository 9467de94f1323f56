"""Packed rank rows, the second level of the two-level join (docs/ARCHITECTURE.md, docs/STREAMS.md "parts"):
the ingest sends each host's rank rows as one msgpack blob plus a compact rank table
(``accumulate.pack_ranks``), and the close reads the table. Nothing a summary says may change: the views,
the named ranks and the rank rows of packed accumulators equal those of full rows (ties, ranks that missed
a collective and irregular rows included), packed parts merge like full ones, and a worker restarted on a
changelog of full rows (an older worker's parts) summarises a multi-rank job as the offline reference."""

from __future__ import annotations

import copy
import random

from obshub.core import schema
from obshub.streams import accumulate, offline, synthetic
from obshub.streams.analysis import ranks as R
from obshub.streams.inproc import InProcess


def _accs(hosts: int, per_host: int, seed: int) -> dict[str, dict]:
    """Host accumulators of ``hosts`` x ``per_host`` ranks, three collectives, arrivals on a coarse grid
    (many ties), clock uncertainties per host and rank, ranks that never reached a collective or have no
    step time yet."""
    rnd = random.Random(seed)
    accs = {}
    for h in range(hosts):
        rows = {}
        for lr in range(per_host):
            colls = {}
            for k in range(3):
                if k == 2 and rnd.random() < 0.2:
                    continue
                t = 1_000_000 * k + rnd.choice((0, 0, 10_000, 20_000, 50_000, 400_000))
                arrive = None if rnd.random() < 0.05 else t
                colls[f"0#{k}"] = ["all_reduce", arrive, t + 90_000, 90_000 - (t % 1_000_000)]
            row = accumulate.new_rank_row(1000 + lr, lr)
            row.update(
                step_ns=rnd.choice((900_000, 950_000, None)),
                unc_ns=rnd.choice((0, 5_000, 20_000)),
                colls=colls,
                gpu=rnd.choice((-1, lr)),
            )
            row["layers"] = {"sched": [rnd.randrange(10**6), 3, 10]}
            rows[str(h * per_host + lr)] = row
        acc = accumulate.new_acc(f"n{h:03d}", h)
        acc.update(unc_ns=rnd.choice((0, 10_000)), ranks=rows, step_ns=950_000)
        acc["colls"] = {k: ["all_reduce", 0, 90_000, 90_000] for k in ("0#0", "0#1", "0#2")}
        accs[f"n{h:03d}"] = acc
    return accs


def _packed(accs: dict[str, dict]) -> dict[str, dict]:
    return {h: accumulate.pack_ranks(copy.deepcopy(a)) for h, a in accs.items()}


def _plain(view: dict[str, dict]) -> dict[str, dict]:
    """A host view without the packed fields (what the analysis reads is compared)."""
    return {h: {k: v for k, v in a.items() if k not in ("ranks", "rb", "rt")} for h, a in view.items()}


def test_packed_rank_rows_give_the_same_views_named_ranks_and_rows_as_full_rows():
    for seed in range(8):
        full = _accs(9, 4, seed)
        packed = _packed(full)
        assert all("ranks" not in a and isinstance(a["rb"], bytes) and a["rt"] for a in packed.values())
        assert {h: accumulate.rank_rows(a) for h, a in packed.items()} == {h: a["ranks"] for h, a in full.items()}
        assert R.rank_units(packed) == R.rank_units(full)
        for strict in (False, True):
            assert _plain(R.host_view(packed, strict)) == _plain(R.host_view(full, strict))
        assert [accumulate.ranks_ended(a) for a in packed.values()] == [
            sum(1 for r in a["ranks"].values() if r["step_ns"] is not None) for a in full.values()
        ]
        assert R.host_ranks(packed) == R.host_ranks(full)
        # the late_ns of every rank row is the per-collective reference's, whichever form
        late, _last = R.rank_lateness(R.rank_units(full))
        rows = R.host_ranks(packed)
        assert {R.unit_key(h, r): row["late_ns"] for h, v in rows.items() for r, row in v["rows"].items()} == late
        lean = R.host_ranks(packed, layers_for=set(), rows_for=set())
        kept = {"n002", "n007"}
        R.fill_rows(lean, packed, kept)
        R.fill_layers(lean, packed, kept)
        assert {h: lean[h]["rows"] for h in kept} == {h: rows[h]["rows"] for h in kept}
        assert {h: v["rank"] for h, v in lean.items()} == {h: v["rank"] for h, v in rows.items()}


def test_a_wide_steps_named_ranks_are_read_without_building_their_entries():
    """``LazyNamed.rank_of`` (the summary's evidence names the rank of hundreds of hosts): the rank each
    built entry names, ties included, None for a host without an entry, and no entry built by the read;
    the rows built later are Python ints read from the packed columns, as the full rows give them."""
    for seed in range(8):
        full = _accs(9, 4, seed)
        packed = _packed(full)
        solo = accumulate.new_acc("solo", 99)
        solo.update(rank=[77, 0, 4242])  # one known rank, no table
        packed["solo"] = solo
        lazy = R.host_ranks(packed, layers_for=set(), rows_for=set())
        assert isinstance(lazy, R.LazyNamed)
        got = {h: lazy.rank_of(h) for h in [*packed, "nobody"]}
        assert len(lazy._built) == 1  # the host without a table only: nothing built by rank_of
        assert got == {**{h: v["rank"] for h, v in R.host_ranks(full).items()}, "solo": 77, "nobody": None}
        eager = R.host_ranks(packed, layers_for=set(), rows_for=set())
        assert {h: eager[h]["rank"] for h in packed} == {h: got[h] for h in packed}
        R.fill_rows(eager, packed, set(full))
        rows = {h: eager[h]["rows"] for h in full}
        assert rows == {
            h: {r: dict(row, layers={}) for r, row in v["rows"].items()} for h, v in R.host_ranks(full).items()
        }
        assert {type(row[f]) for v in rows.values() for row in v.values() for f in ("pid", "local_rank", "gpu")} == {
            int
        }


def test_a_rank_row_the_table_cannot_stand_for_is_read_from_its_rows():
    """A rank's record of a collective with another op than its host's: no table (``rt`` None), and every
    reader falls back to the decoded rows, with the same results."""
    full = _accs(5, 3, 1)
    full["n001"]["ranks"]["4"]["colls"]["0#1"][0] = "broadcast"
    packed = _packed(full)
    assert packed["n001"]["rt"] is None and packed["n000"]["rt"] is not None
    assert R.host_ranks(packed) == R.host_ranks(full)
    for strict in (False, True):
        assert _plain(R.host_view(packed, strict)) == _plain(R.host_view(full, strict))
    assert accumulate.rank_count(packed["n001"]) == 3


def test_packed_parts_merge_as_full_rows_do_an_older_workers_included():
    """Two parts of one host-step (a rank's collective begins in one batch and ends in the next, a rank
    appears in the second only): packed, full (an older worker's changelog) and mixed merges give the
    same rows, and a packed result carries the table of its merged rows."""
    for seed in range(6):
        a = _accs(1, 4, seed)["n000"]
        b = _accs(1, 4, seed + 100)["n000"]
        b["ranks"]["4"] = b["ranks"].pop("3")  # a rank the first part has not seen
        b["colls"]["0#3"] = ["all_reduce", 5, 6, 1]  # and a collective
        b["ranks"]["4"]["colls"]["0#3"] = ["all_reduce", 7, 9, 2]
        for r in a["ranks"].values():  # arrivals in the first part, the ends in the second
            for c in r["colls"].values():
                c[2] = c[3] = None
        want = accumulate.merge(copy.deepcopy(a), copy.deepcopy(b))
        for into, part in (
            (accumulate.pack_ranks(copy.deepcopy(a)), accumulate.pack_ranks(copy.deepcopy(b))),
            (copy.deepcopy(a), accumulate.pack_ranks(copy.deepcopy(b))),  # an older worker's entry
            (accumulate.pack_ranks(copy.deepcopy(a)), copy.deepcopy(b)),  # an older worker's part
        ):
            got = accumulate.merge(into, part)
            assert "ranks" not in got and accumulate.rank_rows(got) == want["ranks"]
            assert got["rt"] == accumulate.rank_table_of(want["colls"], want["ranks"])
            assert {k: v for k, v in got.items() if k not in ("rb", "rt")} == {
                k: v for k, v in want.items() if k != "ranks"
            }
    # a part without rank rows or new collectives leaves the packed table as it is
    a = accumulate.pack_ranks(_accs(1, 4, 0)["n000"])
    rt = a["rt"]
    accumulate.merge(a, accumulate.new_acc("n000", 0))
    assert a["rt"] is rt


def _multi_rank_msgs(scn: synthetic.Scenario, per_host: int) -> list[bytes]:
    return [schema.encode_batch(b) for _k, b in synthetic.generate_ranks(scn, per_host)]


def _reference(scn: synthetic.Scenario, per_host: int) -> dict[int, dict]:
    return {
        step: s
        for (_j, step), s in offline.summarize_batches(b for _k, b in synthetic.generate_ranks(scn, per_host)).items()
    }


# what the offline reference and the worker may differ in, rank rows or not: the worker's own fields and what
# depends on the order steps close in (the baseline history; test_streams_fold.py compares the same way)
_ORDER = ("closed_at_ns", "closed_by", "world_size", "baseline", "stall", "stall_ratio", "evidence", "culprit")


def _same(got: list[dict], want: dict[int, dict], skip: tuple[str, ...] = _ORDER) -> None:
    assert sorted(s["step"] for s in got) == sorted(want)
    for s in got:
        w = want[s["step"]]
        assert {k: v for k, v in s.items() if k not in skip} == {k: v for k, v in w.items() if k not in skip}, s["step"]


def _worker(msgs: list[bytes], packed: bool, monkeypatch, every: int = 5) -> list[dict]:
    with monkeypatch.context() as m:
        if not packed:
            m.setattr(accumulate, "pack_ranks", lambda acc: acc)  # an older worker's ingest: full rank rows
        pipe = InProcess(partitions=2)
        for i in range(0, len(msgs), every):
            pipe.feed_round(msgs[i : i + every])
        pipe.close_all()
    return pipe.summaries


def test_a_multi_rank_job_through_the_worker_summarises_as_with_full_rank_rows(monkeypatch):
    """3 hosts x 4 ranks, rank 6 slowed, in rounds: the worker with packed parts gives every summary field
    of the worker with full rank rows (evidence, culprit, baseline included), and the offline
    reference's straggler, blame, layers and rank rows."""
    scn = synthetic.Scenario(hosts=12, steps=16, straggler=6, guilty_steps=(9, 10, 11), guilty_layer="sched")
    msgs = _multi_rank_msgs(scn, 4)
    got = _worker(msgs, True, monkeypatch)
    _same(got, {s["step"]: s for s in _worker(msgs, False, monkeypatch)}, skip=("closed_at_ns",))
    _same(got, _reference(scn, 4))
    assert {s["step"]: s["straggler"]["rank"] for s in got if s["straggler"]} == {9: 6, 10: 6, 11: 6}


def test_a_worker_restarted_on_an_older_workers_changelog_summarises_as_before(monkeypatch):
    """An older worker (parts with full rank rows) folds the first half of a multi-rank job's batches; a
    new one restarts on its changelogs and folds the rest (packed parts merging into full entries): the
    summaries are those of the older worker alone, field for field."""
    scn = synthetic.Scenario(hosts=12, steps=12, straggler=6, guilty_steps=(7, 8), guilty_layer="sched")
    msgs = _multi_rank_msgs(scn, 4)
    half = len(msgs) // 2 + 1  # mid-step: some host-steps have parts of both formats
    with monkeypatch.context() as m:
        m.setattr(accumulate, "pack_ranks", lambda acc: acc)  # the older worker's ingest
        old = InProcess(partitions=2)
        for i in range(0, half, 3):
            old.feed_round(msgs[i : min(i + 3, half)])
    assert any("ranks" in e["acc"] for rec in old.tables["parts"].values() for e in rec.values())
    new = old.restarted()
    for i in range(half, len(msgs), 3):
        new.feed_round(msgs[i : i + 3])
    new.close_all()
    _same(
        old.summaries + new.summaries, {s["step"]: s for s in _worker(msgs, False, monkeypatch, 3)}, ("closed_at_ns",)
    )
    assert {s["step"]: s["straggler"]["rank"] for s in new.summaries if s["straggler"]} == {7: 6, 8: 6}


def test_a_wide_multi_rank_step_keeps_the_same_rank_rows(monkeypatch):
    """66 hosts x 2 ranks (wider than ``compact.FULL_ROWS``: the close names each host's rank from the
    table and fills the rank rows of the hosts the summary keeps): the same summaries as with full rows."""
    scn = synthetic.Scenario(hosts=132, steps=7, straggler=41, guilty_steps=(5, 6), guilty_layer="sched")
    msgs = _multi_rank_msgs(scn, 2)
    got = _worker(msgs, True, monkeypatch, 40)
    _same(got, {s["step"]: s for s in _worker(msgs, False, monkeypatch, 40)}, skip=("closed_at_ns",))
    assert {s["step"]: (s["straggler"]["host"], s["straggler"]["rank"]) for s in got if s["straggler"]} == {
        5: ("node20", 41),
        6: ("node20", 41),
    }
    assert got[6]["ranks"] and len(got[6]["ranks"]) < 66


def _listed(accs: dict[str, dict]) -> dict[str, dict]:
    """``accs`` with every rank table's columns as int lists: the form tables had before the packed
    columns (an older worker's parts and changelogs)."""
    out = copy.deepcopy(accs)
    for a in out.values():
        if a.get("rt") is not None:
            a["rt"] = accumulate.table_lists(a["rt"])
    return out


def test_rank_tables_of_int_lists_read_as_packed_ones():
    """The rank table's integer columns travel packed (little-endian int64 bytes, None as the mark); a table
    of int lists (written before) gives the same views, named ranks, rows and counts, and a table with a
    value int64 cannot hold stays a table of lists (read exactly, as before)."""
    for seed in range(8):
        full = _accs(6, 4, seed)
        packed = _packed(full)
        assert all(accumulate.is_packed(a["rt"]) for a in packed.values())
        assert all(type(a["rt"].a) is bytes and len(a["rt"].a) == 8 * 4 * 3 for a in packed.values())
        listed = _listed(packed)
        assert not any(isinstance(a["rt"].a, bytes) for a in listed.values())
        assert R.host_ranks(listed) == R.host_ranks(packed) == R.host_ranks(full)
        for strict in (False, True):
            assert _plain(R.host_view(listed, strict)) == _plain(R.host_view(packed, strict))
        for h in full:
            assert accumulate.ranks_ended(listed[h]) == accumulate.ranks_ended(packed[h])
            assert accumulate.rank_count(listed[h]) == accumulate.rank_count(packed[h]) == 4
        mixed = dict(packed, **{h: listed[h] for h in list(listed)[::2]})  # some hosts of each form
        assert R.host_ranks(mixed) == R.host_ranks(full)
    full = _accs(4, 3, 1)
    full["n001"]["ranks"]["3"]["pid"] = 2**63  # beyond int64: that table keeps lists
    packed = _packed(full)
    assert not accumulate.is_packed(packed["n001"]["rt"]) and accumulate.is_packed(packed["n000"]["rt"])
    assert R.host_ranks(packed) == R.host_ranks(full)
    assert accumulate.pack_column([1, None, -(2**63)]) is None  # the mark itself cannot be packed
    assert accumulate.column(accumulate.pack_column([5, None, -7])) == [5, None, -7]


def test_a_worker_restarted_on_a_changelog_of_int_list_tables_summarises_as_before(monkeypatch):
    """An older worker whose ingest wrote rank tables of int lists folds the first half of a multi-rank
    job's batches; a new one (packed columns) restarts on its changelogs and folds the rest: every summary
    is the older worker's alone, field for field."""
    scn = synthetic.Scenario(hosts=12, steps=12, straggler=6, guilty_steps=(7, 8), guilty_layer="sched")
    msgs = _multi_rank_msgs(scn, 4)
    half = len(msgs) // 2 + 1  # mid-step: some host-steps have parts of both forms
    with monkeypatch.context() as m:
        m.setattr(accumulate, "packed_table", lambda t: t)  # the older ingest: tables of int lists
        old = InProcess(partitions=2)
        for i in range(0, half, 3):
            old.feed_round(msgs[i : min(i + 3, half)])
        with monkeypatch.context():
            alone = InProcess(partitions=2)
            for i in range(0, len(msgs), 3):
                alone.feed_round(msgs[i : i + 3])
            alone.close_all()
    entries = [e for rec in old.tables["parts"].values() for e in rec.values()]
    assert entries and all(type(e["acc"]["rt"].a) is list for e in entries if e["acc"].get("rt") is not None)
    new = old.restarted()
    for i in range(half, len(msgs), 3):
        new.feed_round(msgs[i : i + 3])
    new.close_all()
    _same(old.summaries + new.summaries, {s["step"]: s for s in alone.summaries}, ("closed_at_ns",))
    assert {s["step"]: s["straggler"]["rank"] for s in new.summaries if s["straggler"]} == {7: 6, 8: 6}


def test_ranks_ended_counts_the_mark_only_where_a_value_is_it():
    """``ranks_ended`` reads a packed step column without unpacking it when the mark's 8 bytes occur
    nowhere (the fold asks it for each of a wide step's parts): a column whose bytes hold the mark's bytes
    across two values (no value None) still counts every rank, and one with a None counts the others."""
    mark = accumulate.PACKED_NONE.to_bytes(8, "little", signed=True)
    straddle = [5, int.from_bytes(mark[4:] + b"\x01\x00\x00\x00", "little", signed=True), 7]  # mark at byte 4
    col = accumulate.pack_column(straddle)
    assert col is not None and mark in col and col.index(mark) % 8 != 0
    cases = [(straddle, 3), ([5, None, 7], 2), ([None, None], 0), ([900, 950], 2), ([], 0)]
    for values, ended in cases:
        packed = accumulate.pack_column(values)
        assert packed is not None
        for s in (packed, values):  # packed, and the int list form of an older worker's table
            acc = accumulate.new_acc("h", 0)
            acc.rb = b"\x90"
            acc.rt = accumulate.RankTable(s=s)
            assert accumulate.ranks_ended(acc) == ended, (values, type(s).__name__)


def test_parts_records_are_cut_as_their_entries_estimate_says():
    """``parts`` records are cut at ``PART_RECORD_MAX`` hosts or about ``PART_RECORD_BYTES`` by
    ``_entry_bytes`` (the fold's ``_chunks`` computes it inline for a packed entry): the same records
    as the estimate gives, for packed entries, entries with full rank rows and the dict form."""
    from obshub.streams import fold as F

    accs = _accs(40, 4, seed=3)
    packed = _packed(accs)
    entries: dict = {}
    for i, (h, a) in enumerate(sorted(packed.items())):
        if i % 5 == 1:
            a = accs[h]  # full rank rows
        e = accumulate.PartEntry(acc=a, bids=[f"a:{j}" for j in range(1 + i % 3)], q={})
        entries[h] = accumulate.to_dict(e) if i % 7 == 3 else e
    for max_hosts, max_bytes in ((256, 4 * 1024 * 1024), (6, 10**9), (256, 20_000), (256, 1)):
        want, chunk, size = [], {}, 0
        for h, e in entries.items():
            b = F._entry_bytes(e)
            if chunk and (len(chunk) >= max_hosts or size + b > max_bytes):
                want.append(chunk)
                chunk, size = {}, 0
            chunk[h] = e
            size += b
        want.append(chunk)
        old = (F.PART_RECORD_MAX, F.PART_RECORD_BYTES)
        F.PART_RECORD_MAX, F.PART_RECORD_BYTES = max_hosts, max_bytes
        try:
            got = list(F._chunks(entries))
        finally:
            F.PART_RECORD_MAX, F.PART_RECORD_BYTES = old
        assert [list(c) for c in got] == [list(c) for c in want], (max_hosts, max_bytes)
