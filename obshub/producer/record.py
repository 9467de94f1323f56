"""The one definition of the raw record the BPF programs write into the ring buffer (``struct obs_event``).

Everything that reads or writes a record follows this table:

- ``obshub/bpf/record.h``, included by the BPF programs (``obshub/bpf/common.h``) and by the agent's C
  batch reader (``obshub/producer/_ring.c``), is generated from it: ``python -m obshub.producer.record``
  rewrites the file, ``--check`` exits 1 when it differs (``tests/producer/test_record_layout.py`` checks
  it, and that the C compiler lays the struct out at the offsets below);
- :data:`RECORD_STRUCT` (``struct.Struct``), which the Python decoder (``obshub.producer.reader``) unpacks.

A record is little-endian (x86-64 and arm64), naturally aligned with no padding: 8 × 64-bit fields,
2 × u32, 2 × u16, 1 × u32, then two NUL-padded strings, 176 bytes. What ``value``, ``arg0..arg3``,
``str0`` and ``str1`` mean per kind is the kind's record layout (``obshub.core.schema.KIND_INFO[k].record``,
docs/AGENT.md "Probes"). Adding a field is one row here, then regenerating the header; the decoders name
the fields by position, so a new field goes at the end of the integers or strings it joins.
"""

from __future__ import annotations

import struct
from pathlib import Path
from typing import NamedTuple


class Field(NamedTuple):
    """One field of ``struct obs_event``: ``ctype`` is a kernel type name (``__u64``, ``__s64``, ``__u32``,
    ``__u16``) or ``char`` with ``length`` > 0 bytes; ``doc`` becomes the C comment."""

    name: str
    ctype: str
    doc: str
    length: int = 0


STR0_LEN = 64  # bytes of str0 (NUL-padded)
STR1_LEN = 32  # bytes of str1

FIELDS: tuple[Field, ...] = (
    Field("ts_ns", "__u64", "bpf_ktime_get_ns(): CLOCK_MONOTONIC of this host, ns"),
    Field("duration_ns", "__u64", "per kind, ns (0 when the kind has no duration)"),
    Field("trace_key", "__u64", "TraceKey of the thread when the event happened (0 = none)"),
    Field("step", "__s64", "full step number of the thread (-1 = none)"),
    Field("value", "__s64", "per kind (schema.KIND_INFO[kind].value)"),
    Field("arg0", "__u64", "per kind"),
    Field("arg1", "__u64", "per kind"),
    Field("arg2", "__u64", "per kind"),
    Field("pid", "__u32", "tgid of the process the event belongs to"),
    Field("tid", "__u32", "thread id (0 when not tied to a thread)"),
    Field("kind", "__u16", "schema.Kind"),
    Field("probe", "__u16", "probe id (obshub/producer/probes.py)"),
    Field("arg3", "__u32", "per kind"),
    Field("str0", "char", "per kind, NUL-padded", STR0_LEN),
    Field("str1", "char", "per kind, NUL-padded", STR1_LEN),
)

_FORMAT = {"__u64": "Q", "__s64": "q", "__u32": "I", "__u16": "H"}
_SIZE = {"__u64": 8, "__s64": 8, "__u32": 4, "__u16": 2}


def _code(f: Field) -> str:
    return f"{f.length}s" if f.ctype == "char" else _FORMAT[f.ctype]


#: ``struct.Struct`` of one record: ``unpack_from`` gives the fields of :data:`FIELDS` in order (strings
#: as bytes with their NUL padding).
RECORD_STRUCT = struct.Struct("<" + "".join(_code(f) for f in FIELDS))
RECORD_SIZE: int = RECORD_STRUCT.size  # bytes (176)
FIELD_NAMES: tuple[str, ...] = tuple(f.name for f in FIELDS)


def offsets(fields: tuple[Field, ...] = FIELDS) -> dict[str, int]:
    """Byte offset of each field in a record (what ``offsetof(struct obs_event, f)`` must give). Raises
    ValueError when ``fields`` would make a C compiler insert padding (between fields or at the end)."""
    out, pos = {}, 0
    for f in fields:
        size = f.length if f.ctype == "char" else _SIZE[f.ctype]
        if f.ctype != "char" and pos % size:
            raise ValueError(f"field {f.name} at offset {pos} is not aligned to {size} bytes (C would pad)")
        out[f.name] = pos
        pos += size
    if pos % 8:
        raise ValueError(f"record of {pos} bytes: not a multiple of 8, a C compiler would pad its tail")
    return out


HEADER_PATH = Path(__file__).resolve().parent.parent / "bpf" / "record.h"


def render_header(fields: tuple[Field, ...] = FIELDS) -> str:
    """The text of ``obshub/bpf/record.h`` for ``fields``. Raises ValueError when the table would make
    the compiler insert padding (the Python and C layouts would then differ)."""
    layout = offsets(fields)
    size = struct.calcsize("<" + "".join(_code(f) for f in fields))
    assert size == sum(f.length if f.ctype == "char" else _SIZE[f.ctype] for f in fields) and layout
    width = max(
        len(f"{f.ctype} {f.name}[OBS_{f.name.upper()}_LEN];" if f.length else f"{f.ctype} {f.name};") for f in fields
    )
    lines = [
        "/* GENERATED from obshub/producer/record.py by `python -m obshub.producer.record`: do not edit here.",
        " *",
        " * One ring-buffer record of the agent: written by the BPF programs (common.h includes this file), read",
        " * by the agent's C batch reader (obshub/producer/_ring.c) and its Python decoder (obshub/producer/reader.py,",
        f" * record.RECORD_STRUCT). {size} bytes, little-endian, no padding. Per-kind meaning of value, arg0..arg3,",
        ' * str0 and str1: docs/AGENT.md "Probes". The kernel types (__u64 ...) come from linux/types.h.',
        " */",
        "#ifndef OBSHUB_RECORD_H",
        "#define OBSHUB_RECORD_H",
        "",
        *(f"#define OBS_{f.name.upper()}_LEN {f.length}" for f in fields if f.length),
        f"#define OBS_EVENT_SIZE {size}",
        "",
        "struct obs_event {",
    ]
    for f in fields:
        decl = f"{f.ctype} {f.name}[OBS_{f.name.upper()}_LEN];" if f.length else f"{f.ctype} {f.name};"
        lines.append(f"    {decl:<{width + 8}} /* {f.doc} */")
    lines += [
        "};",
        "",
        '_Static_assert(sizeof(struct obs_event) == OBS_EVENT_SIZE, "struct obs_event: see obshub/producer/record.py");',
        "",
        "#endif /* OBSHUB_RECORD_H */",
        "",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """``python -m obshub.producer.record [--check]``: write ``obshub/bpf/record.h`` from :data:`FIELDS`,
    or with ``--check`` exit 1 (saying so) when the file on disk differs. Exit 0 otherwise, 2 on a bad
    argument (argparse)."""
    import argparse

    ap = argparse.ArgumentParser(
        prog="python -m obshub.producer.record",
        description="Generate obshub/bpf/record.h (struct obs_event) from the table in obshub/producer/record.py.",
    )
    ap.add_argument("--check", action="store_true", help="only compare; exit 1 when the header is stale")
    args = ap.parse_args(argv)
    want = render_header()
    have = HEADER_PATH.read_text() if HEADER_PATH.exists() else ""
    if args.check:
        if have != want:
            print(f"{HEADER_PATH}: differs from obshub/producer/record.py; run python -m obshub.producer.record")
            return 1
        print(f"{HEADER_PATH}: up to date")
        return 0
    if have != want:
        HEADER_PATH.write_text(want)
        print(f"wrote {HEADER_PATH}")
    else:
        print(f"{HEADER_PATH}: up to date, not rewritten")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
