"""Typed accumulators (issue #29 item 5): the host accumulators, rank rows, rank tables, part messages and
``parts`` entries are msgspec Structs (``streams.accumulate``). Nothing a summary says may change, and a
worker must read what today's dict-form code wrote. The golden files were written by the dict-form code
(main ``a87518b``, before the change, by ``data/typed_golden.py``):

- ``typed_summaries.msgpack.z``: the summaries of three generated jobs (one, four and eight ranks per
  host; sched, network and memory stragglers) at a fixed clock;
- ``typed_old_changelog.msgpack.z``: every table's changelog records of a worker with three steps open
  (packed rank rows, dict form), the held batches and the summaries that worker wrote after them;
- ``typed_old_parts.msgpack.z``: the internal messages (dict-form ``part`` messages) of a few batches."""

from __future__ import annotations

import pathlib
import zlib

import msgspec
import pytest

from obshub.core import schema
from obshub.streams import accumulate, synthetic, wire
from obshub.streams.inproc import ChangelogDict, InProcess

DATA = pathlib.Path(__file__).parent / "data"
NOW = 1_780_000_000_000_000_000


def _clock() -> int:
    return NOW


def _golden(name: str):
    return wire.unpackb(zlib.decompress((DATA / name).read_bytes()))


def _old_changelog_scenario() -> synthetic.Scenario:
    return synthetic.Scenario(job="old", hosts=8, steps=3, straggler=3, guilty_steps=(1, 2), guilty_layer="sched")


def test_summaries_of_generated_steps_are_byte_identical_to_the_dict_form_codes():
    from tests.streams.data.typed_golden import generated_summaries  # what wrote the golden file

    got = generated_summaries(_clock)
    want = zlib.decompress((DATA / "typed_summaries.msgpack.z").read_bytes())
    assert len(got) == 28 and any(s["straggler"] for s in got)
    assert wire.packb(got) == want


def test_a_worker_restarted_on_a_dict_form_changelog_summarises_as_the_old_worker_did():
    old = _golden("typed_old_changelog.msgpack.z")
    tables = {}
    for name, log in old["logs"].items():
        t = ChangelogDict()
        t.log = dict(log)
        tables[name] = t.recovered()
    # the recovered parts records are in the dict form (host -> {"acc": {...}, "bids", "q"})
    rec = next(v for v in tables["parts"].values() if v)
    assert isinstance(next(iter(rec.values()))["acc"], dict)
    pipe = InProcess(partitions=1, clock=_clock, tables=tables)
    pipe.offset = len(synthetic.generate_ranks(_old_changelog_scenario(), 4)) - len(old["last"])
    for raw in old["last"]:
        pipe.feed(raw)
    pipe.close_all()
    assert [s["step"] for s in pipe.summaries] == [0, 1, 2]
    assert pipe.summaries[1]["straggler"]["host"] == "node0"
    assert wire.packb(pipe.summaries) == wire.packb(old["summaries"])


def test_dict_form_part_messages_fold_as_typed_ones():
    msgs = _golden("typed_old_parts.msgpack.z")
    old = [accumulate.decode_internal(m) for m in msgs]
    assert any(isinstance(v, dict) and v.get("t") == "part" and isinstance(v["acc"], dict) for v in old)
    scn = _old_changelog_scenario()
    new_pipe = InProcess(partitions=1, clock=_clock)
    typed = []
    for _k, b in synthetic.generate_ranks(scn, 4)[:-1]:
        typed.extend(wire.packb(v) for v, _p in new_pipe.parts_of(schema.encode_batch(b)))
    assert any(isinstance(accumulate.decode_internal(m), accumulate.PartMsg) for m in typed)
    outs = []
    for raws in (msgs, typed):
        pipe = InProcess(partitions=1, clock=_clock)
        pipe._apply({"t": "batch", "msgs": raws}, 0)
        pipe.close_all()
        outs.append(wire.packb(pipe.summaries))
    assert outs[0] == outs[1] and len(outs[0]) > 1000


def test_typed_records_round_trip_and_reject_what_is_not_an_accumulator():
    acc = accumulate.new_acc("n1", 1)
    acc.layers["sched"] = [5, 1, 5]
    acc.colls["0#1"] = ["all_reduce", 10, 20, 10]
    acc.ranks = {"3": accumulate.new_rank_row(1003, 1)}
    accumulate.pack_ranks(acc)
    m = accumulate.PartMsg(job="j", step=4, host="n1", bid="a:1", acc=acc, q={"lost_batches": 2})
    raw = wire.packb(m)
    assert wire.unpackb(raw)["t"] == "part" and isinstance(wire.unpackb(raw)["acc"], list)  # an array
    assert m["t"] == m.get("t") == "part" and m.get("colour", 1) == 1  # the dict form's tag, for tools
    back = accumulate.decode_internal(raw)
    assert back == m and accumulate.rank_rows(back.acc)["3"].pid == 1003
    # the dict form converts to the same record; the array form a changelog gives back too
    assert accumulate.as_acc(msgspec.to_builtins(acc)) == acc
    assert accumulate.as_entry(wire.unpackb(wire.packb(accumulate.PartEntry(acc=acc, bids=["a:1"])))).acc == acc
    with pytest.raises(TypeError, match="HostAcc, a dict or a list"):
        accumulate.as_acc("acc")
    with pytest.raises(msgspec.ValidationError, match=r"\$\[0\]"):
        accumulate.as_acc(["not a count of events"])
    with pytest.raises(KeyError, match="no field 'colour'"):
        acc["colour"] = 1


def test_a_message_the_fold_cannot_read_is_handed_to_on_error_and_the_others_still_apply():
    scn = _old_changelog_scenario()
    pipe = InProcess(partitions=1, clock=_clock)
    failed = []
    pipe.fold.on_error = lambda value, exc: failed.append((value, type(exc).__name__))
    good = []
    for _k, b in synthetic.generate_ranks(scn, 4):
        good.extend(wire.packb(v) for v, _p in pipe.parts_of(schema.encode_batch(b)))
    bad_acc = wire.packb({"t": "part", "job": "old", "step": 1, "host": "node0", "bid": "x:1", "acc": ["no"], "q": {}})
    pipe._apply({"t": "batch", "msgs": [b"\xc1", *good[:3], bad_acc, *good[3:]]}, 0)
    pipe.close_all()
    assert failed == [(b"\xc1", "DecodeError"), (bad_acc, "ValidationError")]
    assert [s["step"] for s in pipe.summaries] == [0, 1, 2]
