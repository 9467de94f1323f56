"""The stream worker's codecs: agent batches in, and the compact msgpack of its own topics and tables.

Agent batches (the input topic). :func:`decode_batch` is the worker's decoder: one msgspec pass that
unpacks and type-checks the whole version-1 envelope and every event in C, with the limits of
``obshub.core.schema`` (string lengths, event count, integer ranges, known kinds, payload shape). A message it
rejects is decoded again by ``schema.decode_batch``, the project's reference decoder, whose
:class:`~obshub.core.schema.SchemaError` names the field for the dead-letter record; so the error a user sees is
the same as everywhere else in the project, and the fast path never accepts a batch the reference would
refuse (tests/streams/test_streams_wire.py checks both directions). The decoded batch has the attribute names of
``schema.Batch`` / ``schema.Event`` (``events`` are named tuples, ``kind`` a ``schema.Kind``), which is all
``streams.accumulate`` reads.

The worker's own data is msgpack, written by msgspec. On the repartition topic ``<app>-steps`` keys are
UTF-8 text (codec ``obshub-str``) and values msgpack (codec ``obshub-msgpack``). A table's changelog
value is msgpack after a one-byte mark (codec ``obshub-changelog``, which also reads the JSON values of
older workers); its key stays Faust's JSON text of the key string (codec ``obshub-changelog-json``):
compaction and tombstones match records by their key bytes, so the key bytes of a table entry must not
change between versions. The codecs are registered with Faust's codec registry on import. Values are the plain dicts/lists/ints/strings
of ``streams.accumulate`` and ``streams.fold``; msgpack arrays come back as lists, exactly like JSON did,
so values recovered from a changelog merge like in-process ones.
"""

from __future__ import annotations

from typing import Annotated, Any, NamedTuple

import msgspec
from faust.serializers import codecs
from msgspec import Meta

from obshub.core import schema, wiretypes

# The event's and the envelope's types come from obshub.core.wiretypes, built from schema: one definition.
#: One event as decoded by the worker: the fields of ``schema.Event`` (same names, order, ranges).
WireEvent = NamedTuple("WireEvent", wiretypes.event_fields(schema.MAX_STR_LEN))  # type: ignore[misc]
WireClock = wiretypes.WireClock

#: ``schema.Batch`` of schema version 1 (unknown envelope keys refused, like the reference).
WireBatch = msgspec.defstruct(
    "WireBatch",
    [
        *wiretypes.envelope_fields(schema.MAX_STR_LEN),
        ("events", Annotated[list[WireEvent], Meta(max_length=schema.MAX_EVENTS_PER_BATCH)]),
    ],
    forbid_unknown_fields=True,
)


_batch_decoder = msgspec.msgpack.Decoder(WireBatch)


def decode_batch(data: bytes) -> WireBatch | schema.Batch:
    """Decode and validate one input message. Returns an object with ``schema.Batch``'s attributes.

    Raises only ``schema.SchemaError`` (from the reference decoder, naming the field) for any input the
    reference decoder rejects; ``data`` longer than ``schema.MAX_BATCH_BYTES`` is rejected unread.
    """
    if isinstance(data, (bytes, bytearray, memoryview)) and 0 < len(data) <= schema.MAX_BATCH_BYTES:
        try:
            batch = _batch_decoder.decode(data)
        except (msgspec.DecodeError, msgspec.ValidationError):
            pass
        else:
            if schema.payloads_typed(batch.events):
                return batch  # else a payload value of the wrong type: the reference names it
    return schema.decode_batch(data)  # the reference names what is wrong (or, in a corner, accepts it)


class Undecodable:
    """What a codec returns for bytes it cannot decode (a damaged or foreign changelog record), instead
    of raising inside Faust's recovery, which would retry the same record forever and never become ready.
    ``raw`` keeps the bytes and ``reason`` the decoder's error; tables skip such records
    (``streams.app``)."""

    __slots__ = ("raw", "reason")

    def __init__(self, raw: bytes, reason: str):
        self.raw, self.reason = raw, reason

    def __repr__(self) -> str:
        return f"Undecodable({self.raw[:32]!r}..., {self.reason})"


class _MsgpackCodec(codecs.Codec):
    """Faust codec: any msgpack-able value <-> msgpack bytes (msgspec). Undecodable bytes load as
    :class:`Undecodable`."""

    _enc = msgspec.msgpack.Encoder()
    _dec = msgspec.msgpack.Decoder()

    def _dumps(self, obj: Any) -> bytes:
        return self._enc.encode(obj)

    def _loads(self, s: bytes) -> Any:
        try:
            return self._dec.decode(s)
        except (msgspec.DecodeError, ValueError, TypeError) as exc:
            return Undecodable(bytes(s), f"not msgpack: {exc}")


class _StrCodec(codecs.Codec):
    """Faust codec: ``str`` <-> UTF-8 bytes (table keys that come back as ``str`` after recovery).
    Bytes that are not UTF-8 load as :class:`Undecodable`."""

    def _dumps(self, obj: Any) -> bytes:
        return obj.encode() if isinstance(obj, str) else bytes(obj)

    def _loads(self, s: bytes) -> Any:
        if not isinstance(s, (bytes, bytearray)):
            return s
        try:
            return s.decode()
        except UnicodeDecodeError as exc:
            return Undecodable(bytes(s), f"not UTF-8: byte 0x{s[exc.start]:02x} at offset {exc.start}")


class _ChangelogJsonCodec(codecs.json):
    """Faust's JSON codec (the format of the tables' changelog records, unchanged), except that bytes it
    cannot decode (not UTF-8, not JSON) load as :class:`Undecodable` instead of raising."""

    def _loads(self, s: bytes) -> Any:
        try:
            return super()._loads(s)
        except UnicodeDecodeError as exc:
            return Undecodable(bytes(s), f"not UTF-8: byte 0x{s[exc.start]:02x} at offset {exc.start}")
        except (ValueError, TypeError, RecursionError) as exc:
            return Undecodable(bytes(s), f"not JSON: {type(exc).__name__}: {exc}")


CHANGELOG_MARK = b"\xc1"  # msgpack's one reserved byte: no msgpack value and no UTF-8 text starts with it


class _ChangelogCodec(codecs.Codec):
    """Faust codec of the tables' changelog values: ``CHANGELOG_MARK`` + the value's msgpack (msgspec),
    1 byte more than :func:`packb`. Loads both that and the JSON values of workers that wrote their
    changelogs in Faust's JSON (any record not starting with the mark), so a worker recovers a table
    written before the change of format. Bytes neither format decodes load as :class:`Undecodable`.
    ``0xc1`` is "never used" in the msgpack specification (github.com/msgpack/msgpack, spec.md) and is
    not a valid first byte of UTF-8, so the two formats cannot be mistaken for each other."""

    _enc = msgspec.msgpack.Encoder()
    _dec = msgspec.msgpack.Decoder()
    _legacy = _ChangelogJsonCodec()

    def _dumps(self, obj: Any) -> bytes:
        return CHANGELOG_MARK + self._enc.encode(obj)

    def _loads(self, s: bytes) -> Any:
        if s[:1] != CHANGELOG_MARK:
            return self._legacy._loads(s)
        try:
            return self._dec.decode(memoryview(s)[1:])
        except (msgspec.DecodeError, ValueError, TypeError) as exc:
            return Undecodable(bytes(s), f"not msgpack: {exc}")


MSGPACK = "obshub-msgpack"
STR = "obshub-str"
CHANGELOG_JSON = "obshub-changelog-json"
CHANGELOG = "obshub-changelog"
codecs.register(MSGPACK, _MsgpackCodec())
codecs.register(STR, _StrCodec())
codecs.register(CHANGELOG_JSON, _ChangelogJsonCodec())
codecs.register(CHANGELOG, _ChangelogCodec())

_enc = msgspec.msgpack.Encoder()


_dec = msgspec.msgpack.Decoder()


def packb(obj: Any) -> bytes:
    """``obj`` as msgpack bytes, exactly as the worker writes it to its topics and changelogs."""
    return _enc.encode(obj)


def unpackb(data: bytes) -> Any:
    """The value of msgpack ``data`` (written by :func:`packb`). Raises ``msgspec.DecodeError``."""
    return _dec.decode(data)
