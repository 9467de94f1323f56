"""Generate the field reference of docs/RULES.md from the schema: every field of every signal a rule reads,
with its CEL type and unit, the members of nested fields, every event kind with its payload keys, and the
values of ``payload.symbol``.

Sources: ``obshub.core.schema`` (STEP_SUMMARY_FIELDS, Kind, KIND_INFO), ``obshub.rules.fields`` (event and
health fields), ``obshub.rules.typecheck`` (the types the rule check uses) and ``obshub.producer.probes``
(the CUDA/NCCL functions whose name is ``payload.symbol``).

    python scripts/rules_reference.py            # print the reference
    python scripts/rules_reference.py --write    # replace it in docs/RULES.md (between the markers)
    python scripts/rules_reference.py --check    # exit 1 when docs/RULES.md differs (CI, tests)
"""

from __future__ import annotations

import sys
from pathlib import Path

from obshub.core import schema
from obshub.producer.probes import CUDA_SYMBOLS
from obshub.rules import fields
from obshub.rules.typecheck import EVENT_SCALARS, HEALTH_TYPES, T, step_types

DOC = Path(__file__).resolve().parents[1] / "docs" / "RULES.md"
BEGIN = "<!-- BEGIN GENERATED FIELD REFERENCE: python scripts/rules_reference.py --write -->"
END = "<!-- END GENERATED FIELD REFERENCE -->"

_UNITS = (("_ns", "ns"), ("_us", "µs"), ("_ms", "ms"), ("_s", "s"))
_EXTRA_UNITS = {"stall_ratio": "x median", "hosts": ""}


def unit(name: str) -> str:
    """The unit of a field from its name (``*_ns`` ns, ``*_us`` µs, ``*_ms`` ms, ``*_s`` s); '' if none."""
    if name in _EXTRA_UNITS:
        return _EXTRA_UNITS[name]
    return next((u for suffix, u in _UNITS if name.endswith(suffix)), "")


def type_text(t: T) -> str:
    """A CEL type as the reference writes it: ``int``, ``list(string)``, ``map(string, double)``, ``map``
    (a record, members listed below it), with ``or null`` for a nullable record."""
    if t.kind == "list":
        inner = t.elem or T("dyn")
        return f"list({'map' if inner.kind == 'record' else type_text(inner)})"
    if t.kind == "map":
        return f"map({type_text(t.key or T('dyn'))}, {type_text(t.elem or T('dyn'))})"
    if t.kind == "record" and t.elem is not None:
        return f"map(layer, {type_text(t.elem)})"
    if t.kind == "record":
        return "map or null" if t.nullable else "map"
    return t.kind


def _cell(text: str) -> str:
    return " ".join(text.replace("|", "\\|").split())


def _join(*parts: str) -> str:
    return "; ".join(p for p in parts if p)


def _values(t: T) -> str:
    return f"one of {', '.join(f'`{v}`' for v in sorted(t.values))}" if t.values and len(t.values) < 12 else ""


def _members(path: str, t: T, out: list[str]) -> None:
    """Rows for the members of the record inside ``t`` (a record, a list of records, a map of records)."""
    while t.kind in ("list", "map") or (t.kind == "record" and t.elem is not None):
        if t.elem is None:
            return
        path += "[]" if t.kind == "list" else "[layer]" if t.kind == "record" else "[k]"
        t = t.elem
    if t.kind != "record":
        return
    for name, mt in t.fields:
        out.append(f"| `{path}.{name}` | {type_text(mt)} | {unit(name)} | {_values(mt)} |")
        _members(f"{path}.{name}", mt, out)


def steps_table() -> list[str]:
    out = ["| field | CEL type | unit | meaning |", "|---|---|---|---|"]
    for name, t in step_types().items():
        desc = fields.STEP_VARS.get(name, "")
        out.append(f"| `{name}` | {type_text(t)} | {unit(name)} | {_join(_cell(desc), _values(t))} |")
        _members(name, t, out)
    return out


def events_table() -> list[str]:
    out = ["| field | CEL type | unit | meaning |", "|---|---|---|---|"]
    for name, desc in fields.EVENT_VARS.items():
        t = EVENT_SCALARS.get(name)
        meaning = _join(_cell(desc), _values(t) if t else "")
        out.append(f"| `{name}` | {type_text(t) if t else 'map'} | {unit(name)} | {meaning} |")
    return out


def health_table() -> list[str]:
    out = ["| field | CEL type | unit | meaning |", "|---|---|---|---|"]
    for name, desc in fields.HEALTH_VARS.items():
        out.append(f"| `{name}` | {type_text(HEALTH_TYPES[name])} | {unit(name)} | {_cell(desc)} |")
    return out


_PY = {int: "int", float: "double", str: "string", bool: "bool", bytes: "bytes"}


def kinds_table() -> list[str]:
    out = ["| kind | layer | `duration_ns` | `value` | payload keys (CEL type) |", "|---|---|---|---|---|"]
    for k in schema.Kind:
        info = schema.KIND_INFO[k]
        keys = ", ".join(f"`{n}` ({_PY.get(p, p.__name__)})" for n, p in info.payload.items()) or "none"
        out.append(f"| `{k.name}` | {info.layer.value} | {_cell(info.duration)} | {_cell(info.value)} | {keys} |")
    return out


def symbols_table() -> list[str]:
    out = ["| kind | `payload.symbol` values (library) |", "|---|---|"]
    by_kind: dict[str, list[str]] = {}
    for s in CUDA_SYMBOLS:
        by_kind.setdefault(s.kind.name, []).append(f"`{s.symbol}` ({s.lib})")
    for kind, syms in by_kind.items():
        out.append(f"| `{kind}` | {', '.join(syms)} |")
    return out


def reference() -> str:
    """The generated reference (markdown, between the markers)."""
    parts = [
        BEGIN,
        "",
        "### `steps`: one step summary (`obshub.steps.v1`)",
        "",
        "Members of nested fields are listed under them (`blame[].layer`: the `layer` of each entry of the",
        "list `blame`; `[k]`: the entry of a map's key `k`; `[layer]`: the entry of a layer name in a map",
        "keyed by layer, read as a member: `layers[k].network.time_ns`). A missing field has its neutral",
        "default (0, empty list or map, null `straggler`/`hang`).",
        "",
        *steps_table(),
        "",
        "### `events`: one event of a batch (`obshub.events.v1`)",
        "",
        *events_table(),
        "",
        "### Event kinds and their payload keys",
        "",
        "`kinds:` takes these names; `payload.<key>` may be read for the keys of the rule's kinds.",
        "",
        *kinds_table(),
        "",
        "### `payload.symbol` values",
        "",
        "The CUDA and NCCL functions the agent watches with uprobes; `payload.symbol` is the function's name.",
        "",
        *symbols_table(),
        "",
        "### `health`: the engine's own input health (every 5 s per input topic)",
        "",
        *health_table(),
        "",
        END,
    ]
    return "\n".join(parts) + "\n"


def current(text: str) -> str:
    """The reference part of ``text`` (docs/RULES.md), markers included; '' when it has none."""
    if BEGIN not in text or END not in text:
        return ""
    start = text.index(BEGIN)
    end = text.index(END) + len(END)
    return text[start:end] + "\n"


def main(argv: list[str]) -> int:
    ref = reference()
    if "--write" in argv or "--check" in argv:
        text = DOC.read_text()
        if "--check" in argv:
            if current(text) != ref:
                print(f"{DOC}: the field reference is out of date: run python scripts/rules_reference.py --write")
                return 1
            return 0
        if current(text):
            text = text.replace(current(text), ref)
        else:
            text = text.rstrip("\n") + "\n\n" + ref
        DOC.write_text(text)
        return 0
    sys.stdout.write(ref)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
