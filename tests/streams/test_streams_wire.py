"""The stream worker's decoder and codecs (no broker): the fast decoder accepts exactly what the reference
decoder accepts and returns the same batch, rejected input gets the reference's field-named error, the
inline reduction equals folding every event with ``add_event``, and the Faust codecs round-trip."""

from __future__ import annotations

import random

import msgpack
import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from obshub.core import schema
from obshub.core.schema import Batch, Clock, Event, Kind, SchemaError
from obshub.streams import accumulate, synthetic, wire


def _batch(**kw) -> Batch:
    ev = Event(Kind.STEP_END, 1000, 500, schema.make_trace_key(3, 7, 1), 7, 42, 43, -1, 7, {"phase": "x"})
    base = dict(
        job="j",
        host="node-003",
        host_id=3,
        agent_id="a1",
        seq=0,
        events=[ev],
        clock=Clock(10, 2, 37_000_000_000),
        sent_ns=5,
    )
    base.update(kw)
    return Batch(**base)


def _same(fast, ref: Batch) -> bool:
    return (
        (fast.job, fast.host, fast.host_id, fast.agent_id, fast.seq, fast.sent_ns, fast.v)
        == (ref.job, ref.host, ref.host_id, ref.agent_id, ref.seq, ref.sent_ns, ref.v)
        and (fast.clock.offset_ns, fast.clock.uncertainty_ns, fast.clock.tai_offset_ns)
        == (ref.clock.offset_ns, ref.clock.uncertainty_ns, ref.clock.tai_offset_ns)
        and [tuple(e) for e in fast.events] == [tuple(e) for e in ref.events]
    )


def _both(data: bytes):
    """(the worker's decoder's result or exception, the reference's result or exception). Checks on the way
    that whatever the msgspec pass accepts, the reference accepts too."""
    out = []

    def fast_pass(data):
        b = wire._batch_decoder.decode(data)
        if any(e.payload and schema.payload_type_error(e.kind, e.payload) for e in b.events):
            raise SchemaError("payload", "of the wrong type")
        return b

    for fn in (
        lambda: fast_pass(data),
        lambda: wire.decode_batch(data),
        lambda: schema.decode_batch(data),
    ):
        try:
            out.append(fn())
        except Exception as exc:  # noqa: BLE001 - what is raised is the point
            out.append(exc)
    fast, worker, ref = out
    assert isinstance(fast, Exception) or not isinstance(ref, Exception), (fast, ref)
    return worker, ref


def _agree(worker, ref) -> None:
    assert isinstance(worker, Exception) == isinstance(ref, Exception), (worker, ref)
    if isinstance(ref, Exception):
        assert type(worker) is SchemaError and str(worker) == str(ref) and worker.field == ref.field
    else:
        assert _same(worker, ref)


MUTATIONS = [
    lambda r: r.update(v=2),
    lambda r: r.update(v=True),
    lambda r: r.pop("v"),
    lambda r: r.update(host_id=70000),
    lambda r: r.update(host_id=-1),
    lambda r: r.update(job=5),
    lambda r: r.update(job=""),
    lambda r: r.update(host="x" * (schema.MAX_STR_LEN + 1)),
    lambda r: r.update(seq=-1),
    lambda r: r.pop("clock"),
    lambda r: r.update(extra=1),
    lambda r: r.update(clock={"offset_ns": 1}),
    lambda r: r.update(clock={"offset_ns": 1, "uncertainty_ns": -1}),
    lambda r: r.update(clock={"offset_ns": 1, "uncertainty_ns": 1, "other": 3}),  # accepted by both
    lambda r: r.update(events={}),
    lambda r: r.update(sent_ns=1.5),
    lambda r: r.update(seq=True),
    lambda r: r["events"][0].__setitem__(0, 250),
    lambda r: r["events"][0].__setitem__(0, True),
    lambda r: r["events"][0].__setitem__(3, -5),
    lambda r: r["events"][0].__setitem__(1, "x"),
    lambda r: r["events"][0].pop(),
    lambda r: r["events"][0].append(1),
    lambda r: r["events"][0].__setitem__(9, [1]),
    lambda r: r["events"][0].__setitem__(9, None),
    lambda r: r["events"][0].__setitem__(9, {str(i): i for i in range(schema.MAX_PAYLOAD_KEYS + 1)}),
    lambda r: r["events"][0].__setitem__(9, {"k": b"bytes"}),
    lambda r: r["events"][0].__setitem__(9, {"k": 1.5}),
    lambda r: r["events"][0].__setitem__(9, {"k": "v" * (schema.MAX_STR_LEN + 1)}),
    lambda r: r["events"][0].__setitem__(9, {"k" * (schema.MAX_STR_LEN + 1): 1}),
    lambda r: r["events"][0].__setitem__(4, -2),
    lambda r: r["events"][0].__setitem__(7, 65536),
    lambda r: r["events"][0].__setitem__(8, -(2**63)),
    lambda r: r["events"][0].__setitem__(6, 2**32),
    lambda r: r["events"][0].__setitem__(3, 2**64 - 1),
    lambda r: r["events"][0].__setitem__(2, 2**63),
]


@pytest.mark.parametrize("i", range(len(MUTATIONS)))
def test_fast_decoder_accepts_exactly_what_the_reference_accepts(i):
    raw = msgpack.unpackb(schema.encode_batch(_batch()))
    MUTATIONS[i](raw)
    data = msgpack.packb(raw)
    _agree(*_both(data))


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"\xc1",
        b"\x81",
        b"\xdd\xff\xff\xff\xff",
        b"\xc6\xff\xff\xff\xff",
        msgpack.packb([1, 2, 3]),
        msgpack.packb({1: 2}),
        schema.encode_batch(_batch()) + b"\x00",
        b"x" * (schema.MAX_BATCH_BYTES + 1),
    ],
)
def test_hostile_bytes_get_the_reference_error(data):
    with pytest.raises(SchemaError) as ei:
        wire.decode_batch(data)
    with pytest.raises(SchemaError) as ref:
        schema.decode_batch(data)
    assert str(ei.value) == str(ref.value)


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_fuzz_mutated_batches_agree(data):
    raw = bytearray(schema.encode_batch(_batch()))
    for _ in range(data.draw(st.integers(1, 5))):
        raw[data.draw(st.integers(0, len(raw) - 1))] = data.draw(st.integers(0, 255))
    _agree(*_both(bytes(raw)))


def test_every_single_byte_mutation_agrees():
    raw = schema.encode_batch(_batch())
    for i in range(len(raw)):
        for v in range(0, 256, 3):
            _agree(*_both(raw[:i] + bytes([v]) + raw[i + 1 :]))


def _random_batch(rng: random.Random) -> Batch:
    kinds = [k for k in Kind]
    events = []
    for _ in range(300):
        kind = rng.choice(kinds)
        step = rng.choice([-1, 4, 5, 6])
        payload = None
        if kind in (Kind.TCP_RTT, Kind.TCP_RETRANSMIT):
            payload = {"saddr": rng.choice(["10.0.0.1", "10.0.0.2", "::ffff:a00:3"]), "daddr": "10.0.0.9"}
        elif kind in (Kind.COLLECTIVE_BEGIN, Kind.COLLECTIVE_END):
            payload = {"pg": "0", "coll_seq": rng.randrange(4), "op": "allreduce"}
        elif kind == Kind.PHASE:
            payload = {"phase": rng.choice(schema.PHASES)}
        events.append(
            Event(
                int(kind),
                rng.randrange(1, 10**9),
                rng.randrange(0, 10**6),
                0,
                step,
                1,
                1,
                -1,
                rng.randrange(-3, 5),
                payload,
            )
        )
    return Batch("j", "h", 1, "a", 0, events, Clock(rng.randrange(10**6), 5, 0), 1)


#: the kinds without a TraceKey that ``reduce_batch`` charges to the step the host was in at their time
_CHARGED_BY_TIME = (
    Kind.TCP_RTT,
    Kind.TCP_RETRANSMIT,
    Kind.TCP_QUEUE,
    Kind.SKB_DROP,
    Kind.SCHED_RUNQ,
    Kind.SCHED_OFFCPU,
)


def _reference_reduce(batch) -> dict[int, dict]:
    """The definition: ``add_event`` on every event (with the step rules of ``reduce_batch``)."""
    import bisect

    out: dict[int, dict] = {}
    loose = 0
    stepped = sorted((e.ts_ns, e.step) for e in batch.events if e.step >= 0)
    for e in batch.events:
        if e.step < 0 and e.kind in _CHARGED_BY_TIME and stepped:
            i = bisect.bisect_right(stepped, (e.ts_ns, 1 << 62))
            e = e._replace(step=stepped[i - 1][1] if i else stepped[0][1])
        if e.step < 0:
            if e.kind == Kind.AGENT_LOSS:
                loose += max(0, e.value)
            continue
        acc = out.get(e.step)
        if acc is None:
            acc = out[e.step] = accumulate.new_acc(batch.host, batch.host_id)
            acc["unc_ns"] = batch.clock.uncertainty_ns
        accumulate.add_event(acc, e, batch.clock.offset_ns)
    if loose and out:
        out[min(out)]["ringbuf_lost"] += loose
    return out


@pytest.mark.parametrize("seed", range(20))
def test_inline_reduction_equals_add_event_on_every_event(seed):
    b = _random_batch(random.Random(seed))
    fast = wire.decode_batch(schema.encode_batch(b))
    assert accumulate.reduce_batch(fast) == _reference_reduce(b) == accumulate.reduce_batch(b)


def test_reduction_of_synthetic_runs_unchanged():
    for layer in synthetic.GUILTY_KINDS:
        scn = synthetic.Scenario(job="x", hosts=4, steps=12, straggler=1, guilty_steps=(3, 5), guilty_layer=layer)
        for _k, b in synthetic.generate(scn):
            assert accumulate.reduce_batch(wire.decode_batch(schema.encode_batch(b))) == _reference_reduce(b)


def test_codecs_round_trip_and_are_compact():
    from faust.serializers import codecs

    acc = accumulate.reduce_batch(_random_batch(random.Random(1)))
    value = {"acc": acc[4], "bids": ["a:1"], "q": {}}
    blob = codecs.dumps(wire.MSGPACK, value)
    plain = msgspec.to_builtins(value)  # the typed accumulator as msgpack writes it: an array
    assert codecs.loads(wire.MSGPACK, blob) == msgpack.unpackb(msgpack.packb(plain), strict_map_key=False)
    import json

    assert len(blob) < 0.8 * len(json.dumps(accumulate.to_dict(value)).encode())
    assert codecs.loads(wire.STR, codecs.dumps(wire.STR, "job|7|node-1")) == "job|7|node-1"


def test_changelog_values_are_msgpack_and_older_json_records_still_load():
    """Changelog values: the mark byte + msgpack (digest bytes come back as bytes); a value an older
    worker wrote in Faust's JSON loads as before; damaged bytes in either format load as Undecodable."""
    import json

    from faust.serializers import codecs

    value = {"bids": b"\x00\x01\xff" * 8, "late": 3, "q": {"lost": 0}, "hosts": ["node-1", "node-2"]}
    blob = codecs.dumps(wire.CHANGELOG, value)
    assert blob[:1] == wire.CHANGELOG_MARK and wire.unpackb(blob[1:]) == value
    assert codecs.loads(wire.CHANGELOG, blob) == value
    assert len(blob) < 0.7 * len(codecs.dumps(wire.CHANGELOG_JSON, value))
    assert codecs.loads(wire.CHANGELOG, codecs.dumps(wire.CHANGELOG, 7)) == 7  # a bare offset (``folded``)
    old = json.dumps({"late": 3, "q": {"lost": 0}}).encode()
    assert codecs.loads(wire.CHANGELOG, old) == {"late": 3, "q": {"lost": 0}}
    assert codecs.loads(wire.CHANGELOG, b"7") == 7  # JSON "7", not msgpack's 55
    for bad, why in ((b"\xc1\x93\x01", "not msgpack"), (b"{oops", "not JSON"), (b"\xff\xfe", "not UTF-8")):
        got = codecs.loads(wire.CHANGELOG, bad)
        assert isinstance(got, wire.Undecodable) and got.reason.startswith(why), (bad, got)


@pytest.mark.parametrize(
    "kind, payload, field, words",
    [
        (Kind.COLLECTIVE_BEGIN, {"pg": "0", "coll_seq": "x", "op": "allreduce"}, "payload.coll_seq", "an integer"),
        (Kind.COLLECTIVE_END, {"pg": 5, "coll_seq": 1, "op": "allreduce"}, "payload.pg", "a string"),
        (Kind.PHASE, {"phase": float("nan")}, "payload.phase", "a string"),
        (Kind.REGISTER, {"world_size": True, "job": "j"}, "payload.world_size", "an integer"),
    ],
)
def test_a_payload_value_of_the_wrong_type_is_refused_naming_the_key(kind, payload, field, words):
    ev = Event(kind, 1000, 0, schema.make_trace_key(3, 7, 1), 7, 42, 43, -1, 0, payload)
    data = schema.encode_batch(_batch(events=[_batch().events[0], ev]))
    worker, ref = _both(data)
    for exc in (worker, ref):
        assert isinstance(exc, SchemaError) and exc.field == f"events[1].{field}" and words in exc.reason, exc
    ok = Event(kind, 1000, 0, schema.make_trace_key(3, 7, 1), 7, 42, 43, -1, 0, {k: None for k in payload})
    worker, ref = _both(schema.encode_batch(_batch(events=[ok])))
    assert not isinstance(worker, Exception) and not isinstance(ref, Exception), "nil: not known, accepted"
