"""What the rule engine accepts from Kafka: every record either becomes rule input or is a dead letter.

``decode(topic, value)`` turns one message into ``[(signal, record), ...]`` (the maps of ``rules.fields``)
or raises :class:`schema.SchemaError` whose ``field`` names the offending field (``closed_at_ns``,
``layers.rank3.cuda.time_ns``, ``events[2].ts_ns``) and whose ``reason`` says what was wrong with it.
``decode_change(value)`` does the same for one alert state change read back from ``obshub.alerts.v1``.

``dead_letter`` publishes a message that failed to ``obshub.dlq.v1``, unchanged, with the reason, the
field, where it came from (topic, partition, offset) and which consumer group rejected it in the
headers of ``schema.DLQ_HEADERS``; the consumer then commits past it.

Step summaries (JSON) are checked by ``schema.decode_step_summary``; undocumented step-summary fields
are dropped unread (``fields.step_record``).

Event batches (msgpack): the engine decodes only what its rules read
--------------------------------------------------------------------
``event_kinds(ruleset)`` is the set of kinds any ``signal: events`` rule (or ``correlate`` side) reads
(their ``kinds:``); None when one reads every kind. ``decode_event_batch(value, kinds)`` checks:

- the message: bytes, 1 .. ``schema.MAX_BATCH_BYTES``, one well-formed msgpack value (nothing after
  it), at most ``schema.MAX_EVENTS_PER_BATCH`` events;
- the envelope, always, with the rules of ``schema.validate_batch`` (version, every field present and
  of its type and range, no unknown field, strings of 1 .. ``schema.MAX_STR_LEN`` characters, clock);
- every event: an array whose first element is an integer that is a ``schema.Kind``, so the engine
  knows whether to read it; an event of another kind is skipped there, its other elements unread and
  unchecked (they only have to be well-formed msgpack);
- every event of a read kind, with the rules of ``schema.validate_event`` (10 fields, each of its type
  and range, the payload a map of at most ``schema.MAX_PAYLOAD_KEYS`` string keys to strings, numbers,
  booleans or nil, the keys its kind declares of their type: ``schema.payload_type_error``), and its realtime (``ts_ns + clock.offset_ns``) within the signed 64-bit range.

Anything else makes the batch unusable: SchemaError naming the field (``job``, ``events[20].duration_ns``,
``events[3].kind``), then the DLQ. With every kind read (``kinds=None``) every event is checked as
``schema.decode_batch`` checks it; what differs are the msgpack-level limits the reference applies to
every string and map of a message (4,096 UTF-8 bytes, 1,024 entries), which apply here to what is read
(4,096 characters, the payload's 32 keys).

How: msgspec, in C. A first decoder reads the envelope and only the kind of each event, and accepts a
batch none of whose events is of a read kind (the usual batch: the pack reads a few rare kinds); it
costs ~6 µs for a 64-event batch, against ~150 µs for ``schema.decode_batch`` alone. A batch it refuses
is decoded by a second one, a tagged union over the kinds (events of read kinds typed field by field,
the others skipped past their kind), which gives the records. A batch both refuse (a problem, or only
something they are stricter about: strings over 1,024 characters, unknown clock keys) is checked part by
part (``_decode_checked``, with ``schema``'s validators), which accepts or names the field; the fast
decoders never accept what that path refuses, and give the same records
(tests/rules/test_rules_kinds.py checks both on generated batches).
"""

from __future__ import annotations

import functools
from typing import Annotated, Any, Literal, NamedTuple, Union

import msgspec
from msgspec import Meta

from obshub.core import schema, wiretypes
from obshub.rules import fields
from obshub.rules.model import RuleSet


def decode_step(value: bytes | None) -> dict:
    """One ``obshub.steps.v1`` message -> the step record rules see. Raises SchemaError (field, reason)."""
    return fields.step_record(schema.decode_step_summary(value))


# -- event batches: decode only what the rules read ---------------------------------------------------------
ALL_KINDS: frozenset[int] = frozenset(int(k) for k in schema.Kind)
_STR_FAST = schema.MAX_STR_LEN // 4  # characters: at most 4 UTF-8 bytes each, so within the byte limit too
_NONE = Annotated[int, Meta(ge=1, le=0)]  # no value satisfies it: an 11th element of an event is refused
# the envelope's and the events' types: obshub.core.wiretypes, built from schema (one definition)
_Envelope = msgspec.defstruct("_Envelope", wiretypes.envelope_fields(_STR_FAST), forbid_unknown_fields=True)


class _Peek(msgspec.Struct, array_like=True):
    """The first element of an event array (its kind); the rest is skipped unread."""

    kind: int


# every field but the kind (the tag of each kind's struct), then a sentinel that refuses an 11th element
_EVENT_FIELDS = [*wiretypes.event_fields(_STR_FAST)[1:], ("extra_", _NONE, 0)]


class _Loose(msgspec.Struct, forbid_unknown_fields=True):
    """The envelope's values undecided (checked by ``schema.validate_batch``), events left as raw msgpack."""

    v: Any = msgspec.UNSET
    job: Any = msgspec.UNSET
    host: Any = msgspec.UNSET
    host_id: Any = msgspec.UNSET
    agent_id: Any = msgspec.UNSET
    seq: Any = msgspec.UNSET
    sent_ns: Any = msgspec.UNSET
    clock: Any = msgspec.UNSET
    events: Annotated[list[msgspec.Raw], Meta(max_length=schema.MAX_EVENTS_PER_BATCH)] = msgspec.UNSET


_LOOSE = msgspec.msgpack.Decoder(_Loose)
_PEEK = msgspec.msgpack.Decoder(_Peek)
_ANY = msgspec.msgpack.Decoder()
_MSGSPEC_ERRORS = (msgspec.MsgspecError, ValueError, TypeError, RecursionError, OverflowError)


class _Decoders:
    """The msgspec decoders for one set of read kinds (module docstring, "Event batches").

    ``skip``: the envelope and events whose kinds are all read by no rule (each event an array starting
    with such a kind, the rest skipped); None when every kind is read. ``full``: the envelope and events
    of any known kind, those of read kinds typed field by field (``kind_of``: their class -> kind), the
    others skipped past their kind."""

    def __init__(self, kinds: frozenset[int]):
        self.kinds = kinds
        self.kind_of: dict[type, int] = {}
        members: list[type] = []
        for k in sorted(ALL_KINDS):
            if k in kinds:
                cls = msgspec.defstruct(f"Read{k}", _EVENT_FIELDS, array_like=True, tag=k, tag_field="kind")
                self.kind_of[cls] = k
            else:
                cls = msgspec.defstruct(f"Skip{k}", [], array_like=True, tag=k, tag_field="kind")
            members.append(cls)
        events = Annotated[list[Union[tuple(members)]], Meta(max_length=schema.MAX_EVENTS_PER_BATCH)]
        full = msgspec.defstruct("ReadBatch", [("events", events)], bases=(_Envelope,), forbid_unknown_fields=True)
        self.full = msgspec.msgpack.Decoder(full)
        self.skip = None
        others = sorted(ALL_KINDS - kinds)
        if others:
            other = msgspec.defstruct("Other", [("kind", Literal[tuple(others)])], array_like=True)
            batch = msgspec.defstruct(
                "SkipBatch",
                [("events", Annotated[list[other], Meta(max_length=schema.MAX_EVENTS_PER_BATCH)])],
                bases=(_Envelope,),
                forbid_unknown_fields=True,
            )
            self.skip = msgspec.msgpack.Decoder(batch)


@functools.lru_cache(maxsize=16)
def _decoders(kinds: frozenset[int]) -> _Decoders:
    return _Decoders(kinds)


class EventBatch(NamedTuple):
    """What the engine takes from one event batch: ``records`` (``fields.event_record`` maps, in batch
    order) of the events of the kinds read, ``events``, how many events the batch holds (read or not),
    and the batch's ``job``."""

    records: list[dict]
    events: int
    job: str


def event_kinds(ruleset: RuleSet) -> frozenset[int] | None:
    """The numeric kinds (``schema.Kind``) that a rule of ``ruleset`` may read on signal ``events``, as the
    rule itself or as its ``correlate`` side (``Rule.reads``); None when one reads every kind (no
    ``kinds:``); empty when no rule reads events."""
    out: set[int] = set()
    for r in ruleset.rules.values():
        sides = [(r.signal, r.kinds)] + ([(r.correlate.signal, r.correlate.kinds)] if r.correlate else [])
        for signal, kinds in sides:
            if signal == "events":
                if not kinds:
                    return None
                out.update(int(schema.Kind[k]) for k in kinds if k in schema.Kind.__members__)
    return frozenset(out)


def decode_event_batch(value: bytes | None, kinds: frozenset[int] | None = None) -> EventBatch:
    """One ``obshub.events.v1`` message -> the records of its events of ``kinds`` (numeric kinds; None:
    every kind) and its event count. What is checked is in the module docstring ("Event batches");
    raises SchemaError (field, reason) for a batch the engine cannot use."""
    if value is None:
        raise schema.SchemaError("message", "empty message (a tombstone or a message without a value)")
    if not isinstance(value, (bytes, bytearray, memoryview)) or not 0 < len(value) <= schema.MAX_BATCH_BYTES:
        schema.decode_batch(value)  # raises the reference's reason (type, empty, size)
    kinds = ALL_KINDS if kinds is None else kinds & ALL_KINDS
    dec = _decoders(kinds)
    if dec.skip is not None:
        try:
            b = dec.skip.decode(value)
            return EventBatch([], len(b.events), b.job)
        except _MSGSPEC_ERRORS:
            pass  # an event of a read kind, or something to check closer
    try:
        b = dec.full.decode(value)
    except _MSGSPEC_ERRORS:
        return _decode_checked(value, kinds)
    c = b.clock
    env = schema.Batch(
        b.job, b.host, b.host_id, b.agent_id, b.seq, [], schema.Clock(c.offset_ns, c.uncertainty_ns, c.tai_offset_ns)
    )
    kind_of = dec.kind_of
    out = []
    for i, e in enumerate(b.events):
        k = kind_of.get(e.__class__)
        if k is not None:
            if e.payload:
                bad = schema.payload_type_error(k, e.payload)
                if bad is not None:
                    raise schema.SchemaError(f"events[{i}].payload.{bad[0]}", bad[1])
            ev = schema.Event(k, e.ts_ns, e.duration_ns, e.trace_key, e.step, e.pid, e.tid, e.gpu, e.value, e.payload)
            out.append(_record(env, ev, i))
    return EventBatch(out, len(b.events), b.job)


def _record(batch: schema.Batch, ev: schema.Event, i: int) -> dict:
    rt = schema.to_realtime_ns(ev.ts_ns, batch.clock)
    if not 0 <= rt <= schema.I64_MAX:
        raise schema.SchemaError(f"events[{i}].ts_ns", f"ts_ns + clock.offset_ns = {rt} is outside 0..{schema.I64_MAX}")
    return fields.event_record(batch, ev)


_ENVELOPE = ("v", "job", "host", "host_id", "agent_id", "seq", "sent_ns", "clock", "events")


def _decode_checked(value: bytes, kinds: frozenset[int]) -> EventBatch:
    """The rules of ``decode_event_batch`` checked one part at a time, for a message the fast decoders
    refused: the reason of a refusal names the field. Envelope: ``schema.validate_batch``; each event's
    kind; events of ``kinds`` (and any event whose kind cannot be read): ``schema.validate_event``."""
    try:
        loose = _LOOSE.decode(value)
    except _MSGSPEC_ERRORS:
        batch = schema.decode_batch(value)  # raises the reference's reason (bytes, msgpack, envelope keys)
        recs = [_record(batch, ev, i) for i, ev in enumerate(batch.events) if ev.kind in kinds]
        return EventBatch(recs, len(batch.events), batch.job)
    env = {k: getattr(loose, k) for k in _ENVELOPE if getattr(loose, k) is not msgspec.UNSET}
    if "events" in env:
        env["events"] = []
    batch = schema.validate_batch(env)
    out = []
    for i, raw in enumerate(loose.events):
        try:
            kind: int | None = _PEEK.decode(raw).kind
        except _MSGSPEC_ERRORS:
            kind = None
        if kind in ALL_KINDS and kind not in kinds:
            continue
        where = f"events[{i}]"
        try:
            obj = _ANY.decode(raw)
        except _MSGSPEC_ERRORS as exc:
            raise schema.SchemaError(where, f"not valid msgpack: {type(exc).__name__}: {exc}") from None
        ev = schema.validate_event(obj, where)  # an unknown or unreadable kind is refused here
        for key in ev.payload or {}:
            if len(key) > schema.MAX_STR_LEN:
                raise schema.SchemaError(
                    f"{where}.payload", f"key of {len(key)} characters exceeds {schema.MAX_STR_LEN}"
                )
        out.append(_record(batch, ev, i))
    return EventBatch(out, len(loose.events), batch.job)


def decode_events(value: bytes | None, kinds: frozenset[int] | None = None) -> list[dict]:
    """One ``obshub.events.v1`` message -> one event record per event of ``kinds`` (numeric; None: every
    kind). Raises SchemaError (field, reason). ``decode_event_batch`` also counts the events."""
    return decode_event_batch(value, kinds).records


def decode(topic: str, value: bytes | None, kinds: frozenset[int] | None = None) -> list[tuple[str, dict]]:
    """A message of an input topic -> ``[(signal, record), ...]``; raises SchemaError when it cannot be
    used. ``topic`` is ``schema.TOPIC_STEPS`` (JSON) or any other (msgpack event batches, of which only
    the events of ``kinds`` become records; None: every kind)."""
    if topic == schema.TOPIC_STEPS:
        return [("steps", decode_step(value))]
    return [("events", rec) for rec in decode_events(value, kinds)]


_CHANGE_SHAPE: dict[str, str] = {
    "fingerprint": "str",
    "rule": "str",
    "severity": "str",
    "starts_at": "str",
    "ends_at": "str",
    "starts_at_ns": "int",
    "ends_at_ns": "int",
    "updated_at_ns": "int",
    "value": "number",
    "routes": "list[str]",
    "generator_url": "str",
    "engine": "str",
}
CHANGE_STATUSES = ("pending", "firing", "resolved", "inactive")


def decode_change(value: bytes | None) -> dict:
    """One ``obshub.alerts.v1`` message -> the change record (``lifecycle.change_record``) the notify
    loop delivers. ``fingerprint``, ``rule``, ``status`` and ``labels`` are required; every documented
    field present must have its documented type (``labels`` and ``annotations`` map strings to strings).
    Raises SchemaError (field, reason)."""
    data = schema.decode_json(value, "alert change")
    if not isinstance(data, dict):
        raise schema.SchemaError("message", f"an alert change is a JSON object, got {type(data).__name__}")
    for name in ("fingerprint", "rule", "status", "labels"):
        if name not in data:
            raise schema.SchemaError(name, "missing field")
    if data["status"] not in CHANGE_STATUSES:
        raise schema.SchemaError("status", f"{repr(data['status'])[:40]} is none of {', '.join(CHANGE_STATUSES)}")
    for name, shape in _CHANGE_SHAPE.items():
        if name in data:
            schema.check_shape(name, shape, data[name])
    if not data["fingerprint"]:
        raise schema.SchemaError("fingerprint", "must not be empty")
    for name in ("labels", "annotations"):
        m = data.get(name, {})
        if not isinstance(m, dict):
            raise schema.SchemaError(name, f"expected a map, got {type(m).__name__} {m!r:.60}")
        for k, v in m.items():
            schema.check_json_str(f"{name} (key)", k)
            schema.check_json_str(f"{name}.{k}", v)
    return data


DLQ_MAX_BYTES = schema.DLQ_MAX_BYTES


def dead_letter(producer: Any, msg: Any, exc: BaseException, consumer: str, dlq_topic: str = schema.TOPIC_DLQ) -> str:
    """Publish ``msg`` (a confluent_kafka Message) to the DLQ with its key, value and headers unchanged (a
    value over ``DLQ_MAX_BYTES`` is cut there and gets an ``obshub.truncated`` header with its full
    length), followed by the headers of ``schema.DLQ_HEADERS``: the reason (``field: problem``), the
    field, source topic, partition, offset, and ``consumer`` (the group that rejected it). Returns the
    reason. Does not flush: the caller flushes before it commits past the message."""
    reason = str(exc) or type(exc).__name__
    field = getattr(exc, "field", "") or ""
    values = (reason, field, msg.topic(), str(msg.partition()), str(msg.offset()), consumer)
    headers = list(msg.headers() or [])
    headers += [(k, v.encode("utf-8", "replace")) for k, v in zip(schema.DLQ_HEADERS, values)]
    value = msg.value()
    if value is not None and len(value) > DLQ_MAX_BYTES:
        headers.append(("obshub.truncated", str(len(value)).encode()))
        value = value[:DLQ_MAX_BYTES]
    producer.produce(dlq_topic, value=value, key=msg.key(), headers=headers)
    return reason
