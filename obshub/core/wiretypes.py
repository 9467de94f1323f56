"""msgspec types of the wire format, built from ``obshub.core.schema`` (``EVENT_FIELDS``,
``EVENT_INT_RANGES``, the envelope's keys and bounds), so that the fast decoders of the stream worker
(``obshub.streams.wire``) and the rule engine (``obshub.rules.intake``) and the reference decoder
(``schema.decode_batch``) cannot drift apart: a new event field or range is one edit in ``schema``.

The fast decoders only accept; whatever they refuse goes to the reference decoder, which names the field
that was wrong (``schema.SchemaError``). String bounds are in characters here (msgspec counts code points)
and bytes there: a caller passes ``max_str`` = ``schema.MAX_STR_LEN // 4`` when a string accepted here must
also fit the byte bound (4 UTF-8 bytes per character at most).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, Optional, Union

import msgspec
from msgspec import Meta

from obshub.core import schema
from obshub.core.schema import Kind


def _int(lo: int, hi: int) -> Any:
    # msgspec bounds are 64-bit signed; msgpack integers end at 2**64 - 1 = schema.U64_MAX anyway
    return Annotated[int, Meta(ge=lo, le=hi)] if hi < 2**63 else Annotated[int, Meta(ge=lo)]


def payload_type(max_str: int) -> Any:
    """The type of an event's payload: nil, or a map of at most ``schema.MAX_PAYLOAD_KEYS`` string keys to
    str, int, float, bool or nil; strings at most ``max_str`` characters."""
    text = Annotated[str, Meta(max_length=max_str)]
    return Optional[
        Annotated[dict[text, Union[text, int, float, bool, None]], Meta(max_length=schema.MAX_PAYLOAD_KEYS)]
    ]


def event_fields(max_str: int) -> list[tuple[str, Any]]:
    """``(name, type)`` of every field of an event in ``schema.EVENT_FIELDS`` order: ``kind`` a ``Kind``,
    the integers within ``schema.EVENT_INT_RANGES``, the payload as :func:`payload_type`."""
    out: list[tuple[str, Any]] = []
    for name in schema.EVENT_FIELDS:
        if name == "kind":
            out.append((name, Kind))
        elif name == "payload":
            out.append((name, payload_type(max_str)))
        else:
            out.append((name, _int(*schema.EVENT_INT_RANGES[name])))
    return out


_I64 = Annotated[int, Meta(ge=-(2**63), le=2**63 - 1)]
_U63 = Annotated[int, Meta(ge=0, le=2**63 - 1)]


class WireClock(msgspec.Struct, forbid_unknown_fields=True):
    """``schema.Clock`` (ns). Unknown keys are refused here (msgspec would skip them unchecked); the
    reference decoder then decides, and accepts them."""

    offset_ns: _I64
    uncertainty_ns: _U63
    tai_offset_ns: _I64 = 0


def envelope_fields(max_str: int) -> list[tuple[str, Any]]:
    """``(name, type)`` of a version-1 batch's envelope (every key but ``events``), as ``schema``'s
    reference decoder checks them: non-empty strings of at most ``max_str`` characters, ``host_id`` within
    ``schema.HOST_ID_MAX``, ``seq`` and ``sent_ns`` non-negative 63-bit integers."""
    name = Annotated[str, Meta(min_length=1, max_length=max_str)]
    return [
        ("v", Literal[1]),
        ("job", name),
        ("host", name),
        ("host_id", _int(0, schema.HOST_ID_MAX)),
        ("agent_id", name),
        ("seq", _U63),
        ("sent_ns", _U63),
        ("clock", WireClock),
    ]
