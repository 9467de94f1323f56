"""TraceKey codec and batch codec: round trips (property-based), boundaries, hostile bytes (fuzzed)."""

from __future__ import annotations

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from obshub.core import schema
from obshub.core.schema import Batch, Clock, Event, Kind, SchemaError

u16 = st.integers(0, 0xFFFF)
u32 = st.integers(0, 0xFFFF_FFFF)


@given(u16, st.integers(0, 2**40), u32)
def test_trace_key_round_trip(host, step, op):
    key = schema.make_trace_key(host, step, op)
    assert 0 <= key < 2**64
    parts = schema.parse_trace_key(key)
    assert parts == (host, step % 65536, op)
    assert parts.host_id == host and parts.step16 == step & 0xFFFF and parts.op_seq == op


@given(st.integers(0, 2**64 - 1))
def test_parse_then_make_is_identity(key):
    p = schema.parse_trace_key(key)
    assert schema.make_trace_key(p.host_id, p.step16, p.op_seq) == key


def test_trace_key_bit_layout():
    assert schema.make_trace_key(1, 0, 0) == 1 << 48
    assert schema.make_trace_key(0, 1, 0) == 1 << 32
    assert schema.make_trace_key(0, 0, 1) == 1
    assert schema.make_trace_key(0xFFFF, 0xFFFF, 0xFFFF_FFFF) == 2**64 - 1
    assert schema.make_trace_key(0, 65536 + 5, 0) == 5 << 32  # the step wraps


@pytest.mark.parametrize(
    "args", [(-1, 0, 0), (65536, 0, 0), (0, -1, 0), (0, 0, -1), (0, 0, 2**32), (True, 0, 0), (0, 1.5, 0)]
)
def test_trace_key_rejects(args):
    with pytest.raises(ValueError):
        schema.make_trace_key(*args)


@pytest.mark.parametrize("key", [-1, 2**64, "1", None, 1.0])
def test_parse_trace_key_rejects(key):
    with pytest.raises(ValueError):
        schema.parse_trace_key(key)


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


def test_batch_round_trip():
    b = _batch()
    got = schema.decode_batch(schema.encode_batch(b))
    assert got == b
    assert schema.to_realtime_ns(got.events[0].ts_ns, got.clock) == 1010


def _raw(b: Batch) -> dict:
    return msgpack.unpackb(schema.encode_batch(b))


@pytest.mark.parametrize(
    "mutate,field",
    [
        (lambda r: r.update(v=2), "v"),
        (lambda r: r.pop("v"), "v"),
        (lambda r: r.update(host_id=70000), "host_id"),
        (lambda r: r.update(job=5), "job"),
        (lambda r: r.update(seq=-1), "seq"),
        (lambda r: r.pop("clock"), "clock"),
        (lambda r: r.update(extra=1), "extra"),
        (lambda r: r["events"][0].__setitem__(0, 250), "events[0].kind"),
        (lambda r: r["events"][0].__setitem__(3, -5), "events[0].trace_key"),
        (lambda r: r["events"][0].__setitem__(1, "x"), "events[0].ts_ns"),
        (lambda r: r["events"][0].pop(), "events[0]"),
        (lambda r: r["events"][0].__setitem__(9, [1]), "events[0].payload"),
    ],
)
def test_validation_names_the_field(mutate, field):
    raw = _raw(_batch())
    mutate(raw)
    with pytest.raises(SchemaError) as ei:
        schema.decode_batch(msgpack.packb(raw))
    assert ei.value.field == field


def test_unknown_version_is_clear():
    raw = _raw(_batch())
    raw["v"] = 99
    with pytest.raises(SchemaError, match="unsupported schema version 99"):
        schema.decode_batch(msgpack.packb(raw))


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"\xc1",
        b"\x81",
        b"\xdd\xff\xff\xff\xff",  # array32 claiming 4G elements
        b"\xdb\x7f\xff\xff\xff" + b"a" * 10,  # str32 claiming 2 GiB
        b"\xc6\xff\xff\xff\xff",
        msgpack.packb([1, 2, 3]),
        msgpack.packb({1: 2}),
    ],
)
def test_hostile_bytes_raise_schema_error_only(data):
    with pytest.raises(SchemaError):
        schema.decode_batch(data)


def test_truncations_raise_schema_error_only():
    data = schema.encode_batch(_batch())
    for n in range(len(data)):
        with pytest.raises(SchemaError):
            schema.decode_batch(data[:n])
    with pytest.raises(SchemaError, match="trailing"):
        schema.decode_batch(data + b"\x00")


def test_huge_event_count_rejected_without_allocating():
    raw = _raw(_batch())
    raw["events"] = []
    prefix = msgpack.packb(raw)[:-1]  # everything up to the empty events array
    bomb = prefix + b"\xdd" + (schema.MAX_EVENTS_PER_BATCH + 1).to_bytes(4, "big")
    with pytest.raises(SchemaError, match="msgpack"):
        schema.decode_batch(bomb)


@settings(max_examples=400, deadline=None)
@given(st.binary(max_size=300))
def test_fuzz_random_bytes(data):
    try:
        schema.decode_batch(data)
    except SchemaError:
        pass


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_fuzz_mutated_valid_batches(data):
    raw = bytearray(schema.encode_batch(_batch()))
    for _ in range(data.draw(st.integers(1, 5))):
        i = data.draw(st.integers(0, len(raw) - 1))
        raw[i] = data.draw(st.integers(0, 255))
    try:
        schema.decode_batch(bytes(raw))
    except SchemaError:
        pass


def test_every_kind_documented():
    for k in Kind:
        assert k in schema.KIND_INFO, k
    # the five first kinds keep their numbers
    assert [Kind.PYTORCH_OP, Kind.CUDA_LAUNCH, Kind.PAGE_ALLOC, Kind.RDMA_WQE_POST, Kind.RDMA_CQ_DONE] == [
        1,
        2,
        3,
        4,
        5,
    ]


def test_cluster_ids_never_look_like_options():
    from obshub import stack

    ids = [stack._cluster_id() for _ in range(2000)]
    assert not any(i.startswith("-") for i in ids)
    assert all(len(i) == 22 for i in ids)


def test_a_string_over_the_unpacker_limit_is_named_by_its_field():
    env = {
        "v": 1,
        "job": "x" * 100_000,
        "host": "h",
        "host_id": 1,
        "agent_id": "a",
        "seq": 0,
        "sent_ns": 1,
        "clock": {"offset_ns": 0, "uncertainty_ns": 0, "tai_offset_ns": 0},
        "events": [],
    }
    with pytest.raises(schema.SchemaError) as ei:
        schema.decode_batch(msgpack.packb(env))
    assert ei.value.field == "job" and "100000 characters" in ei.value.reason
    env["job"] = "é" * 3000  # 3,000 characters but 6,000 UTF-8 bytes: the byte limit, said so
    with pytest.raises(schema.SchemaError) as ei:
        schema.decode_batch(msgpack.packb(env))
    assert ei.value.field == "message" and "4096 UTF-8 bytes" in ei.value.reason


def test_a_payload_integer_outside_int64_is_named_and_fails_the_fast_check():
    """A REGISTER whose local rank arrived as 2^64 - 1 (an int32 -1 widened to u64): summaries and the rule
    engine read int64, so the batch is refused naming the field, and the worker's fast check sends it to
    the reference (which names it) instead of into a summary."""
    bad = [int(Kind.REGISTER), 1, 0, 0, 1, 7, 7, -1, 0, {"job": "j", "world_size": 2, "local_rank": 2**64 - 1}]
    with pytest.raises(SchemaError) as exc:
        schema.validate_event(bad, "events[0]")
    assert exc.value.field == "events[0].payload.local_rank" and "outside the signed 64-bit range" in str(exc.value)
    assert not schema.payloads_typed([bad])
    assert schema.payloads_typed([bad[:-1] + [{"job": "j", "world_size": 2, "local_rank": -1}]])
    big = bad[:-1] + [{"job": "j", "world_size": 2, "local_rank": 0, "extra": 2**63}]  # an undeclared key too
    with pytest.raises(SchemaError, match="extra"):
        schema.validate_event(big)


def test_the_agent_reads_register_arguments_as_int32():
    from obshub.producer.reader import _s32

    assert [_s32(v) for v in (2**64 - 1, 0xFFFFFFFF, 3, 2**31 - 1, 2**31)] == [-1, -1, 3, 2**31 - 1, -(2**31)]
