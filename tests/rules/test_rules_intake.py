"""Every record the rule engine reads either becomes rule input or is refused with a SchemaError that names
the field and the problem; nothing else escapes, and nothing refused reaches the engine. Generated hostile
records (hypothesis) against the decoders and the builtin rule pack; no broker."""

from __future__ import annotations

import json
import os

import msgpack
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from obshub.core import schema
from obshub.rules import intake
from obshub.rules.engine import Engine
from obshub.rules.loader import load_ruleset
from obshub.rules.service import BUILTIN_DIR

NOW = 1_764_000_000_000_000_000
HYP = settings(
    max_examples=300,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


def valid_summary(job: str = "job", step: int = 7) -> dict:
    """A step summary as the stream worker writes it (two hosts, a straggler, one blamed layer)."""
    return {
        "v": 1,
        "job": job,
        "step": step,
        "closed_by": "complete",
        "closed_at_ns": NOW,
        "hosts": ["h0", "h1"],
        "expected_hosts": ["h0", "h1"],
        "missing_hosts": [],
        "step_time_ns": {"h0": 100_000_000, "h1": 160_000_000},
        "step_time_max_ns": 160_000_000,
        "straggler": {"host": "h1", "score": 1.6, "excess_ns": 60_000_000, "reason": "last at 3/3 collectives"},
        "blame": [
            {
                "host": "h1",
                "layer": "sched",
                "excess_ns": 50_000_000,
                "straggler_ns": 55_000_000,
                "peer_median_ns": 5_000_000,
                "count": 40,
                "max_ns": 9_000_000,
            }
        ],
        "collectives": [
            {
                "pg": "0",
                "coll_seq": 1,
                "op": "allreduce",
                "skew_ns": 60_000_000,
                "uncertainty_ns": 1000,
                "last_host": "h1",
            }
        ],
        "layers": {
            "h0": {"sched": {"time_ns": 5_000_000, "count": 3, "max_ns": 2_000_000}},
            "h1": {"sched": {"time_ns": 55_000_000, "count": 40, "max_ns": 9_000_000}},
        },
        "baseline": {"median_ns": 100_000_000.0, "p99_ns": 110_000_000, "n": 20},
        "stall": True,
        "stall_ratio": 1.6,
        "quality": {"lost_batches": 0, "duplicate_batches": 0, "late_events": 0, "ringbuf_lost": 0},
    }


@pytest.fixture(scope="module")
def engine() -> Engine:
    return Engine(load_ruleset([BUILTIN_DIR]), lambda change: None)


# values a hostile producer may put in any field
HOSTILE_SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**80), max_value=2**80),
    st.floats(allow_nan=False, allow_infinity=False),
    st.sampled_from([1e300, -1e300, 2.0**63, 0.5]),
    st.text(max_size=20),
    st.sampled_from(["x" * 5000, "\ud800", "é" * 4097]),
)
HOSTILE = st.recursive(
    HOSTILE_SCALARS,
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner, max_size=4)),
    max_leaves=12,
)


def deep(n: int) -> object:
    v: object = 1
    for _ in range(n):
        v = [v]
    return v


def check_step(value: bytes, engine: Engine) -> schema.SchemaError | None:
    """Decode one steps message; a refused one must say which field and what; an accepted one must
    evaluate on the builtin pack without raising."""
    try:
        recs = intake.decode(schema.TOPIC_STEPS, value)
    except schema.SchemaError as exc:
        assert exc.field and exc.reason, f"a refusal names the field and the problem: {exc!r}"
        return exc
    for sig, rec in recs:
        engine.process(sig, rec)
    return None


@HYP
@given(field=st.sampled_from(sorted(schema.STEP_SUMMARY_FIELDS)), value=HOSTILE)
@example(field="closed_at_ns", value=1e300)  # a float too large to be an integer, in a time field
@example(field="closed_at_ns", value=float("inf"))
@example(field="step", value=2.5)
@example(field="layers", value={"h0": {"sched": {"time_ns": deep(10)}}})
@example(field="job", value="x" * 5000)
def test_one_hostile_field_is_refused_naming_it_or_accepted_safely(engine, field, value):
    rec = valid_summary()
    rec[field] = value
    text = json.dumps(rec, allow_nan=True).encode("utf-8", "surrogatepass")
    exc = check_step(text, engine)
    if exc is not None and exc.field != "message":
        assert exc.field.split(".")[0].split("[")[0].split(" ")[0] == field, exc


@HYP
@given(data=st.binary(max_size=200))
@example(data=b"")
@example(data=b"\x00\xff" * 10)
@example(data=b"[" * 100_000)
@example(data=b'{"job": "a", "step": 1e400}')
@example(data=b'{"job": "a", "closed_at_ns": NaN}')
@example(data=b'{"step": ' + b"9" * 5000 + b"}")
@example(data=msgpack.packb({"v": 1}))
def test_random_bytes_never_escape_as_another_error(engine, data):
    check_step(data, engine)
    try:
        intake.decode(schema.TOPIC_EVENTS, data)
    except schema.SchemaError as exc:
        assert exc.reason


@HYP
@given(obj=HOSTILE)
def test_any_json_value_never_escapes(engine, obj):
    check_step(json.dumps(obj).encode("utf-8", "surrogatepass"), engine)
    if isinstance(obj, dict):
        check_step(json.dumps({**valid_summary(), **obj}).encode("utf-8", "surrogatepass"), engine)


def test_valid_summary_is_accepted_unchanged():
    [(sig, rec)] = intake.decode(schema.TOPIC_STEPS, json.dumps(valid_summary()).encode())
    assert sig == "steps" and rec["closed_at_ns"] == NOW and rec["straggler"]["host"] == "h1"
    assert rec["time_ns"] == NOW and rec["blame"][0]["layer"] == "sched"


@pytest.mark.parametrize(
    "field,value,field_named,words",
    [
        ("closed_at_ns", 1e300, "closed_at_ns", "outside"),
        ("step", "7", "step", "expected an integer, got str"),
        ("hosts", ["h0", 3], "hosts[1]", "expected a string"),
        ("layers", {"h0": {"sched": {"time_ns": deep(10)}}}, "layers.h0.sched.time_ns", "nested deeper"),
        ("step_time_ns", {"h0": "slow"}, "step_time_ns.h0", "expected an integer"),
        ("stall", "yes", "stall", "true or false"),
        ("job", "", "job", "must not be empty"),
        ("v", 7, "v", "unsupported schema version 7"),
        ("v", 0, "v", "unsupported schema version 0"),
    ],
)
def test_reasons_name_the_field_and_the_problem(field, value, field_named, words):
    rec = valid_summary()
    rec[field] = value
    with pytest.raises(schema.SchemaError) as ei:
        intake.decode(schema.TOPIC_STEPS, json.dumps(rec).encode())
    assert ei.value.field.startswith(field_named) and words in ei.value.reason, ei.value


def test_json_level_reasons():
    cases = {
        b"[" * 100_000: "nested too deeply",
        b'{"closed_at_ns": Infinity}': "Infinity is not a JSON number",
        b"\x85\xa1v\x01": "looks like msgpack",
        b"{not json": "not JSON",
        b"": "empty message",
        b"[1, 2]": "a step summary is a JSON object, got list",
    }
    for raw, words in cases.items():
        with pytest.raises(schema.SchemaError) as ei:
            intake.decode(schema.TOPIC_STEPS, raw)
        assert words in str(ei.value), (raw[:20], str(ei.value))


def _batch(**over) -> dict:
    b = {
        "v": 1,
        "job": "j",
        "host": "h",
        "host_id": 1,
        "agent_id": "a",
        "seq": 0,
        "sent_ns": 1,
        "clock": {"offset_ns": 0, "uncertainty_ns": 0, "tai_offset_ns": 0},
        "events": [[int(schema.Kind.CUDA_SYNC), 5, 10, 0, 1, 1, 1, 0, 0, None]],
    }
    b.update(over)
    return b


def test_batch_reasons_say_what_the_bytes_are():
    def reason(raw: bytes) -> schema.SchemaError:
        with pytest.raises(schema.SchemaError) as ei:
            schema.decode_batch(raw)
        return ei.value

    as_json = reason(json.dumps(_batch()).encode())
    assert "JSON, not a msgpack batch" in str(as_json) and "trailing" not in str(as_json)
    rnd = reason(bytes(range(1, 60)))
    assert "trailing bytes after the batch" not in str(rnd) and "random or foreign" in str(rnd)
    bomb = reason(b"\x91" * 5000)
    assert "nested deeper than 1024 levels" in str(bomb) and not str(bomb).endswith("StackError")
    top = reason(msgpack.packb({**_batch(), 7: 1}))
    assert top.field == "batch" and "map key 7 is int" in top.reason
    clk = reason(msgpack.packb(_batch(clock={0: 1, "offset_ns": 0, "uncertainty_ns": 0})))
    assert clk.field == "clock" and "map key 0" in clk.reason
    ev = _batch()["events"][0]
    ev[-1] = {1: "x"}
    pay = reason(msgpack.packb(_batch(events=[ev])))
    assert pay.field == "events[0].payload" and "key 1" in pay.reason
    assert "map keys must be strings" in str(reason(b"\x81\x91\x01\x02"))


def test_event_realtime_out_of_range_is_refused():
    raw = msgpack.packb(_batch(clock={"offset_ns": 2**63 - 1, "uncertainty_ns": 0}))
    with pytest.raises(schema.SchemaError) as ei:
        intake.decode(schema.TOPIC_EVENTS, raw)
    assert ei.value.field == "events[0].ts_ns" and "outside" in ei.value.reason
    assert len(intake.decode(schema.TOPIC_EVENTS, msgpack.packb(_batch()))) == 1


def valid_change() -> dict:
    return {
        "v": 1,
        "fingerprint": "0123456789abcdef",
        "rule": "r",
        "status": "firing",
        "severity": "warning",
        "labels": {"alertname": "r", "host": "h"},
        "annotations": {"summary": "s"},
        "starts_at": "",
        "ends_at": "",
        "starts_at_ns": 1,
        "ends_at_ns": 0,
        "updated_at_ns": 2,
        "value": 1.0,
        "routes": [],
        "generator_url": "",
        "engine": "e",
    }


@HYP
@given(field=st.sampled_from(sorted(valid_change())), value=HOSTILE)
def test_alert_change_refused_naming_the_field_or_usable(field, value):
    ch = valid_change()
    ch[field] = value
    try:
        out = intake.decode_change(json.dumps(ch).encode("utf-8", "surrogatepass"))
    except schema.SchemaError as exc:
        assert exc.field and exc.reason
        return
    assert out["status"] in intake.CHANGE_STATUSES and all(isinstance(v, str) for v in out["labels"].values())


def test_alert_change_reasons():
    for over, field in (
        ({"labels": {"h": 1}}, "labels.h"),
        ({"status": "burning"}, "status"),
        ({"routes": "slack"}, "routes"),
    ):
        with pytest.raises(schema.SchemaError) as ei:
            intake.decode_change(json.dumps({**valid_change(), **over}).encode())
        assert ei.value.field == field
    with pytest.raises(schema.SchemaError) as ei:
        intake.decode_change(os.urandom(1) + b"\xff")
    assert ei.value.field == "message"


def test_a_read_payload_value_of_the_wrong_type_is_refused_naming_the_key():
    ev = _batch()["events"][0]
    ev[0], ev[-1] = int(schema.Kind.CUDA_SYNC), {"symbol": 5}
    raw = msgpack.packb(_batch(events=[_batch()["events"][0], ev]))
    for kinds in (None, frozenset({int(schema.Kind.CUDA_SYNC)})):
        with pytest.raises(schema.SchemaError) as ei:
            intake.decode_event_batch(raw, kinds)
        assert ei.value.field == "events[1].payload.symbol" and "a string" in ei.value.reason
    # a kind no rule reads stays unread (docs: the engine checks what it reads)
    assert intake.decode_event_batch(raw, frozenset({int(schema.Kind.TCP_RTT)})).records == []
